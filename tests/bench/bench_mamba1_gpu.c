/* Mamba-1 GPU model throughput on synthetic random weights (generated on the
 * device): 130m (d768 L24) and 1.4b (d2048 L48) shapes, V 50280, bf16 and
 * f32 storage, deterministic GEMM mode and cublas-fast.
 *   decode: tokens/s of mbd_mamba1_gpu_step (graph replay, greedy pick on the
 *           device, tokens in and picks out included) at batch 1/8/64/256;
 *   prefill: tokens/s of one sequence of T=2048 (last-position logits);
 *   floor: HBM bound, (weight bytes + batch * state bytes * 2) per step over
 *          the measured device-to-device copy rate (bytes read + written).
 * Each number is the median of repeated runs timed with CUDA events on the
 * context's stream; "det/cublas" is deterministic over cublas-fast tokens/s.
 * Usage: bench_mamba1_gpu [--ops] [--per-op] [--trace] [--step-events]
 *                         [130m|1.4b|all] [reps] [bf16|f32|all]
 *   --ops: first the per-launch time of each op of one 130m bf16 layer at M=1,
 *          with the separate conv and with the decode fusion (conv in x_proj
 *          and the scan);
 *   --per-op: contexts with the per-op decode path (no persistent decode);
 *   --trace: the persistent decode's time per stage at batch 1
 *            (decode_persistent.h's stage trace);
 *   --step-events: the device time of a batch-1 step's stages, from events
 *                  recorded in its graph (mamba1_gpu.h's step_events).
 * mbd_mops_conv_fused (kernels/cuda/ops/conv_xproj.h) picks the model's decode path;
 * MBD_BENCH_PROFILE_STEP: see profile_step. */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mamba_config.h"
#include "kernels/cuda/bench/mamba1_gpu_bench.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/mamba_ops.h"
#include "kernels/cuda/mamba1_gpu.h"

#define CK(expr)                                                          \
  do {                                                                    \
    if ((expr) != 0) {                                                    \
      fprintf(stderr, "%s failed: %s\n", #expr, err.msg);                 \
      return 1;                                                           \
    }                                                                     \
  } while (0)

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
  qsort(v, (size_t)n, sizeof(float), cmp_f);
  return v[n / 2];
}

/* Device-to-device copy rate in bytes (read + written) per second. */
static double copy_rate(void) {
  size_t n = (size_t)1 << 30;
  void *a = NULL, *b = NULL;
  if (cudaMalloc(&a, n) || cudaMalloc(&b, n)) return 0;
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
  return 2.0 * (double)n / (median(t, 10) * 1e-3);
}

typedef struct shape {
  const char *name;
  int d, L;
} shape;

/* MBD_BENCH_PROFILE_STEP=B (1, 8, 64 or 256): bracket one deterministic
 * batch-B decode step with cudaProfilerStart/Stop, for ncu
 * --profile-from-start off --graph-profiling node (per-kernel device time of
 * a step's graph). */
static int profile_step;

/* Command-line choices (see the usage above). */
static int per_op, want_trace, want_step_events;

