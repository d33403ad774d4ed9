/* Mamba-2 GPU model throughput through the CUDA backend (kernels/backend.h),
 * on synthetic checkpoints written to a temporary directory
 * (mbd_mamba2_synth_write, the shapes of `mambad-model synth --family
 * mamba2`: 130m d768 L24 and 1.3b d2048 L48, d_state 128, head_dim 64,
 * V 50288), bf16 weights, deterministic GEMM mode.
 *   decode: tokens/s of step_greedy over n states (tokens in, greedy picks
 *           out, logits left on the device) at batch 1/8/64/256;
 *   prefill: tokens/s of prefill_batch of b sequences of T=2048 (last-position
 *            logits to the host) at batch 1 and 8;
 *   floor: HBM bound, (weight bytes + batch * state bytes * 2) per call over
 *          the measured device-to-device copy rate (bytes read + written);
 *          for prefill the weights and each state read and written once.
 *   ssd_scan alone: us of mbd_mops_ssd_scan for one layer of the shape,
 *          decode (T = 1, mean of 10 launches in a row) at batch 1/8/64/256
 *          with the state's read + write rate, prefill of T=2048 (batch 8
 *          as the model runs it: 8 launches of 256 steps) with state
 *          entries x steps per second.
 * Each call of the backend ends in a stream synchronize, so each run is timed
 * with CUDA events on the default stream around the call (host overhead
 * included). Each cell: warm-up runs, then the median of up to `reps` runs,
 * fewer where one run is long (a time budget per cell); the reps row says how
 * many were taken.
 * Usage: bench_mamba2_gpu [130m|1.3b|all] [reps]   (exits 77 without a device) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cuda/ops/ssd_scan.h"
#include "kernels/model/mamba2.h"

enum { NB = 4, MAXB = 256, T_PRE = 2048, NCOL = 6 };

/* Seconds of timed runs per cell; the whole `all` run stays under 150 s. */
#define CELL_BUDGET_S 4.0

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

/* Bytes of the bf16 weights a step reads: the tied head, in_proj and
 * out_proj in bf16, the per-layer vectors in f32. */
static double weight_bytes(const mbd_mamba2_config *c) {
  const double d = c->d_model, di = c->d_inner, H = c->n_heads, K = c->d_conv;
  const double cd = di + 2.0 * c->n_groups * c->d_state, pin = di + cd + H;
  const double per_layer = (pin * d + d * di) * 2 + (d + cd * K + cd + 3 * H + di) * 4;
  return (double)c->vocab_size * d * 2 + c->n_layer * per_layer + d * 4;
}

/* One benchmark case: a decode step over b states or a prefill of b x T. */
typedef struct bench_case {
  mbd_backend *be;
  mbd_bmodel *m;
  mbd_bstate **st;
  int64_t *tok, *next, *ptok;
  float *lg;
  int b, prefill;
  cudaEvent_t e0, e1;
} bench_case;

static int run_once(bench_case *k, float *ms, mbd_error *err) {
  int rc;
  cudaEventRecord(k->e0, 0);
  if (k->prefill)
    rc = mbd_backend_prefill_batch(k->be, k->m, k->st, k->b, k->ptok, T_PRE, true, k->lg, err);
  else
    rc = k->be->ops->step_greedy(k->be, k->m, k->st, k->tok, k->b, k->next, NULL, err);
  cudaEventRecord(k->e1, 0);
  cudaEventSynchronize(k->e1);
  cudaEventElapsedTime(ms, k->e0, k->e1);
  if (!rc && !k->prefill) memcpy(k->tok, k->next, sizeof(int64_t) * (size_t)k->b);
  return rc;
}

/* Median ms of one cell; *taken = timed runs. Prefill states restart from
 * zero each run so every run feeds the same T tokens into fresh states. */
