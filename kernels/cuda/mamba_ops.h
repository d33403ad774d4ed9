/* Mamba-1 element-wise and recurrent ops on the GPU (everything except the
 * projections, which go through mbd_gpu_gemm). C header: streams are passed as
 * opaque pointers (a cudaStream_t), every buffer is a device pointer.
 *
 * Arithmetic contract: each op performs, per element, exactly the roundings of
 * the CPU reference in kernels/cpu/mamba_ops.c (x_proj and dt_proj have their
 * own summation orders, stated below) (same expression order, same
 * fmaf placement, IEEE division and square root, and exp/log1p/SiLU/softplus
 * from kernels/portable_math.h on both sides, not CUDA's or the C library's),
 * so on f32 routes the model's logits and states are bit-identical to the CPU
 * backend's. Prefill and decode run the same kernels: a prefill over T tokens makes
 * the same roundings as T single steps (bit-identical states and logits), and
 * one sequence's bits never depend on which other sequences share the launch.
 *
 * Activation dtype `act`: the dtype in which an op writes the input of the
 * next GEMM (F32, or the storage dtype BF16/F16, rounded to nearest even).
 * Recurrent state and everything else stays f32.
 *
 * All launchers enqueue asynchronously and return 0 or MBD_E_DEVICE (launch
 * error) / MBD_E_INVALID (unsupported size) with a message in err.
 *
 * Launches use programmatic dependent launch (also inside captured graphs): a
 * kernel may start while the previous kernel on the stream is finishing and
 * read its weights (conv, dt_proj, A, D) before that kernel has completed;
 * every activation, state, token or slot input is read only after it. Weights
 * written by a kernel must therefore be complete (stream synchronised) before
 * an op that uses them is enqueued. MBD_PDL=0 in the environment turns the
 * attribute off (benchmarking; same bits). */
#ifndef MBD_CUDA_MAMBA_OPS_H
#define MBD_CUDA_MAMBA_OPS_H

#include <stddef.h>
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
 * xc_act != NULL, the same values in dtype `act`. K in 2..8. Each output is
 * mbd_cpu_conv_step's arithmetic; the T steps run in parallel segments. */
int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                       int64_t ldxz, const float *w, const float *bias, float *conv_state,
                       int64_t slot_stride, const int32_t *slots, float *xc, mbd_dtype act,
                       void *xc_act, mbd_error *err);

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
 * d_inner di <= 2048, the single-step scan on, nseq <= MBD_CONV_FUSE_MAX
 * (environment, default 64; 0 turns the fusion off: a benchmarking switch). */
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

/* x_proj: out[r, o] = sum over k < K of x[r, k] * w[o, k], f32 [M, NO]; x
 * [M, K] and w [NO, K] in dtype dt (f32/bf16/f16), widened to f32. Contract
 * (independent of M and of the other rows):
 * - f32: the f32 GEMM contract (= the CPU model's x_proj): an fmaf chain from
 *   0 over k ascending;
 * - bf16/f16: lane l of 32 accumulates an fmaf chain from 0 over
 *   k = 256 i + 8 l + j (i ascending, then j = 0..7), the 32 partial sums are
 *   added by an xor butterfly (16, 8, 4, 2, 1). */
int mbd_mops_xproj(void *stream, int64_t M, int K, int NO, mbd_dtype dt, const void *x,
                   const void *w, float *out, mbd_error *err);

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
 * per-step arithmetic (MBD_SCAN_STEP=0 in the environment: the chunked one).
 * conv: NULL, or (T == 1, conv width 4, act bf16/f16, after
 * mbd_mops_conv_xproj) the layer's conv: x is then recomputed from xz's x part
 * and the conv state (xc is not read, may be NULL) and the conv state is
 * advanced, as mbd_mops_conv_silu would have done. */
int mbd_mops_scan(void *stream, int nseq, int T, int di, int N, int R, const float *xc,
                  const float *dbl, mbd_dtype wdt, const void *dt_w, const void *dt_b,
                  const float *A, const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                  float *ssm_state, int64_t slot_stride, const int32_t *slots,
                  const mbd_mops_conv *conv, mbd_dtype act, void *y, mbd_error *err);

/* Bytes of the sampler's device workspace for n rows. It must be zero-filled
 * once before its first use; every launch leaves it zero-filled again. */
size_t mbd_mops_sample_work_bytes(int n);

/* Next token per row r < n of logits [n, ld] (V columns):
 *   temp[r] <= 0: greedy argmax (lowest index among equal maxima; NaN ignored);
 *   temp[r] > 0 : Gumbel-max sampling: argmax of l / temp + g, with
 *     g = -logf(-logf(u)), u = mbd_sample_uniform(seed[r], step[r], index).
 * The draw depends only on (seed, step, index) and the row's logits, so it is
 * batch-invariant; the row is split over several blocks, and the winner (the
 * lowest-index maximum) does not depend on the reduction order. temp, seed,
 * step may be NULL (all greedy). work: mbd_mops_sample_work_bytes(n) bytes;
 * launches sharing one workspace must be stream-ordered. */
int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                    const float *temp, const uint64_t *seed, const uint64_t *step, void *work,
                    int32_t *out, mbd_error *err);

/* p[i] = uniform in [-scale, scale) from a hash of (seed, i), stored in dt.
 * Synthetic weights for benchmarks and tests: no host round trip. */
int mbd_mops_fill_uniform(void *stream, mbd_dtype dt, void *p, int64_t n, uint64_t seed,
                          float scale, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
