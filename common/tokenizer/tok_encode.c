/* Encoding, in the library's order: added tokens with normalized: false are
 * cut out of the raw text; each remaining span is normalized, and added tokens
 * with normalized: true are cut out of that; what remains is pre-tokenized and
 * run through the BPE model; with add_special the post-processor's template
 * puts its ids around the result. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

typedef struct encoder {
  tok_pre_scratch *pre;
  tok_bpe_scratch *bpe;
  tok_segment *raw, *norm; /* segment lists of the two added-token passes */
  size_t raw_cap, norm_cap;
} encoder;

static int encode_span(const mbd_tokenizer *t, encoder *e, const char *s, size_t n, tok_ids *out,
                       mbd_error *err) {
  char *ns = NULL;
  size_t nn = 0;
  bool owned = false;
  int rc = tok_normalize(t, s, n, &ns, &nn, &owned, err);
  if (rc) return rc;
  size_t n_segs = 0;
  if (tok_added_split(&t->added_norm, ns, nn, &e->norm, &n_segs, &e->norm_cap)) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "encode: out of memory");
    goto done;
  }
  for (size_t i = 0; i < n_segs; i++) {
    const tok_segment *g = &e->norm[i];
    if (!g->len) continue;
    if (g->id >= 0) {
      if (tok_ids_push(out, g->id)) {
        rc = mbd_error_set(err, MBD_E_NOMEM, "encode: out of memory");
        goto done;
      }
    } else if ((rc = tok_pretokenize(t, e->pre, e->bpe, ns + g->off, g->len, out, err))) {
      goto done;
    }
  }
done:
  if (owned) free(ns);
  return rc;
}

int mbd_tokenizer_encode(const mbd_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n, mbd_error *err) {
  *ids = NULL;
  *n = 0;
  if (!text && len) return mbd_error_set(err, MBD_E_INVALID, "encode: NULL text");
  size_t bad = tok_utf8_check(text, len);
  if (bad < len)
    return mbd_error_set(err, MBD_E_INVALID, "encode: text is not valid UTF-8 (byte %zu of %zu)", bad, len);
  encoder e = {0};
  tok_ids out = {0};
  int rc = 0;
  e.pre = tok_pre_scratch_new(t);
  e.bpe = tok_bpe_scratch_new();
  if (!e.pre || !e.bpe) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "encode: out of memory");
    goto done;
  }
  if (add_special)
    for (size_t i = 0; i < t->n_post_prefix; i++)
      if (tok_ids_push(&out, t->post_prefix[i])) goto nomem;
  size_t n_segs = 0;
  if (tok_added_split(&t->added_raw, text, len, &e.raw, &n_segs, &e.raw_cap)) goto nomem;
  for (size_t i = 0; i < n_segs; i++) {
    const tok_segment *g = &e.raw[i];
    if (!g->len) continue;
    if (g->id >= 0) {
      if (tok_ids_push(&out, g->id)) goto nomem;
    } else if ((rc = encode_span(t, &e, text + g->off, g->len, &out, err))) {
      goto done;
    }
  }
  if (add_special)
    for (size_t i = 0; i < t->n_post_suffix; i++)
      if (tok_ids_push(&out, t->post_suffix[i])) goto nomem;
  if (!out.p && !(out.p = malloc(sizeof *out.p))) goto nomem; /* empty result: still a block */
  *ids = out.p;
  *n = out.n;
  out.p = NULL;
  goto done;
nomem:
  rc = mbd_error_set(err, MBD_E_NOMEM, "encode: out of memory");
done:
  free(out.p);
  free(e.raw);
  free(e.norm);
  tok_pre_scratch_free(e.pre);
  tok_bpe_scratch_free(e.bpe);
  return rc;
}
