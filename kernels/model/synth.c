/* Synthetic Mamba-1 checkpoint writer (see synth.h). Every tensor draws from
 * its own splitmix64 stream keyed by (seed, tensor index), so a tensor's
 * values do not depend on the model's other sizes' generation order. */
#include "kernels/model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

void mbd_synth_custom(int d_model, int n_layer, int vocab, mbd_mamba_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->d_model = d_model;
  cfg->n_layer = n_layer;
  cfg->vocab_size = vocab;
  cfg->d_state = 16;
  cfg->d_conv = 4;
  cfg->expand = 2;
  cfg->d_inner = 2 * d_model;
  cfg->dt_rank = (d_model + 15) / 16;
  cfg->norm_eps = 1e-5f;
  cfg->conv_bias = true;
  cfg->proj_bias = false;
  cfg->residual_in_fp32 = true;
  cfg->tie_embeddings = true;
  cfg->eos_token_id = 0;
}

int mbd_synth_shape(const char *name, mbd_mamba_config *cfg, mbd_error *err) {
  static const struct {
    const char *name;
    int d, l;
  } shapes[] = {{"130m", 768, 24}, {"370m", 1024, 48}, {"1.4b", 2048, 48}, {"2.8b", 2560, 64}};
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
    if (name && strcasecmp(name, shapes[i].name) == 0) {
      mbd_synth_custom(shapes[i].d, shapes[i].l, 50280, cfg);
      return MBD_OK;
    }
  return mbd_error_set(err, MBD_E_INVALID,
                       "unknown model shape '%s' (valid: 130m, 370m, 1.4b, 2.8b, custom)",
                       name ? name : "");
}

typedef struct tensor_buf {
  char name[128];
  mbd_tensor_desc desc;
  void *data;
} tensor_buf;

enum { KIND_UNIFORM, KIND_ONES, KIND_ALOG, KIND_DTBIAS };

/* Generates one tensor: values in f64, stored rounded to dtype. */
static int gen(tensor_buf *t, const char *name, mbd_dtype dt, int ndim, const int64_t *shape,
               int kind, double scale, uint64_t seed, uint64_t index, mbd_error *err) {
  snprintf(t->name, sizeof(t->name), "%s", name);
  int rc = mbd_tensor_desc_make(&t->desc, dt, ndim, shape, err);
  size_t n = 0;
  if (!rc) rc = mbd_tensor_desc_numel(&t->desc, &n, err);
  if (rc) return rc;
  t->data = malloc(n * mbd_dtype_size(dt) + 1);
  if (!t->data) return mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory for %s", name);
  uint64_t s = mix(seed ^ mix(index));
  int64_t cols = shape[ndim - 1];
  for (size_t i = 0; i < n; i++) {
    double v;
    switch (kind) {
      case KIND_ONES: v = 1.0; break;
      case KIND_ALOG: v = log((double)(i % (size_t)cols) + 1.0); break;
      case KIND_DTBIAS: {
        double u = (unif(&s) + 1.0) / 2.0; /* [0,1) */
        double dtv = exp(u * (log(0.1) - log(0.001)) + log(0.001));
        if (dtv < 1e-4) dtv = 1e-4;
        v = dtv + log(-expm1(-dtv)); /* inverse softplus */
        break;
      }
      default: v = unif(&s) * scale; break;
    }
    float f = (float)v;
    if (dt == MBD_DTYPE_F32)
      ((float *)t->data)[i] = f;
    else if (dt == MBD_DTYPE_BF16)
      ((uint16_t *)t->data)[i] = mbd_f32_to_bf16(f);
    else
      ((uint16_t *)t->data)[i] = mbd_f32_to_f16(f);
  }
  return MBD_OK;
}

int mbd_synth_write(const mbd_mamba_config *cfg, mbd_dtype dtype, uint64_t seed, const char *dir,
                    mbd_error *err) {
  return mbd_synth_write_progress(cfg, dtype, seed, dir, NULL, err);
}

static uint64_t tbytes(const tensor_buf *t) {
  size_t n = 0;
  mbd_tensor_desc_nbytes(&t->desc, &n, NULL);
  return n;
}

/* Bytes of the checkpoint's tensors (for the progress threshold). */
static uint64_t synth_bytes(const mbd_mamba_config *c, mbd_dtype dtype) {
  uint64_t d = (uint64_t)c->d_model, di = (uint64_t)c->d_inner, S = (uint64_t)c->d_state;
  uint64_t R = (uint64_t)c->dt_rank, dc = (uint64_t)c->d_conv;
  uint64_t layer = d + 2 * di * d + di * dc + (c->conv_bias ? di : 0) + (R + 2 * S) * di +
                   di * R + di + di * S + di + d * di;
  return ((uint64_t)c->vocab_size * d + (uint64_t)c->n_layer * layer + d) * mbd_dtype_size(dtype);
}

