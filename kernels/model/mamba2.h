/* Mamba-2 language model (Hugging Face `Mamba2ForCausalLM`, model_type
 * "mamba2"): config, weights, per-sequence recurrent state, prefill and step.
 *
 * The CPU model of the Mamba-2 family (behind the backends through
 * kernels/model/family.h). A layer: RMSNorm, in_proj to (z, xBC, dt), causal
 * depthwise conv + SiLU over xBC = (x, B, C), per-head step size
 * softplus(dt + dt_bias) clamped to time_step_limit, the recurrence with a
 * scalar A per head and B/C shared by the heads of a group
 * (kernels/cpu/ssd_step.h), D skip, gated RMSNorm per group of d_inner /
 * n_groups channels (mamba_ssm's semantics, kernels/cpu/gated_rmsnorm.h),
 * out_proj, residual. norm_f then the LM head (tied to the embedding unless
 * the config unties it and lm_head.weight is stored).
 *
 * Determinism contract (docs/route.md, "Mamba-2"): a sequence's logits and
 * state are bit-identical whether it runs alone or in any slot of a batch,
 * and whether its tokens come in one prefill, several prefills of any
 * lengths or one step at a time: the prefill is the step recurrence applied
 * token by token. A model is not reentrant: one call at a time. */
#ifndef MBD_MAMBA2_H
#define MBD_MAMBA2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/model/family.h"
#include "kernels/state_blob.h"

/* config.json of model_type "mamba2" (keys as transformers' Mamba2Config;
 * absent keys take that class's defaults). */
typedef struct mbd_mamba2_config {
  int d_model;          /* hidden_size */
  int n_layer;          /* num_hidden_layers */
  int vocab_size;       /* vocab_size (the model uses the embedding's rows) */
  int d_state;          /* state_size */
  int d_conv;           /* conv_kernel */
  int expand;           /* expand */
  int d_inner;          /* expand * hidden_size = num_heads * head_dim */
  int n_heads;          /* num_heads */
  int head_dim;         /* head_dim */
  int n_groups;         /* n_groups */
  int chunk_size;       /* chunk_size (tiles the scan; does not change bits) */
  float norm_eps;       /* layer_norm_epsilon */
  float dt_min, dt_max; /* time_step_limit */
  bool conv_bias;       /* use_conv_bias */
  bool proj_bias;       /* use_bias (in_proj / out_proj bias) */
  bool norm_before_gate;/* norm_before_gate (absent: false, as transformers) */
  bool tie_embeddings;  /* tie_word_embeddings */
  int eos_token_id;     /* -1 when absent */
} mbd_mamba2_config;

/* Reads DIR/config.json (or the file itself). MBD_E_FORMAT naming the field
 * for a wrong type, a non-positive size, num_heads * head_dim != expand *
 * hidden_size, num_heads not a multiple of n_groups, or an activation other
 * than silu; another model_type is MBD_E_UNSUPPORTED. */
int mbd_mamba2_config_load(const char *path, mbd_mamba2_config *out, mbd_error *err);
/* Same from a JSON text of `len` bytes; `label` names it in errors. */
int mbd_mamba2_config_parse(const char *json, size_t len, const char *label,
                            mbd_mamba2_config *out, mbd_error *err);

typedef struct mbd_mamba2_model mbd_mamba2_model;
typedef struct mbd_mamba2_state mbd_mamba2_state;

typedef struct mbd_mamba2_options {
  mbd_dtype dtype; /* weight storage: f32, bf16 or f16 (activations f32) */
  int threads;     /* CPU threads; <= 0 = one per online CPU */
  int isa;         /* mbd_cpu_isa; 0 = best available */
  int max_rows;    /* token rows per internal chunk (workspace); 0 = 256 */
  const mbd_progress_opts *progress; /* loading progress; NULL (default): silent */
} mbd_mamba2_options;

/* Fills defaults: f32, all threads, best ISA, 256 rows. */
void mbd_mamba2_options_default(mbd_mamba2_options *o);

/* Loads DIR/config.json and DIR/model.safetensors (or the shards of
 * DIR/model.safetensors.index.json), converting weights to opts->dtype.
 * Errors name the file and tensor. */
int mbd_mamba2_load(const char *dir, const mbd_mamba2_options *opts, mbd_mamba2_model **out,
                    mbd_error *err);
