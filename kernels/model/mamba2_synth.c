/* Synthetic Mamba-2 checkpoints (see mamba2.h): seeded random weights in the
 * Hugging Face Mamba2ForCausalLM layout, initialised like that class (A_log
 * = log of uniform [1, 16] per head, D = 1, dt_bias = softplus^-1 of dt
 * log-uniform in [1e-3, 1e-1], uniform fan-in projections, unit norms). The
 * tensors come from kernels/model/synth_tensors.h. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/model/mamba2.h"
#include "kernels/model/synth_tensors.h"

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
  if (c->d_model < 1 || c->n_layer < 1 || c->vocab_size < 1 || c->d_state < 1 ||
      c->d_conv < 1 || c->n_heads < 1 || c->head_dim < 1 || c->n_groups < 1 ||
      c->n_heads * c->head_dim != c->d_inner || c->n_heads % c->n_groups)
    return mbd_error_set(err, MBD_E_INVALID, "synth: inconsistent mamba2 sizes");
  int64_t d = c->d_model, di = c->d_inner, H = c->n_heads, dc = c->d_conv;
  int64_t cd = di + 2 * (int64_t)c->n_groups * c->d_state, pin = di + cd + H;
  mbd_synth_tensors ts, *T = &ts;
  int rc = mbd_synth_tensors_init(T, 2 + (size_t)c->n_layer * 12, dtype, seed, err);
  if (rc) return rc;
  int64_t s_emb[2] = {c->vocab_size, d}, s_d[1] = {d};
  mbd_synth_tensors_add(T, "backbone.embeddings.weight", 2, s_emb, MBD_SYNTH_UNIFORM,
                        0.02 * sqrt(3.0));
  for (int l = 0; l < c->n_layer; l++) {
    int64_t s_in[2] = {pin, d}, s_conv[3] = {cd, 1, dc}, s_cd[1] = {cd};
    int64_t s_H[1] = {H}, s_di[1] = {di}, s_out[2] = {d, di};
    mbd_synth_tensors_add_layer(T, l, "norm.weight", 1, s_d, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.in_proj.weight", 2, s_in, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)d));
    mbd_synth_tensors_add_layer(T, l, "mixer.conv1d.weight", 3, s_conv, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)dc));
    if (c->conv_bias)
      mbd_synth_tensors_add_layer(T, l, "mixer.conv1d.bias", 1, s_cd, MBD_SYNTH_UNIFORM,
                                  1.0 / sqrt((double)dc));
    mbd_synth_tensors_add_layer(T, l, "mixer.dt_bias", 1, s_H, MBD_SYNTH_DTBIAS, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.A_log", 1, s_H, MBD_SYNTH_ALOG_U16, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.D", 1, s_H, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.norm.weight", 1, s_di, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.out_proj.weight", 2, s_out, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)di) / sqrt((double)c->n_layer));
  }
  mbd_synth_tensors_add(T, "backbone.norm_f.weight", 1, s_d, MBD_SYNTH_ONES, 0);
  rc = mbd_synth_tensors_write(T, dir, NULL);
  if (!rc) rc = write_config(c, dir, err);
  mbd_synth_tensors_free(T);
  return rc;
}
