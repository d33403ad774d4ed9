/* GEMM benchmark on one GPU: the deterministic kernels vs cuBLAS (cublas-fast;
 * for f32 also cublas-pedantic, true FP32) through the same mbd_gpu_gemm entry,
 * at the Mamba projection shapes (130m d768, 1.4b d2048, 2.8b d2560: in_proj
 * d->4d, x_proj 2d->dt_rank+32, dt_proj dt_rank->2d, out_proj 2d->d, lm_head
 * d->50280) for M = 1, 64, 256, 4096 in bf16 and f32. Timing: CUDA events on
 * the context stream, warm-up, median of 7 batches, random data, weights and
 * inputs rotated over copies larger than L2. For M <= 64 it prints the HBM
 * floor: bytes moved / measured device copy bandwidth. */
#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "common/half.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
}

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s failed: %s at %s:%d\n", #x, cudaGetErrorName(e_), __FILE__,   \
              __LINE__);                                                                 \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static void die(const char *what, const mbd_error &err) {
  fprintf(stderr, "%s: %s\n", what, err.msg);
  exit(1);
}

static double copy_bandwidth(cudaStream_t s) {
  size_t bytes = (size_t)1 << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemsetAsync(a, 1, bytes, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < 8; i++) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (t[t.size() / 2] * 1e-3); /* read + write */
}

struct bufset {
  std::vector<void *> x, w;
  void *y;
};

static void fill_random(void *d, size_t n, mbd_dtype dt, unsigned seed) {
  size_t es = dt == MBD_DTYPE_F32 ? 4 : 2;
  std::vector<unsigned char> h(n * es);
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float v = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    if (dt == MBD_DTYPE_F32) memcpy(&h[i * 4], &v, 4);
    else {
      uint16_t b = mbd_f32_to_bf16(v);
      memcpy(&h[i * 2], &b, 2);
    }
  }
  CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
}

