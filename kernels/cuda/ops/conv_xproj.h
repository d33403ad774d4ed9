/* The decode fusion of conv + SiLU into x_proj on the GPU
 * (kernels/cuda/ops/conv_xproj.cu), and the conv descriptor it shares with
 * the scan. C header; the conventions shared by the model ops are in
 * kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_CONV_XPROJ_H
#define MBD_CUDA_OPS_CONV_XPROJ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* One layer's causal conv for the decode fusion below: w tap-major [K][di],
 * bias [di] or NULL, state of slot q at state + q * slot_stride, [K-1][di]
 * oldest first (as mbd_mops_conv_silu). */
typedef struct mbd_mops_conv {
  int K;
  const float *w;
  const float *bias;
  float *state;
  int64_t slot_stride;
} mbd_mops_conv;

/* Whether a forward over nseq sequences of T tokens runs a layer's conv
 * fused into x_proj and the scan (mbd_mops_conv_xproj, then mbd_mops_scan with
 * the conv: one launch less, the same bits) instead of mbd_mops_conv_silu +
 * mbd_mops_xproj + mbd_mops_scan: T == 1, conv width K == 4, act bf16 or f16,
 * d_inner di <= 2048 and 1 <= nseq <= 64 (beyond either the recomputed conv
 * costs more than the launch it saves). */
int mbd_mops_conv_fused(int nseq, int T, int K, int di, mbd_dtype act);

/* x_proj of nseq decode rows (T = 1) whose input is the conv + SiLU output of
 * xz's x part (xz[s * ldxz + c], c < di) against conv->state of slots[s]:
 * out[s, :] = what mbd_mops_conv_silu (xc_act in dtype dt) followed by
 * mbd_mops_xproj would give, bit for bit (the same per-step conv function, the
 * same x_proj contract). Reads the conv state and writes neither it nor xc:
 * mbd_mops_scan with the same conv does both, after this kernel. Conv width
 * 4, dtype bf16/f16 (see mbd_mops_conv_fused). */
int mbd_mops_conv_xproj(void *stream, int nseq, int di, const mbd_mops_conv *conv,
                        const float *xz, int64_t ldxz, const int32_t *slots, int NO,
                        mbd_dtype dt, const void *w, float *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
