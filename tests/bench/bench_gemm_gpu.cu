/* GEMM benchmark on one GPU: the deterministic kernels vs cuBLAS (cublas-fast;
 * for f32 also cublas-pedantic, true FP32) through the same mbd_gpu_gemm entry,
 * at the Mamba projection shapes (130m d768, 1.4b d2048, 2.8b d2560: in_proj
 * d->4d, x_proj 2d->dt_rank+32, dt_proj dt_rank->2d, out_proj 2d->d, lm_head
 * d->50280) for M = 1, 16, 64, 256, 2048, 8192 in bf16 (f32 too with --f32).
 * Timing: CUDA events on the context stream, warm-up, median of 7 batches,
 * random data, weights and inputs rotated over copies larger than L2; the
 * det and cuBLAS columns in two rounds, each side timed right after an
 * untimed run of itself, the faster round of each (time_pair).
 * For M <= 64 it prints GB/s of weight bytes and the fraction of the measured
 * device copy bandwidth (read + write bytes per second) that is; for M >= 256
 * TFLOP/s. Summary: geometric mean of det/cuBLAS speed over M >= 256 (bf16, all
 * three models) and the 1.4b M=1 weight bandwidth aggregated over its five
 * projections (total weight bytes / total time). --quick: M <= 256 only.
 * At M >= 256 the deterministic GEMM (default: the tile kernels, 2 x 1
 * clusters where pick_wcltile chooses them) also runs with MBD_GEMM_MCAST=0
 * (the plain tile kernels alone), =2 (2 x 1 thread-block clusters sharing
 * the W tile by TMA multicast), =4 (2 x 2 where the tile allows),
 * MBD_GEMM_PERSIST=1 (the 128-row tiles persistent: at most the co-resident
 * blocks, each walking tiles with one ring) alone and with MBD_GEMM_MCAST=2,
 * same bits, a SUMMARY line each.
 * Each M >= 256 shape also prints a "sched" line: us per GEMM under each
 * MBD_GEMM_SCHED setting (gpu_gemm.cu sched_tile: unset = the default, the
 * 128 x 192 tiles (producer warpgroup's registers given to the consumers)
 * where their waves cost no more than the 128 x 128 tiles'; old = the 128 x
 * 128 tiles as before; w192f = 128 x 192 wherever 128 x 128 would run; same
 * bits), the ratio cuBLAS-fast / that, and the kernel (wgemm slot, or the
 * name), with a SUMMARY geomean per setting.
 * Each M = 64 and 256 shape with K > 256 (M = 64 only among the Mamba-2
 * rows) prints a "ksplit" line: us per GEMM under each MBD_GEMM_KSPLIT
 * setting (0: the tile kernels; default: K split tile 1 for narrow N and
 * long K; 1..4: K split tile 0..3, a cluster of blocks sharing one tile
 * along K; same bits), with a SUMMARY geomean of the 0 and default settings.
 * Each M >= 64 shape also prints a "tiles" line: us per GEMM under each
 * MBD_GEMM_WTILE setting (one tile configuration alone; same bits) and the
 * fastest, with a SUMMARY geomean of the faster of the default and that (what
 * a perfect tile choice would give).
 * First the Mamba-2 projections (bench_mamba2, M = 1, 8, 16, 64 and 2048;
 * --mamba2: only those). */
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
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

/* Uniform values in [-1, 1) from a hash of (seed, index), on the device (the
 * buffers reach gigabytes: a host fill would dominate the run). */
