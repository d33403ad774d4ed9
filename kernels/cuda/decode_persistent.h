/* Persistent decode: every Mamba-1 layer of a small decode batch (1..4 rows)
 * and the final add + norm in one launch, one block per SM, no grid barrier.
 *
 * A batch-1 decode step through the per-op kernels is ~125 dependent launches
 * of a few microseconds each; here a block waits only for the words it reads
 * (each value carries the tag of the layer that wrote it) at three exchanges
 * per layer, and streams its next layer's weight slices into shared memory
 * while the current layer runs. The bits are the per-op path's: the
 * projections run the GEMM family's sm_90a contract (256-wide K chunks of
 * m16n8k16 steps, folded in order, then the bias), and the norm, conv, x_proj,
 * scan and gate call the same functions as the per-op kernels
 * (mops_arith.cuh). tests/gpu/test_mamba1_gpu.c compares the two paths with
 * memcmp. Only for cc 9.0 devices with an sm_90a build, bf16/f16 storage,
 * d_state 16, conv width 4, d_model and d_inner multiples of 256 (whole K
 * chunks: the chains load a chunk's fragments before its steps), and shapes
 * whose per-block weight slices fit shared memory twice (130m at 1..4 rows,
 * 180-213 KB; 370m's need 237 KB at one row, over the H200's 227 KB). */
#ifndef MBD_KERNELS_CUDA_DECODE_PERSISTENT_H
#define MBD_KERNELS_CUDA_DECODE_PERSISTENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's device weights: the model's own layer table (mamba1_gpu.cu
 * loads into it and uploads it as is). */
typedef struct mbd_dp_layer {
  float *norm;   /* [d] f32 (values rounded through the storage dtype) */
  void *in_w;    /* [2 di, d] dtype */
  void *in_b;    /* [2 di] dtype or NULL */
  float *conv_w; /* [K][di] tap-major */
  float *conv_b; /* [di] or NULL */
  void *x_w;     /* [R + 2N, di] dtype: rows 0..R dt part, then B, then C */
  void *x_wg;    /* x_w regrouped [di / 8][R + 2N][8] (one contiguous slice per
                    8-channel group, for the persistent decode), or NULL */
  void *dt_w;    /* [di, R] dtype */
  void *dt_b;    /* [di] dtype */
  float *A;      /* [di][N] = -exp(A_log) (host mbd_pm_expf, as the CPU model) */
  float *D;      /* [di] */
  void *out_w;   /* [d, di] dtype */
  void *out_b;   /* [d] dtype or NULL */
} mbd_dp_layer;

typedef struct mbd_dp_model {
  int d_model, d_inner, dt_rank, d_state, d_conv, n_layer;
  float norm_eps;
  mbd_dtype dtype;
  const void *emb;              /* [V, d] dtype */
  const mbd_dp_layer *layers;   /* device array [n_layer] */
  float *conv_state;            /* slot s, layer l: + s * conv_slot + l * 3 * di */
  int64_t conv_slot;
  float *ssm_state;             /* slot s, layer l: + s * ssm_slot + l * di * 16 */
  int64_t ssm_slot;
  /* exchange words (value | layer tag << 32), zeroed once, owned by this model */
  uint64_t *xq;                 /* [4][R + 32][32][MBD_DP_MAX_INNER / 512]: x_proj
                                   group partials, lane-major (decode_persistent.cu) */
  uint64_t *xs;                 /* [4][R + 32]: x_proj outputs (folded partials) */
  uint64_t *xy;                 /* [4][d_inner / 2]: y, two dtype values a word */
  uint64_t *xo;                 /* [4][d_model]: out_proj outputs (f32) */
  unsigned *epoch;              /* launches so far (the tags' base), zeroed once */
  uint32_t epoch_wrap;          /* at this many launches the words are re-zeroed and
                                   the count restarts (tags stay below 2^32) */
  float *resid, *out;           /* [rows][d]: on return, the per-op path's values
                                   after the final add (resid) */
  const float *norm_f;          /* [d] final norm weight */
  void *hn;                     /* [rows][d] dtype: on return, the final norm's output */
} mbd_dp_model;

/* The widest d_inner it runs (its x_proj fold holds 4 group partials a lane). */
#define MBD_DP_MAX_INNER 2048
/* 1 when `rows` decode rows of m run persistently on the current device (see
 * above), else 0. Whether the model asks is its route's decode path
 * (mamba1_gpu_run.cu). */
int mbd_dp_fits(const mbd_dp_model *m, int rows);

/* Bytes the launch also moves, off its critical path, for the kernels after
 * it (the sampling's inputs, from mapped pinned memory): up to three ranges,
 * 4-byte aligned. */
typedef struct mbd_dp_side {
  const void *src[3];
  void *dst[3];
  size_t bytes[3];
} mbd_dp_side;

/* Enqueues the layers of one decode step of `rows` rows (tokens tok[rows],
 * state slots slots[rows]: device or mapped pinned host arrays, read once at
 * the start) and the final add + norm on stream; side (or NULL) is copied
 * meanwhile. trace: NULL, or a stage trace buffer (below) of this device and
 * m's depth that the launch fills. mbd_dp_fits must hold. Leaves resid, out
 * and hn as the per-op path's final add + norm leaves them. */
int mbd_dp_decode(void *stream, const mbd_dp_model *m, int rows, const int32_t *tok,
                  const int32_t *slots, const mbd_dp_side *side, void *trace, mbd_error *err);

/* Stage trace (a diagnostic; the same bits with or without it): int64 words,
 * for every block b of the grid (one per SM) and layer l, the block's clock64
 * at MBD_DP_TRACE_POINTS points of the layer, at [(b * n_layer + l) *
 * MBD_DP_TRACE_POINTS + i]. Segment i runs from point i to point i + 1 (the
 * last to the next layer's point 0): 0 stage A waits for the previous
 * out_proj words and norms, 1 in_proj mma, 2 fold + conv, 3 x_proj partials,
 * 4 stage C waits for and folds x_proj, 5 scan, 6 stage D waits for y, 7
 * out_proj, 8 layer end. A block with no work leaves its words zero. Then two
 * words: block 0's globaltimer (ns) at the launch's start and end. */
#define MBD_DP_TRACE_POINTS 9
/* Bytes of a trace buffer for the current device and n_layer layers; 0 when
 * the device cannot be queried. */
size_t mbd_dp_trace_bytes(int n_layer);

#ifdef __cplusplus
}
#endif

#endif
