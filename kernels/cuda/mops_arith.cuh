/* The per-element arithmetic of the Mamba-1 model kernels: loads and stores
 * through the activation dtype, SiLU/softplus, the conv step, the x_proj
 * group partial and class tree, the scan step and the RMSNorm scale. The
 * only place each is spelled: the per-op kernels (kernels/cuda/ops/) and the persistent decode kernel
 * (decode_persistent.cu) both call these, so their bits cannot drift apart.
 * Every rounding is an explicit _rn intrinsic (see ops/common.cuh). */
#ifndef MBD_MOPS_ARITH_CUH
#define MBD_MOPS_ARITH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/device/mma_m16n8k16.cuh"
#include "kernels/portable_math.h"

__device__ __forceinline__ float ld_f32(const float *p) { return *p; }
__device__ __forceinline__ float ld_f32(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld_f32(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void st_act(float *p, float v) { *p = v; }
__device__ __forceinline__ void st_act(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st_act(__half *p, float v) { *p = __float2half_rn(v); }

/* x / (1 + exp(-x)) and x > 20 ? x : log1p(exp(x)) (torch's softplus), as
 * mbd_cpu_silu / mbd_cpu_softplus: the same portable functions. */
__device__ __forceinline__ float silu_f(float x) { return mbd_pm_silu(x); }
__device__ __forceinline__ float softplus_f(float x) { return mbd_pm_softplus(x); }

/* Programmatic dependent launch. A decode step is a chain of over a hundred
 * small dependent kernels, so each one's launch latency and prologue (index math,
 * weight loads) is on the critical path. Every model kernel is launched with
 * programmatic stream serialisation: it may start while its predecessor is
 * still running, does only work that reads no predecessor output (weights,
 * index math), then waits in pdl_wait() until the predecessor has completed
 * and its writes are visible. It calls pdl_wait() unconditionally before any
 * early return, so its completion still implies its predecessor's, and the
 * chain stays fully ordered. pdl_trigger() lets the successor's blocks launch
 * early. Both are no-ops when the launch carries no attribute (the chunked
 * scan's; the bits are the same either way). */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/* Hint: pull [p, p + bytes) toward L2 while the predecessor still runs. */
__device__ __forceinline__ void prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

/* One causal conv + SiLU output, mbd_cpu_conv_step's arithmetic: the window
 * taps (oldest first) in ascending order, then the new input, then the bias.
 * The only place that arithmetic is spelled: k_conv_silu (prefill) and the
 * decode fusion (k_conv_xproj, k_scan_step with KC > 0) all call it, so their
 * bits cannot drift apart. */
template <int K>
__device__ __forceinline__ float conv_silu_out(const float (&wk)[K], const float (&win)[K - 1],
                                               float xv, bool has_bias, float b) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < K - 1; j++) acc = __fmaf_rn(wk[j], win[j], acc);
  acc = __fmaf_rn(wk[K - 1], xv, acc);
  if (has_bias) acc = __fadd_rn(acc, b);
  return silu_f(acc);
}

#define XP_ROWS 4     /* decode rows a fused block runs (the persistent kernel's rows) */
#define XP_GW 16      /* channels per x_proj group: one k16 step */
#define XP_CLASSES 32 /* lane classes: group g is in class g % 32 */

/* The 16-bit x_proj contract (docs/route.md, "Model kernels"):
 *   p_g   = mma.m16n8k16 (f32 accumulate, C = +0) over the 16 products
 *           x[r, 16 g + j] * w[o, 16 g + j] (storage dtype, zeros past K);
 *   S_c   = +0, then S_c = S_c + p_g for g = c, c + 32, ... ascending;
 *   out   = the xor butterfly 16, 8, 4, 2, 1 over S_0..S_31.
 * The butterfly is a fixed binary tree: its leaves, in bit-reversed order of
 * the class (0, 16, 8, 24, 4, ...), are added pairwise level by level (every
 * lane of the butterfly ends with its bits, a + b == b + a). So a warp may
 * complete classes one at a time in leaf order and fold them with a binary
 * counter (xp_tree_push), and warps owning consecutive leaf ranges (whole
 * subtrees) combine their subtree sums in leaf order (xp_tree_fold): the
 * same additions as the butterfly. */

/* The class of leaf i of the tree: i's five bits reversed. */
__host__ __device__ constexpr int xp_leaf_class(int i) {
  return (i & 1) << 4 | (i & 2) << 2 | (i & 4) | (i & 8) >> 2 | (i & 16) >> 4;
}

/* One group's tensor-core partial, the contract's p_g: a single m16n8k16
 * step from zero. a: 16 x 16 operand fragment, b: 16 x 8 operand fragment
 * (mma_m16n8k16.cuh layout; either operand may hold x or w: an m16n8k16
 * step's bits do not depend on the operand roles or on where in the
 * fragment an element sits). p: the 16 x 8 result fragment. */
template <typename T>
__device__ __forceinline__ void xp_group_partial(const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 float (&p)[4]) {
  p[0] = p[1] = p[2] = p[3] = 0.0f;
  mma_op<T>::run(p, a, b);
}

/* Elements k, k + 1 of a 16-bit row of length K as one fragment word (k
 * even; element k in the low half; zeros past K; row NULL: zeros). VEC: K
 * even and the row 4-byte aligned (one 32-bit load). */
template <bool VEC, typename T>
__device__ __forceinline__ uint32_t xp_ld2(const T *row, int k, int K) {
  if (!row || k >= K) return 0u;
  if (VEC) return *(const uint32_t *)(row + k);
  const uint32_t lo = *(const unsigned short *)(row + k);
  const uint32_t hi = k + 1 < K ? *(const unsigned short *)(row + k + 1) : 0u;
  return hi << 16 | lo;
}

/* xp_warp_leaves' fragments from rows in memory (global or shared): the A
 * operand's fragment rows gq, gq + 8 = w rows w0, w1, the B operand's column
 * gq = row xr (gq = lane / 4, t = lane % 4; a NULL row: zeros). */
template <bool VEC, typename T>
struct xp_rows_frag {
  const T *w0, *w1, *xr;
  int K, t;
  __device__ __forceinline__ void operator()(int g, uint32_t (&a)[4], uint32_t (&b)[2]) const {
    const int k = XP_GW * g + 2 * t;
    a[0] = xp_ld2<VEC>(w0, k, K);
    a[1] = xp_ld2<VEC>(w1, k, K);
    a[2] = xp_ld2<VEC>(w0, k + 8, K);
    a[3] = xp_ld2<VEC>(w1, k + 8, K);
    b[0] = xp_ld2<VEC>(xr, k, K);
    b[1] = xp_ld2<VEC>(xr, k + 8, K);
  }
};

/* Pushes v, the sum of leaf i (leaves of a subtree numbered from 0, i
 * known at compile time after unrolling), onto a binary-counter stack of LV
 * levels (s[l]: a pending left subtree of 2^l leaves). After leaf 2^LV - 1,
 * v is the subtree's sum. */
template <int LV, int NV>
__device__ __forceinline__ void xp_tree_push(float (&s)[LV > 0 ? LV : 1][NV], int i,
                                             float (&v)[NV]) {
  bool done = false;
#pragma unroll
  for (int l = 0; l < LV; l++) {
    if (done) continue;
    if ((i >> l) & 1) {
#pragma unroll
      for (int n = 0; n < NV; n++) v[n] = __fadd_rn(s[l][n], v[n]);
    } else {
#pragma unroll
      for (int n = 0; n < NV; n++) s[l][n] = v[n];
      done = true;
    }
  }
}

/* The sum of NS consecutive subtree sums v[0..NS-1] (NS a power of two),
 * adjacent pairs first, level by level: the tree's upper levels. */
template <int NS>
__device__ __forceinline__ float xp_tree_fold(float (&v)[NS]) {
  static_assert(NS >= 1 && (NS & (NS - 1)) == 0, "a power of two");
#pragma unroll
  for (int h = NS / 2; h >= 1; h /= 2)
#pragma unroll
    for (int i = 0; i < NS / 2; i++)
      if (i < h) v[i] = __fadd_rn(v[2 * i], v[2 * i + 1]);
  return v[0];
}

/* One warp's share of the contract for one 16 x 8 fragment of outputs: the
 * LPW leaves leaf0 .. leaf0 + LPW - 1 (a whole subtree: leaf0 a multiple of
 * LPW, a power of two), each class's groups g < ceil(K / 16) ascending.
 * frag(g, a, b) fills group g's operand fragments. v: the subtree's sum, a
 * result fragment. NB groups' fragments are loaded before their steps. */
template <typename T, int LPW, int NB = 4, typename F>
__device__ __forceinline__ void xp_warp_leaves(int leaf0, int K, F frag, float (&v)[4]) {
  constexpr int LV = LPW == 1 ? 0 : LPW == 2 ? 1 : LPW == 4 ? 2 : LPW == 8 ? 3 : LPW == 16 ? 4 : 5;
  static_assert(1 << LV == LPW, "leaves a warp: a power of two up to 32");
  const int ng = (K + XP_GW - 1) / XP_GW;
  float st[LV > 0 ? LV : 1][4];
#pragma unroll
  for (int i = 0; i < LPW; i++) {
    const int c = xp_leaf_class(leaf0 + i);
    float S[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int g0 = c; g0 < ng; g0 += NB * XP_CLASSES) {
      uint32_t a[NB][4], b[NB][2];
#pragma unroll
      for (int u = 0; u < NB; u++)
        if (g0 + u * XP_CLASSES < ng) frag(g0 + u * XP_CLASSES, a[u], b[u]);
#pragma unroll
      for (int u = 0; u < NB; u++)
        if (g0 + u * XP_CLASSES < ng) {
          float p[4];
          xp_group_partial<T>(a[u], b[u], p);
#pragma unroll
          for (int n = 0; n < 4; n++) S[n] = __fadd_rn(S[n], p[n]);
        }
    }
    xp_tree_push<LV, 4>(st, i, S);
    if (i == LPW - 1)
#pragma unroll
      for (int n = 0; n < 4; n++) v[n] = S[n];
  }
}

/* A block of NW warps, warp q holding in v the sum of leaves q * 32 / NW ..
 * (q + 1) * 32 / NW - 1 for the same 16 x 8 result fragment: the outputs,
 * each the fold of the NW subtree sums in warp order, handed to
 * f(e, value) for fragment element e = 4 lane' + n (lane' = e / 4: the
 * owning lane of the fragment, n = e % 4: its register) by threads 0..127.
 * part: shared [NW][4][32]. Ends with the block synchronised. */
template <int NW, typename F>
__device__ __forceinline__ void xp_block_fold(float (*part)[4][32], const float (&v)[4], F f) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int n = 0; n < 4; n++) part[warp][n][lane] = v[n];
  __syncthreads();
  if (tid < 128) {
    const int ln = tid & 31, n = tid >> 5;
    float s[NW];
#pragma unroll
    for (int q = 0; q < NW; q++) s[q] = part[q][n][ln];
    f(4 * ln + n, xp_tree_fold<NW>(s));
  }
  __syncthreads();
}