int mbd_synth_write_progress(const mbd_mamba_config *cfg, mbd_dtype dtype, uint64_t seed,
                             const char *dir, const mbd_progress_opts *progress, mbd_error *err) {
  if (dtype != MBD_DTYPE_F32 && dtype != MBD_DTYPE_BF16 && dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "synth: dtype must be f32, bf16 or f16");
  if (cfg->d_model < 1 || cfg->n_layer < 1 || cfg->vocab_size < 1 || cfg->d_state < 1 ||
      cfg->d_conv < 1 || cfg->d_inner < 1 || cfg->dt_rank < 1)
    return mbd_error_set(err, MBD_E_INVALID, "synth: all model sizes must be positive");
  int64_t d = cfg->d_model, di = cfg->d_inner, S = cfg->d_state, R = cfg->dt_rank;
  int64_t V = cfg->vocab_size, dc = cfg->d_conv;
  size_t ntens = 2 + (size_t)cfg->n_layer * 12;
  tensor_buf *t = calloc(ntens, sizeof(*t));
  mbd_st_writer *w = NULL;
  char path[4096], what[4096 + 16];
  int rc = MBD_OK;
  size_t k = 0;
  if (!t) return mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory");
  mbd_progress pr;
  snprintf(what, sizeof what, "synthesising %s", dir);
  mbd_progress_begin(&pr, progress, what, "tensors", synth_bytes(cfg, dtype),
                     2 + (uint64_t)cfg->n_layer * (cfg->conv_bias ? 10 : 9));
  int64_t s_emb[2] = {V, d};
  if ((rc = gen(&t[k], "backbone.embeddings.weight", dtype, 2, s_emb, KIND_UNIFORM,
                0.02 * sqrt(3.0), seed, k, err)))
    goto fail;
  mbd_progress_add(&pr, tbytes(&t[k]), 1);
  k++;
  for (int l = 0; l < cfg->n_layer; l++) {
    char nm[128];
    int64_t s_d[1] = {d}, s_in[2] = {2 * di, d}, s_conv[3] = {di, 1, dc}, s_di[1] = {di};
    int64_t s_x[2] = {R + 2 * S, di}, s_dt[2] = {di, R}, s_A[2] = {di, S}, s_out[2] = {d, di};
#define G(suffix, nd, shape, kind, scale)                                                   \
  do {                                                                                      \
    snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", l, suffix);                           \
    if ((rc = gen(&t[k], nm, dtype, nd, shape, kind, scale, seed, k, err))) goto fail;      \
    mbd_progress_add(&pr, tbytes(&t[k]), 1);                                                \
    k++;                                                                                    \
  } while (0)
    G("norm.weight", 1, s_d, KIND_ONES, 0);
    G("mixer.in_proj.weight", 2, s_in, KIND_UNIFORM, 1.0 / sqrt((double)d));
    G("mixer.conv1d.weight", 3, s_conv, KIND_UNIFORM, 1.0 / sqrt((double)dc));
    if (cfg->conv_bias) G("mixer.conv1d.bias", 1, s_di, KIND_UNIFORM, 1.0 / sqrt((double)dc));
    G("mixer.x_proj.weight", 2, s_x, KIND_UNIFORM, 1.0 / sqrt((double)di));
    G("mixer.dt_proj.weight", 2, s_dt, KIND_UNIFORM, 1.0 / sqrt((double)R));
    G("mixer.dt_proj.bias", 1, s_di, KIND_DTBIAS, 0);
    G("mixer.A_log", 2, s_A, KIND_ALOG, 0);
    G("mixer.D", 1, s_di, KIND_ONES, 0);
    G("mixer.out_proj.weight", 2, s_out, KIND_UNIFORM,
      1.0 / sqrt((double)di) / sqrt((double)cfg->n_layer));
#undef G
  }
  int64_t s_d[1] = {d};
  if ((rc = gen(&t[k], "backbone.norm_f.weight", dtype, 1, s_d, KIND_ONES, 0, seed, k, err)))
    goto fail;
  mbd_progress_add(&pr, tbytes(&t[k]), 1);
  k++;
  mbd_progress_end(&pr);
  if ((rc = mbd_st_writer_new(&w, err))) goto fail;
  mbd_st_writer_set_progress(w, progress);
  for (size_t i = 0; i < k; i++)
    if ((rc = mbd_st_writer_add(w, t[i].name, &t[i].desc, t[i].data, err))) goto fail;
  if ((rc = mbd_st_writer_set_metadata(w, "format", "pt", err))) goto fail;
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  if ((rc = mbd_st_writer_write(w, path, err))) goto fail;
  snprintf(path, sizeof(path), "%s/config.json", dir);
  rc = mbd_mamba_config_write(cfg, path, err);
fail:
  mbd_progress_end(&pr);
  mbd_st_writer_destroy(&w);
  for (size_t i = 0; i < ntens; i++) free(t[i].data);
  free(t);
  return rc;
}
