/* Mamba-1 element-wise and recurrent ops on the GPU (everything except the
 * projections, which go through mbd_gpu_gemm). C header: streams are passed as
 * opaque pointers (a cudaStream_t), every buffer is a device pointer.
 *
 * Arithmetic contract: each op performs, per element, exactly the roundings of
 * the CPU reference in kernels/cpu/mamba_ops.c (same expression order, same
 * fmaf placement, IEEE division and square root). Only expf/log1pf come from
 * the CUDA math library instead of glibc (both accurate to a couple of ulp,
 * not bit-equal), so GPU f32 matches the CPU within a small tolerance, not in
 * bits. Prefill and decode run the same kernels: a prefill over T tokens makes
 * the same roundings as T single steps (bit-identical states and logits), and
 * one sequence's bits never depend on which other sequences share the launch.
 *
 * Activation dtype `act`: the dtype in which an op writes the input of the
 * next GEMM (F32, or the storage dtype BF16/F16, rounded to nearest even).
 * Recurrent state and everything else stays f32.
 *
 * All launchers enqueue asynchronously and return 0 or MBD_E_DEVICE (launch
 * error) / MBD_E_INVALID (unsupported size) with a message in err. */
#ifndef MBD_CUDA_MAMBA_OPS_H
#define MBD_CUDA_MAMBA_OPS_H

#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r, :] = table[tok[r], :] widened to f32, r < M. tok must be in range
 * (callers validate on the host). table has dtype `dt` and d columns. */
int mbd_mops_embed(void *stream, int64_t M, int d, const int32_t *tok, mbd_dtype dt,
                   const void *table, float *out, mbd_error *err);

/* For i < M, with row r = i * in_stride + in_offset:
 *   if delta: resid[r] += delta[r] (f32, stored back)
 *   out[i] = w * (x * (1 / sqrtf(ss / d + eps))), ss = fmaf chain over the
 *   row in ascending order (as mbd_cpu_rmsnorm), written in dtype `act`.
 * in_stride/in_offset let the final norm pick each sequence's last row. */
int mbd_mops_add_rmsnorm(void *stream, int64_t M, int d, int64_t in_stride, int64_t in_offset,
                         float *resid, const float *delta, const float *w, float eps,
                         mbd_dtype act, void *out, mbd_error *err);

/* Causal depthwise conv + SiLU over nseq sequences of T tokens (row s*T+t).
 * x[row, c] = xz[row * ldxz + c]; w tap-major [K][di]; bias [di] or NULL;
 * state of sequence s at conv_state + slots[s] * slot_stride, [K-1][di]
 * oldest first (updated in place). Writes xc (f32 [M, di]) and, when
 * xc_act != NULL, the same values in dtype `act`. K in 2..8. */
int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                       int64_t ldxz, const float *w, const float *bias, float *conv_state,
                       int64_t slot_stride, const int32_t *slots, float *xc, mbd_dtype act,
                       void *xc_act, mbd_error *err);

/* Selective scan + D skip + SiLU gate (as mbd_cpu_scan_step), over nseq
 * sequences of T tokens. Per row: x = xc[row, c], dt = softplus(dt_raw[row, c]),
 * B = bc[row, 0..N), C = bc[row, N..2N), z = xz[row * ldxz + zoff + c]; A, D
 * f32 [di][N], [di]; state at ssm_state + slots[s] * slot_stride, [di][N].
 * Writes y[row, c] in dtype `act`. N in {4, 8, 16, 32}. */
int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, const float *xc,
                  const float *dt_raw, const float *bc, const float *A, const float *D,
                  const float *xz, int64_t ldxz, int64_t zoff, float *ssm_state,
                  int64_t slot_stride, const int32_t *slots, mbd_dtype act, void *y,
                  mbd_error *err);

/* Next token per row r < n of logits [n, ld] (V columns):
 *   temp[r] <= 0: greedy argmax (lowest index among equal maxima; NaN ignored);
 *   temp[r] > 0 : Gumbel-max sampling: argmax of l / temp + g, with
 *     g = -logf(-logf(u)), u = mbd_sample_uniform(seed[r], step[r], index).
 * The draw depends only on (seed, step, index) and the row's logits, so it is
 * batch-invariant. temp, seed, step may be NULL (all greedy). */
int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                    const float *temp, const uint64_t *seed, const uint64_t *step, int32_t *out,
                    mbd_error *err);

/* p[i] = uniform in [-scale, scale) from a hash of (seed, i), stored in dt.
 * Synthetic weights for benchmarks and tests: no host round trip. */
int mbd_mops_fill_uniform(void *stream, mbd_dtype dt, void *p, int64_t n, uint64_t seed,
                          float scale, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