/* The contract's xor butterfly over the 32 lanes: every lane ends with the
 * same bits (a + b == b + a). */
__device__ __forceinline__ float lane_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

/* Rounds v through the activation dtype (what a GEMM input in that dtype holds). */
template <typename T>
__device__ __forceinline__ float round_act(float v) {
  T t;
  st_act(&t, v);
  return ld_f32(&t);
}

template <int N>
__device__ __forceinline__ void ld_f32x(const float *p, float (&v)[N]) {
#pragma unroll
  for (int n = 0; n < N; n += 4) {
    float4 q = *(const float4 *)(p + n);
    v[n] = q.x, v[n + 1] = q.y, v[n + 2] = q.z, v[n + 3] = q.w;
  }
}

/* The pieces of one channel's scan step, mbd_cpu_scan_step's roundings:
 * dt = softplus(fmaf chain from 0 over k of dt_low[k] * wr[k], + bias), and
 * one state's update h' = fmaf(exp(dt * a), h, (dt * B) * x). */
__device__ __forceinline__ float scan_dt(const float *sd, const float *wr, int R, float bdt) {
  float dt = 0.0f;
#pragma unroll 8
  for (int k = 0; k < R; k++) dt = __fmaf_rn(sd[k], wr[k], dt);
  return softplus_f(__fadd_rn(dt, bdt));
}
__device__ __forceinline__ float scan_state(float dt, float a, float b, float x, float h) {
  const float dA = mbd_pm_expf(__fmul_rn(dt, a));
  return __fmaf_rn(dA, h, __fmul_rn(__fmul_rn(dt, b), x));
}

