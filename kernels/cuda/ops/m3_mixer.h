/* The Mamba-3 SISO mixer's per-token ops on the GPU (kernels/cuda/ops/
 * m3_mixer.cu): the in_proj row preprocessing and the recurrence, with the
 * roundings of the CPU reference (kernels/cpu/mamba3_ops.h) statement for
 * statement, through the host/device functions of kernels/model/mamba3_math.h.
 * f32 activations. C header. */
#ifndef MBD_CUDA_OPS_M3_MIXER_H
#define MBD_CUDA_OPS_M3_MIXER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"

/* The sizes of one layer's mixer. */
typedef struct mbd_m3g_dims {
  int64_t d_inner, d_in_proj;
  int heads, headdim, d_state, ngroups, angles;
  float a_floor, eps;
} mbd_m3g_dims;

/* mbd_cpu_m3_preprocess on each of M rows of proj [M, d_in_proj], in place:
 * B/C RMSNorm per group, dt, A dt, sigmoid(trap), tanh(angle) pi. */
int mbd_mops_m3_preprocess(void *stream, const mbd_m3g_dims *d, int64_t M, const float *dt_bias,
                           const float *b_norm, const float *c_norm, float *proj, mbd_error *err);

/* mbd_cpu_m3_head_step for every head of nseq sequences over T tokens in
 * time order: sequence j's rows are proj[j * T + t], its state is slot
 * slots[j] of `state` (per slot: slot_floats floats laid out angle
 * [L][H][S], ssm [L][H][P][N], k [L][H][N], v [L][H][P], as the CPU state
 * image), layer `layer` of n_layer; y [nseq * T, d_inner] gated by silu(z). */
int mbd_mops_m3_heads(void *stream, const mbd_m3g_dims *d, int nseq, int T, int n_layer,
                      int layer, const int32_t *slots, int64_t slot_floats, float *state,
                      const float *proj, const float *b_bias, const float *c_bias,
                      const float *D, float *y, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
