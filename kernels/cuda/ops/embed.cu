/* Embedding gather (see embed.h): one block per row. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/embed.h"

template <typename T>
__global__ void k_embed(int64_t M, int d, const int32_t *__restrict__ tok,
                        const T *__restrict__ table, float *__restrict__ out) {
  int64_t r = blockIdx.x;
  pdl_wait();
  pdl_trigger();
  const T *src = table + (int64_t)tok[r] * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[r * d + c] = ld_f32(src + c);
}

template <typename T>
static int embed_launch(cudaStream_t s, int64_t M, int d, const int32_t *tok, const T *table,
                        float *out, mbd_error *err) {
  return launch_pdl("embedding gather", k_embed<T>, dim3((unsigned)M), dim3(256), 0, s, err, M, d,
                    tok, table, out);
}

extern "C" int mbd_mops_embed(void *stream, int64_t M, int d, const int32_t *tok, mbd_dtype dt,
                              const void *table, float *out, mbd_error *err) {
  if (M <= 0) return 0;
  if (M > INT32_MAX || d <= 0)
    return mbd_error_set(err, MBD_E_INVALID, "embedding: %lld rows or width %d out of range",
                         (long long)M, d);
  cudaStream_t s = (cudaStream_t)stream;
#define EMB(T) return embed_launch<T>(s, M, d, tok, (const T *)table, out, err)
  MBD_ACT_DISPATCH(dt, EMB)
#undef EMB
  return 0;
}
