/* Portable f32 transcendentals for the Mamba-1 element-wise ops, giving the
 * same bits on the host (C or C++, any libm, any compiler flags) and on a
 * CUDA device. libm's and CUDA's expf/log1pf are each accurate to a few ulp
 * but differ in the last bit on some inputs (and glibc's change between
 * versions), so the CPU and GPU routes could not share logits bit for bit.
 *
 * Every function is a fixed sequence of IEEE f32 operations: round-to-nearest
 * +, *, /, fma and exact integer manipulation of the bit patterns, nothing
 * else. On the device each one is an _rn intrinsic, so nvcc can neither
 * contract nor reorder them (whatever --fmad says); on the host they are plain
 * operators and fmaf, and no product ever feeds an addition except through an
 * explicit fmaf, so even -ffp-contract=fast has nothing to contract (fmaf and
 * / are correctly rounded by IEEE 754, so a libm's fmaf cannot change bits).
 * Denormals must not be flushed (no -ftz / fast-math on either side).
 *
 * Measured accuracy against the double-precision libm, in ulps of the f32
 * result, over every third float of each domain (2.6e9 inputs; the unit test
 * tests/unit/test_portable_math.c sweeps every 997th and bounds the same):
 *   mbd_pm_expf     x in [-120, 100] (denormal results and overflow
 *                   included): max 0.98 ulp; 0 below, +inf above, exact
 *   mbd_pm_log1pf   y in (-1, FLT_MAX]: max 0.75 ulp
 *   mbd_pm_softplus x in [-100, 20]: max 1.57 ulp (exp's rounded result
 *                   feeds log1p, as torch's log1p(exp(x))); x > 20: x
 *   mbd_pm_silu     x in [-88, 100]: within 2 ulp (unit test bound); below
 *                   -88.7 e^-x overflows and x / inf = -0, as in f32 torch
 * NaN inputs are returned unchanged. */
#ifndef MBD_PORTABLE_MATH_H
#define MBD_PORTABLE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MBD_PM_FN static __host__ __device__ __forceinline__
#else
#define MBD_PM_FN static inline
#endif

/* One rounding each, in the order written. */
#if defined(__CUDA_ARCH__)
#define MBD_PM_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define MBD_PM_MUL(a, b) __fmul_rn((a), (b))
#define MBD_PM_ADD(a, b) __fadd_rn((a), (b))
#define MBD_PM_DIV(a, b) __fdiv_rn((a), (b))
#else
#define MBD_PM_FMA(a, b, c) fmaf((a), (b), (c))
#define MBD_PM_MUL(a, b) ((a) * (b))
#define MBD_PM_ADD(a, b) ((a) + (b))
#define MBD_PM_DIV(a, b) ((a) / (b))
#endif

MBD_PM_FN uint32_t mbd_pm_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MBD_PM_FN float mbd_pm_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/* 2^k for k in [-126, 127], exact. */
MBD_PM_FN float mbd_pm_pow2(int32_t k) { return mbd_pm_from_bits((uint32_t)(k + 127) << 23); }

/* e^x. x = j ln2 + r, j = rint(x / ln2), |r| <= ln2 / 2; e^r = 1 + r + r^2
 * q(r) with q a degree-5 fit of (e^r - 1 - r) / r^2 (relative error 2^-30
 * on e^r); the result is (e^r * 2^(j/2)) * 2^(j - j/2): the first product is
 * exact, the second rounds once, into the denormals or to infinity when the
 * result lies there. */
