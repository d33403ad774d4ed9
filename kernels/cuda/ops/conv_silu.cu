/* Causal depthwise conv + SiLU, prefill and decode (see conv_silu.h).
 * Where rows and pointers allow 16-byte accesses the prefill runs
 * k_conv_tile and the decode step k_conv_step4 (four channels a thread);
 * otherwise k_conv_silu, which the benches and tests can also ask for
 * (conv_pick). Each output has conv_silu_out's roundings (its sum and
 * mbd_pm_silu, or silu_group's grouped SiLUs with the same bits). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/silu_group.cuh"

#include <string.h>

/* Time steps per conv thread. A thread owns (sequence, channel, segment of
 * CONV_SEG steps); its window starts from the inputs just before the segment
 * (the slot's state for the first segment), so segments run in parallel and
 * each output still gets mbd_cpu_conv_step's arithmetic: the window taps in
 * ascending order, then the new input, then the bias. Only the first
 * segment's thread touches the state: it reads it first and writes the new
 * window last, so no other thread can observe a half-updated state. */
#define CONV_SEG 16

template <int K, typename ActT>
__global__ void k_conv_silu(int T, int di, const float *__restrict__ xz, int64_t ldxz,
                            const float *__restrict__ w, const float *__restrict__ bias,
                            float *__restrict__ conv_state, int64_t slot_stride,
                            const int32_t *__restrict__ slots, float *__restrict__ xc,
                            ActT *__restrict__ xc_act, bool early) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int seg = blockIdx.y, s = blockIdx.z;
  const int cw = c < di ? c : di - 1;
  float win[K - 1], wk[K];
#pragma unroll
  for (int j = 0; j < K; j++) wk[j] = w[(int64_t)j * di + cw]; /* weights: before the wait */
  const float b = bias ? bias[cw] : 0.0f;
  pdl_enter(early);
  if (c >= di) return;
  const int t0 = seg * CONV_SEG, t1 = min(T, t0 + CONV_SEG);
  const int64_t base = (int64_t)s * T; /* row of the sequence's step 0 */
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
#pragma unroll
  for (int j = 0; j < K - 1; j++)
    win[j] = seg == 0 ? st[(int64_t)j * di] : xz[(base + t0 - (K - 1) + j) * ldxz + c];
  /* The segment's inputs are independent of the arithmetic: load them all
   * first so their latencies overlap. */
  float xs[CONV_SEG];
#pragma unroll
  for (int i = 0; i < CONV_SEG; i++)
    xs[i] = t0 + i < t1 ? xz[(base + t0 + i) * ldxz + c] : 0.0f;
#pragma unroll
  for (int i = 0; i < CONV_SEG; i++) {
    if (t0 + i >= t1) break;
    const float xv = xs[i];
    const float v = conv_silu_out<K>(wk, win, xv, bias != nullptr, b);
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    win[K - 2] = xv;
    const int64_t row = base + t0 + i;
    xc[row * di + c] = v;
    if (xc_act) st_act(xc_act + row * di + c, v);
  }
  if (seg != 0) return;
  if (t1 == T) { /* one segment: the window is the new state */
#pragma unroll
    for (int j = 0; j < K - 1; j++) st[(int64_t)j * di] = win[j];
  } else { /* T > CONV_SEG >= K - 1: the last K - 1 inputs */
#pragma unroll
    for (int j = 0; j < K - 1; j++)
      st[(int64_t)j * di] = xz[(base + T - (K - 1) + j) * ldxz + c];
  }
}

#define CONV_BT 64 /* channels per block */

template <int K, typename ActT>
static int conv_silu_launch(cudaStream_t s, int nseq, int T, int di, const float *xz,
                            int64_t ldxz, const float *w, const float *bias, float *conv_state,
                            int64_t slot_stride, const int32_t *slots, float *xc, ActT *xc_act,
                            mbd_error *err) {
  const dim3 grid((unsigned)((di + CONV_BT - 1) / CONV_BT),
                  (unsigned)((T + CONV_SEG - 1) / CONV_SEG), (unsigned)nseq);
  return launch_pdl("conv_silu", k_conv_silu<K, ActT>, grid, dim3(CONV_BT), 0, s, err, T, di, xz,
                    ldxz, w, bias, conv_state, slot_stride, slots, xc, xc_act, pdl_early());
}

/* The K taps and the bias (zeros without one) of channels c .. c + 3, as
 * 16-byte loads. */
