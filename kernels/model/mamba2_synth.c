/* Synthetic Mamba-2 checkpoints (see mamba2.h): seeded random weights in the
 * Hugging Face Mamba2ForCausalLM layout, initialised like that class (A_log
 * = log of uniform [1, 16] per head, D = 1, dt_bias = softplus^-1 of dt
 * log-uniform in [1e-3, 1e-1], uniform fan-in projections, unit norms). Every
 * tensor draws from its own splitmix64 stream keyed by (seed, tensor index). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/model/mamba2.h"

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

void mbd_mamba2_synth_custom(int d_model, int n_layer, int vocab, mbd_mamba2_config *c) {
  memset(c, 0, sizeof *c);
  c->d_model = d_model;
  c->n_layer = n_layer;
  c->vocab_size = vocab;
  c->d_state = 128;
  c->d_conv = 4;
  c->expand = 2;
  c->d_inner = 2 * d_model;
  c->head_dim = 64;
  c->n_heads = c->d_inner / 64 > 0 ? c->d_inner / 64 : 1;
  if (c->n_heads * 64 != c->d_inner) c->head_dim = c->d_inner, c->n_heads = 1;
  c->n_groups = 1;
  c->chunk_size = 256;
  c->norm_eps = 1e-5f;
  c->dt_min = 0.0f;
  c->dt_max = INFINITY;
  c->conv_bias = true;
  c->tie_embeddings = true;
  c->eos_token_id = 0;
}

int mbd_mamba2_synth_shape(const char *name, mbd_mamba2_config *c, mbd_error *err) {
  /* state-spaces/mamba2-*: d_state 128, head_dim 64, one group, vocab 50288 */
  static const struct {
    const char *name;
    int d, l;
  } shapes[] = {{"130m", 768, 24},   {"370m", 1024, 48}, {"780m", 1536, 48},
                {"1.3b", 2048, 48}, {"2.7b", 2560, 64}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if (name && !strcasecmp(name, shapes[i].name)) {
      mbd_mamba2_synth_custom(shapes[i].d, shapes[i].l, 50288, c);
      return MBD_OK;
    }
  return mbd_error_set(err, MBD_E_INVALID,
                       "unknown mamba2 shape '%s' (valid: 130m, 370m, 780m, 1.3b, 2.7b, custom)",
                       name ? name : "");
}

typedef struct tensor_buf {
  char name[128];
  mbd_tensor_desc desc;
  void *data;
} tensor_buf;

enum { KIND_UNIFORM, KIND_ONES, KIND_ALOG, KIND_DTBIAS };

