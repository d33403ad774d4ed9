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
 * [M, K] and w [NO, K] in dtype dt (f32/bf16/f16). Contract (independent of
 * M and of the other rows; docs/route.md, "Model kernels"):
 * - f32: the f32 GEMM contract (= the CPU model's x_proj): an fmaf chain from
 *   0 over k ascending;
 * - bf16/f16: group g of 16 channels gives p_g = one m16n8k16 tensor-core
 *   step from zero over its 16 products (zeros past K); class c = g mod 32
 *   sums its p_g from +0 in ascending g; the 32 class sums are added by an
 *   xor butterfly (16, 8, 4, 2, 1).
 * Few rows run 16-output x 8-row blocks whose warps split the class tree;
 * many rows (M >= 128, sm_90) run clusters of eight blocks that split it
 * over row tiles (the same operations per output; MBD_XPROJ_TILE picks
 * others for the benchmarks, xproj.cu). */
int mbd_mops_xproj(void *stream, int64_t M, int K, int NO, mbd_dtype dt, const void *x,
                   const void *w, float *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
