/* Decoding ids back to text: decoders ByteLevel (each token's characters
 * through the GPT-2 table, or the token's own UTF-8 when a character is not in
 * it; the bytes joined and converted with U+FFFD for invalid sequences) and
 * Sequence of them; with no decoder the tokens are joined by spaces, as the
 * library does. The first ByteLevel step reads per-id bytes the loader
 * computed once. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

/* A further ByteLevel step over an already joined string. */
static int byte_level_again(char **text, size_t *len, size_t *cap) {
  char *raw = malloc(*len + 1);
  if (!raw) return MBD_E_NOMEM;
  size_t n = 0;
  bool all = true;
  for (size_t i = 0; i < *len;) {
    size_t adv;
    int b = tok_char_byte(tok_utf8_cp(*text + i, *len - i, &adv));
    if (b < 0) {
      all = false;
      break;
    }
    raw[n++] = (char)b;
    i += adv;
  }
  if (!all) {
    free(raw);
    return 0;
  }
  char *out = NULL;
  size_t olen = 0, ocap = 0;
  int rc = tok_utf8_lossy_append(raw, n, &out, &olen, &ocap);
  free(raw);
  if (rc) return rc;
  free(*text);
  *text = out;
  *len = olen;
  *cap = ocap;
  return 0;
}

int tok_decode_ids(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                   char **text, size_t *len, mbd_error *err) {
  *text = NULL;
  *len = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= t->n_ids || t->kind[ids[i]] == TOK_ID_HOLE)
      return mbd_error_set(err, MBD_E_INVALID, "decode: id %d (position %zu) is not in the vocabulary",
                           (int)ids[i], i);
  char *buf = NULL;
  size_t blen = 0, bcap = 0;
  int rc = 0;
  if (t->has_decoder && t->n_dec_byte_level) {
    char *raw = NULL;
    size_t rlen = 0, rcap = 0;
    for (size_t i = 0; i < n && !rc; i++) {
      if (skip_special && t->kind[ids[i]] == TOK_ID_SPECIAL) continue;
      rc = tok_buf_append(&raw, &rlen, &rcap, t->byte_blob + t->byte_off[ids[i]],
                          t->byte_off[ids[i] + 1] - t->byte_off[ids[i]]);
    }
    if (!rc) rc = tok_utf8_lossy_append(raw ? raw : "", rlen, &buf, &blen, &bcap);
    free(raw);
    for (size_t k = 1; k < t->n_dec_byte_level && !rc; k++) rc = byte_level_again(&buf, &blen, &bcap);
  } else {
    bool first = true;
    for (size_t i = 0; i < n && !rc; i++) {
      if (skip_special && t->kind[ids[i]] == TOK_ID_SPECIAL) continue;
      if (!first && !t->has_decoder) rc = tok_buf_append(&buf, &blen, &bcap, " ", 1);
      first = false;
      if (!rc)
        rc = tok_buf_append(&buf, &blen, &bcap, t->str_blob + t->str_off[ids[i]],
                            t->str_off[ids[i] + 1] - t->str_off[ids[i]]);
    }
    if (!rc && !buf) rc = tok_buf_append(&buf, &blen, &bcap, "", 0);
  }
  if (rc) {
    free(buf);
    return mbd_error_set(err, MBD_E_NOMEM, "decode: out of memory");
  }
  *text = buf;
  *len = blen;
  return 0;
}

int mbd_tokenizer_decode(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len, mbd_error *err) {
  size_t l = 0;
  int rc = tok_decode_ids(t, ids, n, skip_special, text, &l, err);
  if (len) *len = l;
  return rc;
}
