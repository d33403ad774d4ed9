/* Gated RMSNorm (see gated_rmsnorm.h). */
#include "kernels/cpu/gated_rmsnorm.h"

#include <math.h>

#include "kernels/portable_math.h"

void mbd_cpu_gated_rmsnorm(const float *y, const float *z, const float *w, int64_t n,
                           int64_t group, float eps, bool norm_before_gate, float *out) {
  for (int64_t g0 = 0; g0 < n; g0 += group) {
    float ss = 0.0f;
    for (int64_t i = g0; i < g0 + group; i++) {
      const float v = norm_before_gate ? y[i] : y[i] * mbd_pm_silu(z[i]);
      out[i] = v;
      ss = fmaf(v, v, ss);
    }
    const float r = 1.0f / sqrtf(ss / (float)group + eps);
    for (int64_t i = g0; i < g0 + group; i++) {
      const float v = w[i] * (out[i] * r);
      out[i] = norm_before_gate ? v * mbd_pm_silu(z[i]) : v;
    }
  }
}
