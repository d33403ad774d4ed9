/* Residual add + RMSNorm (see add_rmsnorm.h). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/add_rmsnorm.h"

/* One block per row. The row goes through shared memory; the first warp
 * computes the route's scale (rms_inv_route), the block writes the output
 * (rms_out). */
template <typename OutT>
__global__ void k_add_rmsnorm(int d, int64_t in_stride, int64_t in_offset,
                              float *__restrict__ resid, const float *__restrict__ delta,
                              const float *__restrict__ w, float eps, OutT *__restrict__ out) {
  extern __shared__ float4 smem4[];
  float *row = (float *)smem4;
  __shared__ float r_sh;
  const int64_t i = blockIdx.x;
  const int64_t r = i * in_stride + in_offset;
  float *x = resid + r * d;
  pdl_wait();
  pdl_trigger();
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

template <typename T>
static int add_rmsnorm_launch(cudaStream_t s, int64_t M, int d, int64_t in_stride,
                              int64_t in_offset, float *resid, const float *delta, const float *w,
                              float eps, T *out, mbd_error *err) {
  const size_t sh = ((size_t)d + 3) / 4 * 16;
  int rc = allow_smem(k_add_rmsnorm<T>, sh, err);
  if (rc < 0) return rc;
  return launch_pdl("add_rmsnorm", k_add_rmsnorm<T>, dim3((unsigned)M), dim3(256), sh, s, err, d,
                    in_stride, in_offset, resid, delta, w, eps, out);
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
