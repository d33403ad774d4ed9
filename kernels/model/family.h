/* Model families: which architecture a checkpoint holds (from its
 * config.json) and the CPU implementation of each, behind one vtable, so the
 * backends (kernels/backend.h) load any family without naming it and the
 * worker never does. The CUDA implementations have their own table
 * (kernels/cuda/gpu_family.h) under the same family names.
 *
 * Adding a family (Mamba-2, Mamba-3): its model file in kernels/model with an
 * mbd_cpu_model_ops, a row in family.c's table, and its GPU model in
 * kernels/cuda with a row in gpu_family.c. */
#ifndef MBD_KERNELS_FAMILY_H
#define MBD_KERNELS_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"

/* Which logits a prefill returns (every family, every backend). */
typedef enum mbd_logits_sel {
  MBD_LOGITS_NONE = 0, /* only advance the states */
  MBD_LOGITS_LAST = 1, /* [batch, V]: each sequence's last token */
  MBD_LOGITS_ALL = 2,  /* [sum(lens), V]: sequence b's rows follow b-1's */
} mbd_logits_sel;

/* What the CPU backend asks of a model it loads. */
typedef struct mbd_cpu_model_opts {
  mbd_dtype dtype; /* weight storage: f32, bf16 or f16 */
  int threads;     /* <= 0: one per online CPU */
  int isa;         /* mbd_cpu_isa; 0 = best available */
  const mbd_progress_opts *progress; /* loading progress (mbd_st_dir_set_progress); NULL: silent */
} mbd_cpu_model_opts;

/* A family on the CPU: a model and its per-sequence states, opaque. The
 * contract is the backend's (kernels/backend.h): batch-invariant bits. */
typedef struct mbd_cpu_model_ops {
  int (*load)(const char *dir, const mbd_cpu_model_opts *o, void **model, mbd_error *err);
  void (*destroy)(void *model); /* NULL-safe */
  int64_t (*vocab)(const void *model);
  const char *(*isa)(const void *model); /* ISA level the model runs ("x86-64-v3") */
  int (*state_new)(const void *model, void **state, mbd_error *err); /* zeroed */
  void (*state_free)(void *state); /* NULL-safe */
  /* The state image (kernels/state_blob.h): size, save, load (refuses a
   * foreign image: MBD_E_FORMAT / MBD_E_SHAPE, state unchanged). */
  size_t (*state_bytes)(const void *state);
  int (*state_save)(const void *state, void *dst, size_t cap, mbd_error *err);
  int (*state_load)(void *state, const void *src, size_t len, mbd_error *err);
  /* Feeds lens[b] tokens[b][..] to states[b] (distinct), b < n; logits as sel. */
  int (*prefill)(void *model, void *const *states, int n, const int32_t *const *tokens,
                 const int64_t *lens, mbd_logits_sel sel, float *logits, mbd_error *err);
  /* One token per state: logits [n, V] (may be NULL). */
  int (*step)(void *model, void *const *states, int n, const int32_t *tokens, float *logits,
              mbd_error *err);
} mbd_cpu_model_ops;

/* One row of the family table. */
typedef struct mbd_model_family {
  const char *name;          /* "mamba1": the key of the per-backend tables */
  const char *model_type;    /* config.json "model_type" it serves ("mamba") */
  const char *legacy_layer;  /* state-spaces configs (no model_type): ssm_cfg.layer */
  const mbd_cpu_model_ops *cpu; /* the CPU implementation, or NULL */
} mbd_model_family;

/* The family of the checkpoint in DIR, from config.json's model_type (or, in
 * a state-spaces config without one, ssm_cfg.layer; absent means Mamba-1).
 * A model_type or layer that no family serves is MBD_E_UNSUPPORTED naming it
 * and the families of this build. A config.json that cannot be read or is not
 * a JSON object gives the Mamba-1 family, whose loader then says exactly what
 * is wrong with it. */
int mbd_model_family_detect(const char *dir, const mbd_model_family **out, mbd_error *err);
/* The family named `name` ("mamba1"), or NULL. */
const mbd_model_family *mbd_model_family_find(const char *name);

#endif
