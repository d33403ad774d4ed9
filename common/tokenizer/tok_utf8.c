/* UTF-8 as the tokenizer needs it: validation with the maximal-subpart rule
 * (what Rust's from_utf8_lossy replaces by one U+FFFD), code points in and out,
 * the GPT-2 byte <-> character table, and the two character classes the added
 * tokens' flags test. Character properties come from utf8proc. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/tokenizer/tok_internal.h"

int tok_utf8_seq(const uint8_t *s, size_t n, bool *truncated) {
  *truncated = false;
  uint8_t b = s[0];
  if (b < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */
  if (b >= 0xc2 && b <= 0xdf) need = 1;
  else if (b >= 0xe0 && b <= 0xef) {
    need = 2;
    if (b == 0xe0) lo = 0xa0;
    if (b == 0xed) hi = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    need = 3;
    if (b == 0xf0) lo = 0x90;
    if (b == 0xf4) hi = 0x8f;
  } else {
    return -1;
  }
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n) {
      *truncated = true;
      return -i;
    }
    uint8_t c = s[i];
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) return -i;
  }
  return need + 1;
}

size_t tok_utf8_check(const char *s, size_t len) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    bool trunc;
    int k = tok_utf8_seq(u + i, len - i, &trunc);
    if (k < 0) return i;
    i += (size_t)k;
  }
  return len;
}

int32_t tok_utf8_cp(const char *s, size_t n, size_t *adv) {
  utf8proc_int32_t cp = 0;
  utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
  if (k <= 0) {
    *adv = 1;
    return 0xfffd;
  }
  *adv = (size_t)k;
  return cp;
}

size_t tok_utf8_put(int32_t cp, char *out) {
  return (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}

int tok_buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t nc = *cap ? *cap : 64;
    while (nc < *len + n + 1) nc *= 2;
    char *p = realloc(*buf, nc);
    if (!p) return MBD_E_NOMEM;
    *buf = p;
    *cap = nc;
  }
  if (n) memcpy(*buf + *len, s, n);
  *len += n;
  (*buf)[*len] = '\0';
  return 0;
}

int tok_utf8_lossy_append(const char *s, size_t n, char **buf, size_t *len, size_t *cap) {
  const uint8_t *u = (const uint8_t *)s;
  size_t i = 0;
  while (i < n) {
    size_t run = i; /* longest valid run, copied at once */
    while (run < n) {
      if (u[run] < 0x80) {
        run++;
        continue;
      }
      bool trunc;
      int k = tok_utf8_seq(u + run, n - run, &trunc);
      if (k < 0) break;
      run += (size_t)k;
    }
    if (tok_buf_append(buf, len, cap, s + i, run - i)) return MBD_E_NOMEM;
    i = run;
    if (i < n) {
      bool trunc;
      int k = tok_utf8_seq(u + i, n - i, &trunc);
      if (tok_buf_append(buf, len, cap, "\xef\xbf\xbd", 3)) return MBD_E_NOMEM;
      i += (size_t)(-k);
    }
  }
  if (!*buf) return tok_buf_append(buf, len, cap, "", 0);
  return 0;
}

void tok_byte_chars(int32_t out[256]) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    out[b] = printable ? b : 256 + n++;
  }
}

int tok_char_byte(int32_t cp) {
  if ((cp >= '!' && cp <= '~') || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff)) return cp;
  if (cp < 256 || cp >= 256 + 68) return -1;
  /* the n-th non-printable byte maps to 256 + n */
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    if (!printable && 256 + n++ == cp) return b;
  }
  return -1;
}

bool tok_is_space(int32_t cp) {
  if ((cp >= 9 && cp <= 13) || cp == 0x85) return true;
  utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool tok_is_word(int32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200c || cp == 0x200d; /* Join_Control */
  }
}