void mbd_mamba2_destroy(mbd_mamba2_model **m);

const mbd_mamba2_config *mbd_mamba2_model_config(const mbd_mamba2_model *m);
int mbd_mamba2_vocab(const mbd_mamba2_model *m);
mbd_dtype mbd_mamba2_dtype(const mbd_mamba2_model *m);
const char *mbd_mamba2_isa(const mbd_mamba2_model *m);
size_t mbd_mamba2_weight_bytes(const mbd_mamba2_model *m);

/* ---- recurrent state ---- */

int mbd_mamba2_state_new(const mbd_mamba2_model *m, mbd_mamba2_state **out, mbd_error *err);
void mbd_mamba2_state_destroy(mbd_mamba2_state **s);
void mbd_mamba2_state_reset(mbd_mamba2_state *s);
int64_t mbd_mamba2_state_position(const mbd_mamba2_state *s);

/* The state image (kernels/state_blob.h): header with family
 * MBD_STATE_FAMILY_MAMBA2 and shape n_layer / d_inner / d_conv / d_state,
 * then the payload: u32 n_heads, u32 head_dim, u32 n_groups, u32 0, f32
 * conv[n_layer][d_conv-1][conv_dim] (conv_dim = d_inner + 2 n_groups
 * d_state, channels x then B then C), f32 ssm[n_layer][n_heads][head_dim]
 * [d_state]. */
size_t mbd_mamba2_state_export_size(const mbd_mamba2_state *s);
int mbd_mamba2_state_export(const mbd_mamba2_state *s, void *buf, size_t cap, size_t *len,
                            mbd_error *err);
/* MBD_E_FORMAT / MBD_E_SHAPE on a bad or foreign image (s unchanged then). */
int mbd_mamba2_state_import(mbd_mamba2_state *s, const void *buf, size_t len, mbd_error *err);
/* The image header shape of a Mamba-2 state of config cfg. */
mbd_state_shape mbd_mamba2_state_shape(const mbd_mamba2_config *cfg);

/* ---- forward (selectors as mbd_logits_sel) ---- */

/* Feeds lens[b] tokens tokens[b][..] to states[b] (distinct), b < batch.
 * LAST: logits [batch, V] (a row with lens[b] == 0 is left untouched); ALL:
 * [sum(lens), V], sequence b's rows after b-1's. Token ids outside [0, V)
 * are MBD_E_INVALID and nothing changes. */
int mbd_mamba2_prefill(mbd_mamba2_model *m, mbd_mamba2_state *const *states, int batch,
                       const int32_t *const *tokens, const int64_t *lens, mbd_logits_sel which,
                       float *logits, mbd_error *err);
/* One token per sequence: logits [batch, V] (may be NULL). */
int mbd_mamba2_step(mbd_mamba2_model *m, mbd_mamba2_state *const *states, int batch,
                    const int32_t *tokens, float *logits, mbd_error *err);

/* ---- synthetic checkpoints (kernels/model/mamba2_synth.c) ---- */

/* cfg for a published Mamba-2 shape: "130m" (d768 L24), "370m" (d1024 L48),
 * "780m" (d1536 L48), "1.3b" (d2048 L48), "2.7b" (d2560 L64); vocab 50288,
 * d_state 128, head_dim 64, expand 2, one group, conv 4, tied head.
 * MBD_E_INVALID names the valid shapes. */
int mbd_mamba2_synth_shape(const char *name, mbd_mamba2_config *cfg, mbd_error *err);
/* cfg for custom sizes with the same defaults (head_dim 64 when 2 d_model
 * is a multiple of 64, else one head). */
void mbd_mamba2_synth_custom(int d_model, int n_layer, int vocab, mbd_mamba2_config *cfg);
/* Writes dir/config.json and dir/model.safetensors (dir must exist) in the
 * Hugging Face Mamba2ForCausalLM layout, tensors stored in dtype. */
int mbd_mamba2_synth_write(const mbd_mamba2_config *cfg, mbd_dtype dtype, uint64_t seed,
                           const char *dir, mbd_error *err);

/* The Mamba-2 family on the CPU backend. */
extern const mbd_cpu_model_ops mbd_mamba2_cpu_ops;

#endif
