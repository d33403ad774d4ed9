/* Synthetic Mamba-3 SISO checkpoint writer (see mamba3_synth.h). Every tensor
 * draws from its own splitmix64 stream keyed by (seed, tensor index). */
#include "kernels/model/mamba3_synth.h"

#include <jansson.h>
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

int mbd_mamba3_synth_shape(const char *name, int d_model, int n_layer, int vocab,
                           mbd_mamba3_config *c, mbd_error *err) {
  static const struct {
    const char *name;
    int d, l;
  } shapes[] = {{"130m", 768, 24}, {"1.3b", 2048, 48}, {"custom", 0, 0}};
  size_t i = 0;
  while (i < sizeof shapes / sizeof shapes[0] && !(name && !strcasecmp(name, shapes[i].name))) i++;
  if (i == sizeof shapes / sizeof shapes[0])
    return mbd_error_set(err, MBD_E_INVALID,
                         "unknown Mamba-3 shape '%s' (valid: 130m, 1.3b, custom)", name ? name : "");
  memset(c, 0, sizeof(*c));
  c->d_model = d_model > 0 ? d_model : shapes[i].d;
  c->n_layer = n_layer > 0 ? n_layer : shapes[i].l;
  c->vocab_size = vocab > 0 ? vocab : 50280;
  if (c->d_model < 1 || c->n_layer < 1)
    return mbd_error_set(err, MBD_E_INVALID, "Mamba-3 shape custom needs d_model and layers");
  c->d_state = 128;
  c->headdim = 64;
  while (c->headdim > 1 && (2 * c->d_model) % c->headdim) c->headdim /= 2;
  c->ngroups = 1;
  c->d_inner = 2 * (int64_t)c->d_model;
  c->heads = (int)(c->d_inner / c->headdim);
  c->rope_fraction = 0.5f;
  c->angles = c->d_state / 4;
  c->a_floor = 1e-4f;
  c->eps = 1e-5f;
  c->tie_embeddings = 1;
  c->vocab_padded = (c->vocab_size + 7) / 8 * 8;
  c->d_in_proj = 2 * c->d_inner + 2 * c->d_state + 3 * c->heads + c->angles;
  return MBD_OK;
}

enum { KIND_UNIFORM, KIND_ONES, KIND_DTBIAS };

typedef struct tensor_buf {
  char name[128];
  mbd_tensor_desc desc;
  void *data;
} tensor_buf;

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
  for (size_t i = 0; i < n; i++) {
    double v = 1.0;
    if (kind == KIND_UNIFORM) {
      v = unif(&s) * scale;
    } else if (kind == KIND_DTBIAS) {
      double u = (unif(&s) + 1.0) / 2.0;
      double dtv = exp(u * (log(0.1) - log(0.001)) + log(0.001));
      if (dtv < 1e-4) dtv = 1e-4;
      v = dtv + log(-expm1(-dtv));
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

static int write_config(const mbd_mamba3_config *c, const char *path, mbd_error *err) {
  json_t *ssm = json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:i}", "layer", "Mamba3",
                          "d_state", c->d_state, "expand", 2, "headdim", c->headdim, "ngroups",
                          c->ngroups, "rope_fraction", (double)c->rope_fraction, "A_floor", 1e-4,
                          "is_outproj_norm", 0, "is_mimo", 0, "chunk_size", 64);
  json_t *root = json_pack("{s:i, s:i, s:i, s:i, s:o, s:[], s:{}, s:b, s:b, s:b, s:i, s:b}",
                           "d_model", c->d_model, "d_intermediate", 0, "n_layer", c->n_layer,
                           "vocab_size", c->vocab_size, "ssm_cfg", ssm, "attn_layer_idx",
                           "attn_cfg", "rms_norm", 1, "residual_in_fp32", 1, "fused_add_norm", 1,
                           "pad_vocab_size_multiple", 8, "tie_embeddings", 1);
  int rc = root && !json_dump_file(root, path, JSON_INDENT(4))
               ? MBD_OK
               : mbd_error_set(err, MBD_E_IO, "synth: cannot write %s", path);
  json_decref(root);
  return rc;
}

int mbd_mamba3_synth_write(const mbd_mamba3_config *c, mbd_dtype dtype, uint64_t seed,
                           const char *dir, mbd_error *err) {
  if (dtype != MBD_DTYPE_F32 && dtype != MBD_DTYPE_BF16 && dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "synth: dtype must be f32, bf16 or f16");
  int64_t d = c->d_model, di = c->d_inner, N = c->d_state, H = c->heads;
  size_t ntens = 2 + (size_t)c->n_layer * 9;
  tensor_buf *t = calloc(ntens, sizeof(*t));
  mbd_st_writer *w = NULL;
  char path[4096], nm[128];
  int rc = MBD_OK;
  size_t k = 0;
  if (!t) return mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory");
  int64_t s_emb[2] = {c->vocab_padded, d}, s_d[1] = {d};
  if ((rc = gen(&t[k], "backbone.embedding.weight", dtype, 2, s_emb, KIND_UNIFORM,
                0.02 * sqrt(3.0), seed, k, err)))
    goto fail;
  k++;
  for (int l = 0; l < c->n_layer; l++) {
    int64_t s_in[2] = {c->d_in_proj, d}, s_h[1] = {H}, s_bias[3] = {H, 1, N}, s_n[1] = {N};
    int64_t s_out[2] = {d, di};
#define G(suffix, nd, shape, kind, scale)                                              \
  do {                                                                                 \
    snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", l, suffix);                      \
    if ((rc = gen(&t[k], nm, dtype, nd, shape, kind, scale, seed, k, err))) goto fail; \
    k++;                                                                               \
  } while (0)
    G("norm.weight", 1, s_d, KIND_ONES, 0);
    G("mixer.in_proj.weight", 2, s_in, KIND_UNIFORM, 1.0 / sqrt((double)d));
    G("mixer.dt_bias", 1, s_h, KIND_DTBIAS, 0);
    G("mixer.B_bias", 3, s_bias, KIND_ONES, 0);
    G("mixer.C_bias", 3, s_bias, KIND_ONES, 0);
    G("mixer.B_norm.weight", 1, s_n, KIND_ONES, 0);
    G("mixer.C_norm.weight", 1, s_n, KIND_ONES, 0);
    G("mixer.D", 1, s_h, KIND_ONES, 0);
    G("mixer.out_proj.weight", 2, s_out, KIND_UNIFORM,
      1.0 / sqrt((double)di) / sqrt((double)c->n_layer));
#undef G
  }
  if ((rc = gen(&t[k], "backbone.norm_f.weight", dtype, 1, s_d, KIND_ONES, 0, seed, k, err)))
    goto fail;
  k++;
  if ((rc = mbd_st_writer_new(&w, err))) goto fail;
  for (size_t i = 0; i < k; i++)
    if ((rc = mbd_st_writer_add(w, t[i].name, &t[i].desc, t[i].data, err))) goto fail;
  if ((rc = mbd_st_writer_set_metadata(w, "format", "pt", err))) goto fail;
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  if ((rc = mbd_st_writer_write(w, path, err))) goto fail;
  snprintf(path, sizeof(path), "%s/config.json", dir);
  rc = write_config(c, path, err);
fail:
  mbd_st_writer_destroy(&w);
  for (size_t i = 0; i < ntens; i++) free(t[i].data);
  free(t);
  return rc;
}
