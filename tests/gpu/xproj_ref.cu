/* The x_proj contract's reference (xproj_ref.h), written apart from the
 * kernels' helpers: warp (r, o) runs, for every group g = 0, 1, ..., one
 * m16n8k16 step from zero whose A operand holds w[o, 16 g .. 16 g + 15] in
 * its row 0 and zeros elsewhere, and whose B operand holds x[r, same k] in
 * its column 0 and zeros elsewhere (zeros past K); lane g % 32 adds the
 * result (row 0, column 0: lane 0's first register) to its class sum, from
 * +0, groups in order; then the xor butterfly 16, 8, 4, 2, 1. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "tests/gpu/xproj_ref.h"

template <bool BF16>
__device__ __forceinline__ void ref_mma(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  if (BF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Elements k, k + 1 of a row of 16-bit values (zeros past K). */
__device__ __forceinline__ uint32_t ref_pair(const unsigned short *row, int k, int K) {
  const uint32_t lo = k < K ? row[k] : 0u, hi = k + 1 < K ? row[k + 1] : 0u;
  return hi << 16 | lo;
}

template <bool BF16>
__global__ void k_xproj_ref(int M, int K, int NO, const unsigned short *x, int64_t ldx,
                            const unsigned short *w, float *out) {
  const int lane = threadIdx.x & 31;
  const int64_t u = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (u >= (int64_t)M * NO) return;
  const int r = (int)(u / NO), o = (int)(u % NO);
  const unsigned short *xr = x + r * ldx, *wr = w + (int64_t)o * K;
  const int gq = lane >> 2, t = lane & 3;
  float s = 0.0f;
  for (int g = 0; 16 * g < K; g++) {
    const int k = 16 * g + 2 * t;
    /* A row 0: lanes 0..3 hold a0/a1 (k 2t, 2t + 1) and a4/a5 (k 2t + 8, ..) */
    const uint32_t a[4] = {gq == 0 ? ref_pair(wr, k, K) : 0u, 0u,
                           gq == 0 ? ref_pair(wr, k + 8, K) : 0u, 0u};
    /* B column 0: lanes 0..3 */
    const uint32_t b[2] = {gq == 0 ? ref_pair(xr, k, K) : 0u,
                           gq == 0 ? ref_pair(xr, k + 8, K) : 0u};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ref_mma<BF16>(d, a, b);
    const float p = __shfl_sync(0xffffffffu, d[0], 0);
    if (lane == g % 32) s = __fadd_rn(s, p);
  }
  for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  if (lane == 0) out[(int64_t)r * NO + o] = s;
}

extern "C" int xproj_ref(int bf16, int M, int K, int NO, const void *x, int64_t ldx,
                         const void *w, float *out) {
  if (M <= 0 || NO <= 0) return 0;
  const int64_t n = (int64_t)M * NO;
  const unsigned blocks = (unsigned)((n + 7) / 8);
  if (bf16)
    k_xproj_ref<true><<<blocks, 256>>>(M, K, NO, (const unsigned short *)x, ldx,
                                       (const unsigned short *)w, out);
  else
    k_xproj_ref<false><<<blocks, 256>>>(M, K, NO, (const unsigned short *)x, ldx,
                                        (const unsigned short *)w, out);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "xproj_ref: %s\n", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}
