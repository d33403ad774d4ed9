/* CPU backend benchmark: Mamba-1 130m shape (synthetic weights) decode and
 * prefill throughput in f32 and bf16 storage, and deterministic GEMM GFLOP/s
 * for the 130m projections. Prints a markdown table (docs/benchmarks.md).
 *   bench_cpu [--threads N] [--quick]   (--quick: tiny repeat counts, for CI) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/model/mamba1.h"
#include "kernels/model/synth.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const mbd_error *err) {
  fprintf(stderr, "bench_cpu: %s: %s\n", what, err->msg);
  exit(1);
}

static void bench_gemm(int threads, int quick) {
  mbd_error err = {0};
  mbd_cpu_ctx *ctx = NULL;
  if (mbd_cpu_ctx_new(threads, MBD_CPU_ISA_AUTO, &ctx, &err)) die("ctx", &err);
  static const struct {
    const char *name;
    int64_t k, n;
  } shapes[] = {{"in_proj 768->3072", 768, 3072},  {"x_proj 1536->80", 1536, 80},
                {"dt_proj 48->1536", 48, 1536},    {"out_proj 1536->768", 1536, 768},
                {"lm_head 768->50280", 768, 50280}};
  static const int64_t ms[] = {1, 16, 256, 2048};
  printf("\n### GEMM GFLOP/s (f32 packed weights, %s, %d threads)\n\n",
         mbd_cpu_isa_name(mbd_cpu_ctx_isa(ctx)), mbd_cpu_ctx_threads(ctx));
  printf("| projection | M=1 | M=16 | M=256 | M=2048 |\n|---|---|---|---|---|\n");
  for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
    int64_t K = shapes[s].k, N = shapes[s].n;
    float *W = calloc((size_t)(N * K), sizeof(float));
    float *A = calloc((size_t)(2048 * K), sizeof(float));
    float *C = malloc((size_t)(2048 * N) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) W[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
    for (int64_t i = 0; i < 2048 * K; i++) A[i] = (float)((i * 13) % 97) * 0.01f - 0.5f;
    mbd_cpu_wpack *wp = NULL;
    if (mbd_cpu_wpack_new(MBD_DTYPE_F32, N, K, MBD_DTYPE_F32, W, K, &wp, &err)) die("pack", &err);
    printf("| %s |", shapes[s].name);
    for (size_t mi = 0; mi < 4; mi++) {
      int64_t M = ms[mi];
      double flops = 2.0 * (double)M * (double)N * (double)K, budget = quick ? 0.02 : 0.4;
      int reps = 0;
      double t0 = now_s(), t;
      do {
        if (mbd_cpu_gemm_packed(ctx, M, A, K, wp, NULL, C, N, &err)) die("gemm", &err);
        reps++;
        t = now_s() - t0;
      } while (t < budget);
      printf(" %.1f |", flops * reps / t * 1e-9);
      fflush(stdout);
    }
    printf("\n");
    mbd_cpu_wpack_destroy(&wp);
    free(W);
    free(A);
    free(C);
  }
  mbd_cpu_ctx_destroy(&ctx);
}

/* tokens/s: decode (batch 1 and 8, after an 8-token prompt) and prefill. */
static void bench_model(const char *dir, mbd_dtype dt, int threads, int quick) {
  mbd_error err = {0};
  mbd_mamba1_options o;
  mbd_mamba1_options_default(&o);
  o.dtype = dt;
  o.threads = threads;
  mbd_mamba1_model *m = NULL;
  double t0 = now_s();
  if (mbd_mamba1_load(dir, &o, &m, &err)) die("load", &err);
  double t_load = now_s() - t0;
  int V = mbd_mamba1_vocab(m);
  float *logits = malloc((size_t)8 * (size_t)V * sizeof(float));
  mbd_mamba1_state *st[8];
  for (int b = 0; b < 8; b++)
    if (mbd_mamba1_state_new(m, &st[b], &err)) die("state", &err);
  double dec[2];
  int batches[2] = {1, 8};
  for (int bi = 0; bi < 2; bi++) {
    int B = batches[bi], steps = quick ? 2 : (B == 1 ? 24 : 8);
    int32_t tok[8];
    for (int b = 0; b < 8; b++) {
      mbd_mamba1_state_reset(st[b]);
      tok[b] = 100 + b;
    }
    /* warm-up step, then timed steps */
    if (mbd_mamba1_step(m, st, B, tok, logits, &err)) die("step", &err);
    t0 = now_s();
    for (int s = 0; s < steps; s++) {
      for (int b = 0; b < B; b++) tok[b] = (tok[b] * 31 + s) % V;
      if (mbd_mamba1_step(m, st, B, tok, logits, &err)) die("step", &err);
    }
    dec[bi] = (double)(B * steps) / (now_s() - t0);
  }
  int64_t T = quick ? 16 : 256;
  int32_t *prompt = malloc((size_t)T * sizeof(int32_t));
  for (int64_t t = 0; t < T; t++) prompt[t] = (int32_t)((t * 7919) % V);
  mbd_mamba1_state_reset(st[0]);
  const int32_t *tp = prompt;
  t0 = now_s();
  if (mbd_mamba1_prefill(m, st, 1, &tp, &T, MBD_MAMBA1_LOGITS_LAST, logits, &err))
    die("prefill", &err);
  double pre = (double)T / (now_s() - t0);
  printf("| %s | %s | %.1f | %.1f | %.1f | %.0f MB | %.1f s |\n", mbd_dtype_name(dt),
         mbd_mamba1_isa(m), dec[0], dec[1], pre, (double)mbd_mamba1_weight_bytes(m) / 1e6,
         t_load);
  fflush(stdout);
  free(prompt);
  for (int b = 0; b < 8; b++) mbd_mamba1_state_destroy(&st[b]);
  free(logits);
  mbd_mamba1_destroy(&m);
}

int main(int argc, char **argv) {
  int threads = 0, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else {
      fprintf(stderr, "usage: bench_cpu [--threads N] [--quick]\n");
      return 2;
    }
  }
  double t_start = now_s();
  char dir[] = "/tmp/mbd-bench-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("bench_cpu: mkdtemp");
    return 1;
  }
  mbd_error err = {0};
  mbd_mamba_config cfg;
  if (mbd_synth_shape("130m", &cfg, &err)) die("shape", &err);
  if (quick) mbd_synth_custom(768, 2, 50280, &cfg);
  if (mbd_synth_write(&cfg, MBD_DTYPE_F32, 1, dir, &err)) die("synth", &err);
  printf("### Mamba-1 %s (d_model %d, %d layers, vocab %d), synthetic weights\n\n",
         quick ? "130m-shaped, 2 layers (--quick)" : "130m", cfg.d_model, cfg.n_layer,
         cfg.vocab_size);
  printf("| storage | ISA | decode tok/s B=1 | decode tok/s B=8 | prefill tok/s (T=%d) | weights "
         "| load |\n|---|---|---|---|---|---|---|\n",
         quick ? 16 : 256);
  bench_model(dir, MBD_DTYPE_F32, threads, quick);
  bench_model(dir, MBD_DTYPE_BF16, threads, quick);
  char path[256];
  snprintf(path, sizeof(path), "%s/model.safetensors", dir);
  unlink(path);
  snprintf(path, sizeof(path), "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
  bench_gemm(threads, quick);
  printf("\n(total bench time %.0f s)\n", now_s() - t_start);
  return 0;
}
