/* Mamba-3 SISO per-token ops (see mamba3_ops.h). */
#include "kernels/cpu/mamba3_ops.h"

#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/mamba3_math.h"

/* Offsets of the in_proj row's parts. */
static int64_t off_b(const mbd_m3_dims *d) { return 2 * d->d_inner; }
static int64_t off_c(const mbd_m3_dims *d) {
  return off_b(d) + (int64_t)d->ngroups * d->d_state;
}
static int64_t off_dt(const mbd_m3_dims *d) {
  return off_c(d) + (int64_t)d->ngroups * d->d_state;
}

void mbd_cpu_m3_preprocess(const mbd_m3_dims *d, const float *dt_bias, const float *b_norm,
                           const float *c_norm, float *row) {
  const int N = d->d_state, H = d->heads;
  for (int g = 0; g < d->ngroups; g++) {
    float *b = row + off_b(d) + (int64_t)g * N, *c = row + off_c(d) + (int64_t)g * N;
    mbd_cpu_rmsnorm(b, b_norm, N, d->eps, b);
    mbd_cpu_rmsnorm(c, c_norm, N, d->eps, c);
  }
  float *dt = row + off_dt(d), *adt = dt + H, *trap = adt + H, *ang = trap + H;
  for (int h = 0; h < H; h++) {
    dt[h] = mbd_pm_softplus(dt[h] + dt_bias[h]);
    adt[h] = mbd_m3_decay(adt[h], d->a_floor) * dt[h];
    trap[h] = mbd_m3_sigmoid(trap[h]);
  }
  for (int s = 0; s < d->angles; s++) ang[s] = mbd_m3_tanh(ang[s]) * MBD_M3_PI;
}

void mbd_cpu_m3_head_step(const mbd_m3_dims *d, int h, const float *row, const float *b_bias,
                          const float *c_bias, float D, int gated, float *ang, float *ssm,
                          float *kst, float *vst, float *y, float *scratch) {
  const int N = d->d_state, P = d->headdim, H = d->heads, S = d->angles;
  const int g = h / (H / d->ngroups);
  const float *z = row + (int64_t)h * P, *x = row + d->d_inner + (int64_t)h * P;
  const float *B = row + off_b(d) + (int64_t)g * N, *C = row + off_c(d) + (int64_t)g * N;
  const float *pre = row + off_dt(d);
  const float dt = pre[h], adt = pre[H + h], trap = pre[2 * H + h];
  const float *theta = pre + 3 * H;
  float *q = scratch, *k = scratch + N;
  for (int n = 0; n < N; n++) {
    q[n] = C[n] + c_bias[n];
    k[n] = B[n] + b_bias[n];
  }
  for (int i = 0; i < S; i++) {
    const float a = mbd_m3_angle_step(theta[i], dt, ang[i]);
    ang[i] = a;
    float sn, cs;
    mbd_m3_sincos(a, &sn, &cs);
    mbd_m3_rotate(&q[2 * i], &q[2 * i + 1], sn, cs);
    mbd_m3_rotate(&k[2 * i], &k[2 * i + 1], sn, cs);
  }
  float alpha, beta, gamma;
  mbd_m3_coeffs(adt, dt, trap, &alpha, &beta, &gamma);
  for (int p = 0; p < P; p++) {
    const float acc = mbd_m3_channel(N, alpha, beta, gamma, vst[p], x[p], D, ssm + (int64_t)p * N,
                                     kst, k, q);
    y[p] = gated ? acc * mbd_pm_silu(z[p]) : acc;
  }
  for (int n = 0; n < N; n++) kst[n] = k[n];
  for (int p = 0; p < P; p++) vst[p] = x[p];
}
