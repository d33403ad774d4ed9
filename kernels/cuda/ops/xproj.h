/* x_proj, the small projection of every layer's conv output, on the GPU
 * (kernels/cuda/ops/xproj.cu). C header; the conventions shared by the model
 * ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_XPROJ_H
#define MBD_CUDA_OPS_XPROJ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* x_proj: out[r, o] = sum over k < K of x[r, k] * w[o, k], f32 [M, NO]; x
 * [M, K] and w [NO, K] in dtype dt (f32/bf16/f16), widened to f32. Contract
 * (independent of M and of the other rows):
 * - f32: the f32 GEMM contract (= the CPU model's x_proj): an fmaf chain from
 *   0 over k ascending;
 * - bf16/f16: for i ascending, lane l of 32 adds (from 0) the partial of its
 *   group, an fmaf chain from 0 over k = 512 i + 16 l + j, j = 0..15 (k < K
 *   only); the 32 lane sums are added by an xor butterfly (16, 8, 4, 2, 1).
 * Few rows run a warp per output; from 32 rows with K a multiple of 512,
 * tiles of 16 rows x 16 outputs (the same operations per output). */
int mbd_mops_xproj(void *stream, int64_t M, int K, int NO, mbd_dtype dt, const void *x,
                   const void *w, float *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
