/* The tensors of a synthetic checkpoint (see synth_tensors.h). */
#include "kernels/model/synth_tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/safetensors.h"

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static double unif(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ull;
  return (double)(mix(*s) >> 11) * 0x1p-52 - 1.0;
}

int mbd_synth_tensors_init(mbd_synth_tensors *s, size_t cap, mbd_dtype dtype, uint64_t seed,
                           mbd_error *err) {
  memset(s, 0, sizeof(*s));
  s->err = err;
  if (dtype != MBD_DTYPE_F32 && dtype != MBD_DTYPE_BF16 && dtype != MBD_DTYPE_F16)
    return s->rc = mbd_error_set(err, MBD_E_INVALID, "synth: dtype must be f32, bf16 or f16");
  s->dtype = dtype;
  s->seed = seed;
  s->cap = cap;
  s->t = calloc(cap, sizeof(*s->t));
  if (!s->t) return s->rc = mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory");
  return MBD_OK;
}

void mbd_synth_tensors_free(mbd_synth_tensors *s) {
  for (size_t i = 0; s->t && i < s->n; i++) free(s->t[i].data);
  free(s->t);
  s->t = NULL;
  s->n = s->cap = 0;
}

static double draw(mbd_synth_kind kind, double scale, size_t i, int64_t cols, uint64_t *st) {
  switch (kind) {
    case MBD_SYNTH_ONES: return 1.0;
    case MBD_SYNTH_ALOG_COL: return log((double)(i % (size_t)cols) + 1.0);
    case MBD_SYNTH_ALOG_U16: return log(1.0 + 15.0 * (unif(st) + 1.0) / 2.0);
    case MBD_SYNTH_DTBIAS: {
      double u = (unif(st) + 1.0) / 2.0; /* [0,1) */
      double dtv = exp(u * (log(0.1) - log(0.001)) + log(0.001));
      if (dtv < 1e-4) dtv = 1e-4;
      return dtv + log(-expm1(-dtv)); /* inverse softplus */
    }
    default: return unif(st) * scale;
  }
}

int mbd_synth_tensors_add(mbd_synth_tensors *s, const char *name, int ndim, const int64_t *shape,
                          mbd_synth_kind kind, double scale) {
  if (s->rc) return s->rc;
  if (s->n == s->cap)
    return s->rc = mbd_error_set(s->err, MBD_E_INVALID, "synth: more tensors than room for %s",
                                 name);
  uint64_t index = s->n;
  mbd_synth_tensor *t = &s->t[s->n];
  snprintf(t->name, sizeof(t->name), "%s", name);
  int rc = mbd_tensor_desc_make(&t->desc, s->dtype, ndim, shape, s->err);
  size_t n = 0;
  if (!rc) rc = mbd_tensor_desc_numel(&t->desc, &n, s->err);
  if (rc) return s->rc = rc;
  t->data = malloc(n * mbd_dtype_size(s->dtype) + 1);
  if (!t->data)
    return s->rc = mbd_error_set(s->err, MBD_E_NOMEM, "synth: out of memory for %s", name);
  s->n++;
  uint64_t st = mix(s->seed ^ mix(index));
  int64_t cols = shape[ndim - 1];
  for (size_t i = 0; i < n; i++) {
    float f = (float)draw(kind, scale, i, cols, &st);
    if (s->dtype == MBD_DTYPE_F32)
      ((float *)t->data)[i] = f;
    else if (s->dtype == MBD_DTYPE_BF16)
      ((uint16_t *)t->data)[i] = mbd_f32_to_bf16(f);
    else
      ((uint16_t *)t->data)[i] = mbd_f32_to_f16(f);
  }
  if (s->pr) {
    size_t nb = 0;
    mbd_tensor_desc_nbytes(&t->desc, &nb, NULL);
    mbd_progress_add(s->pr, nb, 1);
  }
  return MBD_OK;
}

int mbd_synth_tensors_add_layer(mbd_synth_tensors *s, int layer, const char *suffix, int ndim,
                                const int64_t *shape, mbd_synth_kind kind, double scale) {
  char nm[128];
  snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", layer, suffix);
  return mbd_synth_tensors_add(s, nm, ndim, shape, kind, scale);
}

int mbd_synth_tensors_write(mbd_synth_tensors *s, const char *dir,
                            const mbd_progress_opts *progress) {
  if (s->rc) return s->rc;
  mbd_st_writer *w = NULL;
  char path[4096];
  int rc = mbd_st_writer_new(&w, s->err);
  if (rc) return rc;
  mbd_st_writer_set_progress(w, progress);
  for (size_t i = 0; i < s->n && !rc; i++)
    rc = mbd_st_writer_add(w, s->t[i].name, &s->t[i].desc, s->t[i].data, s->err);
  if (!rc) rc = mbd_st_writer_set_metadata(w, "format", "pt", s->err);
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  if (!rc) rc = mbd_st_writer_write(w, path, s->err);
  mbd_st_writer_destroy(&w);
  return rc;
}