static int bench_one(const shape *sh, mbd_dtype dt, int reps, double bw) {
  mbd_error err;
  mbd_error_clear(&err);
  mbd_mamba_config c;
  memset(&c, 0, sizeof c);
  c.d_model = sh->d;
  c.n_layer = sh->L;
  c.vocab_size = 50280;
  c.d_state = 16;
  c.d_conv = 4;
  c.expand = 2;
  c.d_inner = 2 * sh->d;
  c.dt_rank = (sh->d + 15) / 16;
  c.norm_eps = 1e-5f;
  c.conv_bias = true;
  c.residual_in_fp32 = true;
  c.tie_embeddings = true;
  c.eos_token_id = -1;
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = dt == MBD_DTYPE_BF16 ? MBD_POLICY_BF16 : MBD_POLICY_F32;
  cc.state_capacity = 256;
  cc.decode = per_op ? MBD_DECODE_PER_OP : MBD_DECODE_PERSISTENT;
  mbd_gpu_ctx *ctx = NULL;
  mbd_mamba1_gpu *m = NULL;
  mbd_m1g_probes *probes = NULL;
  CK(mbd_gpu_ctx_new(&cc, &ctx, &err));
  mbd_mamba1_gpu_options o;
  mbd_mamba1_gpu_options_default(&o);
  o.dtype = dt;
  o.max_rows = 2048;
  if (want_trace || want_step_events) {
    CK(mbd_m1g_probes_new(c.n_layer, want_step_events, want_trace, &probes, &err));
    mbd_m1g_probes_attach(probes, &o);
  }
  CK(mbd_mamba1_gpu_new_random(ctx, &c, 1234, &o, &m, &err));
  cudaStream_t s = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const int bs[4] = {1, 8, 64, 256};
  int32_t tok[256], sl[256], *ptok = malloc(sizeof(int32_t) * 2048);
  uint64_t rs = 99;
  for (int i = 0; i < 2048; i++) ptok[i] = (int32_t)((rs = rs * 6364136223846793005ull + 1) >> 40) % 50280;
  for (int i = 0; i < 256; i++) sl[i] = i, tok[i] = ptok[i];
  float *t = malloc(sizeof(float) * (size_t)(reps > 5 ? reps : 5));
  const size_t wb = mbd_mamba1_gpu_weight_bytes(m), sb = mbd_mamba1_gpu_state_bytes(m);
  double res[2][5] = {{0}};
  for (int mode = 0; mode < 2; mode++) {
    if (mode == 1) {
      if (mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err)) {
        printf("  cublas-fast unavailable: %s\n", err.msg);
        break;
      }
      mbd_mamba1_gpu_set_graphs(m, 0); /* graphs replay only under their route */
      mbd_mamba1_gpu_set_graphs(m, 1);
    }
    double dec[4], pre;
    for (int k = 0; k < 4; k++) {
      int b = bs[k];
      for (int i = 0; i < b; i++) CK(mbd_mamba1_gpu_slot_reset(m, sl[i], &err));
      for (int w = 0; w < 3; w++) CK(mbd_mamba1_gpu_step(m, b, tok, sl, NULL, tok, NULL, &err));
      if (profile_step == b && mode == 0) { /* one step for ncu --profile-from-start off */
        cudaProfilerStart();
        CK(mbd_mamba1_gpu_step(m, b, tok, sl, NULL, tok, NULL, &err));
        cudaProfilerStop();
      }
      for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, s);
        CK(mbd_mamba1_gpu_step(m, b, tok, sl, NULL, tok, NULL, &err));
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[r], e0, e1);
      }
      dec[k] = b / (median(t, reps) * 1e-3);
      if (probes && mode == 0 && k == 0) mbd_m1g_probes_print_step(probes);
    }
    CK(mbd_mamba1_gpu_slot_reset(m, 0, &err));
    int pr = 3;
    for (int r = 0; r < pr + 1; r++) {
      CK(mbd_mamba1_gpu_slot_reset(m, 0, &err));
      float *lg = malloc(50280 * 4);
      cudaEventRecord(e0, s);
      CK(mbd_mamba1_gpu_prefill(m, 1, 2048, ptok, sl, MBD_MAMBA1_GPU_LOGITS_LAST, lg, &err));
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      if (r) cudaEventElapsedTime(&t[r - 1], e0, e1);
      free(lg);
    }
    pre = 2048 / (median(t, pr) * 1e-3);
    printf("%-5s %-4s %-13s | %9.0f %9.0f %9.0f %9.0f | %9.0f\n", sh->name, mbd_dtype_name(dt),
           mode ? "cublas-fast" : "deterministic", dec[0], dec[1], dec[2], dec[3], pre);
    for (int k = 0; k < 4; k++) res[mode][k] = dec[k];
    if (probes && mode == 0) mbd_m1g_probes_print_trace(probes); /* batch 1's last step */
    res[mode][4] = pre;
    fflush(stdout);
  }
  if (res[1][0] > 0) {
    printf("%-5s %-4s %-13s |", sh->name, mbd_dtype_name(dt), "det/cublas");
    for (int k = 0; k < 5; k++) printf(" %9.2f%s", res[0][k] / res[1][k], k == 3 ? " |" : "");
    printf("\n");
  }
  printf("%-5s %-4s %-13s |", sh->name, mbd_dtype_name(dt), "HBM floor");
  for (int k = 0; k < 4; k++)
    printf(" %9.0f", bs[k] / (((double)wb + (double)bs[k] * sb * 2.0) / bw));
  printf(" |   (weights %.0f MB, state %.2f MB/seq)\n", wb / 1e6, sb / 1e6);
  fflush(stdout);
  free(t);
  free(ptok);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  mbd_mamba1_gpu_destroy(&m);
  mbd_m1g_probes_destroy(&probes);
  mbd_gpu_ctx_destroy(&ctx);
  return 0;
}

