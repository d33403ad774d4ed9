/* Gated RMSNorm (see gated_rmsnorm.h): one block per row; the gated values
 * go through shared memory, each group's square sum is formed, then the
 * block writes the row. f32 routes run the CPU's ascending fmaf chain on one
 * thread per group (rms_inv when the group is whole quads); 16-bit routes,
 * which are not compared with the CPU, give each group a warp and the
 * RMSNorm's lane split (rms_inv_lanes), since the serial chain over d_inner
 * channels sat on every layer's critical path of a small-batch decode. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/gated_rmsnorm.h"

/* Each thread loads GN_BATCH elements before using any: one block per row
 * makes a batch-1 decode latency-bound, and a loop that waits on each load
 * in turn paid the memory latency n / GN_THREADS times. */
#define GN_THREADS 512
#define GN_BATCH 8
#define GN_MAX_GROUPS 64

template <typename OutT>
__global__ void __launch_bounds__(GN_THREADS) k_gated_rmsnorm(int n, int group, const float *__restrict__ y,
                                const float *__restrict__ z, int64_t ldz,
                                const float *__restrict__ w, float eps, int norm_before_gate,
                                OutT *__restrict__ out, bool early) {
  extern __shared__ float4 smem4[];
  float *v = (float *)smem4;
  __shared__ float r_sh[GN_MAX_GROUPS];
  const int64_t i = blockIdx.x;
  float w0[GN_BATCH]; /* the first pass's weights: static, loaded before the wait */
#pragma unroll
  for (int j = 0; j < GN_BATCH; j++) {
    const int c = threadIdx.x + j * GN_THREADS;
    w0[j] = c < n ? w[c] : 0.0f;
  }
  pdl_enter(early);
  for (int c0 = threadIdx.x; c0 < n; c0 += GN_BATCH * GN_THREADS) {
    float yv[GN_BATCH], zv[GN_BATCH];
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      yv[j] = c < n ? y[i * n + c] : 0.0f;
      zv[j] = c < n && !norm_before_gate ? z[i * ldz + c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      if (c < n) v[c] = norm_before_gate ? yv[j] : __fmul_rn(yv[j], mbd_pm_silu(zv[j]));
    }
  }
  __syncthreads();
  if constexpr (sizeof(OutT) == 4) {
    for (int g = threadIdx.x; g < n / group; g += blockDim.x) {
      if (group % 4 == 0) {
        r_sh[g] = rms_inv(v + (int64_t)g * group, group, eps);
        continue;
      }
      float ss = 0.0f;
      for (int c = g * group; c < (g + 1) * group; c++) ss = __fmaf_rn(v[c], v[c], ss);
      r_sh[g] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)group), eps)));
    }
  } else {
    const int lane = threadIdx.x % 32;
    for (int g = threadIdx.x / 32; g < n / group; g += blockDim.x / 32) {
      const float r = rms_inv_lanes(v + (int64_t)g * group, group, eps, lane);
      if (lane == 0) r_sh[g] = r;
    }
  }
  __syncthreads();
  for (int c0 = threadIdx.x; c0 < n; c0 += GN_BATCH * GN_THREADS) {
    float wv[GN_BATCH], zv[GN_BATCH];
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      wv[j] = c0 == (int)threadIdx.x ? w0[j] : c < n ? w[c] : 0.0f;
      zv[j] = c < n && norm_before_gate ? z[i * ldz + c] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < GN_BATCH; j++) {
      const int c = c0 + j * GN_THREADS;
      if (c >= n) continue;
      float o = __fmul_rn(wv[j], __fmul_rn(v[c], r_sh[c / group]));
      if (norm_before_gate) o = __fmul_rn(o, mbd_pm_silu(zv[j]));
      st_act(out + i * n + c, o);
    }
  }
}

template <typename T>
static int gated_rmsnorm_launch(cudaStream_t s, int64_t M, int n, int group, const float *y,
                                const float *z, int64_t ldz, const float *w, float eps,
                                int norm_before_gate, T *out, mbd_error *err) {
  const size_t sh = ((size_t)n + 3) / 4 * 16;
  int rc = allow_smem(k_gated_rmsnorm<T>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("gated_rmsnorm", k_gated_rmsnorm<T>, dim3((unsigned)M), dim3(GN_THREADS), sh,
                    s, err, n, group, y, z, ldz, w, eps, norm_before_gate, out, pdl_early());
}

extern "C" int mbd_mops_gated_rmsnorm(void *stream, int64_t M, int n, int group, const float *y,
                                      const float *z, int64_t ldz, const float *w, float eps,
                                      int norm_before_gate, mbd_dtype act, void *out,
                                      mbd_error *err) {
  if (M <= 0) return 0;
  if (n <= 0 || n > 40960 || group <= 0 || n % group || n / group > GN_MAX_GROUPS ||
      M > INT32_MAX)
    return mbd_error_set(err, MBD_E_INVALID,
                         "gated_rmsnorm: width %d, group %d or %lld rows unsupported", n, group,
                         (long long)M);
  cudaStream_t s = (cudaStream_t)stream;
#define GNR(T)                                                                              \
  return gated_rmsnorm_launch<T>(s, M, n, group, y, z, ldz, w, eps, norm_before_gate, (T *)out, \
                                 err)
  MBD_ACT_DISPATCH(act, GNR)
#undef GNR
  return 0;
}
