/* Portable f32 functions of the Mamba-3 SISO step beyond kernels/portable_math.h:
 * sin and cos of the rotary angle, tanh of the angle projection, the sigmoid
 * of the trapezoid gate and the heavy-tail decay. Each is a fixed sequence of
 * round-to-nearest f32 operations (MBD_PM_* macros), so the CPU model and a
 * CUDA model that includes this header compute the same bits.
 *
 * Accuracy (f32 ulps against double libm; tests/unit/test_mamba3_cpu.c
 * sweeps and bounds them): sincos on [-8, 8] within 2 ulp of 1 in absolute
 * terms (the result's own ulp near 0 is not the target: angles feed a
 * rotation, whose error is absolute); tanh within 1e-7 absolute. */
#ifndef MBD_MAMBA3_MATH_H
#define MBD_MAMBA3_MATH_H

#include "kernels/portable_math.h"

#define MBD_M3_PI 0x1.921fb6p+1f     /* pi rounded to f32 */
#define MBD_M3_TWO_PI 0x1.921fb6p+2f /* 2 pi rounded to f32 */

/* sin(x) and cos(x) for |x| <= 8 (the angle state stays in [0, 2 pi]).
 * x = j pi/2 + r, j = rint(x 2/pi), |r| <= pi/4 + tiny, pi/2 in two parts
 * (the first product is exact for |j| <= 5); degree-7 sine and degree-8
 * cosine fits on [-pi/4, pi/4]; the quadrant j mod 4 picks and signs them. */
MBD_PM_FN void mbd_m3_sincos(float x, float *s, float *c) {
  const float shift = 0x1.8p23f;
  const float t = MBD_PM_FMA(x, 0x1.45f306p-1f, shift); /* x 2/pi + shift */
  const float j = MBD_PM_ADD(t, -shift);
  const int32_t q = (int32_t)(mbd_pm_bits(t) - mbd_pm_bits(shift));
  float r = MBD_PM_FMA(j, -0x1.921fb6p+0f, x);
  r = MBD_PM_FMA(j, 0x1.777a5cp-25f, r); /* pi/2 = 0x1.921fb6p0 - 0x1.777a5cp-25 */
  const float z = MBD_PM_MUL(r, r);
  float ps = MBD_PM_FMA(z, -0x1.9943f2p-13f, 0x1.11073cp-7f);
  ps = MBD_PM_FMA(z, ps, -0x1.555546p-3f);
  const float sn = MBD_PM_FMA(MBD_PM_MUL(z, r), ps, r);
  float pc = MBD_PM_FMA(z, 0x1.99eb9cp-16f, -0x1.6c0c34p-10f);
  pc = MBD_PM_FMA(z, pc, 0x1.55554ap-5f);
  const float cs = MBD_PM_FMA(MBD_PM_MUL(z, z), pc, MBD_PM_FMA(-0.5f, z, 1.0f));
  switch (q & 3) {
  case 0: *s = sn; *c = cs; break;
  case 1: *s = cs; *c = -sn; break;
  case 2: *s = -sn; *c = -cs; break;
  default: *s = -cs; *c = sn; break;
  }
}

/* tanh(x) = (1 - e) / (1 + e), e = e^(-2|x|), sign of x; +-1 beyond 9 (e
 * below 2^-26), x itself below 2^-13 (the quotient would lose it). */
MBD_PM_FN float mbd_m3_tanh(float x) {
  if (!(x == x)) return x;
  const float ax = x < 0.0f ? -x : x;
  if (ax < 0x1.0p-13f) return x;
  float t = 1.0f;
  if (ax < 9.0f) {
    const float e = mbd_pm_expf(MBD_PM_MUL(-2.0f, ax));
    t = MBD_PM_DIV(MBD_PM_ADD(1.0f, -e), MBD_PM_ADD(1.0f, e));
  }
  return x < 0.0f ? -t : t;
}

/* sigmoid 1 / (1 + e^-x). */
MBD_PM_FN float mbd_m3_sigmoid(float x) {
  return MBD_PM_DIV(1.0f, MBD_PM_ADD(1.0f, mbd_pm_expf(-x)));
}

/* The data-dependent decay A = min(-(max(a, 0) + 1 / (1 - min(a, 0))), -floor)
 * (upstream's -heavy_tail_activation(a) clamped to at most -A_floor). */
MBD_PM_FN float mbd_m3_decay(float a, float a_floor) {
  const float pos = a > 0.0f ? a : 0.0f;
  const float neg = a < 0.0f ? a : 0.0f;
  const float A = -MBD_PM_ADD(pos, MBD_PM_DIV(1.0f, MBD_PM_ADD(1.0f, -neg)));
  return A > -a_floor ? -a_floor : A;
}

/* One step of a rotary angle: a = fmaf(theta, dt, a), then reduced into
 * [0, 2 pi] as a = fmaf(-2pi, floorf(a / 2pi), a). */
MBD_PM_FN float mbd_m3_angle_step(float theta, float dt, float a) {
  a = MBD_PM_FMA(theta, dt, a);
  return MBD_PM_FMA(-MBD_M3_TWO_PI, floorf(MBD_PM_DIV(a, MBD_M3_TWO_PI)), a);
}

/* The pair (v0, v1) rotated by the angle of sine sn, cosine cs:
 * (fmaf(v0, cs, -(v1 sn)), fmaf(v0, sn, v1 cs)). */
MBD_PM_FN void mbd_m3_rotate(float *v0, float *v1, float sn, float cs) {
  const float a = *v0, b = *v1;
  *v0 = MBD_PM_FMA(a, cs, -MBD_PM_MUL(b, sn));
  *v1 = MBD_PM_FMA(a, sn, MBD_PM_MUL(b, cs));
}

/* The trapezoidal coefficients: alpha = e^(A dt), beta = ((1 - trap) dt)
 * alpha, gamma = trap dt. */
MBD_PM_FN void mbd_m3_coeffs(float adt, float dt, float trap, float *alpha, float *beta,
                             float *gamma) {
  *alpha = mbd_pm_expf(adt);
  *beta = MBD_PM_MUL(MBD_PM_MUL(MBD_PM_ADD(1.0f, -trap), dt), *alpha);
  *gamma = MBD_PM_MUL(trap, dt);
}

/* One headdim channel of one token: vb = beta v_prev, vg = gamma x; for n
 * ascending h[n] = fmaf(alpha, h[n], fmaf(k_prev[n], vb, vg k[n])),
 * y = fmaf(h[n], q[n], y) from +0; returns fmaf(D, x, y) (ungated). */
MBD_PM_FN float mbd_m3_channel(int N, float alpha, float beta, float gamma, float v_prev,
                               float x, float D, float *h, const float *k_prev, const float *k,
                               const float *q) {
  const float vb = MBD_PM_MUL(beta, v_prev), vg = MBD_PM_MUL(gamma, x);
  float y = 0.0f;
  for (int n = 0; n < N; n++) {
    const float hn = MBD_PM_FMA(alpha, h[n], MBD_PM_FMA(k_prev[n], vb, MBD_PM_MUL(vg, k[n])));
    h[n] = hn;
    y = MBD_PM_FMA(hn, q[n], y);
  }
  return MBD_PM_FMA(D, x, y);
}

#endif