template <int K>
__device__ __forceinline__ void conv_w4(const float *__restrict__ w,
                                        const float *__restrict__ bias, int di, int c,
                                        float (&wk)[4][K], float (&b)[4]) {
#pragma unroll
  for (int j = 0; j < K; j++) {
    const float4 q = *(const float4 *)(w + (int64_t)j * di + c);
    wk[0][j] = q.x, wk[1][j] = q.y, wk[2][j] = q.z, wk[3][j] = q.w;
  }
  const float4 q = bias ? *(const float4 *)(bias + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  b[0] = q.x, b[1] = q.y, b[2] = q.z, b[3] = q.w;
}

/* conv_silu_out's sum before its SiLU, spelled as there: the window taps in
 * ascending order, the new input, then the bias. */
template <int K>
__device__ __forceinline__ float conv_sum(const float (&wk)[K], const float (&win)[K - 1],
                                          float xv, bool has_bias, float b) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < K - 1; j++) acc = __fmaf_rn(wk[j], win[j], acc);
  acc = __fmaf_rn(wk[K - 1], xv, acc);
  if (has_bias) acc = __fadd_rn(acc, b);
  return acc;
}

/* The four outputs of one step of channels c .. c + 3 (win: their window,
 * oldest first; x4: the new inputs), conv_silu_out's roundings: each
 * channel's sum (conv_sum), then the SiLUs as one group (silu_group: the
 * same bits as mbd_pm_silu, the four chains overlapped), or with PLAIN one
 * conv_silu_out a channel. */
template <int K, bool PLAIN = false>
__device__ __forceinline__ void conv_out4(const float (&wk)[4][K], const float4 (&win)[K - 1],
                                          float4 x4, bool has_bias, const float (&b)[4],
                                          float (&o)[4]) {
  const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
  for (int e = 0; e < 4; e++) {
    float wn[K - 1];
#pragma unroll
    for (int j = 0; j < K - 1; j++) wn[j] = ((const float *)&win[j])[e];
    o[e] = PLAIN ? conv_silu_out<K>(wk[e], wn, xv[e], has_bias, b[e])
                 : conv_sum<K>(wk[e], wn, xv[e], has_bias, b[e]);
  }
  if constexpr (!PLAIN) silu_group<4>(o);
}

/* Four outputs rounded to ActT, stored as one access. */
template <typename ActT>
__device__ __forceinline__ void conv_st_act4(ActT *p, const float (&o)[4]) {
  alignas(4 * sizeof(ActT)) ActT h[4];
#pragma unroll
  for (int e = 0; e < 4; e++) st_act(h + e, o[e]);
  if constexpr (sizeof(ActT) == 4)
    *(float4 *)p = *(const float4 *)h;
  else
    *(uint2 *)p = *(const uint2 *)h;
}

/* The decode step (T = 1) where every row and pointer allows 16-byte
 * accesses (conv_vec): k_conv_silu's one-step work, four consecutive
 * channels of one sequence per thread, each tap row, the input, the outputs
 * and the window written back moved 16 bytes at a time. The outputs are
 * conv_out4's (PLAIN: one conv_silu_out a channel, as k_conv_silu), and the
 * window advances in place the same way. */
#define CONV_STEP_BT 128 /* threads per block: 512 channels */

template <int K, bool PLAIN, typename ActT>
__global__ void __launch_bounds__(CONV_STEP_BT)
    k_conv_step4(int di, const float *__restrict__ xz, int64_t ldxz, const float *__restrict__ w,
                 const float *__restrict__ bias, float *__restrict__ conv_state,
                 int64_t slot_stride, const int32_t *__restrict__ slots, float *__restrict__ xc,
                 ActT *__restrict__ xc_act, bool early) {
  const int c = 4 * (blockIdx.x * CONV_STEP_BT + threadIdx.x);
  const int s = blockIdx.y;
  float wk[4][K], b[4];
  conv_w4<K>(w, bias, di, c < di ? c : di - 4, wk, b); /* before the wait */
  pdl_enter(early);
  if (c >= di) return;
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  float4 win4[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; j++) win4[j] = *(const float4 *)(st + (int64_t)j * di);
  const float4 x4 = *(const float4 *)(xz + (int64_t)s * ldxz + c);
  float v[4];
  conv_out4<K, PLAIN>(wk, win4, x4, bias != nullptr, b, v);
  const int64_t o = (int64_t)s * di + c;
  *(float4 *)(xc + o) = make_float4(v[0], v[1], v[2], v[3]);
  if (xc_act) conv_st_act4<ActT>(xc_act + o, v);
#pragma unroll
  for (int j = 0; j + 1 < K - 1; j++) *(float4 *)(st + (int64_t)j * di) = win4[j + 1];
  *(float4 *)(st + (int64_t)(K - 2) * di) = x4;
}

