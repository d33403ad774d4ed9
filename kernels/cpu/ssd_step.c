/* Mamba-2 recurrence step (see ssd_step.h): plain scalar loops with explicit
 * fmaf, compiled with -ffp-contract=off, transcendentals from
 * kernels/portable_math.h, so the bits are the ones written on every host
 * and the CUDA op can make the same roundings. */
#include "kernels/cpu/ssd_step.h"

#include <math.h>

#include "kernels/portable_math.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float ssd_dt(float dt_raw, float dt_bias, float lo, float hi) {
  float dt = mbd_pm_softplus(dt_raw + dt_bias);
  if (dt < lo) dt = lo;
  if (dt > hi) dt = hi;
  return dt;
}

float mbd_cpu_ssd_dt(float dt_raw, float dt_bias, float lo, float hi) {
  return ssd_dt(dt_raw, dt_bias, lo, hi);
}

ALWAYS_INLINE void step_body(const mbd_ssd_dims *dm, int h0, int h1, const float *A,
                             const float *D, const float *dt_bias, float lo, float hi,
                             const float *dt_raw, const float *B, const float *C,
                             const float *x, float *state, float *y) {
  const int P = dm->head_dim, N = dm->d_state, hpg = dm->heads / dm->n_groups;
  for (int h = h0; h < h1; h++) {
    const float dt = ssd_dt(dt_raw[h], dt_bias[h], lo, hi);
    const float dA = mbd_pm_expf(dt * A[h]);
    const float *Bg = B + (int64_t)(h / hpg) * N, *Cg = C + (int64_t)(h / hpg) * N;
    for (int p = 0; p < P; p++) {
      const int64_t c = (int64_t)h * P + p;
      const float xv = x[c];
      float *s = state + c * N;
      float acc = 0.0f;
      for (int n = 0; n < N; n++) {
        s[n] = fmaf(dA, s[n], (dt * Bg[n]) * xv);
        acc = fmaf(s[n], Cg[n], acc);
      }
      y[c] = fmaf(D[h], xv, acc);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MBD_SSD_AVX2 1
__attribute__((target("avx2,fma"))) static void step_avx2(
    const mbd_ssd_dims *dm, int h0, int h1, const float *A, const float *D, const float *dt_bias,
    float lo, float hi, const float *dt_raw, const float *B, const float *C, const float *x,
    float *state, float *y) {
  step_body(dm, h0, h1, A, D, dt_bias, lo, hi, dt_raw, B, C, x, state, y);
}
#endif

void mbd_cpu_ssd_step(mbd_cpu_isa isa, const mbd_ssd_dims *dm, int h0, int h1, const float *A,
                      const float *D, const float *dt_bias, float lo, float hi,
                      const float *dt_raw, const float *B, const float *C, const float *x,
                      float *state, float *y) {
#ifdef MBD_SSD_AVX2
  if (isa == MBD_CPU_ISA_AVX2) {
    step_avx2(dm, h0, h1, A, D, dt_bias, lo, hi, dt_raw, B, C, x, state, y);
    return;
  }
#endif
  (void)isa;
  step_body(dm, h0, h1, A, D, dt_bias, lo, hi, dt_raw, B, C, x, state, y);
}
