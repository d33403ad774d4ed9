/* dt_proj + selective scan + D skip + SiLU gate on the GPU
 * (kernels/cuda/ops/scan.cu). C header; the conventions shared by the model
 * ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_SCAN_H
#define MBD_CUDA_OPS_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/ops/conv_xproj.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* dt_proj + selective scan + D skip + SiLU gate (as mbd_cpu_scan_step), over
 * nseq sequences of T tokens. dbl: x_proj output f32 [M, R + 2N] (dt_low,
 * B, C). Per row: x = xc[row, c];
 *   dt_raw = (fmaf chain over k = 0..R-1 ascending from 0 of
 *             round_act(dt_low[k]) * dt_w[c, k]) + dt_b[c]
 *   (the f32 GEMM contract over dt_low rounded to `act`, weights dt_w
 *   [di, R] and dt_b [di] in dtype wdt (= act) widened), dt = softplus(dt_raw),
 * z = xz[row * ldxz + zoff + c]; A, D f32 [di][N], [di]; state at ssm_state
 * + slots[s] * slot_stride, [di][N]. Writes y[row, c] in dtype `act`.
 * N in {4, 8, 16, 32}. T = 1 (decode) runs a single-step kernel with the same
 * per-step arithmetic as the chunked prefill kernels: scan_prefill.cu's where
 * mbd_mops_scan_prefill_fits (kernels/cuda/ops/scan_prefill.h), else scan.cu's
 * k_scan; MBD_SCAN_PREFILL=old in the environment (read at each call) picks
 * k_scan for every shape. All three give the same bits.
 * conv: NULL, or (T == 1, conv width 4, act bf16/f16, after
 * mbd_mops_conv_xproj) the layer's conv: x is then recomputed from xz's x part
 * and the conv state (xc is not read, may be NULL) and the conv state is
 * advanced, as mbd_mops_conv_silu would have done. */
int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, int R, const float *xc,
                  const float *dbl, mbd_dtype wdt, const void *dt_w, const void *dt_b,
                  const float *A, const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                  float *ssm_state, int64_t slot_stride, const int32_t *slots,
                  const mbd_mops_conv *conv, mbd_dtype act, void *y, mbd_error *err);

/* mbd_mops_scan with the SSM state stored in bf16 (the state=bf16 route,
 * docs/route.md): the same f32 arithmetic, each updated state entry rounded
 * to bf16 (to nearest even) at once and that rounded value carried on (the
 * C . h chain reads it, the next step starts from it), in the prefill
 * kernels after every token as in the decode step, so prefill == decode bit
 * for bit at any chunking. ssm_state: bf16 entries at ssm_state +
 * slots[s] * slot_stride, [di][N]; the pointer and slot_stride * 2 bytes
 * aligned to min(16, 2N) bytes (MBD_E_INVALID otherwise). */
int mbd_mops_scan_bf16state(void *stream, int nseq, int T, int di, int N, int R,
                            const float *xc, const float *dbl, mbd_dtype wdt, const void *dt_w,
                            const void *dt_b, const float *A, const float *D, const float *xz,
                            int64_t ldxz, int64_t zoff, void *ssm_state, int64_t slot_stride,
                            const int32_t *slots, const mbd_mops_conv *conv, mbd_dtype act,
                            void *y, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
