/* The per-element arithmetic of the Mamba-1 model kernels: loads and stores
 * through the activation dtype, SiLU/softplus, the conv step, the x_proj lane
 * chain, the scan step and the RMSNorm scale. The only place each is spelled:
 * the per-op kernels (kernels/cuda/ops/) and the persistent decode kernel
 * (decode_persistent.cu) both call these, so their bits cannot drift apart.
 * Every rounding is an explicit _rn intrinsic (see ops/common.cuh). */
#ifndef MBD_MOPS_ARITH_CUH
#define MBD_MOPS_ARITH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

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

/* Eight consecutive elements k..k+7 widened to f32; one 16- or 32-byte
 * vector load when the row allows it (VEC), element loads otherwise: the same
 * values either way. */
template <bool VEC, typename T>
__device__ __forceinline__ void ld8(const T *p, int k, int K, float v[8]) {
  if (VEC && k + 8 <= K) {
    if constexpr (sizeof(T) == 4) {
      float4 a = *(const float4 *)(p + k), b = *(const float4 *)(p + k + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
      uint4 q = *(const uint4 *)(p + k);
      const T *h = (const T *)&q;
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = ld_f32(h + j);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = k + j < K ? ld_f32(p + k + j) : 0.0f;
  }
}

#define XP_ROWS 4  /* rows per warp: the weight chunk is loaded once for them */
#define XP_GW 16   /* channels per x_proj group (the contract's partial) */

/* One lane's step of the x_proj contract: the group of XP_GW channels at k
 * with weights wv = w[o, k..k+15], against rows 0..nr-1 of x (row stride
 * ldx): the group's partial p = fmaf chain from 0 over j = 0..15 (k + j < K
 * only), then acc[r] = acc[r] + p. A group's partial depends on that group
 * alone, so the persistent decode computes it where the group's channels are
 * (xp_group_partial) and folds the groups later with the same adds.
 * k_xproj and k_conv_xproj both run it. */
template <bool VEC, typename T>
__device__ __forceinline__ void xp_chunk(const T *x, int64_t ldx, int nr, int k, int K,
                                         const float (&wv)[XP_GW], float (&acc)[XP_ROWS]) {
#pragma unroll
  for (int r = 0; r < XP_ROWS; r++) {
    if (r >= nr) break;
    float xv[XP_GW], p = 0.0f;
    ld8<VEC>(x + (int64_t)r * ldx, k, K, xv);
    ld8<VEC>(x + (int64_t)r * ldx, k + 8, K, xv + 8);
#pragma unroll
    for (int j = 0; j < XP_GW; j++)
      if (k + j < K) p = __fmaf_rn(xv[j], wv[j], p);
    acc[r] = __fadd_rn(acc[r], p);
  }
}

/* The partial of one full group (xp_chunk's p) from its inputs already
 * widened to f32. */
__device__ __forceinline__ float xp_group_partial(const float (&xv)[XP_GW],
                                                  const float (&wv)[XP_GW]) {
  float p = 0.0f;
#pragma unroll
  for (int j = 0; j < XP_GW; j++) p = __fmaf_rn(xv[j], wv[j], p);
  return p;
}

/* The contract's xor butterfly over the 32 lanes: every lane ends with the
 * same bits (a + b == b + a). */
__device__ __forceinline__ float lane_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

/* The contract's xor butterfly over the 32 lanes, then lane 0 stores. */
__device__ __forceinline__ void xp_store(float (&acc)[XP_ROWS], int nr, int lane, float *out,
                                         int NO, int o) {
#pragma unroll
  for (int r = 0; r < XP_ROWS; r++) {
    acc[r] = lane_sum(acc[r]);
    if (lane == 0 && r < nr) out[(int64_t)r * NO + o] = acc[r];
  }
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
