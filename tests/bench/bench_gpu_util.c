/* Helpers shared by the GPU model benchmarks (see bench_gpu_util.h). */
#include "bench_gpu_util.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

float mbd_bench_median(float *v, int n) {
  qsort(v, (size_t)n, sizeof(float), cmp_f);
  return v[n / 2];
}

double mbd_bench_copy_rate(void) {
  size_t n = (size_t)1 << 30;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, n) || cudaMalloc(&b, n)) {
    cudaFree(a);
    return 0;
  }
  cudaMemset(a, 1, n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float t[10];
  for (int i = 0; i < 12; i++) {
    cudaEventRecord(e0, 0);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    if (i >= 2) cudaEventElapsedTime(&t[i - 2], e0, e1);
  }
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * (double)n / (mbd_bench_median(t, 10) * 1e-3);
}

int mbd_bench_dzalloc(void *p, size_t n) {
  void **pp = (void **)p;
  if (cudaMalloc(pp, n)) return 1;
  return cudaMemset(*pp, 0, n) != cudaSuccess;
}

int mbd_bench_op_us(void *stream, int reps, mbd_bench_op_fn op, void *arg, float *us,
                    mbd_error *err) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t e0 = NULL, e1 = NULL;
  int rc = op(arg, err); /* warm-up */
  if (rc) return rc;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int r = 0; r < reps && !rc; r++) rc = op(arg, err);
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  *us = ms * 1e3f / (float)reps;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return rc;
}
