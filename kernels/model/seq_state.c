/* The recurrent state of one sequence on the CPU (see seq_state.h). */
#include "kernels/model/seq_state.h"

#include <stdlib.h>
#include <string.h>

int mbd_seq_state_new(const mbd_seq_state_desc *desc, mbd_seq_state **out, mbd_error *err) {
  *out = NULL;
  mbd_seq_state *s = calloc(1, sizeof(*s));
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  s->desc = *desc;
  s->buf = calloc(desc->floats + 1, sizeof(float));
  if (!s->buf) {
    free(s);
    return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  }
  *out = s;
  return MBD_OK;
}

void mbd_seq_state_destroy(mbd_seq_state **ps) {
  if (!ps || !*ps) return;
  free((*ps)->buf);
  free(*ps);
  *ps = NULL;
}

void mbd_seq_state_reset(mbd_seq_state *s) {
  memset(s->buf, 0, s->desc.floats * sizeof(float));
  s->pos = 0;
}

static int words_equal(const uint32_t *a, const uint32_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

int mbd_seq_state_fits(const mbd_seq_state_desc *want, const mbd_seq_state *s) {
  const mbd_seq_state_desc *d = &s->desc;
  return d->shape.family == want->shape.family && d->shape.n_layer == want->shape.n_layer &&
         d->shape.d_inner == want->shape.d_inner && d->shape.d_conv == want->shape.d_conv &&
         d->shape.d_state == want->shape.d_state && d->nwords == want->nwords &&
         words_equal(d->words, want->words, d->nwords) && d->floats == want->floats;
}

static mbd_state_part payload(const mbd_seq_state *s) {
  return (mbd_state_part){s->buf, s->desc.floats};
}

size_t mbd_seq_state_export_size(const mbd_seq_state *s) {
  mbd_state_part p = payload(s);
  return mbd_state_image_size(s->desc.nwords, &p, 1);
}

int mbd_seq_state_export(const mbd_seq_state *s, void *buf, size_t cap, size_t *len,
                         mbd_error *err) {
  mbd_state_part p = payload(s);
  return mbd_state_image_export(buf, cap, len, &s->desc.shape, s->pos, s->desc.words,
                                s->desc.nwords, &p, 1, err);
}

int mbd_seq_state_import(mbd_seq_state *s, const void *buf, size_t len, mbd_error *err) {
  const mbd_seq_state_desc *d = &s->desc;
  mbd_state_part p = payload(s);
  uint32_t w[MBD_SEQ_STATE_MAX_WORDS] = {0};
  int64_t pos;
  int rc = mbd_state_image_check(buf, len, &d->shape, d->nwords, &p, 1, &pos, w, err);
  if (rc) return rc;
  if (!words_equal(w, d->words, d->nwords))
    return mbd_error_set(err, MBD_E_SHAPE,
                         "state import: the image's family words (%u %u %u %u) are not this "
                         "model's (%u %u %u %u)",
                         w[0], w[1], w[2], w[3], d->words[0], d->words[1], d->words[2],
                         d->words[3]);
  mbd_state_image_read_parts(buf, d->nwords, &p, 1);
  s->pos = pos;
  return MBD_OK;
}