static int time_cell(bench_case *k, int reps, float *t, float *out_ms, int *taken,
                     mbd_error *err) {
  float ms = 0;
  int warm = k->prefill ? 1 : 3;
  for (int w = 0; w < warm; w++) {
    if (k->prefill)
      for (int i = 0; i < k->b; i++) {
        k->be->ops->state_free(k->be, k->st[i]);
        if (k->be->ops->state_new(k->be, k->m, &k->st[i], err)) return -1;
      }
    if (run_once(k, &ms, err)) return -1;
  }
  int n = (int)(CELL_BUDGET_S * 1e3 / (ms > 1e-3f ? ms : 1e-3f));
  if (n > reps) n = reps;
  if (n < 1) n = 1;
  for (int r = 0; r < n; r++) {
    if (k->prefill)
      for (int i = 0; i < k->b; i++) {
        k->be->ops->state_free(k->be, k->st[i]);
        if (k->be->ops->state_new(k->be, k->m, &k->st[i], err)) return -1;
      }
    if (run_once(k, &t[r], err)) return -1;
  }
  *out_ms = median(t, n);
  *taken = n;
  return 0;
}

/* Median us of `reps` launches of fn on the default stream. */
typedef int (*scan_fn)(void *ctx);
static float time_launches(scan_fn fn, void *ctx, int reps, float *t) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float ms = -1;
  if (fn(ctx)) goto done; /* warm-up */
  for (int r = 0; r < reps; r++) {
    cudaEventRecord(e0, 0);
    if (fn(ctx)) goto done;
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&t[r], e0, e1);
  }
  ms = median(t, reps);
done:
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3f;
}

/* One layer's recurrence of a batch: nseq sequences, launches of T steps
 * each, nl of them in a row. */
typedef struct scan_case {
  mbd_mops_ssd_dims dm;
  int nseq, T, nl;
  float *A, *D, *bias, *zx, *xbc, *state, *y;
  int32_t *slots;
  int64_t pin, cd, slot;
} scan_case;

static int scan_run(void *ctx) {
  scan_case *k = ctx;
  mbd_error err;
  mbd_error_clear(&err);
  const int64_t di = (int64_t)k->dm.heads * k->dm.head_dim;
  for (int l = 0; l < k->nl; l++)
    if (mbd_mops_ssd_scan(NULL, k->nseq, k->T, &k->dm, k->A, k->D, k->bias, 0.0f, INFINITY,
                          k->zx + di + k->cd, k->pin, k->xbc, k->cd, k->state, k->slot, k->slots,
                          k->y, &err)) {
      fprintf(stderr, "ssd_scan: %s\n", err.msg);
      return -1;
    }
  return 0;
}

/* The ssd_scan row: decode b1/8/64/256, prefill b1/b8 of T_PRE. */
static int bench_scan(const char *name, const mbd_mamba2_config *c, int reps) {
  scan_case k;
  memset(&k, 0, sizeof k);
  k.dm = (mbd_mops_ssd_dims){c->n_heads, c->head_dim, c->d_state, c->n_groups};
  const int64_t di = c->d_inner, N = c->d_state;
  k.cd = di + 2 * (int64_t)c->n_groups * N;
  k.pin = di + k.cd + c->n_heads;
  k.slot = di * N;
  const size_t rows = T_PRE; /* the model's chunk */
  int rc = 1;
  float *t = malloc(sizeof(float) * (size_t)reps);
  int32_t hs[MAXB];
  for (int i = 0; i < MAXB; i++) hs[i] = i;
  if (!t || cudaMalloc((void **)&k.A, 3 * (size_t)c->n_heads * 4) ||
      cudaMalloc((void **)&k.zx, rows * (size_t)k.pin * 4) ||
      cudaMalloc((void **)&k.xbc, rows * (size_t)k.cd * 4) ||
      cudaMalloc((void **)&k.y, rows * (size_t)di * 4) ||
      cudaMalloc((void **)&k.state, (size_t)MAXB * (size_t)k.slot * 4) ||
      cudaMalloc((void **)&k.slots, sizeof hs)) {
    fprintf(stderr, "%s ssd_scan: out of device memory\n", name);
    goto done;
  }
  k.D = k.A + c->n_heads;
  k.bias = k.D + c->n_heads;
  cudaMemset(k.A, 0, 3 * (size_t)c->n_heads * 4);
  cudaMemset(k.zx, 0, rows * (size_t)k.pin * 4);
  cudaMemset(k.xbc, 0, rows * (size_t)k.cd * 4);
  cudaMemset(k.state, 0, (size_t)MAXB * (size_t)k.slot * 4);
  cudaMemcpy(k.slots, hs, sizeof hs, cudaMemcpyHostToDevice);
  const int bs[NCOL] = {1, 8, 64, 256, 1, 8};
  float us[NCOL];
  for (int col = 0; col < NCOL; col++) {
    k.nseq = bs[col];
    k.T = col < NB ? 1 : T_PRE / bs[col];
    /* decode: 10 steps in a row, per step; prefill: the model's chunks of
     * 2048 rows, all of them */
    k.nl = col < NB ? 10 : bs[col];
    if ((us[col] = time_launches(scan_run, &k, reps, t)) < 0) goto done;
    if (col < NB) us[col] /= 10;
  }
  printf("%-5s %-10s |", name, "scan us");
  for (int col = 0; col < NCOL; col++) printf(" %12.1f%s", us[col], col == NB - 1 ? " |" : "");
  printf("\n%-5s %-10s |", name, "scan rate");
  for (int col = 0; col < NCOL; col++) {
    const double b = bs[col], ent = (double)di * N * b;
    if (col < NB)
      printf(" %9.0fGB/s%s", 2.0 * ent * 4 / (us[col] * 1e3), col == NB - 1 ? " |" : "");
    else
      printf(" %7.1fGent/s", ent * T_PRE / (us[col] * 1e3));
  }
  printf("   (one layer; decode: state read + written; prefill: entry-steps)\n");
  fflush(stdout);
  rc = 0;
done:
  cudaFree(k.A);
  cudaFree(k.zx);
  cudaFree(k.xbc);
  cudaFree(k.y);
  cudaFree(k.state);
  cudaFree(k.slots);
  free(t);
  return rc;
}

