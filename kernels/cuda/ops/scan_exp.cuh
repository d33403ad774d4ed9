/* The scan kernels' exp (scan.cu, scan_prefill.cu): mbd_pm_expf,
 * mbd_pm_softplus and mbd_pm_silu with a shorter path where it gives the
 * same bits. Internal to kernels/cuda/ops (C++ only). */
#ifndef MBD_OPS_SCAN_EXP_CUH
#define MBD_OPS_SCAN_EXP_CUH

#include "kernels/cuda/mops_arith.cuh"
#include "kernels/cuda/ops/silu_group.cuh"

/* mbd_pm_expf(x) for |x| < 86, bit for bit: the same range reduction and
 * polynomial; there k = j lies in [-124, 124] and e = e^r in [0.7, 1.42], so
 * both products of mbd_pm_expf's scaling are exact and its result is e 2^k,
 * a normal float: adding k to e's exponent field gives it. (k = bits(t) -
 * bits(shift), and bits(shift) << 23 is 0 modulo 2^32.) */
static __host__ __device__ __forceinline__ float sp_exp_in_range(float x) {
  const float shift = 0x1.8p23f;
  const float t = MBD_PM_FMA(x, 0x1.715476p+0f, shift);
  const float j = MBD_PM_ADD(t, -shift);
  float r = MBD_PM_FMA(j, -0x1.62e430p-1f, x);
  r = MBD_PM_FMA(j, 0x1.05c610p-29f, r);
  float q = MBD_PM_FMA(r, 0x1.a1250cp-13f, 0x1.6d4342p-10f);
  q = MBD_PM_FMA(r, q, 0x1.1110e0p-7f);
  q = MBD_PM_FMA(r, q, 0x1.5554e8p-5f);
  q = MBD_PM_FMA(r, q, 0x1.555556p-3f);
  q = MBD_PM_FMA(r, q, 0x1.0p-1f);
  const float r2 = MBD_PM_MUL(r, r);
  const float em1 = MBD_PM_FMA(r2, q, r);
  const float e = MBD_PM_ADD(1.0f, em1);
  return mbd_pm_from_bits(mbd_pm_bits(e) + (mbd_pm_bits(t) << 23));
}
/* Where sp_exp_in_range(x) == mbd_pm_expf(x) (NaN: false). */
static __host__ __device__ __forceinline__ bool sp_exp_fast(float x) {
  return fabsf(x) < 86.0f;
}
/* mbd_pm_expf, mbd_pm_softplus and mbd_pm_silu with that path. */
__device__ __forceinline__ float sp_expf(float x) {
  return sp_exp_fast(x) ? sp_exp_in_range(x) : mbd_pm_expf(x);
}
__device__ __forceinline__ float sp_softplus(float x) {
  return x > 20.0f ? x : mbd_pm_log1pf(sp_expf(x));
}
__device__ __forceinline__ float sp_silu(float x) {
  return __fdiv_rn(x, __fadd_rn(1.0f, sp_expf(-x)));
}

/* sp_softplus out of line: sp_softplus_group's rare path, one call per
 * value instead of a copy of the whole function per group member. */
static __device__ __noinline__ float sp_softplus_slow(float x) { return sp_softplus(x); }

/* v[g] = mbd_pm_softplus(v[g]) for g < G, bit for bit, as one scheduling
 * region (silu_group's idea, kernels/cuda/ops/silu_group.cuh): where
 * x <= 20, |x| < 86 puts e = e^x in (0, inf) as a normal float
 * (sp_exp_in_range gives mbd_pm_expf's bits), so mbd_pm_log1pf(e) takes
 * none of its early returns, and its two quotients c0 / u (u = 1 + e >= 1)
 * and f / (2 + f) are silu_div_fast's correctly rounded ones where
 * silu_div_fast_ok says so; x > 20 gives x. One branch per group recomputes
 * the whole group with sp_softplus when a value needs more (NaN included). */
