/* The prefill and step driver shared by the CPU models: checks a call,
 * flattens its tokens into rows, sequence-major, in chunks of at most
 * max_rows rows (groups of at most max_rows sequences, time windows of
 * max_rows / group steps), runs the family's forward over each chunk and
 * applies the LM head to the rows the selector asks for. The family gives
 * only its per-chunk forward and its states' description; so the three families
 * batch, chunk and pick logits the one way, and a sequence's bits depend on
 * neither its slot nor the chunking (the GEMM is batch-invariant). */
#ifndef MBD_KERNELS_MODEL_ROWS_H
#define MBD_KERNELS_MODEL_ROWS_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/family.h"
#include "kernels/model/seq_state.h"

/* Per-call buffers, sized by the batch (grow-only). */
typedef struct mbd_rows_batch {
  int cap;                  /* sequences the buffers hold */
  float *last;              /* [cap, d] final-normed last rows */
  int64_t *seg;             /* [cap * 4]: per chunk segment: seq, row0, nrows, t0 */
  const int32_t **step_tok; /* [cap] a step's per-sequence token pointers */
  int64_t *step_len;        /* [cap] a step's lengths (all 1) */
} mbd_rows_batch;

/* Frees b's buffers (b itself is the caller's). */
void mbd_rows_batch_free(mbd_rows_batch *b);

/* A model as the driver sees it; built by the family for each call. */
typedef struct mbd_rows_model {
  void *model;                /* the family's model, passed to the callbacks */
  mbd_cpu_ctx *ctx;           /* threads for the LM head GEMM */
  const mbd_cpu_wpack *embed; /* [V, d] token embedding */
  const mbd_cpu_wpack *head;  /* [V, d] LM head */
  int64_t d, V;               /* model width, vocabulary (embedding rows) */
  int64_t max_rows;           /* rows per chunk (the workspace's) */
  float *resid;               /* [max_rows, d] the forward's input rows */
  const float *xn;            /* [max_rows, d] the forward's final-normed rows */
  mbd_rows_batch *batch;      /* the model's per-call buffers */
  const mbd_seq_state_desc *state; /* the model's states (kernels/model/seq_state.h) */
  /* Runs every layer over `rows` rows in resid, segments seg[nseg][4] of
   * states (mbd_seq_state), leaving final-normed rows in xn. */
  int (*forward)(void *model, void *const *states, const int64_t *seg, int64_t nseg,
                 int64_t rows, mbd_error *err);
} mbd_rows_model;

/* Feeds lens[b] tokens tokens[b][..] to states[b] (mbd_seq_state,
 * distinct), b < batch, as mbd_cpu_model_ops.prefill: LAST logits [batch, V]
 * (a row with lens[b] == 0 is left untouched); ALL [sum(lens), V]. A bad
 * call (NULLs, foreign or shared states, tokens outside [0, V)) is refused
 * before anything changes; r NULL is MBD_E_INVALID. */
int mbd_rows_prefill(const mbd_rows_model *r, void *const *states, int batch,
                     const int32_t *const *tokens, const int64_t *lens, mbd_logits_sel which,
                     float *logits, mbd_error *err);

/* One token per sequence: logits [batch, V] (may be NULL). */
int mbd_rows_step(const mbd_rows_model *r, void *const *states, int batch, const int32_t *tokens,
                  float *logits, mbd_error *err);

#endif
