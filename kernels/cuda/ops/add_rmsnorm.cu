/* Residual add + RMSNorm (see add_rmsnorm.h). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/add_rmsnorm.h"

#include <stdlib.h>

/* One block per row. The row goes through shared memory; the first warp
 * computes the route's scale (rms_inv_route), the block writes the output
 * (rms_out). */
template <typename OutT>
__global__ void k_add_rmsnorm(int d, int64_t in_stride, int64_t in_offset,
                              float *__restrict__ resid, const float *__restrict__ delta,
                              const float *__restrict__ w, float eps, OutT *__restrict__ out,
                              bool early) {
  extern __shared__ float4 smem4[];
  float *row = (float *)smem4;
  __shared__ float r_sh;
  const int64_t i = blockIdx.x;
  const int64_t r = i * in_stride + in_offset;
  float *x = resid + r * d;
  pdl_enter(early);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = x[c];
    if (delta) {
      v = __fadd_rn(v, delta[r * d + c]);
      x[c] = v;
    }
    row[c] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const float v = rms_inv_route<OutT>(row, d, eps, threadIdx.x);
    if (threadIdx.x == 0) r_sh = v;
  }
  __syncthreads();
  const float rr = r_sh;
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    st_act(out + i * d + c, rms_out(w[c], row[c], rr));
}

/* 16-bit routes, d <= 32 NV: one warp per row, the row in registers. Lane l
 * holds c = l + 32 j, j ascending, which is rms_inv_lanes' chain for lane l;
 * then the same butterfly and roundings. The weights are static and load
 * before the dependency wait; no shared memory and no block barrier stand
 * between the loads and the chain. */
#define ARN_ROWS 4 /* rows (warps) per block */
template <typename OutT, int NV>
__global__ void __launch_bounds__(ARN_ROWS * 32)
    k_add_rmsnorm_warp(int64_t M, int d, int64_t in_stride, int64_t in_offset,
                       float *__restrict__ resid, const float *__restrict__ delta,
                       const float *__restrict__ w, float eps, OutT *__restrict__ out,
                       bool early) {
  const int lane = threadIdx.x & 31;
  const int64_t i = (int64_t)blockIdx.x * ARN_ROWS + (threadIdx.x >> 5);
  float wv[NV];
#pragma unroll
  for (int j = 0; j < NV; j++) wv[j] = lane + 32 * j < d ? w[lane + 32 * j] : 0.0f;
  pdl_enter(early);
  if (i >= M) return;
  const int64_t r = i * in_stride + in_offset;
  float *x = resid + r * d;
  float v[NV];
  if (delta) {
    const float *dl = delta + r * d;
    float dv[NV];
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int c = lane + 32 * j;
      v[j] = c < d ? x[c] : 0.0f;
      dv[j] = c < d ? dl[c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int c = lane + 32 * j;
      if (c < d) {
        v[j] = __fadd_rn(v[j], dv[j]);
        x[c] = v[j];
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < NV; j++) v[j] = lane + 32 * j < d ? x[lane + 32 * j] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; j++)
    if (lane + 32 * j < d) ss = __fmaf_rn(v[j], v[j], ss);
  ss = lane_sum(ss);
  const float rr = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
#pragma unroll
  for (int j = 0; j < NV; j++)
    if (lane + 32 * j < d) st_act(out + i * d + lane + 32 * j, rms_out(wv[j], v[j], rr));
}

/* The warp kernel (16-bit routes, d <= 2048) unless MBD_RMSNORM_BLOCK=1 asks
 * for the block kernel (same bits; the benches compare both). */
static bool use_warp_kernel(int d) {
  const char *e = getenv("MBD_RMSNORM_BLOCK");
  return d <= 2048 && !(e && e[0] == '1');
}

template <typename T>
static int add_rmsnorm_launch(cudaStream_t s, int64_t M, int d, int64_t in_stride,
                              int64_t in_offset, float *resid, const float *delta, const float *w,
                              float eps, T *out, mbd_error *err) {
  if constexpr (sizeof(T) == 2) {
    if (use_warp_kernel(d)) {
      const dim3 grid((unsigned)((M + ARN_ROWS - 1) / ARN_ROWS)), block(ARN_ROWS * 32);
      if (d <= 32 * 24)
        return launch_pdl("add_rmsnorm", k_add_rmsnorm_warp<T, 24>, grid, block, 0, s, err, M,
                          d, in_stride, in_offset, resid, delta, w, eps, out, pdl_early());
      return launch_pdl("add_rmsnorm", k_add_rmsnorm_warp<T, 64>, grid, block, 0, s, err, M, d,
                        in_stride, in_offset, resid, delta, w, eps, out, pdl_early());
    }
  }
  const size_t sh = ((size_t)d + 3) / 4 * 16;
  int rc = allow_smem(k_add_rmsnorm<T>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("add_rmsnorm", k_add_rmsnorm<T>, dim3((unsigned)M), dim3(256), sh, s, err, d,
                    in_stride, in_offset, resid, delta, w, eps, out, pdl_early());
}

extern "C" int mbd_mops_add_rmsnorm(void *stream, int64_t M, int d, int64_t in_stride,
                                    int64_t in_offset, float *resid, const float *delta,
                                    const float *w, float eps, mbd_dtype act, void *out,
                                    mbd_error *err) {
  if (M <= 0) return 0;
  if (d <= 0 || d > 12288)
    return mbd_error_set(err, MBD_E_INVALID, "rmsnorm width %d outside 1..12288", d);
  if (M > INT32_MAX || in_stride < 0 || in_offset < 0)
    return mbd_error_set(err, MBD_E_INVALID, "rmsnorm: %lld rows, row stride %lld, offset %lld",
                         (long long)M, (long long)in_stride, (long long)in_offset);
  cudaStream_t s = (cudaStream_t)stream;
#define NRM(T)                                                                             \
  return add_rmsnorm_launch<T>(s, M, d, in_stride, in_offset, resid, delta, w, eps, (T *)out, \
                               err)
  MBD_ACT_DISPATCH(act, NRM)
#undef NRM
  return 0;
}
