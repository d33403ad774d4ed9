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

#ifdef __cplusplus
}
#endif
#endif
