/* Added tokens found in text before the model sees it, as the library's
 * AddedVocabulary::find_matches: leftmost-longest, non-overlapping matches of
 * the patterns; a single_word token is kept only between non-word characters;
 * lstrip / rstrip widen a match over the whitespace beside it (never back over
 * an earlier match). The spans between matches go on to the model. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

/* Code point ending at s[0..end). */
static int32_t cp_before(const char *s, size_t end, size_t *start) {
  size_t i = end;
  while (i > 0 && ((uint8_t)s[i - 1] & 0xc0) == 0x80 && end - i < 3) i--;
  if (i > 0) i--;
  size_t adv;
  int32_t cp = tok_utf8_cp(s + i, end - i, &adv);
  *start = i;
  return cp;
}

static int push(tok_segment **segs, size_t *n, size_t *cap, size_t off, size_t len, int32_t id) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    tok_segment *p = realloc(*segs, nc * sizeof *p);
    if (!p) return MBD_E_NOMEM;
    *segs = p;
    *cap = nc;
  }
  (*segs)[(*n)++] = (tok_segment){off, len, id};
  return 0;
}

/* Leftmost-longest match at or after pos; returns its index or -1. */
static long find(const tok_added_set *set, const char *s, size_t n, size_t pos, size_t *at) {
  for (size_t i = pos; i < n; i++) {
    if (!set->first[(uint8_t)s[i]]) continue;
    for (size_t k = 0; k < set->n; k++) {
      const tok_added *a = &set->tok[k];
      if (a->len <= n - i && (uint8_t)a->pattern[0] == (uint8_t)s[i] && !memcmp(a->pattern, s + i, a->len)) {
        *at = i;
        return (long)k;
      }
    }
  }
  return -1;
}

int tok_added_split(const tok_added_set *set, const char *s, size_t n, tok_segment **segs,
                    size_t *n_segs, size_t *cap) {
  *n_segs = 0;
  if (!n) return 0;
  if (!set->n) return push(segs, n_segs, cap, 0, n, -1);
  size_t start_offset = 0, pos = 0, at = 0;
  long k;
  while (pos < n && (k = find(set, s, n, pos, &at)) >= 0) {
    const tok_added *a = &set->tok[k];
    size_t start = at, stop = at + a->len;
    pos = stop;
    if (a->single_word) {
      size_t b;
      size_t adv;
      bool start_space = start == 0 || !tok_is_word(cp_before(s, start, &b));
      bool stop_space = stop == n || !tok_is_word(tok_utf8_cp(s + stop, n - stop, &adv));
      if (!start_space || !stop_space) continue;
    }
    if (a->lstrip) {
      size_t newstart = start;
      while (newstart > 0) {
        size_t b;
        if (!tok_is_space(cp_before(s, newstart, &b))) break;
        newstart = b;
      }
      start = newstart > start_offset ? newstart : start_offset;
    }
    if (a->rstrip) {
      while (stop < n) {
        size_t adv;
        if (!tok_is_space(tok_utf8_cp(s + stop, n - stop, &adv))) break;
        stop += adv;
      }
    }
    if (start_offset < start && push(segs, n_segs, cap, start_offset, start - start_offset, -1))
      return MBD_E_NOMEM;
    if (push(segs, n_segs, cap, start, stop - start, a->id)) return MBD_E_NOMEM;
    start_offset = stop;
  }
  if (start_offset < n) return push(segs, n_segs, cap, start_offset, n - start_offset, -1);
  return 0;
}
