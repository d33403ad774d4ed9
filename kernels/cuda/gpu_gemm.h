/* Host entry of the GEMM family on a GPU context (kernels in
 * device/gemm_kernels.cu, cuBLAS in the cuBLAS modes). C-callable. */
#ifndef MBD_GPU_GEMM_H
#define MBD_GPU_GEMM_H

#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cuda/gpu_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Y[M,N] = X[M,K] W[N,K]^T (+ bias[N]); inference family. */
typedef struct mbd_gpu_gemm_args {
  mbd_dtype dtype;     /* input dtype: F32 (policy f32/tf32), BF16 or F16 (= policy) */
  mbd_dtype out_dtype; /* F32 or dtype */
  int64_t m, n, k;     /* m, n >= 1; k >= 1; each < 2^31 */
  const void *x;       /* device [m,k] */
  const void *w;       /* device [n,k] (HF [out,in] layout) */
  const void *bias;    /* device [n] of dtype, or NULL */
  void *y;             /* device [m,n] of out_dtype; must not alias x, w or bias */
  int w_static;        /* 1: no kernel just before on the stream writes w or bias (model
                          weights): the GEMM may launch while its predecessor runs
                          (programmatic dependent launch) and stream w early; x and y
                          still wait for the predecessor. 0 (default): plain launch. */
} mbd_gpu_gemm_args;

/* Enqueues the GEMM on the context's stream under its mode (asynchronous).
 * Checks shapes and dtypes; records the launch when recording or capturing. */
int mbd_gpu_gemm(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a, mbd_error *err);

/* The gated RMSNorm that produces a GEMM's single row of x (one group over
 * all K channels): mbd_mops_gated_rmsnorm(M = 1, n = group = K, y, z, w,
 * eps, norm_before_gate, act = the GEMM dtype) would write exactly that x. */
typedef struct mbd_gpu_gated_norm {
  const float *y; /* device [K] f32 */
  const float *z; /* device [K] f32 gate */
  const float *w; /* device [K] f32 norm weight (static, like the GEMM's w) */
  float eps;
  int norm_before_gate;
} mbd_gpu_gated_norm;

/* mbd_gpu_gemm with M = 1 and x = the gated RMSNorm of g, computed by the
 * streaming GEMM kernel itself and never stored (a->x is ignored): the same
 * bits as running the norm into x and then mbd_gpu_gemm. Returns 1 without
 * enqueuing anything where that kernel does not apply (other devices or
 * modes, M != 1, K > 4096, K % 8 != 0, an unaligned w, or the environment
 * variable MBD_GEMM_GATED=0): the caller then runs the two. */
int mbd_gpu_gemm_gated(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a,
                       const mbd_gpu_gated_norm *g, mbd_error *err);

/* The decode conv step mbd_mops_conv_silu(nseq = M, T = 1, di = n, K = 4,
 * xz = the GEMM's output from column lo, w, bias, state, slot_stride, slots,
 * xc = out, f32) applied by the GEMM kernel to its own f32 output columns
 * [lo, lo + n) as they are stored (same bits, same state update). */
typedef struct mbd_gpu_conv_step {
  const float *w;       /* device [4][n] tap-major */
  const float *bias;    /* device [n] or NULL */
  float *state;         /* device windows: state + slots[s] * slot_stride + j * n + c */
  int64_t slot_stride;
  const int32_t *slots; /* device [M] */
  float *out;           /* device [M][n] f32 */
  int64_t lo, n;
  int k; /* taps: only 4 is fused */
} mbd_gpu_conv_step;

/* The residual add + RMSNorm that produces a GEMM's single row of x:
 * mbd_mops_add_rmsnorm(M = 1, d = K, resid = x, delta, w, eps, act = the
 * GEMM dtype) would write exactly that x, except that x + delta goes to
 * x_out (x itself is only read). */
typedef struct mbd_gpu_res_norm {
  const float *x;     /* device [K] f32: the residual stream */
  const float *delta; /* device [K] f32 added to it, or NULL */
  const float *w;     /* device [K] f32 norm weight (static) */
  float eps;
  float *x_out;       /* device [K] f32: receives x + delta (delta set), or NULL; must not
                         alias x or delta */
  const mbd_gpu_conv_step *conv; /* NULL, or the conv step on the output (f32 output;
                                    only the ragged-range kernel has it: 1 otherwise;
                                    MBD_GEMM_CONV=0 turns it off) */
} mbd_gpu_res_norm;

/* mbd_gpu_gemm_gated's counterpart for mbd_gpu_res_norm (same conditions;
 * MBD_GEMM_RESNORM=0 turns it off): one block of the kernel writes x_out. */
int mbd_gpu_gemm_resnorm(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args *a,
                         const mbd_gpu_res_norm *g, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