/* Per-launch time of each op of one layer at M=1 (130m bf16 shapes), each
 * launched 200 times back to back on the context's stream: where a batch-1
 * decode step's time goes. */
static int op_breakdown(void) {
  mbd_error err;
  mbd_error_clear(&err);
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = MBD_POLICY_BF16;
  mbd_gpu_ctx *ctx = NULL;
  CK(mbd_gpu_ctx_new(&cc, &ctx, &err));
  cudaStream_t s = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  void *s_ = (void *)s;
  const int d = 768, di = 1536, R = 48, N = 16, V = 50280;
  void *w = NULL, *x = NULL, *y = NULL, *st = NULL;
  int32_t *sl = NULL;
  cudaMalloc(&w, (size_t)V * d * 2);
  cudaMalloc(&x, (size_t)64 << 20);
  cudaMalloc(&y, (size_t)64 << 20);
  cudaMalloc(&st, (size_t)64 << 20);
  cudaMalloc((void **)&sl, 64);
  cudaMemset(sl, 0, 64);
  CK(mbd_mops_fill_uniform(s_, MBD_DTYPE_BF16, w, (int64_t)V * d, 1, 0.03f, &err));
  CK(mbd_mops_fill_uniform(s_, MBD_DTYPE_F32, x, 1 << 22, 2, 0.5f, &err));
  CK(mbd_mops_fill_uniform(s_, MBD_DTYPE_F32, st, 1 << 22, 3, 0.5f, &err));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  void *wk = NULL;
  cudaMalloc(&wk, mbd_mops_sample_work_bytes(1));
  cudaMemset(wk, 0, mbd_mops_sample_work_bytes(1));
  const char *names[] = {"add_rmsnorm",  "gemm in_proj",  "conv_silu",    "x_proj",
                         "scan+dt_proj", "gemm out_proj", "gemm lm_head", "sample",
                         "conv+x_proj",  "scan+conv"};
  /* ops 8, 9: the decode fusion (mbd_mops_conv_fused); the conv state at its
   * own place */
  const mbd_mops_conv conv = {4, (float *)st, NULL, (float *)st + (2 << 20), 0};
  const int nops = 10;
  float us_op[10] = {0};
  printf("per-op time at M=1 (130m bf16, deterministic), us per launch:\n");
  for (int op = 0; op < nops; op++) {
    float ms = 0;
    for (int pass = 0; pass < 2; pass++) {
      cudaEventRecord(e0, s);
      for (int i = 0; i < 200; i++) {
        mbd_gpu_gemm_args a = {MBD_DTYPE_BF16, MBD_DTYPE_F32, 1, 0, 0, x, w, NULL, y, 0};
        int rc = 0;
        switch (op) {
        case 0: rc = mbd_mops_add_rmsnorm(s_, 1, d, 1, 0, (float *)x, (float *)y, (float *)st, 1e-5f, MBD_DTYPE_BF16, (char *)y + (1 << 20), &err); break;
        case 1: a.n = 2 * di, a.k = d; rc = mbd_gpu_gemm(ctx, &a, &err); break;
        case 2: rc = mbd_mops_conv_silu(s_, 1, 1, di, 4, (float *)x, 2 * di, (float *)st, NULL, (float *)st + (1 << 20), 0, sl, (float *)y, MBD_DTYPE_BF16, (char *)y + (1 << 20), &err); break;
        case 3: rc = mbd_mops_xproj(s_, 1, di, R + 2 * N, MBD_DTYPE_BF16, x, w, (float *)y, &err); break;
        case 4: rc = mbd_mops_scan(s_, 1, 1, di, N, R, (float *)x, (float *)x, MBD_DTYPE_BF16, w, w, (float *)st, (float *)st, (float *)x, 2 * di, di, (float *)st + (1 << 20), 0, sl, NULL, MBD_DTYPE_BF16, y, &err); break;
        case 5: a.n = d, a.k = di; rc = mbd_gpu_gemm(ctx, &a, &err); break;
        case 6: a.n = V, a.k = d; rc = mbd_gpu_gemm(ctx, &a, &err); break;
        case 7: rc = mbd_mops_sample(s_, 1, V, (float *)x, V, NULL, NULL, NULL, wk, (int32_t *)y, &err); break;
        case 8: rc = mbd_mops_conv_xproj(s_, 1, di, &conv, (float *)x, 2 * di, sl, R + 2 * N, MBD_DTYPE_BF16, w, (float *)y, &err); break;
        case 9: rc = mbd_mops_scan(s_, 1, 1, di, N, R, NULL, (float *)x, MBD_DTYPE_BF16, w, w, (float *)st, (float *)st, (float *)x, 2 * di, di, (float *)st + (1 << 20), 0, sl, &conv, MBD_DTYPE_BF16, y, &err); break;
        }
        if (rc) {
          fprintf(stderr, "%s: %s\n", names[op], err.msg);
          return 1;
        }
      }
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      cudaEventElapsedTime(&ms, e0, e1);
    }
    us_op[op] = ms * 1000.0f / 200.0f;
    printf("  %-16s %7.2f\n", names[op], us_op[op]);
  }
  const float head = us_op[6] + us_op[7], norm_gemms = us_op[0] + us_op[1] + us_op[5];
  printf("  sum over 24 layers + head + sample, us per batch-1 step (launched back to back, no "
         "graph): separate conv %.0f, conv in x_proj + scan %.0f\n",
         24 * (norm_gemms + us_op[2] + us_op[3] + us_op[4]) + head,
         24 * (norm_gemms + us_op[8] + us_op[9]) + head);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(st);
  cudaFree(sl);
  cudaFree(wk);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  mbd_gpu_ctx_destroy(&ctx);
  return 0;
}

