/* The trunk of a CPU Mamba model: what every family has around its mixer
 * layers. The thread context, the token embedding, the final norm and the
 * LM head (tied to the embedding unless the checkpoint unties it), the
 * residual stream's workspace rows and the per-call batch buffers. Each
 * family embeds one, loads its layers beside it, and drives prefill and step
 * through it (kernels/model/rows.h). */
#ifndef MBD_KERNELS_MODEL_TRUNK_H
#define MBD_KERNELS_MODEL_TRUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/rows.h"

typedef struct mbd_trunk {
  mbd_dtype dtype;        /* weight storage: f32, bf16 or f16 */
  mbd_cpu_ctx *ctx;       /* threads and ISA */
  int64_t d;              /* model width */
  int64_t V;              /* embedding rows (the vocabulary the model takes) */
  mbd_cpu_wpack *embed;   /* [V, d], also the LM head when tied */
  mbd_cpu_wpack *lm_head; /* [V, d] when untied, else NULL */
  float *norm_f;          /* [d] */
  size_t weight_bytes;    /* storage of every weight loaded through the trunk's dtype */
  int64_t max_rows;       /* token rows per chunk */
  float *resid;           /* [max_rows, d] residual stream */
  float *xn;              /* [max_rows, d] normed rows */
  float *out;             /* [max_rows, d] a layer's output projection */
  mbd_rows_batch batch;   /* per-call buffers */
  mbd_rows_model rows;    /* the model as the prefill driver sees it (mbd_trunk_bind) */
} mbd_trunk;

/* Checks dtype (MBD_E_INVALID naming the three), starts the thread context
 * and sets max_rows (<= 0: 256). t must be zeroed. */
int mbd_trunk_init(mbd_trunk *t, mbd_dtype dtype, int threads, int isa, int max_rows, int64_t d,
                   mbd_error *err);
/* Frees what the trunk holds (t itself is the caller's). */
void mbd_trunk_free(mbd_trunk *t);

/* Loads the embedding `name` [V, d]. */
int mbd_trunk_load_embed(mbd_trunk *t, const mbd_st_dir *s, const char *name, int64_t V,
                         mbd_error *err);
/* Loads backbone.norm_f.weight and, unless tied, lm_head.weight: required,
 * or, with head_optional, tied when the checkpoint has none. */
int mbd_trunk_load_tail(mbd_trunk *t, const mbd_st_dir *s, bool tied, bool head_optional,
                        mbd_error *err);

/* A layer weight in the trunk's dtype, its size added to weight_bytes
 * (kernels/model/weights.h): a vector [ndim] as f32, a matrix packed. */
int mbd_trunk_vec(mbd_trunk *t, const mbd_st_dir *s, const char *name, int ndim,
                  const int64_t *shape, float **out, mbd_error *err);
int mbd_trunk_mat(mbd_trunk *t, const mbd_st_dir *s, const char *name, int64_t rows, int64_t cols,
                  mbd_cpu_wpack **out, mbd_error *err);

/* Allocates n zeroed workspaces *bufs[i] of [max_rows, widths[i]] floats;
 * the trunk's own (resid, xn, out) with the first call. */
int mbd_trunk_alloc_rows(mbd_trunk *t, float **const *bufs, const size_t *widths, size_t n,
                         mbd_error *err);
/* Reserves the GEMM scratch for the widest of the n reduction sizes ks, so
 * a forward never allocates. */
int mbd_trunk_reserve(mbd_trunk *t, const int64_t *ks, int n, mbd_error *err);

/* xn[r] = rmsnorm(resid[r]) * w, r < rows. */
void mbd_trunk_norm(mbd_trunk *t, int64_t rows, const float *w, float eps);
/* resid += out over rows rows. */
void mbd_trunk_add_out(mbd_trunk *t, int64_t rows);

/* Sets t->rows for model and its callbacks, once its weights and rows are
 * in place; then a family's prefill and step are mbd_rows_prefill(&t->rows)
 * and mbd_rows_step(&t->rows). */
void mbd_trunk_bind(mbd_trunk *t, void *model, int (*state_fits)(const void *, const void *),
                    void (*advance)(void *, int64_t),
                    int (*forward)(void *, void *const *, const int64_t *, int64_t, int64_t,
                                   mbd_error *));

#endif
