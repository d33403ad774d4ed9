/* Incremental detokenizer for streaming. With a ByteLevel decoder the text is
 * the lossy UTF-8 of the ids' bytes joined, so bytes are gathered and all but
 * a trailing incomplete (still possibly valid) sequence are converted and
 * emitted; a lead byte begins a fresh sequence in the lossy conversion, so
 * cutting there changes nothing in the concatenation. Other decoders are run
 * over all ids so far and the new stable tail is emitted (a trailing U+FFFD is
 * held back, since more ids may complete it). */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

struct mbd_detok {
  const mbd_tokenizer *t;
  bool skip_special;
  bool bytes_mode;      /* ByteLevel decoder: work on bytes */
  char *held;           /* bytes mode: bytes not yet emitted; else: text emitted so far */
  size_t held_len, held_cap;
  tok_ids ids;          /* other decoders: every id so far */
};

int mbd_detok_new(const mbd_tokenizer *t, bool skip_special, mbd_detok **out, mbd_error *err) {
  *out = NULL;
  mbd_detok *d = calloc(1, sizeof *d);
  if (!d) return mbd_error_set(err, MBD_E_NOMEM, "detokenizer: out of memory");
  d->t = t;
  d->skip_special = skip_special;
  d->bytes_mode = t->has_decoder && t->n_dec_byte_level == 1;
  *out = d;
  return 0;
}

void mbd_detok_destroy(mbd_detok **d) {
  if (!d || !*d) return;
  free((*d)->held);
  free((*d)->ids.p);
  free(*d);
  *d = NULL;
}

static int out_append(char **buf, size_t *len, const char *s, size_t n, mbd_error *err) {
  size_t have = *buf ? *len : 0;
  char *p = realloc(*buf, have + n + 1);
  if (!p) return mbd_error_set(err, MBD_E_NOMEM, "detokenizer: out of memory");
  if (n) memcpy(p + have, s, n);
  p[have + n] = '\0';
  *buf = p;
  *len = have + n;
  return 0;
}

static int emit_lossy(const char *s, size_t n, char **buf, size_t *len, mbd_error *err) {
  char *tmp = NULL;
  size_t tl = 0, tc = 0;
  if (tok_utf8_lossy_append(s, n, &tmp, &tl, &tc)) {
    free(tmp);
    return mbd_error_set(err, MBD_E_NOMEM, "detokenizer: out of memory");
  }
  int rc = out_append(buf, len, tmp, tl, err);
  free(tmp);
  return rc;
}

/* Start of a trailing sequence that more bytes could still complete, or n. */
static size_t incomplete_tail(const char *s, size_t n) {
  for (size_t q = n > 3 ? n - 3 : 0; q < n; q++) {
    uint8_t b = (uint8_t)s[q];
    if (b < 0xc2 || b > 0xf4) continue;
    bool trunc;
    if (tok_utf8_seq((const uint8_t *)s + q, n - q, &trunc) < 0 && trunc) return q;
  }
  return n;
}

static size_t stable_end(const char *s, size_t n) {
  while (n >= 3 && !memcmp(s + n - 3, "\xef\xbf\xbd", 3)) n -= 3;
  return n;
}

/* Other decoders: emits what the decode of all ids adds to the text so far. */
static int generic_step(mbd_detok *d, bool final, char **buf, size_t *len, mbd_error *err) {
  char *full = NULL;
  size_t flen = 0;
  int rc = tok_decode_ids(d->t, d->ids.p, d->ids.n, d->skip_special, &full, &flen, err);
  if (rc) return rc;
  size_t end = final ? flen : stable_end(full, flen);
  if (end > d->held_len && !memcmp(full, d->held ? d->held : "", d->held_len)) {
    rc = out_append(buf, len, full + d->held_len, end - d->held_len, err);
    if (!rc) {
      free(d->held);
      d->held = full;
      d->held_len = end;
      d->held_cap = flen + 1;
      full = NULL;
    }
  } else if (!*buf) {
    rc = out_append(buf, len, "", 0, err);
  }
  free(full);
  return rc;
}

int mbd_detok_push(mbd_detok *d, int32_t id, char **buf, size_t *len, mbd_error *err) {
  const mbd_tokenizer *t = d->t;
  if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_ID_HOLE)
    return mbd_error_set(err, MBD_E_INVALID, "detokenize: id %d is not in the vocabulary", (int)id);
  if (d->skip_special && t->kind[id] == TOK_ID_SPECIAL) return *buf ? 0 : out_append(buf, len, "", 0, err);
  if (!d->bytes_mode) {
    if (tok_ids_push(&d->ids, id)) return mbd_error_set(err, MBD_E_NOMEM, "detokenizer: out of memory");
    return generic_step(d, false, buf, len, err);
  }
  if (tok_buf_append(&d->held, &d->held_len, &d->held_cap, t->byte_blob + t->byte_off[id],
                     t->byte_off[id + 1] - t->byte_off[id]))
    return mbd_error_set(err, MBD_E_NOMEM, "detokenizer: out of memory");
  size_t cut = incomplete_tail(d->held, d->held_len);
  int rc = emit_lossy(d->held, cut, buf, len, err);
  if (rc) return rc;
  memmove(d->held, d->held + cut, d->held_len - cut);
  d->held_len -= cut;
  return 0;
}

int mbd_detok_flush(mbd_detok *d, char **buf, size_t *len, mbd_error *err) {
  if (!d->bytes_mode) return generic_step(d, true, buf, len, err);
  int rc = emit_lossy(d->held ? d->held : "", d->held_len, buf, len, err);
  d->held_len = 0;
  return rc;
}