/* Whether k_conv_step4 and k_conv_tile may run: every row start and pointer
 * 16-byte aligned (xc_act: 4 elements aligned). */
static bool conv_vec(int di, const float *xz, int64_t ldxz, const float *w,
                          const float *bias, const float *conv_state, int64_t slot_stride,
                          const float *xc, const void *xc_act, size_t act_size) {
  const auto al = [](const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; };
  return di % 4 == 0 && ldxz % 4 == 0 && slot_stride % 4 == 0 && al(xz, 16) && al(w, 16) &&
         al(bias, 16) && al(conv_state, 16) && al(xc, 16) && al(xc_act, 4 * act_size);
}

/* The prefill (T > 1) as tiles, where every row and pointer allows 16-byte
 * accesses (conv_vec): a block of CONV_WARPS warps stages CONV_TT
 * steps of 128 channels of one sequence, and the K - 1 inputs before them
 * (the slot's state for the first tile), into shared memory with cp.async,
 * every copy in flight at once; then warp y computes steps y CONV_TT /
 * CONV_WARPS .. of the tile from there, four channels a thread, the window
 * in registers, each step's outputs conv_out4's (the SiLUs as a group: the
 * chains of dependent SiLUs, not the bytes, set this kernel's pace). The
 * state is handled as k_conv_silu does: the first tile's block reads it
 * while staging and writes the new state after the barrier that ends the
 * staging, so its reads of the old state are done. */
#define CONV_TT 32   /* steps per tile */
#define CONV_WARPS 4 /* warps per tile block */

template <int K, typename ActT>
__global__ void __launch_bounds__(32 * CONV_WARPS)
    k_conv_tile(int T, int di, const float *__restrict__ xz, int64_t ldxz,
                const float *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ conv_state, int64_t slot_stride,
                const int32_t *__restrict__ slots, float *__restrict__ xc,
                ActT *__restrict__ xc_act, bool early) {
  constexpr int ROWS = CONV_TT + K - 1, SUB = CONV_TT / CONV_WARPS;
  __shared__ float4 tile[ROWS][32]; /* row r: step t0 - (K - 1) + r */
  const int qx = threadIdx.x, wy = threadIdx.y, s = blockIdx.z, t0 = blockIdx.y * CONV_TT;
  const int c = 4 * (blockIdx.x * 32 + qx);
  float wk[4][K], b[4];
  conv_w4<K>(w, bias, di, c < di ? c : di - 4, wk, b); /* before the wait */
  pdl_enter(early);
  const int t1 = min(T, t0 + CONV_TT);
  const bool live = c < di;
  const int64_t base = (int64_t)s * T;
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  if (live)
    for (int r = wy; r < ROWS; r += CONV_WARPS) {
      const int t = t0 - (K - 1) + r;
      if (t >= t1) break;
      cp_async16(&tile[r][qx], t < 0 ? st + (int64_t)(t + K - 1) * di : xz + (base + t) * ldxz + c);
    }
  cp_async_wait_all();
  __syncthreads();
  if (!live) return;
  const int ts = t0 + wy * SUB;
  float4 win[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; j++) win[j] = tile[ts - t0 + j][qx];
  float *yo = xc + (base + ts) * di + c;
  ActT *ya = xc_act ? xc_act + (base + ts) * di + c : nullptr;
#pragma unroll 4
  for (int i = 0; i < SUB; i++) {
    if (ts + i >= t1) break;
    const float4 x4 = tile[ts - t0 + i + K - 1][qx];
    float o[4];
    conv_out4<K>(wk, win, x4, bias != nullptr, b, o);
#pragma unroll
    for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
    win[K - 2] = x4;
    *(float4 *)yo = make_float4(o[0], o[1], o[2], o[3]);
    yo += di;
    if (ya) {
      conv_st_act4<ActT>(ya, o);
      ya += di;
    }
  }
  if (blockIdx.y != 0 || wy != 0) return;
  /* The new state: the last K - 1 inputs, the old state's newest rows first
   * when T < K - 1 (row j + T is read before it is overwritten). */
  const float *xe = xz + (base + T) * ldxz + c; /* one past the last row */
#pragma unroll
  for (int j = 0; j < K - 1; j++)
    *(float4 *)(st + (int64_t)j * di) = j + T < K - 1
                                            ? *(const float4 *)(st + (int64_t)(j + T) * di)
                                            : *(const float4 *)(xe - (int64_t)(K - 1 - j) * ldxz);
}

