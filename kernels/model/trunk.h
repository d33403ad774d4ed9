/* The trunk of a CPU Mamba model: what every family has around and beneath
 * its mixer math. The thread context, the checkpoint's loading (token
 * embedding, the layers from the family's tensor table, final norm and the
 * LM head, tied to the embedding unless the checkpoint unties it), the
 * residual stream's and the family's workspace rows, the per-call batch
 * buffers and the description of the model's states. Each family embeds
 * one, says what its checkpoint holds, and drives prefill and step through
 * it (kernels/model/rows.h). */
#ifndef MBD_KERNELS_MODEL_TRUNK_H
#define MBD_KERNELS_MODEL_TRUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/rows.h"
#include "kernels/model/seq_state.h"
#include "kernels/model/weights.h"

#define MBD_TRUNK_MAX_LAYER_TENSORS 16 /* rows of a layer's tensor table */
#define MBD_TRUNK_MAX_WORKSPACES 8     /* family workspaces */

/* What a family's checkpoint holds and how to load it. */
typedef struct mbd_trunk_spec {
  mbd_dtype dtype;                   /* weight storage: f32, bf16 or f16 */
  int threads;                       /* <= 0: one per online CPU */
  int isa;                           /* mbd_cpu_isa; 0 = best available */
  int max_rows;                      /* token rows per chunk; <= 0: 256 */
  const mbd_progress_opts *progress; /* loading progress; NULL: silent */
  int64_t d;                         /* model width */
  const char *embed;                 /* the embedding's tensor name */
  int64_t V;                         /* its rows (the vocabulary the model takes) */
  bool V_as_stored;                  /* V is the stored embedding's rows instead */
  bool tied;                         /* the LM head is the embedding */
  bool head_optional;                /* untied, but tied when lm_head.weight is absent */
  int n_layer;
  size_t layer_size;                 /* sizeof the family's layer struct */
  const mbd_weight_spec *layer;      /* a layer's tensors (kernels/model/weights.h) */
  size_t nlayer;                     /* rows of layer, <= MBD_TRUNK_MAX_LAYER_TENSORS */
  float **const *bufs;               /* the family's workspaces, [max_rows, widths[i]] */
  const size_t *widths;
  size_t nbufs;                      /* <= MBD_TRUNK_MAX_WORKSPACES */
  const int64_t *ks;                 /* the GEMMs' reduction sizes, for their scratch */
  int nks;
  mbd_seq_state_desc state;          /* the model's states */
  void *model;                       /* the family's model, for forward */
  /* Runs every layer over `rows` rows (mbd_rows_model.forward). */
  int (*forward)(void *model, void *const *states, const int64_t *seg, int64_t nseg,
                 int64_t rows, mbd_error *err);
} mbd_trunk_spec;

typedef struct mbd_trunk {
  mbd_dtype dtype;        /* weight storage: f32, bf16 or f16 */
  mbd_cpu_ctx *ctx;       /* threads and ISA */
  int64_t d;              /* model width */
  int64_t V;              /* embedding rows (the vocabulary the model takes) */
  mbd_cpu_wpack *embed;   /* [V, d], also the LM head when tied */
  mbd_cpu_wpack *lm_head; /* [V, d] when untied, else NULL */
  float *norm_f;          /* [d] */
  int n_layer;
  void *layers;           /* [n_layer] family layer structs, loaded by the table below */
  size_t layer_size;      /* bytes of one */
  mbd_weight_spec layer[MBD_TRUNK_MAX_LAYER_TENSORS]; /* the layer table, to free them */
  size_t nlayer;          /* its rows */
  size_t weight_bytes;    /* storage of every weight loaded */
  int64_t max_rows;       /* token rows per chunk */
  float *resid;           /* [max_rows, d] residual stream */
  float *xn;              /* [max_rows, d] normed rows */
  float *out;             /* [max_rows, d] a layer's output projection */
  float *ws[MBD_TRUNK_MAX_WORKSPACES]; /* the family's workspaces */
  int nws;                /* how many */
  mbd_seq_state_desc state; /* the model's states */
  mbd_rows_batch batch;   /* per-call buffers */
  mbd_rows_model rows;    /* the model as the prefill driver sees it */
} mbd_trunk;

/* Loads the checkpoint in dir as spec says into t (zeroed): starts the
 * thread context, loads the embedding, every layer, the final norm and the
 * head, allocates the workspaces and sets t->rows, so that the family's
 * prefill and step are mbd_rows_prefill(&t->rows) and mbd_rows_step. Refuses
 * a dtype other than f32, bf16, f16 (MBD_E_INVALID) and a stored embedding
 * of no rows or more than INT32_MAX (MBD_E_SHAPE); errors name the tensor. On failure t holds what was loaded: mbd_trunk_free it. */
int mbd_trunk_load(mbd_trunk *t, const char *dir, const mbd_trunk_spec *spec, mbd_error *err);
/* Frees what the trunk holds (t itself is the caller's). */
void mbd_trunk_free(mbd_trunk *t);

/* *out = n zeroed floats of workspace, which the trunk frees (beside the
 * spec's rows: a family's per-thread scratch). */
int mbd_trunk_alloc_floats(mbd_trunk *t, size_t n, float **out, mbd_error *err);

/* xn[r] = rmsnorm(resid[r]) * w, r < rows. */
void mbd_trunk_norm(mbd_trunk *t, int64_t rows, const float *w, float eps);
/* resid += out over rows rows. */
void mbd_trunk_add_out(mbd_trunk *t, int64_t rows);

#endif
