/* Synthetic weights (see fill_uniform.h): a grid-stride loop over the hash of
 * the sampler (common.cuh sample_uniform). */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/fill_uniform.h"

template <typename T>
__global__ void k_fill_uniform(T *p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float u = sample_uniform(seed, 0x5eedull, (uint64_t)i); /* (0, 1) */
    st_act(p + i, (2.0f * u - 1.0f) * scale);
  }
}

template <typename T>
static int fill_uniform_launch(cudaStream_t s, T *p, int64_t n, uint64_t seed, float scale,
                               mbd_error *err) {
  return launch_ex(false, "fill_uniform", k_fill_uniform<T>, dim3(1024), dim3(256), 0, s, err, p,
                   n, seed, scale);
}

extern "C" int mbd_mops_fill_uniform(void *stream, mbd_dtype dt, void *p, int64_t n,
                                     uint64_t seed, float scale, mbd_error *err) {
  if (n <= 0) return 0;
  if (!p) return mbd_error_set(err, MBD_E_INVALID, "fill_uniform: NULL buffer");
  cudaStream_t s = (cudaStream_t)stream;
#define FILL(T) return fill_uniform_launch<T>(s, (T *)p, n, seed, scale, err)
  MBD_ACT_DISPATCH(dt, FILL)
#undef FILL
  return 0;
}