int main(int argc, char **argv) {
  int ops = 0;
  for (; argc > 1 && strncmp(argv[1], "--", 2) == 0; argc--, argv++) {
    if (!strcmp(argv[1], "--ops")) {
      ops = 1;
    } else if (!strcmp(argv[1], "--per-op")) {
      per_op = 1;
    } else if (!strcmp(argv[1], "--trace")) {
      want_trace = 1;
    } else if (!strcmp(argv[1], "--step-events")) {
      want_step_events = 1;
    } else {
      fprintf(stderr, "bench_mamba1_gpu: unknown option %s (valid: --ops, --per-op, --trace, "
              "--step-events)\n", argv[1]);
      return 2;
    }
  }
  const char *which = argc > 1 ? argv[1] : "all";
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  const char *dtw = argc > 3 ? argv[3] : "all";
  if (reps < 5) reps = 5;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  const char *pe = getenv("MBD_BENCH_PROFILE_STEP");
  profile_step = pe ? atoi(pe) : 0;
  int rc = ops ? op_breakdown() : 0;
  double bw = copy_rate();
  printf("device copy rate %.2f TB/s (read + write); tokens/s, median of %d\n", bw / 1e12, reps);
  printf("%-5s %-4s %-13s | %9s %9s %9s %9s | %9s\n", "model", "dt", "mode", "dec b1", "dec b8",
         "dec b64", "dec b256", "pre T2048");
  const shape shapes[2] = {{"130m", 768, 24}, {"1.4b", 2048, 48}};
  const mbd_dtype dts[2] = {MBD_DTYPE_BF16, MBD_DTYPE_F32};
  for (int i = 0; i < 2; i++) {
    if (strcmp(which, "all") && strcmp(which, shapes[i].name)) continue;
    for (int j = 0; j < 2; j++)
      if (!strcmp(dtw, "all") || !strcmp(dtw, mbd_dtype_name(dts[j])))
        rc |= bench_one(&shapes[i], dts[j], reps, bw);
  }
  return rc;
}
