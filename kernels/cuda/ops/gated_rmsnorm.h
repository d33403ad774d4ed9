/* The Mamba-2 gated RMSNorm on the GPU (kernels/cuda/ops/gated_rmsnorm.cu).
 * C header; the conventions shared by the model ops are in
 * kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_GATED_RMSNORM_H
#define MBD_CUDA_OPS_GATED_RMSNORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* For rows i < M: mbd_cpu_gated_rmsnorm's arithmetic (kernels/cpu/
 * gated_rmsnorm.h) over n channels in groups of `group` (16-bit `act`: each
 * group's square sum split over 32 lanes as the 16-bit RMSNorm's, docs/
 * route.md), y f32 [M, n], gate
 * z[i * ldz + c] f32, weight w [n] f32; out [M, n] in dtype `act` (the
 * out_proj GEMM input). */
int mbd_mops_gated_rmsnorm(void *stream, int64_t M, int n, int group, const float *y,
                           const float *z, int64_t ldz, const float *w, float eps,
                           int norm_before_gate, mbd_dtype act, void *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
