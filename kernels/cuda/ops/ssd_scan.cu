/* The Mamba-2 recurrence (see ssd_scan.h): one block per (head, sequence)
 * holds the head's [P][N] state in shared memory for the launch's T steps,
 * rows padded to N + 1 floats so that the channel threads' n chains, which
 * walk one row each, fall in distinct banks.
 * Per step every thread computes the head's dt and dA (the same roundings,
 * so the same values), updates its state entries, and after a barrier the
 * first P threads run their channel's n chain and the D skip. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/ssd_scan.h"

#define SSD_THREADS 256

__global__ void k_ssd_scan(int T, mbd_mops_ssd_dims dm, const float *__restrict__ A,
                           const float *__restrict__ D, const float *__restrict__ dt_bias,
                           float lo, float hi, const float *__restrict__ dt_raw, int64_t ld_dt,
                           const float *__restrict__ xbc, int64_t ld_xbc,
                           float *__restrict__ state, int64_t slot_stride,
                           const int32_t *__restrict__ slots, float *__restrict__ y) {
  extern __shared__ float4 smem4[];
  float *st = (float *)smem4; /* [P][N + 1] */
  const int h = blockIdx.x, s = blockIdx.y;
  const int P = dm.head_dim, N = dm.d_state, PN = P * N, LD = N + 1;
  const int g = h / (dm.heads / dm.n_groups);
  const int64_t di = (int64_t)dm.heads * P, GN = (int64_t)dm.n_groups * N;
  const float a = A[h], dd = D[h], bias = dt_bias[h]; /* weights: before the wait */
  pdl_wait();
  pdl_trigger();
  float *gst = state + (int64_t)slots[s] * slot_stride + (int64_t)h * PN;
  for (int e = threadIdx.x; e < PN; e += blockDim.x) st[e / N * LD + e % N] = gst[e];
  __syncthreads();
  for (int t = 0; t < T; t++) {
    const int64_t row = (int64_t)s * T + t;
    const float *xr = xbc + row * ld_xbc;
    const float *x = xr + (int64_t)h * P, *B = xr + di + (int64_t)g * N,
                *C = xr + di + GN + (int64_t)g * N;
    float dt = mbd_pm_softplus(__fadd_rn(dt_raw[row * ld_dt + h], bias));
    if (dt < lo) dt = lo;
    if (dt > hi) dt = hi;
    const float dA = mbd_pm_expf(__fmul_rn(dt, a));
    for (int e = threadIdx.x; e < PN; e += blockDim.x) {
      const int p = e / N, n = e - p * N;
      float *se = st + p * LD + n;
      *se = __fmaf_rn(dA, *se, __fmul_rn(__fmul_rn(dt, B[n]), x[p]));
    }
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
      const float *sp = st + p * LD;
      float acc = 0.0f;
      for (int n = 0; n < N; n++) acc = __fmaf_rn(sp[n], C[n], acc);
      y[row * di + (int64_t)h * P + p] = __fmaf_rn(dd, x[p], acc);
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < PN; e += blockDim.x) gst[e] = st[e / N * LD + e % N];
}

static int ssd_scan_launch(cudaStream_t s, int nseq, int T, const mbd_mops_ssd_dims *dm,
                           const float *A, const float *D, const float *dt_bias, float lo,
                           float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                           int64_t ld_xbc, float *state, int64_t slot_stride,
                           const int32_t *slots, float *y, mbd_error *err) {
  const size_t sh = (size_t)dm->head_dim * (size_t)(dm->d_state + 1) * 4;
  int rc = allow_smem(k_ssd_scan, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("ssd_scan", k_ssd_scan, dim3((unsigned)dm->heads, (unsigned)nseq),
                    dim3(SSD_THREADS), sh, s, err, T, *dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                    xbc, ld_xbc, state, slot_stride, slots, y);
}

extern "C" int mbd_mops_ssd_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                                 const float *A, const float *D, const float *dt_bias, float lo,
                                 float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                                 int64_t ld_xbc, float *state, int64_t slot_stride,
                                 const int32_t *slots, float *y, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (nseq > 65535 || dm->heads < 1 || dm->heads > 65535 || dm->n_groups < 1 ||
      dm->heads % dm->n_groups || dm->head_dim < 1 || dm->d_state < 1 ||
      (size_t)dm->head_dim * (size_t)(dm->d_state + 1) * 4 > 200 * 1024)
    return mbd_error_set(err, MBD_E_INVALID,
                         "ssd_scan: %d sequences, %d heads x %d, d_state %d, %d groups "
                         "unsupported",
                         nseq, dm->heads, dm->head_dim, dm->d_state, dm->n_groups);
  return ssd_scan_launch((cudaStream_t)stream, nseq, T, dm, A, D, dt_bias, lo, hi, dt_raw, ld_dt,
                         xbc, ld_xbc, state, slot_stride, slots, y, err);
}
