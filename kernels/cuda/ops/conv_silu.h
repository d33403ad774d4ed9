/* Causal depthwise conv + SiLU on the GPU (kernels/cuda/ops/conv_silu.cu).
 * C header; the conventions shared by the model ops are in
 * kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_CONV_SILU_H
#define MBD_CUDA_OPS_CONV_SILU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* Causal depthwise conv + SiLU over nseq sequences of T tokens (row s*T+t).
 * x[row, c] = xz[row * ldxz + c]; w tap-major [K][di]; bias [di] or NULL;
 * state of sequence s at conv_state + slots[s] * slot_stride, [K-1][di]
 * oldest first (updated in place). Writes xc (f32 [M, di]) and, when
 * xc_act != NULL, the same values in dtype `act`. K in 2..8. Each output is
 * mbd_cpu_conv_step's arithmetic; the T steps run in parallel segments. */
int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                       int64_t ldxz, const float *w, const float *bias, float *conv_state,
                       int64_t slot_stride, const int32_t *slots, float *xc, mbd_dtype act,
                       void *xc_act, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