__global__ void fill_kernel(void *d, size_t n, int f32, unsigned seed) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) * 40503u ^ seed * 97531u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    float v = (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
    if (f32) ((float *)d)[i] = v;
    else ((__nv_bfloat16 *)d)[i] = __float2bfloat16_rn(v);
  }
}
static void fill_random(void *d, size_t n, mbd_dtype dt, unsigned seed) {
  fill_kernel<<<1024, 256>>>(d, n, dt == MBD_DTYPE_F32, seed);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

/* Median device seconds per GEMM: `inner` GEMMs (rotating inputs, so weights
 * come from HBM) captured once into a CUDA graph and replayed, so the host's
 * per-call cost (argument checks, tensor-map encoding, the launch itself)
 * is not in the figure, as in the model's decode graphs. Eager timing when
 * the capture fails (printed once). */
static double time_gemm(mbd_gpu_ctx *ctx, bufset &b, mbd_gpu_gemm_args a) {
  cudaStream_t s = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  mbd_error err;
  size_t nb = b.w.size();
  auto run = [&](int i) {
    a.x = b.x[i % b.x.size()];
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
  mbd_gpu_graph *g = NULL;
  if (mbd_gpu_graph_begin(ctx, &err) == 0) {
    for (int i = 0; i < inner; i++) run(i);
    if (mbd_gpu_graph_end(ctx, &g, &err) != 0) g = NULL;
  }
  static bool warned = false;
  if (!g && !warned) {
    warned = true;
    fprintf(stderr, "graph capture failed (%s): eager timing, host cost included\n", err.msg);
  }
  std::vector<double> t;
  int k = 0;
  if (g && mbd_gpu_graph_launch(ctx, g, &err) < 0) die("graph", err); /* upload, warm */
  for (int rep = 0; rep < 7; rep++) {
    CK(cudaEventRecord(e0, s));
    if (g) {
      if (mbd_gpu_graph_launch(ctx, g, &err) < 0) die("graph", err);
    } else {
      for (int i = 0; i < inner; i++) run(k++);
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e-3 / inner);
  }
  mbd_gpu_graph_destroy(&g);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/* The deterministic GEMM (ctx d) and cuBLAS (ctx f) on one shape, each
 * timed right after an untimed run of itself, in two rounds (d, f, d, f),
 * the faster round of each: a kernel timed right after the other one, or
 * first on a shape's fresh buffers, read slower than the same kernel
 * re-timed after runs of its own (figures: docs/benchmarks.md). */
static void time_pair(mbd_gpu_ctx *d, mbd_gpu_ctx *f, bufset &b, const mbd_gpu_gemm_args &a,
                      double *td, double *tf) {
  *td = *tf = 1e30;
  for (int r = 0; r < 2; r++) {
    (void)time_gemm(d, b, a);
    *td = std::min(*td, time_gemm(d, b, a));
    (void)time_gemm(f, b, a);
    *tf = std::min(*tf, time_gemm(f, b, a));
  }
}

/* MBD_GEMM_SCHED settings (gpu_gemm.cu sched_tile; same bits): "" = unset
 * (the default: 128 x 192 tiles where their waves allow), old (the 128 x 128
 * tiles), w192f (128 x 192 wherever 128 x 128 would run). */
static const char *const k_sched[] = {"", "old", "w192f"};
#define N_SCHED ((int)(sizeof k_sched / sizeof k_sched[0]))
static void time_sched(mbd_gpu_ctx *ctx, bufset &b, const mbd_gpu_gemm_args &a,
                       double t[N_SCHED]) {
  for (int i = 0; i < N_SCHED; i++) {
    if (k_sched[i][0]) setenv("MBD_GEMM_SCHED", k_sched[i], 1);
    t[i] = time_gemm(ctx, b, a);
    unsetenv("MBD_GEMM_SCHED");
  }
}
/* The kernel one launch of a runs (the launch record's name). */
static void kernel_name(mbd_gpu_ctx *ctx, const mbd_gpu_gemm_args &a, char *out, size_t cap) {
  mbd_error err;
  snprintf(out, cap, "?");
  if (mbd_gpu_record_begin(ctx, &err) == 0) {
    if (mbd_gpu_gemm(ctx, &a, &err) < 0) die("gemm", err);
    if (mbd_gpu_record_end(ctx, &err) == 0 && mbd_gpu_record_count(ctx) == 1)
      snprintf(out, cap, "%s", mbd_gpu_record_at(ctx, 0)->kernel);
  }
}
/* Seconds per GEMM of a with the environment variable var set to val (unset
 * for ""), and the kernel it runs into name. */
static double time_setting(mbd_gpu_ctx *ctx, bufset &b, const mbd_gpu_gemm_args &a,
                           const char *var, const char *val, char *name, size_t cap) {
  if (val[0]) setenv(var, val, 1);
  const double t = time_gemm(ctx, b, a);
  mbd_gpu_gemm_args r = a;
  r.x = b.x[0];
  r.w = b.w[0];
  kernel_name(ctx, r, name, cap);
  unsetenv(var);
  return t;
}
/* One line: us per GEMM under each MBD_GEMM_SCHED setting and its kernel. */
static void print_sched(const char *tag, mbd_gpu_ctx *ctx, bufset &b, mbd_gpu_gemm_args a,
                        double fast_t, double out[N_SCHED]) {
  time_sched(ctx, b, a, out);
  a.x = b.x[0];
  a.w = b.w[0];
  printf("  sched %s:", tag);
  for (int i = 0; i < N_SCHED; i++) {
    char name[64];
    if (k_sched[i][0]) setenv("MBD_GEMM_SCHED", k_sched[i], 1);
    kernel_name(ctx, a, name, sizeof name);
    unsetenv("MBD_GEMM_SCHED");
    const char *shortname = strstr(name, "wgemm_") ? strrchr(name, '_') + 1 : name + 4;
    printf(" %s=%.2f(%.2f,%s)", k_sched[i][0] ? k_sched[i] : "default", out[i] * 1e6,
           fast_t / out[i], shortname);
  }
  printf("\n");
}

/* MBD_GEMM_KSPLIT settings (gpu_gemm.cu pick_wkstile; same bits): 0 (the
 * tile kernels), "" = unset (the default: K split tile 1 for narrow N and
 * long K), 1..4 (K split tile 0..3 wherever K exceeds one chunk). */
static const char *const k_ksplit[] = {"0", "", "1", "2", "3", "4"};
#define N_KSPLIT ((int)(sizeof k_ksplit / sizeof k_ksplit[0]))
/* One line: us per GEMM under each MBD_GEMM_KSPLIT setting, the ratio
 * cuBLAS-fast / that, and the kernel; out[] gets the times. */
static void print_ksplit(mbd_gpu_ctx *ctx, bufset &b, mbd_gpu_gemm_args a, double fast_t,
                         double out[N_KSPLIT]) {
  printf("  ksplit (us, cuBLAS-fast / det, kernel):");
  for (int i = 0; i < N_KSPLIT; i++) {
    char name[64];
    out[i] = time_setting(ctx, b, a, "MBD_GEMM_KSPLIT", k_ksplit[i], name, sizeof name);
    printf(" %s=%.2f(%.2f,%s)", k_ksplit[i][0] ? k_ksplit[i] : "default", out[i] * 1e6,
           fast_t / out[i], name + 4);
  }
  printf("\n");
}

/* One line: us per GEMM under each MBD_GEMM_WTILE setting (gpu_gemm.cu
 * forced_wtile: one tile configuration alone, no cluster or K split form;
 * same bits) that runs a tile kernel of its own index, with cuBLAS-fast /
 * that. Returns the least time; *best gets its index. */
#define N_WTILE 11
static double print_tiles(mbd_gpu_ctx *ctx, bufset &b, mbd_gpu_gemm_args a, double fast_t,
                          int *best) {
  printf("  tiles (us, cuBLAS-fast / det):");
  double bt = 1e9;
  *best = -1;
  for (int i = 0; i < N_WTILE; i++) {
    char v[8], name[64];
    snprintf(v, sizeof v, "%d", i);
    setenv("MBD_GEMM_WTILE", v, 1);
    mbd_gpu_gemm_args r = a;
    r.x = b.x[0];
    r.w = b.w[0];
    kernel_name(ctx, r, name, sizeof name);
    const char *idx = strrchr(name, '_');
    if (strstr(name, "wgemm_") && idx && atoi(idx + 1) == i) {
      const double t = time_gemm(ctx, b, a);
      printf(" %d=%.2f(%.2f)", i, t * 1e6, fast_t / t);
      if (t < bt) {
        bt = t;
        *best = i;
      }
    }
    unsetenv("MBD_GEMM_WTILE");
  }
  printf(" best=%d\n", *best);
  return bt;
}

/* Mamba-2 projections (130m: d 768, in_proj N = 2 d_inner + 2 d_state +
 * heads = 3352; 1.3b: d 2048, N = 8512) at M = 1, 8, 16, 64 in bf16: det (the
 * default dispatch), det with MBD_GEMM_RAGGED=0 MBD_GEMM_TILE72=0 (the
 * strided M <= 16 kernel instead of the ragged-range one, and no 64 x 72
 * tiles at M <= 64, where those are chosen; same bits) and cublas-fast, us
 * per GEMM and GB/s of weight bytes. */
static void bench_mamba2(mbd_gpu_ctx *det, mbd_gpu_ctx *fast) {
  struct { const char *model, *name; int n, k; } proj[4] = {
      {"130m", "in_proj", 3352, 768}, {"130m", "out_proj", 768, 1536},
      {"1.3b", "in_proj", 8512, 2048}, {"1.3b", "out_proj", 2048, 4096}};
  const int ms_[5] = {1, 8, 16, 64, 2048};
  printf("Mamba-2 bf16 | %-5s %-8s %5s %5s %5s | %9s %7s | %9s %7s | %9s %7s | %s\n", "model",
         "proj", "M", "N", "K", "det_us", "GB/s", "old_us", "GB/s", "fast_us", "GB/s",
         "det kernel");
  for (auto &p : proj) {
    size_t wbytes = (size_t)p.n * p.k * 2;
    int nb = (int)std::min<size_t>(16, std::max<size_t>(1, ((size_t)256 << 20) / wbytes));
    bufset b;
    for (int i = 0; i < nb; i++) {
      void *w;
      CK(cudaMalloc(&w, wbytes));
      fill_random(w, (size_t)p.n * p.k, MBD_DTYPE_BF16, 7 + i);
      b.w.push_back(w);
    }
    void *x;
    CK(cudaMalloc(&x, (size_t)2048 * p.k * 2));
    fill_random(x, (size_t)2048 * p.k, MBD_DTYPE_BF16, 100);
    b.x.push_back(x);
    CK(cudaMalloc(&b.y, (size_t)2048 * p.n * 4));
    for (int M : ms_) {
      mbd_gpu_gemm_args a = {MBD_DTYPE_BF16, MBD_DTYPE_F32, M, p.n, p.k, x, b.w[0], NULL, b.y, 1};
      mbd_error err;
      char kname[64] = "?";
      if (mbd_gpu_record_begin(det, &err) == 0) {
        if (mbd_gpu_gemm(det, &a, &err) < 0) die("gemm", err);
        if (mbd_gpu_record_end(det, &err) == 0 && mbd_gpu_record_count(det) == 1)
          snprintf(kname, sizeof kname, "%s", mbd_gpu_record_at(det, 0)->kernel);
      }
      double t0 = time_gemm(det, b, a);
      setenv("MBD_GEMM_RAGGED", "0", 1);
      setenv("MBD_GEMM_TILE72", "0", 1);
      double t1 = time_gemm(det, b, a);
      unsetenv("MBD_GEMM_RAGGED");
      unsetenv("MBD_GEMM_TILE72");
      double t2 = time_gemm(fast, b, a);
      printf("Mamba-2 bf16 | %-5s %-8s %5d %5d %5d | %9.2f %7.0f | %9.2f %7.0f | %9.2f %7.0f | %s\n",
             p.model, p.name, M, p.n, p.k, t0 * 1e6, wbytes / t0 / 1e9, t1 * 1e6,
             wbytes / t1 / 1e9, t2 * 1e6, wbytes / t2 / 1e9, kname);
      if (M >= 256) {
        double ts[N_SCHED];
        print_sched("(us, cuBLAS-fast / det, kernel)", det, b, a, t2, ts);
      }
      if (M >= 64) {
        int bi;
        print_tiles(det, b, a, t2, &bi);
      }
      if (M >= 64 && M <= 256 && p.k > 256) {
        double tk[N_KSPLIT];
        print_ksplit(det, b, a, t2, tk);
      }
      fflush(stdout);
    }
    for (auto w : b.w) CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(b.y));
  }
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
  const int ms_[6] = {1, 16, 64, 256, 2048, 8192};
  bool quick = false, with_f32 = false, m2_only = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    if (!strcmp(argv[i], "--f32")) with_f32 = true;
    if (!strcmp(argv[i], "--mamba2")) m2_only = true;
  }
  bench_mamba2(ctx[0][0], ctx[0][1]);
  if (m2_only) {
    for (int d = 0; d < 2; d++)
      for (int m = 0; m < 3; m++) mbd_gpu_ctx_destroy(&ctx[d][m]);
    return 0;
  }
  printf("%-5s %-8s %-4s %5s %6s %5s | %9s %9s | %9s %9s | %6s | %9s %7s | %6s | %9s %6s | "
         "%9s %6s | %9s %6s | %9s %6s | %9s %6s | %s\n",
         "model", "proj", "dt", "M", "N", "K", "det_us", "det", "fast_us", "fast", "ratio",
         "ped_us", "ped_TF", "det/bw", "mc0_us", "ratio", "mc2_us", "ratio", "mc4_us",
         "ratio", "ps_us", "ratio", "ps2_us", "ratio", "det kernel");
  printf("(device time per GEMM from CUDA-graph replay of back-to-back GEMMs, weights rotated "
         "through HBM)\n");
  printf("(det, fast: TFLOP/s for M >= 256, GB/s of weight bytes for M <= 64; ratio = "
         "det speed / cuBLAS speed; det/bw = weight GB/s / copy bandwidth)\n");
  double log_sum = 0, log_mc0 = 0, log_mc4 = 0, log_plain = 0, log_ps = 0, log_ps2 = 0;
  double log_sched[N_SCHED] = {0}, worst_sched[N_SCHED];
  for (int i = 0; i < N_SCHED; i++) worst_sched[i] = 1e9;
  double worst = 1e9, worst_mc0 = 1e9, worst_mc4 = 1e9, worst_plain = 1e9;
  int log_n = 0, log_ks_n = 0;
  double log_best = 0, worst_best = 1e9; /* the default or the best single tile */
  double log_ks_off = 0, log_ks_def = 0;
  double agg_bytes = 0, agg_time = 0, agg_time_fast = 0;
  for (int d = 0; d < (with_f32 ? 2 : 1); d++) {
    mbd_dtype dt = d == 0 ? MBD_DTYPE_BF16 : MBD_DTYPE_F32;
    size_t es = d == 0 ? 2 : 4;
    for (auto &mo : models) {
      struct { const char *name; int n, k; } proj[5] = {
          {"in_proj", 4 * mo.d, mo.d}, {"x_proj", mo.dt_rank + 32, 2 * mo.d},
          {"dt_proj", 2 * mo.d, mo.dt_rank}, {"out_proj", mo.d, 2 * mo.d},
          {"lm_head", 50280, mo.d}};
      for (auto &p : proj) {
        size_t wbytes = (size_t)p.n * p.k * es;
        size_t maxm = quick ? 256 : 8192;
        int nb = (int)std::min<size_t>(16, std::max<size_t>(1, ((size_t)256 << 20) / wbytes));
        size_t xbytes = maxm * p.k * es;
        int nbx = (int)std::min<size_t>(nb, std::max<size_t>(1, ((size_t)128 << 20) / xbytes));
        bufset b;
        for (int i = 0; i < nb; i++) {
          void *w;
          CK(cudaMalloc(&w, wbytes));
          fill_random(w, (size_t)p.n * p.k, dt, 7 + i);
          b.w.push_back(w);
        }
        for (int i = 0; i < nbx; i++) {
          void *x;
          CK(cudaMalloc(&x, xbytes));
          fill_random(x, maxm * p.k, dt, 100 + i);
          b.x.push_back(x);
        }
        CK(cudaMalloc(&b.y, maxm * p.n * 4));
        for (int mi = 0; mi < 6; mi++) {
          int M = ms_[mi];
          if ((size_t)M > maxm) continue;
          mbd_gpu_gemm_args a = {dt, MBD_DTYPE_F32, M, p.n, p.k, NULL, NULL, NULL, b.y, 0};
          double t[3] = {0, 0, 0};
          time_pair(ctx[d][0], ctx[d][1], b, a, &t[0], &t[1]);
          if (d == 1) t[2] = time_gemm(ctx[d][2], b, a);
          double fl = 2.0 * M * p.n * p.k;
          double v0 = M <= 64 ? wbytes / t[0] / 1e9 : fl / t[0] / 1e12;
          double v1 = M <= 64 ? wbytes / t[1] / 1e9 : fl / t[1] / 1e12;
          printf("%-5s %-8s %-4s %5d %6d %5d | %9.2f %9.1f | %9.2f %9.1f | %6.2f | ", mo.name,
                 p.name, mbd_dtype_name(dt), M, p.n, p.k, t[0] * 1e6, v0, t[1] * 1e6, v1,
                 t[1] / t[0]);
          if (d == 1) printf("%9.2f %7.1f | ", t[2] * 1e6, fl / t[2] / 1e12);
          else printf("%9s %7s | ", "-", "-");
          if (M <= 64) printf("%6.2f | ", wbytes / t[0] / bw);
          else printf("%6s | ", "-");
          if (d == 0 && M >= 256) {
            setenv("MBD_GEMM_MCAST", "0", 1);
            const double tl = time_gemm(ctx[d][0], b, a);
            setenv("MBD_GEMM_MCAST", "2", 1);
            const double t0 = time_gemm(ctx[d][0], b, a);
            setenv("MBD_GEMM_MCAST", "4", 1);
            const double t4 = time_gemm(ctx[d][0], b, a);
            unsetenv("MBD_GEMM_MCAST");
            printf("%9.2f %6.2f | %9.2f %6.2f | %9.2f %6.2f | ", tl * 1e6, t[1] / tl, t0 * 1e6,
                   t[1] / t0, t4 * 1e6, t[1] / t4);
            log_plain += log(t[1] / tl);
            worst_plain = std::min(worst_plain, t[1] / tl);
            setenv("MBD_GEMM_PERSIST", "1", 1);
            const double tp = time_gemm(ctx[d][0], b, a);
            setenv("MBD_GEMM_MCAST", "2", 1);
            const double tp2 = time_gemm(ctx[d][0], b, a);
            unsetenv("MBD_GEMM_MCAST");
            unsetenv("MBD_GEMM_PERSIST");
            printf("%9.2f %6.2f | %9.2f %6.2f | ", tp * 1e6, t[1] / tp, tp2 * 1e6, t[1] / tp2);
            log_ps += log(t[1] / tp);
            log_ps2 += log(t[1] / tp2);
            log_sum += log(t[1] / t[0]);
            log_mc0 += log(t[1] / t0);
            log_mc4 += log(t[1] / t4);
            worst = std::min(worst, t[1] / t[0]);
            worst_mc0 = std::min(worst_mc0, t[1] / t0);
            worst_mc4 = std::min(worst_mc4, t[1] / t4);
            log_n++;
          } else {
            printf("%9s %6s | %9s %6s | %9s %6s | %9s %6s | %9s %6s | ", "-", "-", "-", "-", "-",
                   "-", "-", "-", "-", "-");
          }
          {
            char kname[64] = "?";
            mbd_gpu_gemm_args r = a;
            r.x = b.x[0];
            r.w = b.w[0];
            if (mbd_gpu_record_begin(ctx[d][0], &err) == 0) {
              if (mbd_gpu_gemm(ctx[d][0], &r, &err) < 0) die("gemm", err);
              if (mbd_gpu_record_end(ctx[d][0], &err) == 0 &&
                  mbd_gpu_record_count(ctx[d][0]) == 1)
                snprintf(kname, sizeof kname, "%s", mbd_gpu_record_at(ctx[d][0], 0)->kernel);
            }
            printf("%s", kname);
            if (d == 0 && M >= 256) { /* the MBD_GEMM_MCAST=2 kernel, its launch on stderr */
              setenv("MBD_GEMM_MCAST", "2", 1);
              setenv("MBD_GEMM_CLDEBUG", "1", 1);
              fflush(stdout);
              if (mbd_gpu_record_begin(ctx[d][0], &err) == 0) {
                if (mbd_gpu_gemm(ctx[d][0], &r, &err) < 0) die("gemm", err);
                if (mbd_gpu_record_end(ctx[d][0], &err) == 0 &&
                    mbd_gpu_record_count(ctx[d][0]) == 1)
                  printf(" | mc2: %s", mbd_gpu_record_at(ctx[d][0], 0)->kernel);
              }
              unsetenv("MBD_GEMM_CLDEBUG");
              unsetenv("MBD_GEMM_MCAST");
            }
            printf("\n");
          }
          if (d == 0 && (M == 64 || M == 256) && p.k > 256) {
            double tk[N_KSPLIT];
            print_ksplit(ctx[d][0], b, a, t[1], tk);
            log_ks_off += log(t[1] / tk[0]);
            log_ks_def += log(t[1] / tk[1]);
            log_ks_n++;
          }
          if (d == 0 && M >= 64) {
            int bi;
            const double tb = print_tiles(ctx[d][0], b, a, t[1], &bi);
            if (M >= 256 && bi >= 0) {
              log_best += log(t[1] / std::min(tb, t[0]));
              worst_best = std::min(worst_best, t[1] / std::min(tb, t[0]));
            }
          }
          if (d == 0 && M >= 256) {
            double ts[N_SCHED];
            print_sched("(us, cuBLAS-fast / det, kernel)", ctx[d][0], b, a, t[1], ts);
            for (int i = 0; i < N_SCHED; i++) {
              log_sched[i] += log(t[1] / ts[i]);
              worst_sched[i] = std::min(worst_sched[i], t[1] / ts[i]);
            }
          }
          fflush(stdout);
          if (d == 0 && M == 1 && !strcmp(mo.name, "1.4b")) {
            agg_bytes += (double)wbytes;
            agg_time += t[0];
            agg_time_fast += t[1];
          }
        }
        for (auto w : b.w) CK(cudaFree(w));
        for (auto x : b.x) CK(cudaFree(x));
        CK(cudaFree(b.y));
      }
    }
  }
  printf("SUMMARY bf16 det/cublas-fast geomean over M>=256 (%d shapes): %.3f (floor 0.60), "
         "worst %.3f\n", log_n, log_n ? exp(log_sum / log_n) : 0.0, worst);
  printf("SUMMARY bf16 det MBD_GEMM_MCAST=2 / cublas-fast geomean over M>=256: %.3f, worst "
         "%.3f\n", log_n ? exp(log_mc0 / log_n) : 0.0, worst_mc0);
  printf("SUMMARY bf16 det MBD_GEMM_MCAST=4 / cublas-fast geomean over M>=256: %.3f, worst "
         "%.3f\n", log_n ? exp(log_mc4 / log_n) : 0.0, worst_mc4);
  printf("SUMMARY bf16 det MBD_GEMM_MCAST=0 (the plain tile kernels) / cublas-fast geomean "
         "over M>=256: %.3f, worst %.3f\n", log_n ? exp(log_plain / log_n) : 0.0, worst_plain);
  printf("SUMMARY bf16 det MBD_GEMM_PERSIST=1 / cublas-fast geomean over M>=256: %.3f\n",
         log_n ? exp(log_ps / log_n) : 0.0);
  printf("SUMMARY bf16 det MBD_GEMM_PERSIST=1 MBD_GEMM_MCAST=2 / cublas-fast geomean over "
         "M>=256: %.3f\n", log_n ? exp(log_ps2 / log_n) : 0.0);
  printf("SUMMARY bf16 det, the faster of the default and the best single tile (an oracle "
         "tile choice) / cublas-fast geomean over M>=256: %.3f, worst %.3f\n",
         log_n ? exp(log_best / log_n) : 0.0, worst_best);
  for (int i = 0; i < N_SCHED; i++)
    printf("SUMMARY bf16 det MBD_GEMM_SCHED=%s / cublas-fast geomean over M>=256: %.3f, worst "
           "%.3f\n", k_sched[i][0] ? k_sched[i] : "(unset)",
           log_n ? exp(log_sched[i] / log_n) : 0.0, worst_sched[i]);
  printf("SUMMARY bf16 cublas-fast / det at M = 64 and 256, K > 256 (%d shapes): "
         "MBD_GEMM_KSPLIT=0 %.3f, default %.3f (geomeans)\n", log_ks_n,
         log_ks_n ? exp(log_ks_off / log_ks_n) : 0.0, log_ks_n ? exp(log_ks_def / log_ks_n) : 0.0);
  fflush(stdout);
  printf("SUMMARY bf16 1.4b M=1 aggregated weight bandwidth: det %.0f GB/s = %.2f of copy bw "
         "(floor 0.60), cublas-fast %.0f GB/s = %.2f\n", agg_bytes / agg_time / 1e9,
         agg_bytes / agg_time / bw, agg_bytes / agg_time_fast / 1e9,
         agg_bytes / agg_time_fast / bw);
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
    mbd_gpu_gemm_args a = {MBD_DTYPE_BF16, MBD_DTYPE_F32, S, S, S, NULL, NULL, NULL, b.y, 0};
    double t0, t1;
    time_pair(ctx[0][0], ctx[0][1], b, a, &t0, &t1);
    setenv("MBD_GEMM_MCAST", "2", 1);
    const double tm0 = time_gemm(ctx[0][0], b, a);
    setenv("MBD_GEMM_MCAST", "4", 1);
    const double tm4 = time_gemm(ctx[0][0], b, a);
    setenv("MBD_GEMM_MCAST", "0", 1);
    const double tl = time_gemm(ctx[0][0], b, a);
    setenv("MBD_GEMM_MCAST", "2", 1);
    setenv("MBD_GEMM_PERSIST", "1", 1);
    const double tp2 = time_gemm(ctx[0][0], b, a);
    unsetenv("MBD_GEMM_MCAST");
    const double tp = time_gemm(ctx[0][0], b, a);
    unsetenv("MBD_GEMM_PERSIST");
    double fl = 2.0 * S * S * S;
    printf("square bf16 %d^3: det %.1f TFLOP/s, cublas-fast %.1f TFLOP/s, ratio %.2f; "
           "MBD_GEMM_MCAST=2 %.1f, =4 %.1f, =0 %.1f; MBD_GEMM_PERSIST=1 %.1f, "
           "with MBD_GEMM_MCAST=2 %.1f TFLOP/s\n", S, fl / t0 / 1e12, fl / t1 / 1e12, t1 / t0,
           fl / tm0 / 1e12, fl / tm4 / 1e12, fl / tl / 1e12, fl / tp / 1e12, fl / tp2 / 1e12);
    double ts[N_SCHED];
    print_sched("square (us, cuBLAS-fast / det, kernel)", ctx[0][0], b, a, t1, ts);
    printf("square bf16 %d^3 TFLOP/s by MBD_GEMM_SCHED:", S);
    for (int i = 0; i < N_SCHED; i++)
      printf(" %s %.1f", k_sched[i][0] ? k_sched[i] : "default", fl / ts[i] / 1e12);
    printf("\n");
    fflush(stdout);
  }
  for (int d = 0; d < 2; d++)
    for (int m = 0; m < 3; m++) mbd_gpu_ctx_destroy(&ctx[d][m]);
  return 0;
}
