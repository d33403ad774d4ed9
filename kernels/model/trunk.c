/* The trunk of a CPU Mamba model (see trunk.h). */
#include "kernels/model/trunk.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/mamba_ops.h"

#define DEFAULT_MAX_ROWS 256

static int init(mbd_trunk *t, const mbd_trunk_spec *sp, mbd_error *err) {
  if (sp->dtype != MBD_DTYPE_F32 && sp->dtype != MBD_DTYPE_BF16 && sp->dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "model: storage dtype must be f32, bf16 or f16");
  if (sp->nlayer > MBD_TRUNK_MAX_LAYER_TENSORS)
    return mbd_error_set(err, MBD_E_INVALID, "model: %zu layer tensors, at most %d", sp->nlayer,
                         MBD_TRUNK_MAX_LAYER_TENSORS);
  t->dtype = sp->dtype;
  t->d = sp->d;
  t->max_rows = sp->max_rows > 0 ? sp->max_rows : DEFAULT_MAX_ROWS;
  memcpy(t->layer, sp->layer, sp->nlayer * sizeof(*sp->layer));
  t->nlayer = sp->nlayer;
  t->layer_size = sp->layer_size;
  return mbd_cpu_ctx_new(sp->threads, (mbd_cpu_isa)sp->isa, &t->ctx, err);
}

static int load_embed(mbd_trunk *t, const mbd_st_dir *s, const char *dir,
                      const mbd_trunk_spec *sp, mbd_error *err) {
  int64_t V = sp->V;
  const mbd_st_entry *e = sp->V_as_stored ? mbd_st_dir_find(s, sp->embed) : NULL;
  if (e && e->desc.ndim == 2) V = e->desc.shape[0];
  if (sp->V_as_stored && (V < 1 || V > INT32_MAX))
    return mbd_error_set(err, MBD_E_SHAPE, "model %s: embedding has no rows", dir);
  t->V = V;
  return mbd_weights_mat(s, sp->embed, V, t->d, t->dtype, &t->embed, &t->weight_bytes, err);
}

static int load_layers(mbd_trunk *t, const mbd_st_dir *s, int n_layer, mbd_error *err) {
  t->layers = calloc((size_t)n_layer, t->layer_size);
  if (!t->layers) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  t->n_layer = n_layer;
  for (int i = 0; i < n_layer; i++) {
    int rc = mbd_weights_load_layer(s, i, t->layer, t->nlayer, t->dtype,
                                    (char *)t->layers + (size_t)i * t->layer_size,
                                    &t->weight_bytes, err);
    if (rc) return rc;
  }
  return MBD_OK;
}

/* backbone.norm_f.weight and, unless tied, lm_head.weight. */
static int load_tail(mbd_trunk *t, const mbd_st_dir *s, const mbd_trunk_spec *sp,
                     mbd_error *err) {
  int64_t sh_d[1] = {t->d};
  int rc = mbd_weights_vec(s, "backbone.norm_f.weight", 1, sh_d, t->dtype, &t->norm_f,
                           &t->weight_bytes, err);
  if (rc || sp->tied || (sp->head_optional && !mbd_st_dir_find(s, "lm_head.weight"))) return rc;
  return mbd_weights_mat(s, "lm_head.weight", t->V, t->d, t->dtype, &t->lm_head,
                         &t->weight_bytes, err);
}

void mbd_trunk_free(mbd_trunk *t) {
  for (int i = 0; t->layers && i < t->n_layer; i++)
    mbd_weights_free_layer(t->layer, t->nlayer, (char *)t->layers + (size_t)i * t->layer_size);
  free(t->layers);
  t->layers = NULL;
  mbd_cpu_wpack_destroy(&t->embed);
  mbd_cpu_wpack_destroy(&t->lm_head);
  free(t->norm_f);
  free(t->resid);
  free(t->xn);
  free(t->out);
  for (int i = 0; i < t->nws; i++) free(t->ws[i]);
  t->nws = 0;
  mbd_rows_batch_free(&t->batch);
  mbd_cpu_ctx_destroy(&t->ctx);
  t->norm_f = t->resid = t->xn = t->out = NULL;
}

int mbd_trunk_alloc_floats(mbd_trunk *t, size_t n, float **out, mbd_error *err) {
  if (t->nws == MBD_TRUNK_MAX_WORKSPACES)
    return mbd_error_set(err, MBD_E_INVALID, "model: more than %d workspaces",
                         MBD_TRUNK_MAX_WORKSPACES);
  *out = calloc(n, sizeof(float));
  if (!*out) return mbd_error_set(err, MBD_E_NOMEM, "model: cannot allocate workspace");
  t->ws[t->nws++] = *out;
  return MBD_OK;
}

static float *alloc_row_buf(const mbd_trunk *t, size_t width, mbd_error *err) {
  float *b = calloc((size_t)t->max_rows * width, sizeof(float));
  if (!b) mbd_error_set(err, MBD_E_NOMEM, "model: cannot allocate workspace");
  return b;
}

/* The residual stream's rows and the family's workspaces. */
static int alloc_rows(mbd_trunk *t, float **const *bufs, const size_t *widths, size_t n,
                      mbd_error *err) {
  size_t d = (size_t)t->d;
  if (!t->resid && (!(t->resid = alloc_row_buf(t, d, err)) || !(t->xn = alloc_row_buf(t, d, err)) ||
                    !(t->out = alloc_row_buf(t, d, err))))
    return MBD_E_NOMEM;
  for (size_t i = 0; i < n; i++) {
    int rc = mbd_trunk_alloc_floats(t, (size_t)t->max_rows * widths[i], bufs[i], err);
    if (rc) return rc;
  }
  return MBD_OK;
}

/* The GEMM scratch for the widest of the n reduction sizes ks, so a forward
 * never allocates. */
static int reserve(mbd_trunk *t, const int64_t *ks, int n, mbd_error *err) {
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

static void bind(mbd_trunk *t, const mbd_trunk_spec *sp) {
  t->state = sp->state;
  t->rows = (mbd_rows_model){.model = sp->model, .ctx = t->ctx, .embed = t->embed,
                             .head = t->lm_head ? t->lm_head : t->embed, .d = t->d, .V = t->V,
                             .max_rows = t->max_rows, .resid = t->resid, .xn = t->xn,
                             .batch = &t->batch, .state = &t->state, .forward = sp->forward};
}

int mbd_trunk_load(mbd_trunk *t, const char *dir, const mbd_trunk_spec *spec, mbd_error *err) {
  mbd_st_dir *s = NULL;
  int rc = init(t, spec, err);
  if (!rc) rc = mbd_st_dir_open(dir, &s, err);
  if (!rc) rc = mbd_st_dir_set_progress(s, spec->progress, err);
  if (!rc) rc = load_embed(t, s, dir, spec, err);
  if (!rc) rc = load_layers(t, s, spec->n_layer, err);
  if (!rc) rc = load_tail(t, s, spec, err);
  mbd_st_dir_destroy(&s);
  if (!rc) rc = alloc_rows(t, spec->bufs, spec->widths, spec->nbufs, err);
  if (!rc) rc = reserve(t, spec->ks, spec->nks, err);
  if (!rc) bind(t, spec);
  return rc;
}