/* One step of one channel after its dt (scan_dt's): B [N], C [N] its
 * x_proj row's parts; h its state (updated). Returns y before the act
 * rounding: mbd_cpu_scan_step's roundings in its order. */
template <int N>
__device__ __forceinline__ float scan_one_dt(float dt, const float *B, const float *C,
                                             const float (&a)[N], float d, float x, float z,
                                             float (&h)[N]) {
  float acc = 0.0f;
#pragma unroll
  for (int n = 0; n < N; n++) {
    h[n] = scan_state(dt, a[n], B[n], x, h[n]);
    acc = __fmaf_rn(h[n], C[n], acc);
  }
  acc = __fmaf_rn(d, x, acc);
  return __fmul_rn(acc, silu_f(z));
}
/* One step on N lanes of a warp (N divides 32, the channel's lanes aligned),
 * dt from sd = round_act(dt_low) [R] and wr, the channel's dt_proj row
 * (f32), then B, C in sd: lane n updates state n (h: its state), the C chain
 * runs on every lane over the states fetched by shuffles in the same order,
 * so every lane returns scan_one_dt's bits. The N exponentials run side by side instead of on one
 * thread. */
template <int N>
__device__ __forceinline__ float scan_one_lanes(const float *sd, const float *wr, int R, float bdt,
                                                float a, float d, float x, float z, float &h,
                                                int n) {
  const float dt = scan_dt(sd, wr, R, bdt);
  const float *B = sd + R, *C = B + N;
  h = scan_state(dt, a, B[n], x, h);
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < N; m++) acc = __fmaf_rn(__shfl_sync(0xffffffffu, h, m, N), C[m], acc);
  acc = __fmaf_rn(d, x, acc);
  return __fmul_rn(acc, silu_f(z));
}

