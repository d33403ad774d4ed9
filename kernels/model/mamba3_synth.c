/* Synthetic Mamba-3 SISO checkpoint writer (see mamba3_synth.h); the tensors
 * come from kernels/model/synth_tensors.h. */
#include "kernels/model/mamba3_synth.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/model/synth_tensors.h"

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
  int64_t d = c->d_model, di = c->d_inner, N = c->d_state, H = c->heads;
  mbd_synth_tensors ts, *T = &ts;
  int rc = mbd_synth_tensors_init(T, 2 + (size_t)c->n_layer * 9, dtype, seed, err);
  if (rc) return rc;
  char path[4096];
  int64_t s_emb[2] = {c->vocab_padded, d}, s_d[1] = {d};
  mbd_synth_tensors_add(T, "backbone.embedding.weight", 2, s_emb, MBD_SYNTH_UNIFORM,
                        0.02 * sqrt(3.0));
  for (int l = 0; l < c->n_layer; l++) {
    int64_t s_in[2] = {c->d_in_proj, d}, s_h[1] = {H}, s_bias[3] = {H, 1, N}, s_n[1] = {N};
    int64_t s_out[2] = {d, di};
    mbd_synth_tensors_add_layer(T, l, "norm.weight", 1, s_d, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.in_proj.weight", 2, s_in, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)d));
    mbd_synth_tensors_add_layer(T, l, "mixer.dt_bias", 1, s_h, MBD_SYNTH_DTBIAS, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.B_bias", 3, s_bias, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.C_bias", 3, s_bias, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.B_norm.weight", 1, s_n, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.C_norm.weight", 1, s_n, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.D", 1, s_h, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.out_proj.weight", 2, s_out, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)di) / sqrt((double)c->n_layer));
  }
  mbd_synth_tensors_add(T, "backbone.norm_f.weight", 1, s_d, MBD_SYNTH_ONES, 0);
  rc = mbd_synth_tensors_write(T, dir, NULL);
  snprintf(path, sizeof(path), "%s/config.json", dir);
  if (!rc) rc = write_config(c, path, err);
  mbd_synth_tensors_free(T);
  return rc;
}
