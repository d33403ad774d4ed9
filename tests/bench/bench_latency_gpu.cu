/* Device latencies that bound a batch-1 decode step (the persistent decode's
 * stages are chains of them, not bandwidth): a dependent mma.sync m16n8k16
 * step (1, 2, 4 interleaved chains; one warp and eight), and a dependent L2
 * load of data another SM just wrote. Prints a table: cycles and ns at the
 * clock measured during the run (clock64 over %globaltimer), which is below
 * the device attribute's boost clock under load. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

__device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, const uint32_t *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ long long globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* t[0] cycles, t[1] ns of n steps of C interleaved chains (warp 0 of block 0). */
template <int C>
__global__ void k_mma_chain(float *sink, long long *t, int n) {
  const uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, 7u, 9u}, b[2] = {threadIdx.x ^ 5u, 11u};
  float d[C][4] = {};
  __syncwarp();
  const long long c0 = clock64(), g0 = globaltimer();
  for (int i = 0; i < n; i++)
#pragma unroll
    for (int c = 0; c < C; c++) mma_bf16(d[c], a, b);
  const long long c1 = clock64(), g1 = globaltimer();
  float s = 0.0f;
  for (int c = 0; c < C; c++) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0 && blockIdx.x == 0) t[0] = c1 - c0, t[1] = g1 - g0;
}

/* Block 0 writes a chain of indices one 128-byte line apart and releases a
 * flag; block 1 (another SM) acquires it and follows the chain with L2 loads.
 * t[0]: cycles per dependent load. */
__global__ void k_l2_chase(int *chain, int *flag, long long *t, int n) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    for (int i = 0; i < n; i++) chain[i * 32] = (i + 1) * 32;
    __threadfence();
    atomicExch(flag, 1);
    return;
  }
  while (atomicAdd(flag, 0) == 0) {
  }
  __threadfence();
  const long long c0 = clock64();
  int p = 0;
  for (int i = 0; i < n; i++) p = __ldcg(chain + p);
  t[0] = (clock64() - c0) / n;
  t[1] = p;
}

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                         \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

template <int C>
static int chain_row(float *sink, long long *t, int threads) {
  const int n = 4096;
  long long h[2];
  k_mma_chain<C><<<1, threads>>>(sink, t, n); /* warm-up */
  k_mma_chain<C><<<1, threads>>>(sink, t, n);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost));
  printf("mma.sync m16n8k16 bf16 | %d chain(s)/warp, %3d threads | %6.1f cycles | %5.1f ns | %4.0f MHz\n",
         C, threads, (double)h[0] / n, (double)h[1] / n, (double)h[0] / (double)h[1] * 1e3);
  return 0;
}

int main(void) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    printf("bench_latency_gpu: no CUDA device, skipped\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s (cc %d.%d)\n", prop.name, prop.major, prop.minor);
  if (prop.major < 8) {
    printf("mma.sync bf16 needs cc >= 8.0, skipped\n");
    return 0;
  }
  float *sink;
  long long *t;
  int *chain, *flag;
  CK(cudaMalloc((void **)&sink, 1 << 20));
  CK(cudaMalloc((void **)&t, 64));
  CK(cudaMalloc((void **)&chain, 256 * 32 * sizeof(int)));
  CK(cudaMalloc((void **)&flag, sizeof(int)));
  printf("what                   | shape                           | per step     | ns    | clock\n");
  if (chain_row<1>(sink, t, 32) || chain_row<2>(sink, t, 32) || chain_row<4>(sink, t, 32) ||
      chain_row<1>(sink, t, 256) || chain_row<2>(sink, t, 256) || chain_row<4>(sink, t, 256))
    return 1;
  for (int rep = 0; rep < 3; rep++) {
    long long h[2];
    CK(cudaMemset(flag, 0, sizeof(int)));
    k_l2_chase<<<2, 32>>>(chain, flag, t, 256);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost));
    printf("L2 load, another SM's data | dependent chain of 256 lines (run %d) | %6lld cycles |\n",
           rep, h[0]);
  }
  cudaFree(sink);
  cudaFree(t);
  cudaFree(chain);
  cudaFree(flag);
  return 0;
}