static int rm_synth(const char *dir) {
  char p[1200];
  snprintf(p, sizeof p, "%s/config.json", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  return rmdir(dir);
}

static int bench_shape(const char *name, int reps, double bw) {
  mbd_error err;
  mbd_error_clear(&err);
  mbd_mamba2_config c;
  if (mbd_mamba2_synth_shape(name, &c, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  const char *tmp = getenv("TMPDIR");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/bench_mamba2_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  int rc = 1;
  mbd_backend *be = NULL;
  mbd_bmodel *m = NULL;
  bench_case k;
  memset(&k, 0, sizeof k);
  float *t = malloc(sizeof(float) * (size_t)reps);
  k.st = calloc(MAXB, sizeof *k.st);
  k.tok = malloc(sizeof(int64_t) * MAXB);
  k.next = malloc(sizeof(int64_t) * MAXB);
  k.ptok = malloc(sizeof(int64_t) * 8 * T_PRE);
  k.lg = malloc(sizeof(float) * 8 * (size_t)c.vocab_size);
  cudaEventCreate(&k.e0);
  cudaEventCreate(&k.e1);
  if (!t || !k.st || !k.tok || !k.next || !k.ptok || !k.lg) {
    fprintf(stderr, "out of host memory\n");
    goto done;
  }
  fprintf(stderr, "%s: writing a synthetic bf16 checkpoint to %s and loading it\n", name, dir);
  if (mbd_mamba2_synth_write(&c, MBD_DTYPE_BF16, 1234, dir, &err)) {
    fprintf(stderr, "synth %s: %s\n", name, err.msg);
    goto done;
  }
  /* every session slot of the largest decode batch, plus the forward chunk
   * of max_batch rows the backend keeps beside them */
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_BF16, .threads = 1,
                        .state_capacity = MAXB, .device = 0, .max_batch = MAXB};
  if (mbd_backend_new(MBD_BACKEND_CUDA, &o, &be, &err) ||
      be->ops->model_load(be, dir, &m, &err)) {
    fprintf(stderr, "%s: %s\n", name, err.msg);
    goto done;
  }
  if (!be->ops->step_greedy) {
    fprintf(stderr, "%s: the cuda backend has no step_greedy\n", name);
    goto done;
  }
  k.be = be;
  k.m = m;
  for (int i = 0; i < MAXB; i++)
    if (be->ops->state_new(be, m, &k.st[i], &err)) {
      fprintf(stderr, "%s: state %d: %s\n", name, i, err.msg);
      goto done;
    }
  uint64_t rs = 99;
  for (int i = 0; i < 8 * T_PRE; i++)
    k.ptok[i] = (int64_t)(((rs = rs * 6364136223846793005ull + 1) >> 40) % (uint64_t)c.vocab_size);
  for (int i = 0; i < MAXB; i++) k.tok[i] = k.ptok[i];
  const int bs[NCOL] = {1, 8, 64, 256, 1, 8};
  double tps[NCOL];
  int taken[NCOL];
  for (int col = 0; col < NCOL; col++) {
    float ms = 0;
    k.b = bs[col];
    k.prefill = col >= NB;
    if (time_cell(&k, reps, t, &ms, &taken[col], &err)) {
      fprintf(stderr, "%s %s b%d: %s\n", name, k.prefill ? "prefill" : "decode", k.b, err.msg);
      goto done;
    }
    tps[col] = (k.prefill ? (double)k.b * T_PRE : k.b) / (ms * 1e-3);
  }
  const double wb = weight_bytes(&c), sb = (double)be->ops->state_bytes(k.st[0]);
  printf("%-5s %-10s |", name, "tokens/s");
  for (int col = 0; col < NCOL; col++) printf(" %12.0f%s", tps[col], col == NB - 1 ? " |" : "");
  printf("\n%-5s %-10s |", name, "HBM floor");
  for (int col = 0; col < NCOL; col++) {
    double b = bs[col], tok = col >= NB ? b * T_PRE : b;
    printf(" %12.0f%s", tok / ((wb + b * sb * 2.0) / bw), col == NB - 1 ? " |" : "");
  }
  printf("\n%-5s %-10s |", name, "of floor");
  for (int col = 0; col < NCOL; col++) {
    double b = bs[col], tok = col >= NB ? b * T_PRE : b;
    printf(" %11.1f%%%s", 100.0 * tps[col] / (tok / ((wb + b * sb * 2.0) / bw)),
           col == NB - 1 ? " |" : "");
  }
  printf("\n%-5s %-10s |", name, "reps");
  for (int col = 0; col < NCOL; col++) printf(" %12d%s", taken[col], col == NB - 1 ? " |" : "");
  printf("   (weights %.0f MB, state %.1f MB/seq)\n", wb / 1e6, sb / 1e6);
  fflush(stdout);
  rc = bench_scan(name, &c, reps);
done:
  for (int i = 0; be && m && i < MAXB; i++)
    if (k.st && k.st[i]) be->ops->state_free(be, k.st[i]);
  if (be && m) be->ops->model_destroy(be, m);
  mbd_backend_destroy(&be);
  cudaEventDestroy(k.e0);
  cudaEventDestroy(k.e1);
  free(t);
  free(k.st);
  free(k.tok);
  free(k.next);
  free(k.ptok);
  free(k.lg);
  if (rm_synth(dir)) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}

int main(int argc, char **argv) {
  const char *which = argc > 1 ? argv[1] : "all";
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  if (reps < 1) reps = 1;
  if (strcmp(which, "all") && strcmp(which, "130m") && strcmp(which, "1.3b")) {
    fprintf(stderr, "usage: bench_mamba2_gpu [130m|1.3b|all] [reps]\n");
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  double bw = copy_rate();
  printf("Mamba-2 bf16 deterministic, CUDA backend; device copy rate %.2f TB/s (read + write); "
         "tokens/s, median of up to %d runs (%.0f s budget per cell)\n",
         bw / 1e12, reps, CELL_BUDGET_S);
  printf("%-5s %-10s | %12s %12s %12s %12s | %12s %12s\n", "model", "row", "dec b1", "dec b8",
         "dec b64", "dec b256", "pre b1 T2048", "pre b8 T2048");
  const char *shapes[2] = {"130m", "1.3b"};
  int rc = 0;
  for (int i = 0; i < 2; i++)
    if (!strcmp(which, "all") || !strcmp(which, shapes[i])) rc |= bench_shape(shapes[i], reps, bw);
  return rc;
}
