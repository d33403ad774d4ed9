/* The tensors of a synthetic checkpoint, for the per-family writers
 * (synth.c, mamba2_synth.c, mamba3_synth.c): seeded random values, each
 * tensor from its own splitmix64 stream keyed by (seed, its index in the
 * checkpoint), so a tensor's values do not depend on the other tensors'
 * sizes; stored rounded to the checkpoint's dtype and written as one
 * model.safetensors. Adding is sticky on error: after a failure the later
 * adds do nothing and the writer returns the first error, so a family lists
 * its tensors without a check per line. */
#ifndef MBD_KERNELS_MODEL_SYNTH_TENSORS_H
#define MBD_KERNELS_MODEL_SYNTH_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"

/* How a tensor's values are drawn. */
typedef enum mbd_synth_kind {
  MBD_SYNTH_UNIFORM, /* uniform in [-scale, scale) */
  MBD_SYNTH_ONES,    /* 1 */
  MBD_SYNTH_ALOG_COL,/* log(column + 1): Mamba-1's A_log = log(1..S) per row */
  MBD_SYNTH_ALOG_U16,/* log of uniform [1, 16): Mamba-2's per-head A_log */
  MBD_SYNTH_DTBIAS,  /* softplus^-1 of dt log-uniform in [1e-3, 1e-1], dt >= 1e-4 */
} mbd_synth_kind;

typedef struct mbd_synth_tensor {
  char name[128];
  mbd_tensor_desc desc;
  void *data; /* desc's bytes */
} mbd_synth_tensor;

typedef struct mbd_synth_tensors {
  mbd_dtype dtype;      /* storage dtype of every tensor */
  uint64_t seed;        /* the checkpoint's seed */
  mbd_synth_tensor *t;  /* [cap] */
  size_t n, cap;        /* tensors added, room */
  mbd_progress *pr;     /* when not NULL, each added tensor is reported */
  int rc;               /* first error (MBD_OK while none) */
  mbd_error *err;       /* where that error is described */
} mbd_synth_tensors;

/* Room for cap tensors of dtype (f32, bf16 or f16: else MBD_E_INVALID). */
int mbd_synth_tensors_init(mbd_synth_tensors *s, size_t cap, mbd_dtype dtype, uint64_t seed,
                           mbd_error *err);
/* Frees the tensors (s itself is the caller's). */
void mbd_synth_tensors_free(mbd_synth_tensors *s);

/* Generates the tensor `name` and appends it; returns s->rc. */
int mbd_synth_tensors_add(mbd_synth_tensors *s, const char *name, int ndim, const int64_t *shape,
                          mbd_synth_kind kind, double scale);
/* The same for "backbone.layers.<layer>.<suffix>". */
int mbd_synth_tensors_add_layer(mbd_synth_tensors *s, int layer, const char *suffix, int ndim,
                                const int64_t *shape, mbd_synth_kind kind, double scale);

/* Writes dir/model.safetensors (metadata format "pt"), reporting through
 * progress (NULL: silent); returns the first error of the adds, if any. */
int mbd_synth_tensors_write(mbd_synth_tensors *s, const char *dir,
                            const mbd_progress_opts *progress);

#endif
