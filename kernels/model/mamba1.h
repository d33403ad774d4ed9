/* Mamba-1 language model (Hugging Face `MambaForCausalLM`, slow_forward
 * semantics): weights, per-sequence recurrent state, prefill and step.
 *
 * The CPU model of the Mamba-1 family (the GPU one is kernels/cuda/
 * mamba1_gpu.h; both sit behind the backends through kernels/model/family.h):
 * a model is loaded in one storage dtype; the state object is the recurrent
 * state of one sequence (conv window + SSM state per layer, f32) and exports
 * to the family's state image, which imports on any model (CPU or GPU) with
 * the same shapes.
 *
 * Determinism contract (deterministic GEMM route): a sequence's logits and
 * state are bit-identical whether it runs alone or in any slot of a batch of
 * any size, and whether its tokens come in one prefill, several prefills or
 * one step at a time. A model is not reentrant: one call at a time. */
#ifndef MBD_MAMBA1_H
#define MBD_MAMBA1_H

#include <stddef.h>
#include <stdint.h>

#include "common/mamba_config.h"
#include "common/route.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/model/family.h"
#include "kernels/state_blob.h"

typedef struct mbd_mamba1_model mbd_mamba1_model;
typedef struct mbd_mamba1_state mbd_mamba1_state;

typedef struct mbd_mamba1_options {
  mbd_backend_kind backend; /* MBD_BACKEND_CPU (CUDA: MBD_E_UNSUPPORTED for now) */
  mbd_dtype dtype;          /* weight storage: f32, bf16 or f16 (activations f32) */
  int threads;              /* CPU threads; <= 0 = one per online CPU */
  int isa;                  /* mbd_cpu_isa; 0 = best available */
  int max_rows;             /* token rows per internal chunk (workspace); 0 = 256 */
  const mbd_progress_opts *progress; /* loading progress; NULL (default): silent */
} mbd_mamba1_options;

/* Fills defaults: CPU, f32, all threads, best ISA, 256 rows. */
void mbd_mamba1_options_default(mbd_mamba1_options *o);

/* Loads DIR/config.json and DIR/model.safetensors (or the shards listed in
 * DIR/model.safetensors.index.json), converting weights to opts->dtype.
 * Errors name the file and tensor (missing, wrong shape, non-float dtype). */
int mbd_mamba1_load(const char *dir, const mbd_mamba1_options *opts, mbd_mamba1_model **out,
                    mbd_error *err);
void mbd_mamba1_destroy(mbd_mamba1_model **m);

const mbd_mamba_config *mbd_mamba1_model_config(const mbd_mamba1_model *m);
int mbd_mamba1_vocab(const mbd_mamba1_model *m);
/* Route-relevant description: backend, dtype, ISA level ("x86-64-v3"). */
mbd_dtype mbd_mamba1_dtype(const mbd_mamba1_model *m);
const char *mbd_mamba1_isa(const mbd_mamba1_model *m);
/* Bytes of weights held (after conversion). */
size_t mbd_mamba1_weight_bytes(const mbd_mamba1_model *m);

/* ---- recurrent state ---- */

/* A zeroed state (start of a sequence) shaped for m. */
int mbd_mamba1_state_new(const mbd_mamba1_model *m, mbd_mamba1_state **out, mbd_error *err);
void mbd_mamba1_state_destroy(mbd_mamba1_state **s);
void mbd_mamba1_state_reset(mbd_mamba1_state *s);
/* Tokens consumed since the last reset/import. */
int64_t mbd_mamba1_state_position(const mbd_mamba1_state *s);

/* Export: a state image (kernels/state_blob.h: "MBDMSTA1" header, family
 * MBD_STATE_FAMILY_MAMBA1, shape n_layer / d_inner / d_conv / d_state) whose
 * payload is f32 conv[n_layer][d_conv-1][d_inner] then f32
 * ssm[n_layer][d_inner][d_state]. The GPU model writes the same image. */
size_t mbd_mamba1_state_export_size(const mbd_mamba1_state *s);
/* Writes the export into buf (cap >= export size); MBD_E_TOO_LARGE otherwise. */
int mbd_mamba1_state_export(const mbd_mamba1_state *s, void *buf, size_t cap, size_t *len,
                            mbd_error *err);
/* Replaces s with an export; MBD_E_FORMAT / MBD_E_SHAPE on a bad or foreign
 * blob (s unchanged then). */
int mbd_mamba1_state_import(mbd_mamba1_state *s, const void *buf, size_t len, mbd_error *err);

/* The image shape of a Mamba-1 state of config cfg (for every backend). */
mbd_state_shape mbd_mamba1_state_shape(const mbd_mamba_config *cfg);

/* ---- forward ---- */

typedef enum mbd_mamba1_logits {
  MBD_MAMBA1_LOGITS_NONE = 0, /* only advance the states */
  MBD_MAMBA1_LOGITS_LAST = 1, /* logits [batch, V] for each sequence's last token */
  MBD_MAMBA1_LOGITS_ALL = 2,  /* logits [sum(lens), V]: sequence b's rows follow b-1's
                                 ([B,T,V] when all lengths are T) */
} mbd_mamba1_logits;

/* Feeds lens[b] tokens tokens[b][0..lens[b]) to sequence b (states[b], distinct),
 * b < batch, continuing from each state. lens[b] may be 0 (then with LAST the
 * row is left untouched). Token ids outside [0, vocab) are MBD_E_INVALID and
 * nothing is changed. */
int mbd_mamba1_prefill(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                       const int32_t *const *tokens, const int64_t *lens,
                       mbd_mamba1_logits which, float *logits, mbd_error *err);

/* One token per sequence: logits [batch, V] (may be NULL). Same arithmetic as
 * prefill. */
int mbd_mamba1_step(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                    const int32_t *tokens, float *logits, mbd_error *err);

/* The Mamba-1 family on the CPU backend (kernels/model/family.h): the
 * functions above behind the family vtable. */
extern const mbd_cpu_model_ops mbd_mamba1_cpu_ops;

#endif
