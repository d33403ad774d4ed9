/* Mamba-1 per-token element-wise ops (see mamba_ops.h). Written as plain
 * scalar loops with explicit fmaf: the kernels library is compiled with
 * -ffp-contract=off, so every rounding here is the one written. The
 * transcendentals come from kernels/portable_math.h, not libm: the CUDA ops
 * (kernels/cuda/mamba_ops.cu) use the same functions and make the same
 * roundings, so f32 logits are bit-identical between the backends and do not
 * depend on the C library. */
#include "kernels/cpu/mamba_ops.h"

#include <math.h>

#include "kernels/portable_math.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

void mbd_cpu_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; i++) ss = fmaf(x[i], x[i], ss);
  float r = 1.0f / sqrtf(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

ALWAYS_INLINE float silu(float x) { return mbd_pm_silu(x); }
ALWAYS_INLINE float softplus(float x) { return mbd_pm_softplus(x); }
float mbd_cpu_silu(float x) { return silu(x); }
float mbd_cpu_softplus(float x) { return softplus(x); }

ALWAYS_INLINE void conv_body(int64_t c0, int64_t c1, int64_t di, int dconv, const float *w,
                             const float *bias, float *state, const float *x, float *out) {
  for (int64_t c = c0; c < c1; c++) {
    float acc = 0.0f;
    for (int j = 0; j < dconv - 1; j++) acc = fmaf(w[j * di + c], state[j * di + c], acc);
    acc = fmaf(w[(int64_t)(dconv - 1) * di + c], x[c], acc);
    if (bias) acc = acc + bias[c];
    for (int j = 0; j + 1 < dconv - 1; j++) state[j * di + c] = state[(j + 1) * di + c];
    if (dconv > 1) state[(int64_t)(dconv - 2) * di + c] = x[c];
    out[c] = silu(acc);
  }
}

ALWAYS_INLINE void scan_body(int64_t c0, int64_t c1, int ds, const float *A, const float *D,
                             const float *dt_raw, const float *B, const float *C,
                             const float *x, const float *z, float *h, float *out) {
  for (int64_t c = c0; c < c1; c++) {
    float dt = softplus(dt_raw[c]);
    float xc = x[c];
    float *hc = h + c * ds;
    const float *Ac = A + c * ds;
    float y = 0.0f;
    for (int n = 0; n < ds; n++) {
      float dA = mbd_pm_expf(dt * Ac[n]);
      hc[n] = fmaf(dA, hc[n], (dt * B[n]) * xc);
      y = fmaf(hc[n], C[n], y);
    }
    y = fmaf(D[c], xc, y);
    out[c] = y * silu(z[c]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MBD_OPS_AVX2 1
__attribute__((target("avx2,fma"))) static void conv_avx2(int64_t c0, int64_t c1, int64_t di,
                                                          int dconv, const float *w,
                                                          const float *bias, float *state,
                                                          const float *x, float *out) {
  conv_body(c0, c1, di, dconv, w, bias, state, x, out);
}
__attribute__((target("avx2,fma"))) static void scan_avx2(int64_t c0, int64_t c1, int ds,
                                                          const float *A, const float *D,
                                                          const float *dt_raw, const float *B,
                                                          const float *C, const float *x,
                                                          const float *z, float *h, float *out) {
  scan_body(c0, c1, ds, A, D, dt_raw, B, C, x, z, h, out);
}
#endif

void mbd_cpu_conv_step(mbd_cpu_isa isa, int64_t c0, int64_t c1, int64_t di, int dconv,
                       const float *w, const float *bias, float *state, const float *x,
                       float *out) {
#ifdef MBD_OPS_AVX2
  if (isa == MBD_CPU_ISA_AVX2) {
    conv_avx2(c0, c1, di, dconv, w, bias, state, x, out);
    return;
  }
#endif
  conv_body(c0, c1, di, dconv, w, bias, state, x, out);
}

void mbd_cpu_scan_step(mbd_cpu_isa isa, int64_t c0, int64_t c1, int ds, const float *A,
                       const float *D, const float *dt_raw, const float *B, const float *C,
                       const float *x, const float *z, float *h, float *out) {
#ifdef MBD_OPS_AVX2
  if (isa == MBD_CPU_ISA_AVX2) {
    scan_avx2(c0, c1, ds, A, D, dt_raw, B, C, x, z, h, out);
    return;
  }
#endif
  scan_body(c0, c1, ds, A, D, dt_raw, B, C, x, z, h, out);
}
