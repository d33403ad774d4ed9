/* SiLU of several values at once with mbd_pm_silu's bits (kernels/
 * portable_math.h: x / (1 + e^-x), each step rounded as written), for the
 * elementwise prefill kernels (conv_silu.cu, gated_rmsnorm.cu), whose time
 * goes to SiLU's dependent chains rather than to their bytes.
 *
 * mbd_pm_silu has two branches: mbd_pm_expf returns a NaN input as it is,
 * and __fdiv_rn compiles to a reciprocal, five FMAs, a range check and a
 * call to a slow path. A branch ends ptxas's scheduling region, so the
 * chains of consecutive SiLUs cannot overlap within a thread. Here a
 * group's G values run as one region: the exponential's arithmetic without
 * the NaN test (silu_exp: mbd_pm_expf's operations in its order, so its
 * value for any other input), and each quotient by the reciprocal-and-FMA
 * sequence, which is the correctly rounded quotient wherever no step leaves
 * the normal range (1 <= d <= 2^64, 2^-60 <= |x| <= 2^60, or x = 0). One
 * branch per group recomputes the whole group with mbd_pm_silu when any
 * value is outside that range (NaN included: its d is NaN). A correctly
 * rounded quotient is unique, so either path gives mbd_pm_silu's bits.
 * The sequence was checked on the host against IEEE division with
 * reciprocal estimates up to 3 ulp off (the hardware's is within 1 ulp),
 * quotients next to a rounding boundary included; tests/gpu/
 * test_ops_matrix_vec.c compares the kernels that use it with the ones that
 * call mbd_pm_silu. Internal to kernels/cuda/ops (C++ only). */
#ifndef MBD_OPS_SILU_GROUP_CUH
#define MBD_OPS_SILU_GROUP_CUH

#include "kernels/portable_math.h"

/* x / d rounded to nearest for x, d in silu_div_fast_ok's range: an
 * estimate of 1 / d, one Newton step, the quotient, its exact residual, one
 * correction. The sign is x's (the sequence gives +0 for x = -0). */
__device__ __forceinline__ float silu_div_fast(float x, float d) {
  float y0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(d));
  const float e = __fmaf_rn(-d, y0, 1.0f);
  const float y1 = __fmaf_rn(y0, e, y0);
  const float q0 = __fmul_rn(x, y1);
  const float r = __fmaf_rn(-d, q0, x);
  return copysignf(__fmaf_rn(y1, r, q0), x);
}
/* Whether silu_div_fast(x, d) is the correctly rounded x / d (d >= 1 or NaN
 * here: 1 + e^-x). False for NaN. */
__device__ __forceinline__ bool silu_div_fast_ok(float x, float d) {
  const float ax = fabsf(x);
  return (d <= 0x1p64f) & (ax <= 0x1p60f) & ((ax >= 0x1p-60f) | (x == 0.0f));
}

/* mbd_pm_expf(x) for x not NaN: its clamps (as min / max, equal there)
 * and its operations in its order; for NaN some NaN. */
__device__ __forceinline__ float silu_exp(float x) {
  x = fmaxf(fminf(x, 100.0f), -120.0f);
  const float shift = 0x1.8p23f;
  const float t = __fmaf_rn(x, 0x1.715476p+0f, shift);
  const float j = __fadd_rn(t, -shift);
  const int32_t k = (int32_t)(__float_as_uint(t) - __float_as_uint(shift));
  float r = __fmaf_rn(j, -0x1.62e430p-1f, x);
  r = __fmaf_rn(j, 0x1.05c610p-29f, r);
  float q = __fmaf_rn(r, 0x1.a1250cp-13f, 0x1.6d4342p-10f);
  q = __fmaf_rn(r, q, 0x1.1110e0p-7f);
  q = __fmaf_rn(r, q, 0x1.5554e8p-5f);
  q = __fmaf_rn(r, q, 0x1.555556p-3f);
  q = __fmaf_rn(r, q, 0x1.0p-1f);
  const float r2 = __fmul_rn(r, r);
  const float em1 = __fmaf_rn(r2, q, r);
  const float e = __fadd_rn(1.0f, em1);
  const int32_t k1 = k / 2, k2 = k - k1;
  return __fmul_rn(__fmul_rn(e, mbd_pm_pow2(k1)), mbd_pm_pow2(k2));
}

/* v[g] = mbd_pm_silu(v[g]) for g < G, bit for bit. */
template <int G>
__device__ __forceinline__ void silu_group(float (&v)[G]) {
  float q[G];
  bool ok = true;
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float d = __fadd_rn(1.0f, silu_exp(-v[g]));
    q[g] = silu_div_fast(v[g], d);
    ok = ok & silu_div_fast_ok(v[g], d);
  }
  if (!ok) {
#pragma unroll
    for (int g = 0; g < G; g++) q[g] = mbd_pm_silu(v[g]);
  }
#pragma unroll
  for (int g = 0; g < G; g++) v[g] = q[g];
}

#endif
