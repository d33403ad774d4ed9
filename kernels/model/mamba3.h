/* Mamba-3 SISO language model (state-spaces/mamba `MambaLMHeadModel` with
 * ssm_cfg.layer "Mamba3", is_mimo false): weights, per-sequence recurrent
 * state, prefill and step, on the CPU backend.
 *
 * Checkpoint: DIR/config.json (mamba_ssm's MambaConfig fields; ssm_cfg keys
 * absent take Mamba3's defaults) and DIR/model.safetensors (or shards) with
 * mamba_ssm's key names; the layout is ../shared/fixtures/mamba3/README.md's.
 * The vocabulary is the embedding's padded row count.
 *
 * Per layer and token: in_proj gives z, x, B, C, dd_dt, dd_A, trap and the
 * rotary angle projection; B and C are RMS-normed, biased per head and rotated
 * by the head's cumulative data-dependent angle; the state takes the
 * trapezoidal update h = alpha h + beta k_prev v_prev^T + gamma k v^T; y = h q
 * + D x, gated by silu(z) (or by the out-proj gated norm), then out_proj.
 * The exact operation order is kernels/cpu/mamba3_ops.h's; docs/route.md
 * ("Mamba-3 SISO") states the contract.
 *
 * Determinism contract: a sequence's logits and state are bit-identical
 * whether it runs alone or in any slot of a batch of any size, and whether its
 * tokens come in one prefill, several prefills or one step at a time. A model
 * is not reentrant: one call at a time. */
#ifndef MBD_MAMBA3_H
#define MBD_MAMBA3_H

#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/model/family.h"
#include "kernels/state_blob.h"

typedef struct mbd_mamba3_config {
  int d_model, n_layer;
  int vocab_size;     /* config's vocab_size */
  int vocab_padded;   /* embedding rows: vocab_size rounded up to pad_vocab_size_multiple */
  int d_state, headdim, ngroups, heads, angles; /* angles: rotary pairs S */
  int64_t d_inner;    /* expand * d_model = heads * headdim */
  int64_t d_in_proj;  /* 2 d_inner + 2 ngroups d_state + 3 heads + angles */
  float rope_fraction, a_floor, eps;
  int outproj_norm;   /* is_outproj_norm */
  int tie_embeddings;
} mbd_mamba3_config;

/* Reads DIR/config.json; MBD_E_FORMAT / MBD_E_UNSUPPORTED naming the field
 * (MIMO, an MLP, attention layers, LayerNorm are refused). */
int mbd_mamba3_config_load(const char *dir, mbd_mamba3_config *out, mbd_error *err);
/* The same from len bytes of JSON text (label names it in errors). */
int mbd_mamba3_config_parse(const char *json, size_t len, const char *label,
                            mbd_mamba3_config *out, mbd_error *err);

typedef struct mbd_mamba3_model mbd_mamba3_model;
typedef struct mbd_mamba3_state mbd_mamba3_state;

typedef struct mbd_mamba3_options {
  mbd_dtype dtype; /* weight storage: f32, bf16 or f16 (activations f32) */
  int threads;     /* CPU threads; <= 0 = one per online CPU */
  int isa;         /* mbd_cpu_isa; 0 = best available */
  int max_rows;    /* token rows per internal chunk (workspace); 0 = 256 */
  const mbd_progress_opts *progress; /* loading progress; NULL (default): silent */
} mbd_mamba3_options;

void mbd_mamba3_options_default(mbd_mamba3_options *o);

/* Loads the checkpoint in DIR, GEMM weights and norms converted to
 * opts->dtype (dt_bias, B/C biases and D stay f32, as upstream keeps them). */
int mbd_mamba3_load(const char *dir, const mbd_mamba3_options *opts, mbd_mamba3_model **out,
                    mbd_error *err);
void mbd_mamba3_destroy(mbd_mamba3_model **m);

const mbd_mamba3_config *mbd_mamba3_model_config(const mbd_mamba3_model *m);
int mbd_mamba3_vocab(const mbd_mamba3_model *m); /* padded: the LM head's rows */
mbd_dtype mbd_mamba3_dtype(const mbd_mamba3_model *m);
const char *mbd_mamba3_isa(const mbd_mamba3_model *m);
/* Bytes of weights held (after conversion). */
size_t mbd_mamba3_weight_bytes(const mbd_mamba3_model *m);

/* ---- recurrent state ---- */

int mbd_mamba3_state_new(const mbd_mamba3_model *m, mbd_mamba3_state **out, mbd_error *err);
void mbd_mamba3_state_destroy(mbd_mamba3_state **s);
void mbd_mamba3_state_reset(mbd_mamba3_state *s);
int64_t mbd_mamba3_state_position(const mbd_mamba3_state *s);

/* State image (kernels/state_blob.h): family MBD_STATE_FAMILY_MAMBA3, shape
 * n_layer / d_inner / d_conv := heads / d_state; payload f32
 * angle[n_layer][heads][S], ssm[n_layer][heads][headdim][d_state],
 * k[n_layer][heads][d_state], v[n_layer][heads][headdim] (S follows from the
 * payload size, which import checks). */
size_t mbd_mamba3_state_export_size(const mbd_mamba3_state *s);
int mbd_mamba3_state_export(const mbd_mamba3_state *s, void *buf, size_t cap, size_t *len,
                            mbd_error *err);
int mbd_mamba3_state_import(mbd_mamba3_state *s, const void *buf, size_t len, mbd_error *err);
/* The image shape of a Mamba-3 state of config cfg (for every backend). */
mbd_state_shape mbd_mamba3_state_shape(const mbd_mamba3_config *cfg);

/* ---- forward ---- */

/* Feeds lens[b] tokens tokens[b][..] to states[b] (distinct), b < batch;
 * logits as sel (kernels/model/family.h). Token ids outside [0, vocab) are
 * MBD_E_INVALID and nothing changes. */
int mbd_mamba3_prefill(mbd_mamba3_model *m, mbd_mamba3_state *const *states, int batch,
                       const int32_t *const *tokens, const int64_t *lens, mbd_logits_sel sel,
                       float *logits, mbd_error *err);
/* One token per sequence: logits [batch, V] (may be NULL). */
int mbd_mamba3_step(mbd_mamba3_model *m, mbd_mamba3_state *const *states, int batch,
                    const int32_t *tokens, float *logits, mbd_error *err);

/* The Mamba-3 family on the CPU backend (kernels/model/family.h). */
extern const mbd_cpu_model_ops mbd_mamba3_cpu_ops;

#endif
