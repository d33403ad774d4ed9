/* Synthetic Mamba-1 checkpoint writer (see synth.h); the tensors come from
 * kernels/model/synth_tensors.h. */
#include "kernels/model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/model/synth_tensors.h"

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

int mbd_synth_write(const mbd_mamba_config *cfg, mbd_dtype dtype, uint64_t seed, const char *dir,
                    mbd_error *err) {
  return mbd_synth_write_progress(cfg, dtype, seed, dir, NULL, err);
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
  if (cfg->d_model < 1 || cfg->n_layer < 1 || cfg->vocab_size < 1 || cfg->d_state < 1 ||
      cfg->d_conv < 1 || cfg->d_inner < 1 || cfg->dt_rank < 1)
    return mbd_error_set(err, MBD_E_INVALID, "synth: all model sizes must be positive");
  int64_t d = cfg->d_model, di = cfg->d_inner, S = cfg->d_state, R = cfg->dt_rank;
  int64_t V = cfg->vocab_size, dc = cfg->d_conv;
  mbd_synth_tensors ts, *T = &ts;
  int rc = mbd_synth_tensors_init(T, 2 + (size_t)cfg->n_layer * 12, dtype, seed, err);
  if (rc) return rc;
  mbd_progress pr;
  char path[4096], what[4096 + 16];
  snprintf(what, sizeof what, "synthesising %s", dir);
  mbd_progress_begin(&pr, progress, what, "tensors", synth_bytes(cfg, dtype),
                     2 + (uint64_t)cfg->n_layer * (cfg->conv_bias ? 10 : 9));
  ts.pr = &pr;
  int64_t s_emb[2] = {V, d}, s_d[1] = {d};
  mbd_synth_tensors_add(T, "backbone.embeddings.weight", 2, s_emb, MBD_SYNTH_UNIFORM,
                        0.02 * sqrt(3.0));
  for (int l = 0; l < cfg->n_layer; l++) {
    int64_t s_in[2] = {2 * di, d}, s_conv[3] = {di, 1, dc}, s_di[1] = {di};
    int64_t s_x[2] = {R + 2 * S, di}, s_dt[2] = {di, R}, s_A[2] = {di, S}, s_out[2] = {d, di};
    mbd_synth_tensors_add_layer(T, l, "norm.weight", 1, s_d, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.in_proj.weight", 2, s_in, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)d));
    mbd_synth_tensors_add_layer(T, l, "mixer.conv1d.weight", 3, s_conv, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)dc));
    if (cfg->conv_bias)
      mbd_synth_tensors_add_layer(T, l, "mixer.conv1d.bias", 1, s_di, MBD_SYNTH_UNIFORM,
                                  1.0 / sqrt((double)dc));
    mbd_synth_tensors_add_layer(T, l, "mixer.x_proj.weight", 2, s_x, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)di));
    mbd_synth_tensors_add_layer(T, l, "mixer.dt_proj.weight", 2, s_dt, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)R));
    mbd_synth_tensors_add_layer(T, l, "mixer.dt_proj.bias", 1, s_di, MBD_SYNTH_DTBIAS, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.A_log", 2, s_A, MBD_SYNTH_ALOG_COL, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.D", 1, s_di, MBD_SYNTH_ONES, 0);
    mbd_synth_tensors_add_layer(T, l, "mixer.out_proj.weight", 2, s_out, MBD_SYNTH_UNIFORM,
                                1.0 / sqrt((double)di) / sqrt((double)cfg->n_layer));
  }
  mbd_synth_tensors_add(T, "backbone.norm_f.weight", 1, s_d, MBD_SYNTH_ONES, 0);
  mbd_progress_end(&pr);
  rc = mbd_synth_tensors_write(T, dir, progress);
  snprintf(path, sizeof(path), "%s/config.json", dir);
  if (!rc) rc = mbd_mamba_config_write(cfg, path, err);
  mbd_progress_end(&pr);
  mbd_synth_tensors_free(T);
  return rc;
}
