/* Causal depthwise conv + SiLU, prefill and decode (see conv_silu.h).
 * Where rows and pointers allow 16-byte accesses the prefill runs
 * k_conv_tile (or k_conv_seg, for the benches) and the decode step
 * k_conv_step4 (four channels a thread); otherwise k_conv_silu, which
 * MBD_CONV_PREFILL=old also selects for the prefill. Each output has
 * conv_silu_out's roundings (its sum and mbd_pm_silu, or silu_group's
 * grouped SiLUs with the same bits). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/cp_async.cuh"
#include "kernels/cuda/ops/silu_group.cuh"

#include <stdio.h>
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

/* The decode step (T = 1) where every row and pointer allows 16-byte
 * accesses (conv_step_vec): k_conv_silu's one-step work, four consecutive
 * channels of one sequence per thread, each tap row, the input, the outputs
 * and the window written back moved 16 bytes at a time. Each channel's
 * output is conv_silu_out's, as in k_conv_silu, and the window advances in
 * place the same way. */
#define CONV_STEP_BT 128 /* threads per block: 512 channels */

template <int K, typename ActT>
__global__ void __launch_bounds__(CONV_STEP_BT)
    k_conv_step4(int di, const float *__restrict__ xz, int64_t ldxz, const float *__restrict__ w,
                 const float *__restrict__ bias, float *__restrict__ conv_state,
                 int64_t slot_stride, const int32_t *__restrict__ slots, float *__restrict__ xc,
                 ActT *__restrict__ xc_act, bool early) {
  const int c = 4 * (blockIdx.x * CONV_STEP_BT + threadIdx.x);
  const int s = blockIdx.y;
  const int cw = c < di ? c : di - 4;
  float wk[4][K], b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < K; j++) { /* weights: before the wait */
    const float4 q = *(const float4 *)(w + (int64_t)j * di + cw);
    wk[0][j] = q.x, wk[1][j] = q.y, wk[2][j] = q.z, wk[3][j] = q.w;
  }
  if (bias) {
    const float4 q = *(const float4 *)(bias + cw);
    b[0] = q.x, b[1] = q.y, b[2] = q.z, b[3] = q.w;
  }
  pdl_enter(early);
  if (c >= di) return;
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  float4 win4[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; j++) win4[j] = *(const float4 *)(st + (int64_t)j * di);
  const float4 x4 = *(const float4 *)(xz + (int64_t)s * ldxz + c);
  const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float win[K - 1];
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = ((const float *)&win4[j])[i];
    v[i] = conv_silu_out<K>(wk[i], win, xv[i], bias != nullptr, b[i]);
  }
  const int64_t o = (int64_t)s * di + c;
  *(float4 *)(xc + o) = make_float4(v[0], v[1], v[2], v[3]);
  if (xc_act) {
    alignas(4 * sizeof(ActT)) ActT h[4];
#pragma unroll
    for (int i = 0; i < 4; i++) st_act(h + i, v[i]);
    if constexpr (sizeof(ActT) == 4)
      *(float4 *)(xc_act + o) = *(const float4 *)h;
    else
      *(uint2 *)(xc_act + o) = *(const uint2 *)h;
  }
#pragma unroll
  for (int j = 0; j + 1 < K - 1; j++) *(float4 *)(st + (int64_t)j * di) = win4[j + 1];
  *(float4 *)(st + (int64_t)(K - 2) * di) = x4;
}

/* Whether k_conv_step4 may run: every row start and pointer 16-byte aligned
 * (xc_act: 4 elements aligned). */
static bool conv_step_vec(int di, const float *xz, int64_t ldxz, const float *w,
                          const float *bias, const float *conv_state, int64_t slot_stride,
                          const float *xc, const void *xc_act, size_t act_size) {
  const auto al = [](const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; };
  return di % 4 == 0 && ldxz % 4 == 0 && slot_stride % 4 == 0 && al(xz, 16) && al(w, 16) &&
         al(bias, 16) && al(conv_state, 16) && al(xc, 16) && al(xc_act, 4 * act_size);
}

