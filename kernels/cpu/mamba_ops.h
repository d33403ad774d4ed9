/* Per-token Mamba-1 element-wise ops on the CPU (f32). Prefill and decode call
 * exactly these functions one time step at a time, so a prefill of T tokens
 * and T single-token steps perform the same roundings (bit-identical logits
 * and state). All are single-threaded over the given channel range; callers
 * parallelise across channels and sequences, which never changes the bits. */
#ifndef MBD_CPU_MAMBA_OPS_H
#define MBD_CPU_MAMBA_OPS_H

#include <stdint.h>

#include "kernels/cpu/cpu_ctx.h"

/* out[i] = w[i] * (x[i] * r), r = 1 / sqrtf(mean(x^2) + eps); the square sum
 * is an fmaf chain in ascending i. In-place (out == x) allowed. */
void mbd_cpu_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out);

/* SiLU x / (1 + exp(-x)) and softplus (x > 20 ? x : log1p(exp(x)), as torch),
 * exp and log1p from kernels/portable_math.h (mbd_pm_silu, mbd_pm_softplus:
 * the same bits on every host and on the GPU). */
float mbd_cpu_silu(float x);
float mbd_cpu_softplus(float x);

/* conv_step and scan_step take the context's ISA: with MBD_CPU_ISA_AVX2 the
 * same source is compiled for FMA hardware so fmaf is one instruction instead
 * of a libm call; the roundings are identical (fma is exact). */

/* Causal depthwise conv for one token on channels [c0, c1):
 *   acc = fma chain over taps oldest..newest of w[j][c] * in_j, + bias[c]
 *   out[c] = silu(acc); the window shifts: state keeps the dconv-1 latest inputs.
 * w is tap-major [dconv][di]; state is [dconv-1][di] (oldest first); bias may
 * be NULL. */
void mbd_cpu_conv_step(mbd_cpu_isa isa, int64_t c0, int64_t c1, int64_t di, int dconv, const float *w,
                       const float *bias, float *state, const float *x, float *out);

/* Selective scan for one token on channels [c0, c1), state size ds:
 *   dt = softplus(dt_raw[c]); for n ascending:
 *     h[c][n] = fmaf(mbd_pm_expf(dt * A[c][n]), h[c][n], (dt * B[n]) * x[c])
 *     y = fmaf(h[c][n], C[n], y)          (y starts at +0)
 *   y = fmaf(D[c], x[c], y); out[c] = y * silu(z[c]). */
void mbd_cpu_scan_step(mbd_cpu_isa isa, int64_t c0, int64_t c1, int ds, const float *A, const float *D,
                       const float *dt_raw, const float *B, const float *C, const float *x,
                       const float *z, float *h, float *out);

#endif