template <int G>
__device__ __forceinline__ void sp_softplus_group(float (&v)[G]) {
  float o[G];
  bool ok = true;
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float x = v[g];
    const float y = sp_exp_in_range(x);
    /* mbd_pm_log1pf(y), statement for statement */
    const float u = __fadd_rn(1.0f, y);
    const float c0 = y > 1.0f ? __fadd_rn(1.0f, -__fadd_rn(u, -y))
                              : __fadd_rn(y, -__fadd_rn(u, -1.0f));
    const uint32_t iu = __float_as_uint(u) + (0x3f800000u - 0x3f3504f3u);
    const int32_t k = (int32_t)(iu >> 23) - 127;
    const float m = __uint_as_float((iu & 0x007fffffu) + 0x3f3504f3u);
    const float f = __fadd_rn(m, -1.0f);
    const float c = silu_div_fast(c0, u);
    const float f2 = __fadd_rn(2.0f, f);
    const float s = silu_div_fast(f, f2);
    const float z = __fmul_rn(s, s);
    float p = __fmaf_rn(z, 0x1.ddd5dap-3f, 0x1.245c22p-2f);
    p = __fmaf_rn(z, p, 0x1.9999ecp-2f);
    p = __fmaf_rn(z, p, 0x1.555556p-1f);
    const float R = __fmul_rn(z, p);
    const float hf = __fmul_rn(0.5f, f);
    const float kf = (float)k;
    const float lo = __fmaf_rn(kf, -0x1.05c610p-29f, c);
    const float t = __fmaf_rn(s, __fmaf_rn(hf, f, R), lo);
    const float w = __fmaf_rn(hf, f, -t);
    const float l1p = __fmaf_rn(kf, 0x1.62e430p-1f, __fadd_rn(f, -w));
    const bool big = x > 20.0f;
    o[g] = big ? x : l1p;
    ok = ok & (big | (sp_exp_fast(x) & silu_div_fast_ok(c0, u) & silu_div_fast_ok(f, f2)));
  }
  if (!ok) {
#pragma unroll
    for (int g = 0; g < G; g++) o[g] = sp_softplus_slow(v[g]);
  }
#pragma unroll
  for (int g = 0; g < G; g++) v[g] = o[g];
}

/* Storage of one SSM state entry, ST float or __nv_bfloat16: rnd rounds an
 * updated entry to what is stored (none for f32, to nearest even for bf16),
 * ld widens a stored entry, put stores a value rnd rounded (exact). The
 * arithmetic is f32 either way; a bf16 state's kernels keep the rounded
 * value, so the y chain reads the state that is stored and every chunking
 * rounds after every step. */
template <typename ST>
struct sp_st;
template <>
struct sp_st<float> {
  static __device__ __forceinline__ float rnd(float v) { return v; }
  static __device__ __forceinline__ float ld(const float *p) { return *p; }
  static __device__ __forceinline__ void put(float *p, float v) { *p = v; }
};
template <>
struct sp_st<__nv_bfloat16> {
  static __device__ __forceinline__ float rnd(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
  }
  static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
  }
  static __device__ __forceinline__ void put(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
  }
};

/* One step of one channel after its dt: scan_one_dt's arithmetic
 * (mops_arith.cuh), its exps by sp_exp_in_range when dt amax (amax: the
 * largest |a[n]|, +inf if one is NaN) is in its range, which puts every
 * dt a[n] there (rounding is monotonic). Each updated entry is rounded as
 * a state of ST is stored (sp_st) before the y chain reads it. */
template <int N, typename ST = float>
__device__ __forceinline__ float sp_one_dt(float dt, const float *B, const float *C,
                                           const float (&a)[N], float amax, float d, float x,
                                           float z, float (&h)[N]) {
  float acc = 0.0f;
  if (sp_exp_fast(__fmul_rn(dt, amax))) {
#pragma unroll
    for (int n = 0; n < N; n++) {
      const float dA = sp_exp_in_range(__fmul_rn(dt, a[n]));
      h[n] = sp_st<ST>::rnd(__fmaf_rn(dA, h[n], __fmul_rn(__fmul_rn(dt, B[n]), x)));
      acc = __fmaf_rn(h[n], C[n], acc);
    }
  } else {
#pragma unroll
    for (int n = 0; n < N; n++) {
      h[n] = sp_st<ST>::rnd(scan_state(dt, a[n], B[n], x, h[n]));
      acc = __fmaf_rn(h[n], C[n], acc);
    }
  }
  acc = __fmaf_rn(d, x, acc);
  return __fmul_rn(acc, sp_silu(z));
}

/* max |v[i]|, +inf if one is NaN (sp_one_dt's amax). */
template <int N>
__device__ __forceinline__ float sp_absmax(const float (&v)[N]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < N; i++) m = v[i] == v[i] ? fmaxf(m, fabsf(v[i])) : INFINITY;
  return m;
}

#endif