/* The prefill (T > 1) where every row and pointer allows 16-byte accesses
 * (conv_step_vec): V consecutive channels per thread (4, as k_conv_step4;
 * or 2), and a time segment of seg_len steps that the thread walks with its
 * window in registers, so each input row is read about once (the K - 1
 * rows before a segment also by the segment before it, mostly from cache).
 * A warp takes 32 V channels of one segment (512 contiguous bytes a row at
 * V = 4); a block, the same channels over CONV_SEGS consecutive segments.
 * The loads of the next P steps are issued before the current P steps are
 * computed, so a thread keeps P vector loads in flight while the SiLUs run.
 * Each channel's output is conv_silu_out's, as in k_conv_silu (window taps
 * in ascending order, the new input, then the bias), and the state is
 * handled the same way: only the first segment's thread reads it, and it
 * writes the new state last. */
#define CONV_SEGS 4 /* warps per block, one segment each */

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

/* V outputs of one step, conv_silu_out's roundings: each channel's sum
 * (conv_sum), then the SiLU: mbd_pm_silu's, per value (FD false) or as a
 * group (silu_group, the same bits with the V chains overlapped). */
template <int K, int V, bool FD>
__device__ __forceinline__ void conv_outs(const float (&wk)[V][K], const float (&win)[K - 1][V],
                                          const float (&xv)[V], bool has_bias,
                                          const float (&b)[V], float (&o)[V]) {
#pragma unroll
  for (int e = 0; e < V; e++) {
    float w1[K - 1];
#pragma unroll
    for (int j = 0; j < K - 1; j++) w1[j] = win[j][e];
    o[e] = FD ? conv_sum<K>(wk[e], w1, xv[e], has_bias, b[e])
              : conv_silu_out<K>(wk[e], w1, xv[e], has_bias, b[e]);
  }
  if constexpr (FD) silu_group<V>(o);
}

/* V consecutive floats (V = 2 or 4) moved as one 8- or 16-byte access. */
template <int V>
struct convv {
  float f[V];
  __device__ __forceinline__ static convv ld(const float *p) {
    convv r;
    if constexpr (V == 4) {
      const float4 q = *(const float4 *)p;
      r.f[0] = q.x, r.f[1] = q.y, r.f[2] = q.z, r.f[3] = q.w;
    } else {
      const float2 q = *(const float2 *)p;
      r.f[0] = q.x, r.f[1] = q.y;
    }
    return r;
  }
  __device__ __forceinline__ static convv zero() {
    convv r;
#pragma unroll
    for (int e = 0; e < V; e++) r.f[e] = 0.0f;
    return r;
  }
  __device__ __forceinline__ void st(float *p) const {
    if constexpr (V == 4)
      *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
    else
      *(float2 *)p = make_float2(f[0], f[1]);
  }
};

/* V values rounded to ActT, stored as one access of V elements. */
template <int V, typename ActT>
__device__ __forceinline__ void st_actv(ActT *p, const float (&v)[V]) {
  alignas(V * sizeof(ActT)) ActT h[V];
#pragma unroll
  for (int e = 0; e < V; e++) st_act(h + e, v[e]);
  if constexpr (V * sizeof(ActT) == 16)
    *(float4 *)p = *(const float4 *)h;
  else if constexpr (V * sizeof(ActT) == 8)
    *(uint2 *)p = *(const uint2 *)h;
  else
    *(uint32_t *)p = *(const uint32_t *)h;
}