MBD_PM_FN float mbd_pm_expf(float x) {
  if (!(x == x)) return x;
  /* Beyond these the result is 0 or +inf anyway; clamping keeps j small. */
  if (x > 100.0f) x = 100.0f;
  if (x < -120.0f) x = -120.0f;
  const float shift = 0x1.8p23f; /* t's last bit is then the unit */
  const float t = MBD_PM_FMA(x, 0x1.715476p+0f, shift);
  const float j = MBD_PM_ADD(t, -shift);
  const int32_t k = (int32_t)(mbd_pm_bits(t) - mbd_pm_bits(shift));
  /* ln2 = 0x1.62e430p-1 - 0x1.05c610p-29: the first step is exact (the
   * difference is a multiple of 2^-25 below 2^-1), the second rounds once. */
  float r = MBD_PM_FMA(j, -0x1.62e430p-1f, x);
  r = MBD_PM_FMA(j, 0x1.05c610p-29f, r);
  float q = MBD_PM_FMA(r, 0x1.a1250cp-13f, 0x1.6d4342p-10f);
  q = MBD_PM_FMA(r, q, 0x1.1110e0p-7f);
  q = MBD_PM_FMA(r, q, 0x1.5554e8p-5f);
  q = MBD_PM_FMA(r, q, 0x1.555556p-3f);
  q = MBD_PM_FMA(r, q, 0x1.0p-1f);
  const float r2 = MBD_PM_MUL(r, r);
  const float em1 = MBD_PM_FMA(r2, q, r); /* e^r - 1 */
  const float e = MBD_PM_ADD(1.0f, em1);
  const int32_t k1 = k / 2, k2 = k - k1; /* both in [-87, 72] */
  return MBD_PM_MUL(MBD_PM_MUL(e, mbd_pm_pow2(k1)), mbd_pm_pow2(k2));
}

/* log(1 + y). u = fl(1 + y) and its rounding error c0 (exact, Fast2Sum);
 * u = 2^k m with m in [sqrt(2)/2, sqrt(2)), f = m - 1 (exact);
 * log1p(y) = k ln2 + log(1 + f) + c0 / u, and with s = f / (2 + f),
 * log(1 + f) = f - f^2/2 + s (f^2/2 + R), R = z P(z), z = s^2, P a degree-3
 * fit (relative error 2^-31.6), evaluated so that the rounding of s and of
 * 2 + f only touch the small correction terms. */
MBD_PM_FN float mbd_pm_log1pf(float y) {
  if (!(y == y)) return y;
  if (y == 0.0f || y == mbd_pm_from_bits(0x7f800000u)) return y; /* +-0, +inf */
  if (y <= -1.0f) return mbd_pm_from_bits(y == -1.0f ? 0xff800000u : 0x7fc00000u);
  const float u = MBD_PM_ADD(1.0f, y);
  const float c0 = y > 1.0f ? MBD_PM_ADD(1.0f, -MBD_PM_ADD(u, -y))
                            : MBD_PM_ADD(y, -MBD_PM_ADD(u, -1.0f));
  const uint32_t iu = mbd_pm_bits(u) + (0x3f800000u - 0x3f3504f3u);
  const int32_t k = (int32_t)(iu >> 23) - 127;
  const float m = mbd_pm_from_bits((iu & 0x007fffffu) + 0x3f3504f3u);
  const float f = MBD_PM_ADD(m, -1.0f);
  const float c = MBD_PM_DIV(c0, u);
  const float s = MBD_PM_DIV(f, MBD_PM_ADD(2.0f, f));
  const float z = MBD_PM_MUL(s, s);
  float p = MBD_PM_FMA(z, 0x1.ddd5dap-3f, 0x1.245c22p-2f);
  p = MBD_PM_FMA(z, p, 0x1.9999ecp-2f);
  p = MBD_PM_FMA(z, p, 0x1.555556p-1f);
  const float R = MBD_PM_MUL(z, p);
  const float hf = MBD_PM_MUL(0.5f, f); /* exact */
  const float kf = (float)k;
  const float lo = MBD_PM_FMA(kf, -0x1.05c610p-29f, c);       /* k ln2_lo + c */
  const float t = MBD_PM_FMA(s, MBD_PM_FMA(hf, f, R), lo);    /* s (f^2/2 + R) + lo */
  const float v = MBD_PM_FMA(hf, f, -t);                      /* f^2/2 - t */
  return MBD_PM_FMA(kf, 0x1.62e430p-1f, MBD_PM_ADD(f, -v)); /* k ln2_hi + (f - v) */
}

/* SiLU x / (1 + e^-x). */
MBD_PM_FN float mbd_pm_silu(float x) {
  return MBD_PM_DIV(x, MBD_PM_ADD(1.0f, mbd_pm_expf(-x)));
}

/* softplus as torch: x > 20 ? x : log1p(e^x). */
MBD_PM_FN float mbd_pm_softplus(float x) {
  return x > 20.0f ? x : mbd_pm_log1pf(mbd_pm_expf(x));
}

#endif
