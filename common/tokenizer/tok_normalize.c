/* Normalizers NFC, NFKC, NFD, NFKD (and Sequence, flattened by the loader)
 * through utf8proc. ASCII text is the same under all four, so it is passed
 * through untouched (English prose mostly is). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/tokenizer/tok_internal.h"

static bool is_ascii(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((uint8_t)s[i] >= 0x80) return false;
  return true;
}

int tok_normalize(const mbd_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len,
                  bool *owned, mbd_error *err) {
  *out = (char *)s;
  *out_len = n;
  *owned = false;
  if (!t->n_norm || !n || is_ascii(s, n)) return 0;
  for (size_t k = 0; k < t->n_norm; k++) {
    int opt = UTF8PROC_STABLE;
    switch (t->norm[k]) {
      case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
      case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
      case TOK_NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)*out, (utf8proc_ssize_t)*out_len,
                                      &res, (utf8proc_option_t)opt);
    if (m < 0) {
      if (*owned) free(*out);
      *owned = false;
      return mbd_error_set(err, m == UTF8PROC_ERROR_NOMEM ? MBD_E_NOMEM : MBD_E_INVALID,
                           "normalizing text: %s", utf8proc_errmsg(m));
    }
    if (*owned) free(*out);
    *out = (char *)res;
    *out_len = (size_t)m;
    *owned = true;
  }
  return 0;
}