template <int K, int P, int V, bool FD, typename ActT>
__global__ void __launch_bounds__(32 * CONV_SEGS)
    k_conv_seg(int T, int di, int seg_len, const float *__restrict__ xz, int64_t ldxz,
               const float *__restrict__ w, const float *__restrict__ bias,
               float *__restrict__ conv_state, int64_t slot_stride,
               const int32_t *__restrict__ slots, float *__restrict__ xc,
               ActT *__restrict__ xc_act, bool early) {
  using vec = convv<V>;
  const int c = V * (blockIdx.x * 32 + threadIdx.x);
  const int seg = blockIdx.y * CONV_SEGS + threadIdx.y, s = blockIdx.z;
  const int cw = c < di ? c : di - V;
  float wk[V][K], b[V];
#pragma unroll
  for (int j = 0; j < K; j++) { /* weights: before the wait */
    const vec q = vec::ld(w + (int64_t)j * di + cw);
#pragma unroll
    for (int e = 0; e < V; e++) wk[e][j] = q.f[e];
  }
  const vec bq = bias ? vec::ld(bias + cw) : vec::zero();
#pragma unroll
  for (int e = 0; e < V; e++) b[e] = bq.f[e];
  pdl_enter(early);
  const int t0 = seg * seg_len;
  if (c >= di || t0 >= T) return;
  const int t1 = min(T, t0 + seg_len);
  const int64_t row0 = (int64_t)s * T + t0; /* the segment's first row */
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  const float *xp = xz + row0 * ldxz + c;
  /* buf[0 .. K-2]: the window (oldest first); buf[K-1 ..]: the group's inputs */
  vec buf[K - 1 + P], nx[P];
  if (seg == 0) {
#pragma unroll
    for (int j = 0; j < K - 1; j++) buf[j] = vec::ld(st + (int64_t)j * di);
  } else {
#pragma unroll
    for (int j = 0; j < K - 1; j++) buf[j] = vec::ld(xp - (int64_t)(K - 1 - j) * ldxz);
  }
#pragma unroll
  for (int i = 0; i < P; i++) nx[i] = t0 + i < t1 ? vec::ld(xp + (int64_t)i * ldxz) : vec::zero();
  float *yo = xc + row0 * di + c;
  ActT *ya = xc_act ? xc_act + row0 * di + c : nullptr;
  for (int t = t0; t < t1; t += P) {
#pragma unroll
    for (int i = 0; i < P; i++) buf[K - 1 + i] = nx[i];
    xp += P * ldxz;
#pragma unroll
    for (int i = 0; i < P; i++) /* the next group's inputs, before this group's work */
      nx[i] = t + P + i < t1 ? vec::ld(xp + (int64_t)i * ldxz) : vec::zero();
#pragma unroll
    for (int i = 0; i < P; i++) {
      if (t + i >= t1) break;
      vec o;
      float win[K - 1][V];
#pragma unroll
      for (int j = 0; j < K - 1; j++)
#pragma unroll
        for (int e = 0; e < V; e++) win[j][e] = buf[i + j].f[e];
      conv_outs<K, V, FD>(wk, win, buf[i + K - 1].f, bias != nullptr, b, o.f);
      o.st(yo);
      yo += di;
      if (ya) {
        st_actv<V>(ya, o.f);
        ya += di;
      }
    }
#pragma unroll
    for (int j = 0; j < K - 1; j++) buf[j] = buf[P + j];
  }
  if (seg != 0) return;
  /* The new state: the last K - 1 inputs, the old state's newest rows first
   * when T < K - 1 (row j + T is read before it is overwritten). */
  const float *xe = xz + ((int64_t)s * T + T) * ldxz + c; /* one past the last row */
#pragma unroll
  for (int j = 0; j < K - 1; j++) {
    const vec q = j + T < K - 1 ? vec::ld(st + (int64_t)(j + T) * di)
                                : vec::ld(xe - (int64_t)(K - 1 - j) * ldxz);
    q.st(st + (int64_t)j * di);
  }
}

/* The prefill as tiles (the default, TT = 32: conv_prefill_launch): a
 * block of CONV_SEGS warps stages TT steps of 128 channels of one sequence,
 * and the K - 1 inputs before them (the slot's state for the first tile),
 * into shared memory with cp.async, every copy in flight at once, then warp
 * y computes steps y TT / 4 .. of the tile from there, the window in
 * registers, GS steps' SiLUs at a time (a group with FD: silu_group); the
 * same outputs as k_conv_seg. The first tile's
 * block writes the new state after the barrier that ends the staging, so
 * its reads of the old state are done. */