/* 1 / sqrt(mean(row^2) + eps) with mbd_cpu_rmsnorm's arithmetic: one fmaf
 * chain over the row in ascending order, on one thread (a tree would be
 * faster but would round differently from the reference). The chain is on
 * every layer's critical path, so the next eight quads load while the
 * current eight are chained (one shared-memory latency per 32 elements, not
 * per 4); the order of the fmafs is unchanged. row: 16-byte aligned (shared
 * memory). */
__device__ __forceinline__ void rms_quad(float4 q, float &ss) {
  ss = __fmaf_rn(q.x, q.x, ss);
  ss = __fmaf_rn(q.y, q.y, ss);
  ss = __fmaf_rn(q.z, q.z, ss);
  ss = __fmaf_rn(q.w, q.w, ss);
}
__device__ __forceinline__ float rms_inv(const float *row, int d, float eps) {
  const float4 *row4 = (const float4 *)row;
  const int nq = d / 4;
  float ss = 0.0f;
  int i = 0;
  if (nq >= 8) {
    float4 q[8];
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = row4[j];
    for (; i + 16 <= nq; i += 8) {
      float4 nx[8];
#pragma unroll
      for (int j = 0; j < 8; j++) nx[j] = row4[i + 8 + j];
#pragma unroll
      for (int j = 0; j < 8; j++) rms_quad(q[j], ss);
#pragma unroll
      for (int j = 0; j < 8; j++) q[j] = nx[j];
    }
#pragma unroll
    for (int j = 0; j < 8; j++) rms_quad(q[j], ss);
    i += 8;
  }
  for (; i < nq; i++) rms_quad(row4[i], ss);
  for (int c = 4 * nq; c < d; c++) ss = __fmaf_rn(row[c], row[c], ss);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
}
/* The 16-bit routes' RMSNorm scale, on one warp: lane l runs the fmaf chain
 * from 0 over c = l, l + 32, ... (c < d), the 32 lane sums are added by the
 * xor butterfly (lane_sum), then rms_inv's last three roundings. Every lane
 * returns the same bits. f32 routes keep rms_inv, the CPU model's chain;
 * 16-bit routes are not compared with the CPU, and a serial chain over
 * d_model sits on every layer's critical path of a batch-1 decode. */
__device__ __forceinline__ float rms_inv_lanes(const float *row, int d, float eps, int lane) {
  float ss = 0.0f;
#pragma unroll 1
  for (int c0 = lane; c0 < d; c0 += 256) { /* eight loads, then their eight fmafs */
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = c0 + 32 * j < d ? row[c0 + 32 * j] : 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (c0 + 32 * j < d) ss = __fmaf_rn(v[j], v[j], ss);
  }
  ss = lane_sum(ss);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
}
/* rms_inv (f32 routes, on one thread) or rms_inv_lanes (16-bit routes, on a
 * warp) by the activation dtype T: every lane of the calling warp returns it. */
template <typename T>
__device__ __forceinline__ float rms_inv_route(const float *row, int d, float eps, int lane) {
  if constexpr (sizeof(T) == 4) {
    float v = 0.0f;
    if (lane == 0) v = rms_inv(row, d, eps);
    return __shfl_sync(0xffffffffu, v, 0);
  } else {
    return rms_inv_lanes(row, d, eps, lane);
  }
}
/* One normalised element: w * (x * rinv), before the activation rounding. */
__device__ __forceinline__ float rms_out(float w, float x, float rinv) {
  return __fmul_rn(w, __fmul_rn(x, rinv));
}

#endif