/* Median seconds per GEMM. */
static double time_gemm(mbd_gpu_ctx *ctx, bufset &b, mbd_gpu_gemm_args a) {
  cudaStream_t s = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  mbd_error err;
  size_t nb = b.w.size();
  auto run = [&](int i) {
    a.x = b.x[i % nb];
    a.w = b.w[i % nb];
    if (mbd_gpu_gemm(ctx, &a, &err) < 0) die("gemm", err);
  };
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; i++) run(i);
  CK(cudaEventRecord(e0, s));
  run(0);
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms1;
  CK(cudaEventElapsedTime(&ms1, e0, e1));
  int inner = std::max(1, std::min(200, (int)(2.0 / std::max(ms1, 1e-4f))));
  std::vector<double> t;
  int k = 0;
  for (int rep = 0; rep < 7; rep++) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < inner; i++) run(k++);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e-3 / inner);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char **argv) {
  mbd_error err;
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  mbd_gpu_ctx *ctx[2][3] = {{NULL}}; /* [dtype bf16/f32][det, fast, pedantic] */
  mbd_dtype_policy pols[2] = {MBD_POLICY_BF16, MBD_POLICY_F32};
  mbd_gemm_mode modes[3] = {MBD_GEMM_DETERMINISTIC, MBD_GEMM_CUBLAS_FAST,
                            MBD_GEMM_CUBLAS_PEDANTIC};
  for (int d = 0; d < 2; d++)
    for (int m = 0; m < 3; m++) {
      cfg.policy = pols[d];
      cfg.mode = modes[m];
      if (mbd_gpu_ctx_new(&cfg, &ctx[d][m], &err) < 0) {
        if (strstr(err.msg, "no CUDA device")) {
          printf("SKIP: %s\n", err.msg);
          return 77;
        }
        die("context", err);
      }
    }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  double bw = copy_bandwidth((cudaStream_t)mbd_gpu_ctx_stream(ctx[0][0]));
  printf("device: %s, %d SMs, L2 %d MiB; measured D2D copy bandwidth %.2f TB/s\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e12);
  struct model { const char *name; int d, dt_rank; } models[3] = {
      {"130m", 768, 48}, {"1.4b", 2048, 128}, {"2.8b", 2560, 160}};
  int ms_[4] = {1, 64, 256, 4096};
  bool quick = argc > 1 && !strcmp(argv[1], "--quick");
  printf("%-5s %-8s %-4s %5s %6s %5s | %9s %7s | %9s %7s | %6s | %9s %7s | %8s %5s\n", "model",
         "proj", "dt", "M", "N", "K", "det_us", "det_TF", "fast_us", "fast_TF", "ratio",
         "ped_us", "ped_TF", "floor_us", "det/fl");
  for (int d = 0; d < 2; d++) {
    mbd_dtype dt = d == 0 ? MBD_DTYPE_BF16 : MBD_DTYPE_F32;
    size_t es = d == 0 ? 2 : 4;
    for (auto &mo : models) {
      struct { const char *name; int n, k; } proj[5] = {
          {"in_proj", 4 * mo.d, mo.d}, {"x_proj", mo.dt_rank + 32, 2 * mo.d},
          {"dt_proj", 2 * mo.d, mo.dt_rank}, {"out_proj", mo.d, 2 * mo.d},
          {"lm_head", 50280, mo.d}};
      for (auto &p : proj) {
        size_t wbytes = (size_t)p.n * p.k * es;
        int nb = (int)std::min<size_t>(16, std::max<size_t>(1, ((size_t)256 << 20) / wbytes));
        bufset b;
        size_t maxm = quick ? 256 : 4096;
        for (int i = 0; i < nb; i++) {
          void *x, *w;
          CK(cudaMalloc(&w, wbytes));
          CK(cudaMalloc(&x, maxm * p.k * es));
          fill_random(w, (size_t)p.n * p.k, dt, 7 + i);
          fill_random(x, maxm * p.k, dt, 100 + i);
          b.w.push_back(w);
          b.x.push_back(x);
        }
        CK(cudaMalloc(&b.y, maxm * p.n * 4));
        for (int mi = 0; mi < 4; mi++) {
          int M = ms_[mi];
          if ((size_t)M > maxm) continue;
          mbd_gpu_gemm_args a = {dt, MBD_DTYPE_F32, M, p.n, p.k, NULL, NULL, NULL, b.y};
          double t[3] = {0, 0, 0};
          for (int m = 0; m < 3; m++)
            if (m < 2 || d == 1) t[m] = time_gemm(ctx[d][m], b, a);
          double fl = 2.0 * M * p.n * p.k;
          double floor_s = ((double)wbytes + (double)M * p.k * es + (double)M * p.n * 4) / bw;
          printf("%-5s %-8s %-4s %5d %6d %5d | %9.2f %7.1f | %9.2f %7.1f | %6.2f | ", mo.name,
                 p.name, mbd_dtype_name(dt), M, p.n, p.k, t[0] * 1e6, fl / t[0] / 1e12,
                 t[1] * 1e6, fl / t[1] / 1e12, t[1] / t[0]);
          if (d == 1) printf("%9.2f %7.1f | ", t[2] * 1e6, fl / t[2] / 1e12);
          else printf("%9s %7s | ", "-", "-");
          if (M <= 64) printf("%8.2f %5.2f\n", floor_s * 1e6, t[0] / floor_s);
          else printf("%8s %5s\n", "-", "-");
          fflush(stdout);
        }
        for (int i = 0; i < nb; i++) {
          CK(cudaFree(b.w[i]));
          CK(cudaFree(b.x[i]));
        }
        CK(cudaFree(b.y));
      }
    }
  }
  /* Ceiling check: square bf16 */
  {
    int S = 8192;
    bufset b;
    void *x, *w;
    CK(cudaMalloc(&x, (size_t)S * S * 2));
    CK(cudaMalloc(&w, (size_t)S * S * 2));
    CK(cudaMalloc(&b.y, (size_t)S * S * 4));
    fill_random(x, (size_t)S * S, MBD_DTYPE_BF16, 1);
    fill_random(w, (size_t)S * S, MBD_DTYPE_BF16, 2);
    b.x.push_back(x);
    b.w.push_back(w);
    mbd_gpu_gemm_args a = {MBD_DTYPE_BF16, MBD_DTYPE_F32, S, S, S, NULL, NULL, NULL, b.y};
    double t0 = time_gemm(ctx[0][0], b, a), t1 = time_gemm(ctx[0][1], b, a);
    double fl = 2.0 * S * S * S;
    printf("square bf16 %d^3: det %.1f TFLOP/s, cublas-fast %.1f TFLOP/s, ratio %.2f\n", S,
           fl / t0 / 1e12, fl / t1 / 1e12, t1 / t0);
  }
  for (int d = 0; d < 2; d++)
    for (int m = 0; m < 3; m++) mbd_gpu_ctx_destroy(&ctx[d][m]);
  return 0;
}