template <int K, int TT, bool FD, int GS, typename ActT>
__global__ void __launch_bounds__(32 * CONV_SEGS)
    k_conv_tile(int T, int di, const float *__restrict__ xz, int64_t ldxz,
                const float *__restrict__ w, const float *__restrict__ bias,
                float *__restrict__ conv_state, int64_t slot_stride,
                const int32_t *__restrict__ slots, float *__restrict__ xc,
                ActT *__restrict__ xc_act, bool early) {
  using vec = convv<4>;
  constexpr int ROWS = TT + K - 1, SUB = TT / CONV_SEGS;
  __shared__ float4 tile[ROWS][32]; /* row r: step t0 - (K - 1) + r */
  const int qx = threadIdx.x, wy = threadIdx.y, s = blockIdx.z, t0 = blockIdx.y * TT;
  const int c = 4 * (blockIdx.x * 32 + qx), cw = c < di ? c : di - 4;
  float wk[4][K], b[4];
#pragma unroll
  for (int j = 0; j < K; j++) { /* weights: before the wait */
    const vec q = vec::ld(w + (int64_t)j * di + cw);
#pragma unroll
    for (int e = 0; e < 4; e++) wk[e][j] = q.f[e];
  }
  const vec bq = bias ? vec::ld(bias + cw) : vec::zero();
#pragma unroll
  for (int e = 0; e < 4; e++) b[e] = bq.f[e];
  pdl_enter(early);
  const int t1 = min(T, t0 + TT);
  const bool live = c < di;
  const int64_t base = (int64_t)s * T;
  float *st = conv_state + (int64_t)slots[s] * slot_stride + c;
  if (live)
    for (int r = wy; r < ROWS; r += CONV_SEGS) {
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
  for (int i = 0; i < SUB; i += GS) {
    if (ts + i >= t1) break;
    /* GS steps' sums (the rows past t1 hold no input: their outputs are
     * computed but not stored), then their SiLUs as one group */
    float o[GS * 4];
#pragma unroll
    for (int u = 0; u < GS; u++) {
      const float4 x4 = tile[ts - t0 + i + u + K - 1][qx];
      const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float wn[K - 1];
#pragma unroll
        for (int j = 0; j < K - 1; j++) wn[j] = ((const float *)&win[j])[e];
        o[u * 4 + e] = FD ? conv_sum<K>(wk[e], wn, xv[e], bias != nullptr, b[e])
                          : conv_silu_out<K>(wk[e], wn, xv[e], bias != nullptr, b[e]);
      }
#pragma unroll
      for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
      win[K - 2] = x4;
    }
    if constexpr (FD) silu_group<GS * 4>(o);
#pragma unroll
    for (int u = 0; u < GS; u++) {
      if (ts + i + u >= t1) break;
      const float(&ou)[4] = *(const float(*)[4])(o + 4 * u);
      vec ov;
#pragma unroll
      for (int e = 0; e < 4; e++) ov.f[e] = ou[e];
      ov.st(yo);
      yo += di;
      if (ya) {
        st_actv<4>(ya, ov.f);
        ya += di;
      }
    }
  }
  if (blockIdx.y != 0 || wy != 0) return;
  /* the new state, as k_conv_seg writes it */
  const float *xe = xz + (base + T) * ldxz + c;
#pragma unroll
  for (int j = 0; j < K - 1; j++) {
    const vec q = j + T < K - 1 ? vec::ld(st + (int64_t)(j + T) * di)
                                : vec::ld(xe - (int64_t)(K - 1 - j) * ldxz);
    q.st(st + (int64_t)j * di);
  }
}

template <int K, int TT, bool FD, int GS, typename ActT>
static int conv_tile_launch(cudaStream_t s, int nseq, int T, int di, const float *xz,
                            int64_t ldxz, const float *w, const float *bias, float *conv_state,
                            int64_t slot_stride, const int32_t *slots, float *xc, ActT *xc_act,
                            mbd_error *err) {
  const dim3 grid((unsigned)((di / 4 + 31) / 32), (unsigned)((T + TT - 1) / TT), (unsigned)nseq);
  return launch_pdl("conv_silu (tile)", k_conv_tile<K, TT, FD, GS, ActT>, grid,
                    dim3(32, CONV_SEGS), 0, s, err, T, di, xz, ldxz, w, bias, conv_state,
                    slot_stride, slots, xc, xc_act, pdl_early());
}

template <int K, int V, bool FD, typename ActT>
static int conv_seg_launch(cudaStream_t s, int nseq, int T, int di, int seg_len, const float *xz,
                           int64_t ldxz, const float *w, const float *bias, float *conv_state,
                           int64_t slot_stride, const int32_t *slots, float *xc, ActT *xc_act,
                           mbd_error *err) {
  const int nsegs = (T + seg_len - 1) / seg_len;
  const dim3 grid((unsigned)((di / V + 31) / 32), (unsigned)((nsegs + CONV_SEGS - 1) / CONV_SEGS),
                  (unsigned)nseq);
  return launch_pdl("conv_silu (seg)", k_conv_seg<K, 8, V, FD, ActT>, grid,
                    dim3(32, CONV_SEGS), 0, s, err, T, di, seg_len, xz, ldxz, w, bias,
                    conv_state, slot_stride, slots, xc, xc_act, pdl_early());
}