static int gen(tensor_buf *t, const char *name, mbd_dtype dt, int ndim, const int64_t *shape,
               int kind, double scale, uint64_t seed, uint64_t index, mbd_error *err) {
  snprintf(t->name, sizeof t->name, "%s", name);
  int rc = mbd_tensor_desc_make(&t->desc, dt, ndim, shape, err);
  size_t n = 0;
  if (!rc) rc = mbd_tensor_desc_numel(&t->desc, &n, err);
  if (rc) return rc;
  t->data = malloc(n * mbd_dtype_size(dt) + 1);
  if (!t->data) return mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory for %s", name);
  uint64_t s = mix(seed ^ mix(index));
  for (size_t i = 0; i < n; i++) {
    double v, u;
    switch (kind) {
      case KIND_ONES: v = 1.0; break;
      case KIND_ALOG: v = log(1.0 + 15.0 * (unif(&s) + 1.0) / 2.0); break;
      case KIND_DTBIAS:
        u = (unif(&s) + 1.0) / 2.0;
        v = exp(u * (log(0.1) - log(0.001)) + log(0.001));
        if (v < 1e-4) v = 1e-4;
        v = v + log(-expm1(-v)); /* inverse softplus */
        break;
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

/* config.json as transformers' Mamba2Config writes it. */
static int write_config(const mbd_mamba2_config *c, const char *dir, mbd_error *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *lim = json_pack("[f,{s:s}]", (double)c->dt_min, "__float__", "Infinity");
  json_t *root = json_pack(
      "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:b,s:b,s:b,s:s,s:i,s:o}",
      "architectures", "Mamba2ForCausalLM", "model_type", "mamba2", "hidden_size", c->d_model,
      "num_hidden_layers", c->n_layer, "vocab_size", c->vocab_size, "state_size", c->d_state,
      "conv_kernel", c->d_conv, "expand", c->expand, "num_heads", c->n_heads, "head_dim",
      c->head_dim, "n_groups", c->n_groups, "chunk_size", c->chunk_size, "layer_norm_epsilon",
      (double)c->norm_eps, "use_conv_bias", (int)c->conv_bias, "use_bias", (int)c->proj_bias,
      "tie_word_embeddings", (int)c->tie_embeddings, "residual_in_fp32", 1, "hidden_act", "silu",
      "eos_token_id", c->eos_token_id, "time_step_limit", lim);
  if (!root) return mbd_error_set(err, MBD_E_NOMEM, "synth: cannot build config.json");
  int bad = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(6));
  json_decref(root);
  return bad ? mbd_error_set(err, MBD_E_IO, "synth: cannot write %s", path) : MBD_OK;
}

int mbd_mamba2_synth_write(const mbd_mamba2_config *c, mbd_dtype dtype, uint64_t seed,
                           const char *dir, mbd_error *err) {
  if (dtype != MBD_DTYPE_F32 && dtype != MBD_DTYPE_BF16 && dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "synth: dtype must be f32, bf16 or f16");
  if (c->d_model < 1 || c->n_layer < 1 || c->vocab_size < 1 || c->d_state < 1 ||
      c->d_conv < 1 || c->n_heads < 1 || c->head_dim < 1 || c->n_groups < 1 ||
      c->n_heads * c->head_dim != c->d_inner || c->n_heads % c->n_groups)
    return mbd_error_set(err, MBD_E_INVALID, "synth: inconsistent mamba2 sizes");
  int64_t d = c->d_model, di = c->d_inner, H = c->n_heads, dc = c->d_conv;
  int64_t cd = di + 2 * (int64_t)c->n_groups * c->d_state, pin = di + cd + H;
  size_t ntens = 2 + (size_t)c->n_layer * 12;
  tensor_buf *t = calloc(ntens, sizeof *t);
  mbd_st_writer *w = NULL;
  char path[4096];
  int rc = MBD_OK;
  size_t k = 0;
  if (!t) return mbd_error_set(err, MBD_E_NOMEM, "synth: out of memory");
  int64_t s_emb[2] = {c->vocab_size, d};
  if ((rc = gen(&t[k], "backbone.embeddings.weight", dtype, 2, s_emb, KIND_UNIFORM,
                0.02 * sqrt(3.0), seed, k, err)))
    goto fail;
  k++;
  for (int l = 0; l < c->n_layer; l++) {
    char nm[128];
    int64_t s_d[1] = {d}, s_in[2] = {pin, d}, s_conv[3] = {cd, 1, dc}, s_cd[1] = {cd};
    int64_t s_H[1] = {H}, s_di[1] = {di}, s_out[2] = {d, di};
#define G(suffix, nd, shape, kind, scale)                                              \
  do {                                                                                 \
    snprintf(nm, sizeof nm, "backbone.layers.%d.%s", l, suffix);                       \
    if ((rc = gen(&t[k], nm, dtype, nd, shape, kind, scale, seed, k, err))) goto fail; \
    k++;                                                                               \
  } while (0)
    G("norm.weight", 1, s_d, KIND_ONES, 0);
    G("mixer.in_proj.weight", 2, s_in, KIND_UNIFORM, 1.0 / sqrt((double)d));
    G("mixer.conv1d.weight", 3, s_conv, KIND_UNIFORM, 1.0 / sqrt((double)dc));
    if (c->conv_bias) G("mixer.conv1d.bias", 1, s_cd, KIND_UNIFORM, 1.0 / sqrt((double)dc));
    G("mixer.dt_bias", 1, s_H, KIND_DTBIAS, 0);
    G("mixer.A_log", 1, s_H, KIND_ALOG, 0);
    G("mixer.D", 1, s_H, KIND_ONES, 0);
    G("mixer.norm.weight", 1, s_di, KIND_ONES, 0);
    G("mixer.out_proj.weight", 2, s_out, KIND_UNIFORM,
      1.0 / sqrt((double)di) / sqrt((double)c->n_layer));
#undef G
  }
  int64_t s_d[1] = {d};
  if ((rc = gen(&t[k], "backbone.norm_f.weight", dtype, 1, s_d, KIND_ONES, 0, seed, k, err)))
    goto fail;
  k++;
  if ((rc = mbd_st_writer_new(&w, err))) goto fail;
  for (size_t i = 0; i < k; i++)
    if ((rc = mbd_st_writer_add(w, t[i].name, &t[i].desc, t[i].data, err))) goto fail;
  if ((rc = mbd_st_writer_set_metadata(w, "format", "pt", err))) goto fail;
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if ((rc = mbd_st_writer_write(w, path, err))) goto fail;
  rc = write_config(c, dir, err);
fail:
  mbd_st_writer_destroy(&w);
  for (size_t i = 0; i < ntens; i++) free(t[i].data);
  free(t);
  return rc;
}
