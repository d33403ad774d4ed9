/* Mamba-3 SISO mixer ops (see m3_mixer.h). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/m3_mixer.h"
#include "kernels/model/mamba3_math.h"

/* mbd_cpu_rmsnorm's roundings: fmaf chain ascending, 1 / sqrtf(ss / n + eps),
 * w * (x * r); in place. */
__device__ static void m3_rmsnorm(float *x, const float *w, int n, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < n; i++) ss = __fmaf_rn(x[i], x[i], ss);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
  for (int i = 0; i < n; i++) x[i] = __fmul_rn(w[i], __fmul_rn(x[i], r));
}

/* One thread per row: the same serial order as the CPU function. */
__global__ void k_m3_preprocess(mbd_m3g_dims d, int64_t M, const float *__restrict__ dt_bias,
                                const float *__restrict__ b_norm,
                                const float *__restrict__ c_norm, float *__restrict__ proj) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  float *row = proj + r * d.d_in_proj;
  const int N = d.d_state, H = d.heads;
  float *b = row + 2 * d.d_inner, *c = b + (int64_t)d.ngroups * N;
  for (int g = 0; g < d.ngroups; g++) {
    m3_rmsnorm(b + (int64_t)g * N, b_norm, N, d.eps);
    m3_rmsnorm(c + (int64_t)g * N, c_norm, N, d.eps);
  }
  float *dt = c + (int64_t)d.ngroups * N, *adt = dt + H, *trap = adt + H, *ang = trap + H;
  for (int h = 0; h < H; h++) {
    dt[h] = mbd_pm_softplus(__fadd_rn(dt[h], dt_bias[h]));
    adt[h] = __fmul_rn(mbd_m3_decay(adt[h], d.a_floor), dt[h]);
    trap[h] = mbd_m3_sigmoid(trap[h]);
  }
  for (int s = 0; s < d.angles; s++) ang[s] = __fmul_rn(mbd_m3_tanh(ang[s]), MBD_M3_PI);
}

/* One block per (sequence, head), one thread per headdim channel p; the
 * rotated q/k, the previous k and the angles of the head in shared memory
 * (3 N + S floats). Tokens in time order. */
__global__ void k_m3_heads(mbd_m3g_dims d, int T, int n_layer, int layer,
                           const int32_t *__restrict__ slots, int64_t slot_floats,
                           float *__restrict__ state, const float *__restrict__ proj,
                           const float *__restrict__ b_bias, const float *__restrict__ c_bias,
                           const float *__restrict__ Dv, float *__restrict__ y) {
  extern __shared__ float sh[];
  const int N = d.d_state, P = d.headdim, H = d.heads, S = d.angles;
  const int j = blockIdx.x, h = blockIdx.y, p = threadIdx.x;
  const int g = h / (H / d.ngroups);
  float *q = sh, *k = sh + N, *kprev = sh + 2 * N, *ang = sh + 3 * N;
  float *st = state + (int64_t)slots[j] * slot_floats;
  const int64_t L = n_layer;
  float *ang_g = st + ((int64_t)layer * H + h) * S;
  float *ssm_g = st + L * H * S + (((int64_t)layer * H + h) * P) * N;
  float *k_g = st + L * H * S + L * H * P * N + ((int64_t)layer * H + h) * N;
  float *v_g = st + L * H * S + L * H * P * N + L * H * N + ((int64_t)layer * H + h) * P;
  for (int n = p; n < N; n += P) kprev[n] = k_g[n];
  for (int s = p; s < S; s += P) ang[s] = ang_g[s];
  float vprev = p < P ? v_g[p] : 0.0f;
  const float Dh = Dv[h];
  const float *bb = b_bias + (int64_t)h * N, *cb = c_bias + (int64_t)h * N;
  __syncthreads();
  for (int t = 0; t < T; t++) {
    const float *row = proj + ((int64_t)j * T + t) * d.d_in_proj;
    const float *B = row + 2 * d.d_inner + (int64_t)g * N;
    const float *C = row + 2 * d.d_inner + (int64_t)d.ngroups * N + (int64_t)g * N;
    const float *pre = row + 2 * d.d_inner + 2 * (int64_t)d.ngroups * N;
    const float dt = pre[h], adt = pre[H + h], trap = pre[2 * H + h];
    for (int n = p; n < N; n += P) {
      q[n] = __fadd_rn(C[n], cb[n]);
      k[n] = __fadd_rn(B[n], bb[n]);
    }
    __syncthreads();
    for (int i = p; i < S; i += P) {
      const float a = mbd_m3_angle_step(pre[3 * H + i], dt, ang[i]);
      ang[i] = a;
      float sn, cs;
      mbd_m3_sincos(a, &sn, &cs);
      mbd_m3_rotate(&q[2 * i], &q[2 * i + 1], sn, cs);
      mbd_m3_rotate(&k[2 * i], &k[2 * i + 1], sn, cs);
    }
    __syncthreads();
    float alpha, beta, gamma;
    mbd_m3_coeffs(adt, dt, trap, &alpha, &beta, &gamma);
    const float x = row[d.d_inner + (int64_t)h * P + p], z = row[(int64_t)h * P + p];
    const float acc =
        mbd_m3_channel(N, alpha, beta, gamma, vprev, x, Dh, ssm_g + (int64_t)p * N, kprev, k, q);
    y[((int64_t)j * T + t) * d.d_inner + (int64_t)h * P + p] = __fmul_rn(acc, mbd_pm_silu(z));
    vprev = x;
    __syncthreads();
    for (int n = p; n < N; n += P) kprev[n] = k[n];
    __syncthreads();
  }
  for (int n = p; n < N; n += P) k_g[n] = kprev[n];
  for (int s = p; s < S; s += P) ang_g[s] = ang[s];
  v_g[p] = vprev;
}

extern "C" int mbd_mops_m3_preprocess(void *stream, const mbd_m3g_dims *d, int64_t M,
                                      const float *dt_bias, const float *b_norm,
                                      const float *c_norm, float *proj, mbd_error *err) {
  if (M <= 0) return 0;
  if (M > INT32_MAX) return mbd_error_set(err, MBD_E_INVALID, "m3 preprocess: %lld rows", (long long)M);
  const unsigned blocks = (unsigned)((M + 127) / 128);
  return launch_ex(false, "m3_preprocess", k_m3_preprocess, dim3(blocks), dim3(128), 0,
                   (cudaStream_t)stream, err, *d, M, dt_bias, b_norm, c_norm, proj);
}

extern "C" int mbd_mops_m3_heads(void *stream, const mbd_m3g_dims *d, int nseq, int T,
                                 int n_layer, int layer, const int32_t *slots,
                                 int64_t slot_floats, float *state, const float *proj,
                                 const float *b_bias, const float *c_bias, const float *D,
                                 float *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (d->headdim < 1 || d->headdim > 1024 || d->heads > 65535)
    return mbd_error_set(err, MBD_E_INVALID, "m3 heads: headdim %d / %d heads unsupported",
                         d->headdim, d->heads);
  const size_t sh = (3 * (size_t)d->d_state + (size_t)d->angles) * sizeof(float);
  int rc = allow_smem(k_m3_heads, sh, err);
  if (rc < 0) return rc;
  return launch_ex(false, "m3_heads", k_m3_heads, dim3((unsigned)nseq, (unsigned)d->heads),
                   dim3((unsigned)d->headdim), sh, (cudaStream_t)stream, err, *d, T, n_layer,
                   layer, slots, slot_floats, state, proj, b_bias, c_bias, D, y);
}