/* The prefill kernel: k_conv_tile with tiles of 32 steps (the fastest
 * measured: 1.3b b8 chunk 39.5 us, k_conv_silu 40.9), or, at width 4 (the
 * models'), what MBD_CONV_PREFILL asks for (same bits, for the benches):
 * "t64" (tiles of 64 steps), "s<steps>" (k_conv_seg with segments of 8, 16,
 * 32 or 64 steps, 4 channels a thread), "s<steps>v2" (2 channels a thread),
 * each with a "g" appended for grouped SiLUs (silu_group: t32g, s16v2g),
 * "t32g8" (two steps' SiLUs a group); "old" keeps k_conv_silu (returns 0).
 * Read at each launch. */
template <int K, typename ActT>
static int conv_prefill_launch(cudaStream_t s, int nseq, int T, int di, const float *xz,
                               int64_t ldxz, const float *w, const float *bias,
                               float *conv_state, int64_t slot_stride, const int32_t *slots,
                               float *xc, ActT *xc_act, bool *taken, mbd_error *err) {
  const char *e = getenv("MBD_CONV_PREFILL");
  *taken = !(e && !strcmp(e, "old"));
  if (!*taken) return 0;
#define CONV_ARGS xz, ldxz, w, bias, conv_state, slot_stride, slots, xc, xc_act, err
  if constexpr (K == 4) {
    int sl = 0;
    const bool g = e && strchr(e, 'g');
    if (e && !strcmp(e, "t64"))
      return conv_tile_launch<K, 64, false, 1, ActT>(s, nseq, T, di, CONV_ARGS);
    if (e && !strcmp(e, "t32"))
      return conv_tile_launch<K, 32, false, 1, ActT>(s, nseq, T, di, CONV_ARGS);
    if (e && !strcmp(e, "t32g8"))
      return conv_tile_launch<K, 32, true, 2, ActT>(s, nseq, T, di, CONV_ARGS);
    if (e && sscanf(e, "s%d", &sl) == 1 && (sl == 8 || sl == 16 || sl == 32 || sl == 64)) {
      if (strstr(e, "v2"))
        return g ? conv_seg_launch<K, 2, true, ActT>(s, nseq, T, di, sl, CONV_ARGS)
                 : conv_seg_launch<K, 2, false, ActT>(s, nseq, T, di, sl, CONV_ARGS);
      return g ? conv_seg_launch<K, 4, true, ActT>(s, nseq, T, di, sl, CONV_ARGS)
               : conv_seg_launch<K, 4, false, ActT>(s, nseq, T, di, sl, CONV_ARGS);
    }
    return conv_tile_launch<K, 32, true, 1, ActT>(s, nseq, T, di, CONV_ARGS);
  }
  return conv_tile_launch<K, 32, false, 1, ActT>(s, nseq, T, di, CONV_ARGS);
#undef CONV_ARGS
}

template <int K, typename ActT>
static int conv_step4_launch(cudaStream_t s, int nseq, int di, const float *xz, int64_t ldxz,
                             const float *w, const float *bias, float *conv_state,
                             int64_t slot_stride, const int32_t *slots, float *xc, ActT *xc_act,
                             mbd_error *err) {
  const dim3 grid((unsigned)((di / 4 + CONV_STEP_BT - 1) / CONV_STEP_BT), (unsigned)nseq);
  return launch_pdl("conv_silu (step)", k_conv_step4<K, ActT>, grid, dim3(CONV_STEP_BT), 0, s,
                    err, di, xz, ldxz, w, bias, conv_state, slot_stride, slots, xc, xc_act,
                    pdl_early());
}

template <int K, typename ActT>
static int conv_launch(cudaStream_t s, int nseq, int T, int di, const float *xz, int64_t ldxz,
                       const float *w, const float *bias, float *conv_state, int64_t slot_stride,
                       const int32_t *slots, float *xc, ActT *xc_act, mbd_error *err) {
  if (conv_step_vec(di, xz, ldxz, w, bias, conv_state, slot_stride, xc, xc_act,
                    sizeof(ActT))) {
    if (T == 1)
      return conv_step4_launch<K, ActT>(s, nseq, di, xz, ldxz, w, bias, conv_state, slot_stride,
                                        slots, xc, xc_act, err);
    bool taken;
    const int rc = conv_prefill_launch<K, ActT>(s, nseq, T, di, xz, ldxz, w, bias, conv_state,
                                                slot_stride, slots, xc, xc_act, &taken, err);
    if (taken) return rc;
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
