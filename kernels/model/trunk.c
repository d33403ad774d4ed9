/* The trunk of a CPU Mamba model (see trunk.h). */
#include "kernels/model/trunk.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/weights.h"

#define DEFAULT_MAX_ROWS 256

int mbd_trunk_init(mbd_trunk *t, mbd_dtype dtype, int threads, int isa, int max_rows, int64_t d,
                   mbd_error *err) {
  if (dtype != MBD_DTYPE_F32 && dtype != MBD_DTYPE_BF16 && dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "model: storage dtype must be f32, bf16 or f16");
  t->dtype = dtype;
  t->d = d;
  t->max_rows = max_rows > 0 ? max_rows : DEFAULT_MAX_ROWS;
  return mbd_cpu_ctx_new(threads, (mbd_cpu_isa)isa, &t->ctx, err);
}

void mbd_trunk_free(mbd_trunk *t) {
  mbd_cpu_wpack_destroy(&t->embed);
  mbd_cpu_wpack_destroy(&t->lm_head);
  free(t->norm_f);
  free(t->resid);
  free(t->xn);
  free(t->out);
  mbd_rows_batch_free(&t->batch);
  mbd_cpu_ctx_destroy(&t->ctx);
  t->norm_f = t->resid = t->xn = t->out = NULL;
}

int mbd_trunk_vec(mbd_trunk *t, const mbd_st_dir *s, const char *name, int ndim,
                  const int64_t *shape, float **out, mbd_error *err) {
  return mbd_weights_vec(s, name, ndim, shape, t->dtype, out, &t->weight_bytes, err);
}

int mbd_trunk_mat(mbd_trunk *t, const mbd_st_dir *s, const char *name, int64_t rows, int64_t cols,
                  mbd_cpu_wpack **out, mbd_error *err) {
  return mbd_weights_mat(s, name, rows, cols, t->dtype, out, &t->weight_bytes, err);
}

int mbd_trunk_load_embed(mbd_trunk *t, const mbd_st_dir *s, const char *name, int64_t V,
                         mbd_error *err) {
  t->V = V;
  return mbd_weights_mat(s, name, V, t->d, t->dtype, &t->embed, &t->weight_bytes, err);
}

int mbd_trunk_load_tail(mbd_trunk *t, const mbd_st_dir *s, bool tied, bool head_optional,
                        mbd_error *err) {
  int64_t sh_d[1] = {t->d};
  int rc = mbd_weights_vec(s, "backbone.norm_f.weight", 1, sh_d, t->dtype, &t->norm_f,
                           &t->weight_bytes, err);
  if (rc || tied || (head_optional && !mbd_st_dir_find(s, "lm_head.weight"))) return rc;
  return mbd_weights_mat(s, "lm_head.weight", t->V, t->d, t->dtype, &t->lm_head,
                         &t->weight_bytes, err);
}

static int alloc_rows(const mbd_trunk *t, float **const *bufs, const size_t *widths, size_t n,
                      mbd_error *err) {
  for (size_t i = 0; i < n; i++) {
    *bufs[i] = calloc((size_t)t->max_rows * widths[i], sizeof(float));
    if (!*bufs[i]) return mbd_error_set(err, MBD_E_NOMEM, "model: cannot allocate workspace");
  }
  return MBD_OK;
}

int mbd_trunk_alloc_rows(mbd_trunk *t, float **const *bufs, const size_t *widths, size_t n,
                         mbd_error *err) {
  if (!t->resid) {
    float **own[] = {&t->resid, &t->xn, &t->out};
    size_t d[] = {(size_t)t->d, (size_t)t->d, (size_t)t->d};
    int rc = alloc_rows(t, own, d, 3, err);
    if (rc) return rc;
  }
  return alloc_rows(t, bufs, widths, n, err);
}

int mbd_trunk_reserve(mbd_trunk *t, const int64_t *ks, int n, mbd_error *err) {
  size_t need = 0;
  for (int i = 0; i < n; i++) {
    size_t b = mbd_cpu_gemm_scratch_bytes(ks[i]);
    if (b > need) need = b;
  }
  return mbd_cpu_ctx_reserve(t->ctx, need, err);
}

void mbd_trunk_norm(mbd_trunk *t, int64_t rows, const float *w, float eps) {
  for (int64_t r = 0; r < rows; r++)
    mbd_cpu_rmsnorm(t->resid + r * t->d, w, t->d, eps, t->xn + r * t->d);
}

void mbd_trunk_add_out(mbd_trunk *t, int64_t rows) {
  for (int64_t i = 0; i < rows * t->d; i++) t->resid[i] = t->resid[i] + t->out[i];
}

void mbd_trunk_bind(mbd_trunk *t, void *model, int (*state_fits)(const void *, const void *),
                    void (*advance)(void *, int64_t),
                    int (*forward)(void *, void *const *, const int64_t *, int64_t, int64_t,
                                   mbd_error *)) {
  t->rows = (mbd_rows_model){.model = model, .ctx = t->ctx, .embed = t->embed,
                             .head = t->lm_head ? t->lm_head : t->embed, .d = t->d, .V = t->V,
                             .max_rows = t->max_rows, .resid = t->resid, .xn = t->xn,
                             .batch = &t->batch, .state_fits = state_fits, .advance = advance,
                             .forward = forward};
}
