/* Hugging Face config.json for `model_type: mamba` (Mamba-1). */
#ifndef MBD_MAMBA_CONFIG_H
#define MBD_MAMBA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef struct mbd_mamba_config {
  int d_model;            /* hidden_size */
  int n_layer;            /* num_hidden_layers */
  int vocab_size;         /* rows of backbone.embeddings.weight */
  int d_state;            /* state_size */
  int d_conv;             /* conv_kernel */
  int expand;             /* expand */
  int d_inner;            /* intermediate_size (default expand * d_model) */
  int dt_rank;            /* time_step_rank ("auto" = ceil(d_model / 16)) */
  float norm_eps;         /* layer_norm_epsilon */
  bool conv_bias;         /* use_conv_bias */
  bool proj_bias;         /* use_bias (in_proj / out_proj bias) */
  bool residual_in_fp32;  /* residual_in_fp32 */
  bool tie_embeddings;    /* tie_word_embeddings */
  int eos_token_id;       /* -1 when absent */
} mbd_mamba_config;

/* Reads DIR/config.json (path may also name the file itself). Rejects other
 * model_types, missing or non-positive sizes, with the field named. */
int mbd_mamba_config_load(const char *path, mbd_mamba_config *out, mbd_error *err);
/* Same from a JSON text of `len` bytes; `label` names it in errors. */
int mbd_mamba_config_parse(const char *json, size_t len, const char *label, mbd_mamba_config *out,
                           mbd_error *err);
/* Writes a Hugging Face compatible config.json for cfg into path. */
int mbd_mamba_config_write(const mbd_mamba_config *cfg, const char *path, mbd_error *err);

#endif