/* The kernel a launch runs. Each choice gives the same bits; the benches
 * and tests override the default through two variables, read at each
 * launch (any other value, or none, keeps the default):
 *   MBD_CONV_PREFILL=old  the prefill (T > 1) on k_conv_silu, not k_conv_tile;
 *   MBD_CONV_STEP=old     the decode step (T = 1) on k_conv_silu, not k_conv_step4;
 *   MBD_CONV_STEP=plain   k_conv_step4 with one mbd_pm_silu per channel, not
 *                         silu_group.
 * Without 16-byte rows and pointers (vec false) every launch takes
 * k_conv_silu. */
enum conv_kernel { CONV_K_SILU, CONV_K_TILE, CONV_K_STEP4, CONV_K_STEP4_PLAIN };

static conv_kernel conv_pick(int T, bool vec) {
  if (!vec) return CONV_K_SILU;
  const char *e = getenv(T == 1 ? "MBD_CONV_STEP" : "MBD_CONV_PREFILL");
  if (e && !strcmp(e, "old")) return CONV_K_SILU;
  if (T > 1) return CONV_K_TILE;
  return e && !strcmp(e, "plain") ? CONV_K_STEP4_PLAIN : CONV_K_STEP4;
}

template <int K, typename ActT>
static int conv_launch(cudaStream_t s, int nseq, int T, int di, const float *xz, int64_t ldxz,
                       const float *w, const float *bias, float *conv_state, int64_t slot_stride,
                       const int32_t *slots, float *xc, ActT *xc_act, mbd_error *err) {
  const bool vec =
      conv_vec(di, xz, ldxz, w, bias, conv_state, slot_stride, xc, xc_act, sizeof(ActT));
  const dim3 step_grid((unsigned)((di / 4 + CONV_STEP_BT - 1) / CONV_STEP_BT), (unsigned)nseq);
  switch (conv_pick(T, vec)) {
  case CONV_K_TILE:
    return launch_pdl("conv_silu (tile)", k_conv_tile<K, ActT>,
                      dim3((unsigned)((di / 4 + 31) / 32), (unsigned)((T + CONV_TT - 1) / CONV_TT),
                           (unsigned)nseq),
                      dim3(32, CONV_WARPS), 0, s, err, T, di, xz, ldxz, w, bias, conv_state,
                      slot_stride, slots, xc, xc_act, pdl_early());
  case CONV_K_STEP4:
    return launch_pdl("conv_silu (step)", k_conv_step4<K, false, ActT>, step_grid,
                      dim3(CONV_STEP_BT), 0, s, err, di, xz, ldxz, w, bias, conv_state,
                      slot_stride, slots, xc, xc_act, pdl_early());
  case CONV_K_STEP4_PLAIN:
    return launch_pdl("conv_silu (step)", k_conv_step4<K, true, ActT>, step_grid,
                      dim3(CONV_STEP_BT), 0, s, err, di, xz, ldxz, w, bias, conv_state,
                      slot_stride, slots, xc, xc_act, pdl_early());
  case CONV_K_SILU: break;
  }
  return conv_silu_launch<K, ActT>(s, nseq, T, di, xz, ldxz, w, bias, conv_state, slot_stride,
                                   slots, xc, xc_act, err);
}

extern "C" int mbd_mops_conv_silu(void *stream, int nseq, int T, int di, int K, const float *xz,
                                  int64_t ldxz, const float *w, const float *bias,
                                  float *conv_state, int64_t slot_stride, const int32_t *slots,
                                  float *xc, mbd_dtype act, void *xc_act, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (nseq > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "conv_silu: %d sequences > 65535", nseq);
  if (di <= 0 || (T + CONV_SEG - 1) / CONV_SEG > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "conv_silu: d_inner %d or %d tokens out of range",
                         di, T);
  cudaStream_t s = (cudaStream_t)stream;
#define CONV_K(KK, T_)                                                                      \
  case KK:                                                                                  \
    return conv_launch<KK, T_>(s, nseq, T, di, xz, ldxz, w, bias, conv_state, slot_stride,  \
                               slots, xc, (T_ *)xc_act, err);
#define CONV(T_)                                                                            \
  switch (K) {                                                                              \
    CONV_K(2, T_) CONV_K(3, T_) CONV_K(4, T_) CONV_K(5, T_) CONV_K(6, T_) CONV_K(7, T_)     \
    CONV_K(8, T_)                                                                           \
  default: return mbd_error_set(err, MBD_E_INVALID, "conv kernel width %d outside 2..8", K); \
  }
  MBD_ACT_DISPATCH(act, CONV)
#undef CONV
#undef CONV_K
  return 0;
}
