/* Residual add + RMSNorm on the GPU (kernels/cuda/ops/add_rmsnorm.cu). C
 * header; the conventions shared by the model ops are in
 * kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_ADD_RMSNORM_H
#define MBD_CUDA_OPS_ADD_RMSNORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* For i < M, with row r = i * in_stride + in_offset:
 *   if delta: resid[r] += delta[r] (f32, stored back)
 *   out[i] = w * (x * (1 / sqrtf(ss / d + eps))), ss = fmaf chain over the
 *   row in ascending order (as mbd_cpu_rmsnorm), written in dtype `act`.
 * in_stride/in_offset let the final norm pick each sequence's last row. */
int mbd_mops_add_rmsnorm(void *stream, int64_t M, int d, int64_t in_stride, int64_t in_offset,
                         float *resid, const float *delta, const float *w, float eps,
                         mbd_dtype act, void *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
