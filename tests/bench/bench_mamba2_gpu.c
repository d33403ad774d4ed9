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
 *          for prefill the weights and each state read and written once;
 *          state bytes: a slot's bytes on the device (conv windows f32, SSM
 *          state in the route's state dtype).
 *   per-op: us of each op of one layer (add_rmsnorm, in_proj, conv_silu,
 *           ssd_scan, gated_norm, out_proj) and the LM head, on zeroed
 *           buffers of a context of its own, mean of 10 launches in a row:
 *           prefill b1 T=2048, one of the b8 prefill's 8 chunks (8 x 256),
 *           decode b1/8/64/256; then the layer's sum and layers x sum + head
 *           (unfused; the scan_conv row is the decode fusion that replaces
 *           conv_silu + ssd_scan at up to 16 sequences; then ops 1 and 2
 *           on the kernels MBD_RMSNORM_BLOCK=1 and MBD_GEMM_RAGGED=0
 *           MBD_GEMM_TILE72=0 select: the block RMSNorm; the strided M <= 16
 *           GEMM and no 64 x 72 tiles; same bits; then five rows of
 *           ssd_scan with MBD_SSD=rows, k_ssd_step_rows at every batch
 *           (ssd_scan.cu), and launch shape knobs: =r1, ssd_chunk.cu with one channel a thread, =r2,
 *           ssd_prefill.cu with two channels a lane, =spb1 / spb8, the old
 *           bf16 decode with one or eight sequences a block;
 *           then conv_silu with
 *           MBD_CONV_PREFILL=old (the prefill on k_conv_silu, the older
 *           kernel, not k_conv_tile), MBD_CONV_STEP=old (the decode step on
 *           k_conv_silu, not k_conv_step4) and MBD_CONV_STEP=plain
 *           (k_conv_step4 with one mbd_pm_silu per channel, not grouped
 *           SiLUs), and gated_norm with MBD_GATED_NORM=old (k_gated_rmsnorm,
 *           not k_gated_rmsnorm4); all outside the sums); then the HBM
 *           floor of conv_silu and gated_norm over 2048 rows (their bytes
 *           at 4 TB/s).
 * Each call of the backend ends in a stream synchronize, so each run is timed
 * with CUDA events on the default stream around the call (host overhead
 * included). Each cell: warm-up runs, then the median of up to `reps` runs,
 * fewer where one run is long (a time budget per cell); the reps row says how
 * many were taken.
 * --state bf16 runs the bf16-state route (state=bf16, docs/route.md), the
 * per-op ssd_scan row included (the scan_conv row then stays out: that
 * fusion keeps an f32 state); the default is f32.
 * ablation rows (old, early pdl): decode b1/b8/b64 of a second copy of the
 * model loaded with kernel choices switched by their environment
 * variables (bench_ablate); same bits, so only the time differs.
 * MBD_BENCH_PROFILE=d1|d8|d64|d256|p1|p8: one extra, untimed run of that
 * cell between cudaProfilerStart and cudaProfilerStop, for ncu
 * --profile-from-start off (the kernels of one decode step or one prefill).
 * Usage: bench_mamba2_gpu [--state f32|bf16] [130m|1.3b|all] [reps]
 * (exits 77 without a device) */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_gpu_util.h"
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/ops/add_rmsnorm.h"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/gated_rmsnorm.h"
#include "kernels/cuda/ops/ssd_scan.h"
#include "kernels/model/mamba2.h"

enum { NB = 4, MAXB = 256, T_PRE = 2048, NCOL = 6 };

/* Seconds of timed runs per cell; the whole `all` run stays under 150 s. */
#define CELL_BUDGET_S 4.0

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
  const char *pe = getenv("MBD_BENCH_PROFILE");
  char cell[16];
  snprintf(cell, sizeof cell, "%c%d", k->prefill ? 'p' : 'd', k->b);
  if (pe && !strcmp(pe, cell)) {
    if (k->prefill)
      for (int i = 0; i < k->b; i++) {
        k->be->ops->state_free(k->be, k->st[i]);
        if (k->be->ops->state_new(k->be, k->m, &k->st[i], err)) return -1;
      }
    float pms = 0;
    cudaProfilerStart();
    int rc = run_once(k, &pms, err);
    cudaProfilerStop();
    if (rc) return -1;
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
  *out_ms = mbd_bench_median(t, n);
  *taken = n;
  return 0;
}

/* ---- one layer op by op ---- */

enum { NOPS = 19, NOC = 6, OP_REPS = 10 };
static const char *const k_op_names[NOPS] = {"add_rmsnorm", "in_proj",  "conv_silu",
                                             "ssd_scan",    "gated_norm", "out_proj",
                                             "lm_head",     "scan_conv (decode <= 16)",
                                             "add_rmsnorm RMSNORM_BLOCK=1",
                                             "in_proj RAGGED=0 TILE72=0",
                                             "ssd_scan MBD_SSD=rows",
                                             "ssd_scan MBD_SSD=r1",
                                             "ssd_scan MBD_SSD=r2",
                                             "ssd_scan MBD_SSD=spb1",
                                             "ssd_scan MBD_SSD=spb8",
                                             "conv_silu MBD_CONV_PREFILL=old",
                                             "conv_silu MBD_CONV_STEP=old",
                                             "conv_silu MBD_CONV_STEP=plain",
                                             "gated_norm MBD_GATED_NORM=old"};

/* Ops 15-18: conv_silu and gated_norm under these values of their variables. */
static const char *const k_var_op[4][2] = {{"MBD_CONV_PREFILL", "old"},
                                           {"MBD_CONV_STEP", "old"},
                                           {"MBD_CONV_STEP", "plain"},
                                           {"MBD_GATED_NORM", "old"}};

/* One layer's buffers on a context of its own (zeros: the timing does not
 * depend on the values), for up to T_PRE rows and MAXB slots. */
typedef struct op_bench {
  mbd_gpu_ctx *ctx;
  void *stream;
  mbd_mamba2_config c;
  int64_t pin, cd, V;
  float *resid, *out, *zx, *xbc, *y, *norm, *conv_w, *conv_b, *conv_st, *A, *D, *bias, *gnorm,
      *ssm_st, *logits;
  void *hn, *y_act, *in_w, *out_w, *head;
  int32_t *slots, *tickets;
  mbd_state_dtype state; /* ssm_st holds f32 or bf16 entries */
} op_bench;

static int gemm_bf16(op_bench *o, int64_t m, int64_t n, int64_t k, const void *x, const void *w,
                     float *y, mbd_error *err) {
  mbd_gpu_gemm_args a;
  memset(&a, 0, sizeof a);
  a.dtype = MBD_DTYPE_BF16;
  a.out_dtype = MBD_DTYPE_F32;
  a.m = m, a.n = n, a.k = k;
  a.x = x, a.w = w, a.y = y;
  a.w_static = 1;
  return mbd_gpu_gemm(o->ctx, &a, err);
}

/* Op `op` of a layer over nseq sequences of T steps (as mamba2_gpu.cu runs it). */
static int run_op(op_bench *o, int op, int nseq, int T, mbd_error *err) {
  const mbd_mamba2_config *c = &o->c;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, di = c->d_inner;
  const mbd_mops_ssd_dims dm = {c->n_heads, c->head_dim, c->d_state, c->n_groups};
  switch (op) {
  case 0:
    return mbd_mops_add_rmsnorm(o->stream, M, (int)d, 1, 0, o->resid, o->out, o->norm,
                                c->norm_eps, MBD_DTYPE_BF16, o->hn, err);
  case 1: return gemm_bf16(o, M, o->pin, d, o->hn, o->in_w, o->zx, err);
  case 2:
    return mbd_mops_conv_silu(o->stream, nseq, T, (int)o->cd, c->d_conv, o->zx + di, o->pin,
                              o->conv_w, o->conv_b, o->conv_st, (int64_t)(c->d_conv - 1) * o->cd,
                              o->slots, o->xbc, MBD_DTYPE_F32, NULL, err);
  case 10:
  case 11:
  case 12:
  case 13:
  case 14: { /* ssd_scan under MBD_SSD=rows, r1, r2, spb1, spb8 (ssd_common.cuh) */
    static const char *const val[5] = {"rows", "r1", "r2", "spb1", "spb8"};
    const char *was = getenv("MBD_SSD");
    char keep[64] = "";
    if (was) snprintf(keep, sizeof keep, "%s", was);
    setenv("MBD_SSD", val[op - 10], 1);
    int rc = run_op(o, 3, nseq, T, err);
    if (was)
      setenv("MBD_SSD", keep, 1);
    else
      unsetenv("MBD_SSD");
    return rc;
  }
  case 15:
  case 16:
  case 17:
  case 18: { /* ops 2 and 4 on the kernels these variables select (same bits) */
    const char *var = k_var_op[op - 15][0];
    setenv(var, k_var_op[op - 15][1], 1);
    const int rc = run_op(o, op < 18 ? 2 : 4, nseq, T, err);
    unsetenv(var);
    return rc;
  }
  case 3:
    if (o->state == MBD_STATE_BF16)
      return mbd_mops_ssd_scan_bf16state(o->stream, nseq, T, &dm, o->A, o->D, o->bias, c->dt_min,
                                         c->dt_max, o->zx + di + o->cd, o->pin, o->xbc, o->cd,
                                         o->ssm_st, di * c->d_state, o->slots, o->y, err);
    return mbd_mops_ssd_scan(o->stream, nseq, T, &dm, o->A, o->D, o->bias, c->dt_min, c->dt_max,
                             o->zx + di + o->cd, o->pin, o->xbc, o->cd, o->ssm_st,
                             di * c->d_state, o->slots, o->y, err);
  case 4:
    return mbd_mops_gated_rmsnorm(o->stream, M, (int)di, (int)(di / c->n_groups), o->y, o->zx,
                                  o->pin, o->gnorm, c->norm_eps, c->norm_before_gate,
                                  MBD_DTYPE_BF16, o->y_act, err);
  case 5: return gemm_bf16(o, M, d, di, o->y_act, o->out_w, o->out, err);
  case 6: return gemm_bf16(o, nseq, o->V, d, o->hn, o->head, o->logits, err);
  case 8:
  case 9: { /* ops 0 and 1 on the kernels these variables select (same bits) */
    const char *var = op == 8 ? "MBD_RMSNORM_BLOCK" : "MBD_GEMM_RAGGED";
    setenv(var, op == 8 ? "1" : "0", 1);
    if (op == 9) setenv("MBD_GEMM_TILE72", "0", 1);
    const int rc = run_op(o, op - 8, nseq, T, err);
    unsetenv(var);
    unsetenv("MBD_GEMM_TILE72");
    return rc;
  }
  default: {
    /* the model folds the conv in only there, with an f32 state */
    if (T != 1 || nseq > 16 || o->state != MBD_STATE_F32) return 0;
    const mbd_mops_ssd_conv cv = {c->d_conv, o->conv_w, o->conv_b, o->conv_st,
                                  (int64_t)(c->d_conv - 1) * o->cd, o->zx + di, o->pin,
                                  o->tickets};
    return mbd_mops_ssd_scan_conv(o->stream, nseq, &dm, o->A, o->D, o->bias, c->dt_min, c->dt_max,
                                  o->zx + di + o->cd, o->pin, &cv, o->ssm_st, di * c->d_state,
                                  o->slots, o->y, err);
  }
  }
}

static void op_bench_free(op_bench *o) {
  void *p[] = {o->resid, o->out,   o->zx,   o->xbc,    o->y,     o->norm,  o->conv_w,
               o->conv_b, o->conv_st, o->A, o->gnorm, o->ssm_st, o->logits, o->hn,
               o->y_act, o->in_w, o->out_w, o->head, o->slots, o->tickets};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
  mbd_gpu_ctx_destroy(&o->ctx);
}

static int dz(void *p, size_t n) { return mbd_bench_dzalloc(p, n); }

/* The op table: us per op (mean of OP_REPS launches in a row on the
 * context's stream), prefill b1 T=2048 and one of the b8 prefill's eight
 * chunks (8 x 256 rows), decode b1/8/64/256. */
static int bench_ops(const char *name, const mbd_mamba2_config *c, mbd_state_dtype sd) {
  op_bench o;
  memset(&o, 0, sizeof o);
  o.c = *c;
  o.state = sd;
  const size_t ses = sd == MBD_STATE_BF16 ? 2 : 4; /* bytes of an SSM state entry */
  o.V = c->vocab_size;
  const int64_t d = c->d_model, di = c->d_inner, N = c->d_state, K = c->d_conv;
  o.cd = di + 2 * (int64_t)c->n_groups * N;
  o.pin = di + o.cd + c->n_heads;
  const size_t M = T_PRE, S = MAXB;
  mbd_error err;
  mbd_error_clear(&err);
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = MBD_POLICY_BF16;
  int rc = 1;
  if (mbd_gpu_ctx_new(&cc, &o.ctx, &err)) {
    fprintf(stderr, "%s ops: %s\n", name, err.msg);
    return 1;
  }
  o.stream = mbd_gpu_ctx_stream(o.ctx);
  int32_t hs[MAXB];
  for (int i = 0; i < MAXB; i++) hs[i] = i;
  if (dz(&o.resid, M * d * 4) || dz(&o.out, M * d * 4) || dz(&o.zx, M * o.pin * 4) ||
      dz(&o.xbc, M * o.cd * 4) || dz(&o.y, M * di * 4) || dz(&o.norm, d * 4) ||
      dz(&o.conv_w, K * o.cd * 4) || dz(&o.conv_b, o.cd * 4) ||
      dz(&o.conv_st, S * (K - 1) * o.cd * 4) || dz(&o.A, 3 * (size_t)c->n_heads * 4) ||
      dz(&o.gnorm, di * 4) || dz(&o.ssm_st, S * di * N * ses) || dz(&o.logits, S * o.V * 4) ||
      dz(&o.hn, M * d * 2) || dz(&o.y_act, M * di * 2) || dz(&o.in_w, o.pin * d * 2) ||
      dz(&o.out_w, d * di * 2) || dz(&o.head, o.V * d * 2) || dz(&o.slots, sizeof hs) ||
      dz(&o.tickets, 16 * (size_t)c->n_groups * 4)) {
    fprintf(stderr, "%s ops: out of device memory\n", name);
    goto done;
  }
  o.D = o.A + c->n_heads;
  o.bias = o.D + c->n_heads;
  cudaMemcpy(o.slots, hs, sizeof hs, cudaMemcpyHostToDevice);
  static const int ns[NOC] = {1, 8, 1, 8, 64, 256}, ts[NOC] = {T_PRE, T_PRE / 8, 1, 1, 1, 1};
  float us[NOPS][NOC];
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int col = 0; col < NOC; col++)
    for (int op = 0; op < NOPS; op++) {
      if (run_op(&o, op, ns[col], ts[col], &err)) goto fail; /* warm-up */
      cudaEventRecord(e0, (cudaStream_t)o.stream);
      for (int r = 0; r < OP_REPS; r++)
        if (run_op(&o, op, ns[col], ts[col], &err)) goto fail;
      cudaEventRecord(e1, (cudaStream_t)o.stream);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      us[op][col] = ms * 1e3f / OP_REPS;
    }
  printf("%-5s per-op us (mean of %d in a row) | %9s %9s | %9s %9s %9s %9s\n", name, OP_REPS,
         "pre b1", "pre b8/8", "dec b1", "dec b8", "dec b64", "dec b256");
  float layer[NOC] = {0};
  for (int op = 0; op < NOPS; op++) {
    printf("%-5s %-30s |", name, k_op_names[op]);
    for (int col = 0; col < NOC; col++) {
      printf(" %9.1f%s", us[op][col], col == 1 ? " |" : "");
      if (op < 6) layer[col] += us[op][col];
    }
    printf("\n");
  }
  printf("%-5s %-30s |", name, "layer (ops 1-6)");
  for (int col = 0; col < NOC; col++) printf(" %9.1f%s", layer[col], col == 1 ? " |" : "");
  printf("\n%-5s %-30s |", name, "x layers + head");
  for (int col = 0; col < NOC; col++)
    printf(" %9.0f%s", layer[col] * c->n_layer + us[6][col], col == 1 ? " |" : "");
  printf("   (pre b8/8: one of 8 chunks; ssd_scan decode state %.1f MB per seq, %s)\n",
         (double)di * N * (double)ses / 1e6, mbd_state_dtype_name(sd));
  { /* the bytes the two elementwise ops of a 2048-row launch must move */
    const double conv_b = (double)M * (double)o.cd * 8, gn_b = (double)M * (double)di * 10;
    printf("%-5s floor at 4 TB/s, %zu rows: conv_silu %.1f us (%.1f MB: xBC f32 in, out), "
           "gated_norm %.1f us (%.1f MB: y, z f32 in, bf16 out)\n",
           name, M, conv_b / 4e6, conv_b / 1e6, gn_b / 4e6, gn_b / 1e6);
  }
  fflush(stdout);
  rc = 0;
fail:
  if (rc) fprintf(stderr, "%s ops: %s\n", name, err.msg);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
done:
  op_bench_free(&o);
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

/* Decode b1/b8/b64 on a second copy of the model loaded with some kernel
 * choices turned off through their environment variables (read when a
 * decode graph is captured or a kernel launched; same bits), so one run
 * shows what they buy: "old" = the strided M <= 16 GEMM, no 64 x 72 tiles
 * and the block RMSNorm; "early pdl" = the PDL trigger before the wait. */
static int bench_ablate(const char *name, mbd_backend *be, const char *dir, int reps, float *t,
                        const bench_case *base) {
  enum { NV = 4, AB = 64 };
  static const char *const vars[NV] = {"MBD_GEMM_RAGGED", "MBD_GEMM_TILE72", "MBD_RMSNORM_BLOCK",
                                       "MBD_PDL_EARLY"};
  static const char *const vals[NV] = {"0", "0", "1", "1"};
  static const char *const rows[2] = {"old", "early pdl"};
  static const unsigned masks[2] = {0x7, 0x8}; /* which variables each row sets */
  int rc = 0;
  for (int v = 0; v < 2 && !rc; v++) {
    char what[160] = "";
    for (int i = 0; i < NV; i++)
      if (masks[v] >> i & 1) {
        setenv(vars[i], vals[i], 1);
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s=%s", what[0] ? " " : "",
                 vars[i], vals[i]);
      }
    mbd_error err;
    mbd_error_clear(&err);
    bench_case k = *base;
    mbd_bstate *st[AB] = {NULL};
    k.m = NULL;
    k.st = st;
    if (be->ops->model_load(be, dir, &k.m, &err)) {
      fprintf(stderr, "%s ablation: %s\n", name, err.msg);
      rc = 1;
    }
    for (int i = 0; !rc && i < AB; i++)
      if (be->ops->state_new(be, k.m, &st[i], &err)) {
        fprintf(stderr, "%s ablation state %d: %s\n", name, i, err.msg);
        rc = 1;
      }
    static const int bs[3] = {1, 8, 64};
    double tps[3] = {0, 0, 0};
    for (int col = 0; !rc && col < 3; col++) {
      float ms = 0;
      int taken = 0;
      k.b = bs[col];
      k.prefill = 0;
      if (time_cell(&k, reps, t, &ms, &taken, &err)) {
        fprintf(stderr, "%s ablation b%d: %s\n", name, k.b, err.msg);
        rc = 1;
      }
      tps[col] = k.b / (ms * 1e-3);
    }
    if (!rc)
      printf("%-5s %-10s | %12.0f %12.0f %12.0f   (decode b1/b8/b64 tokens/s, %s)\n", name,
             rows[v], tps[0], tps[1], tps[2], what);
    fflush(stdout);
    for (int i = 0; i < AB; i++)
      if (st[i]) be->ops->state_free(be, st[i]);
    if (k.m) be->ops->model_destroy(be, k.m);
    for (int i = 0; i < NV; i++) unsetenv(vars[i]);
  }
  return rc;
}

static int bench_shape(const char *name, int reps, double bw, mbd_state_dtype sd) {
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
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_BF16, .state = sd,
                        .threads = 1, .state_capacity = MAXB, .device = 0, .max_batch = MAXB};
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
  /* a slot's device bytes (the stash holds exactly its regions); the f32
   * image where the backend keeps no stashes */
  const size_t dev_sb = be->ops->stash_bytes ? be->ops->stash_bytes(be, m) : 0;
  const double wb = weight_bytes(&c),
               sb = dev_sb ? (double)dev_sb : (double)be->ops->state_bytes(k.st[0]);
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
  printf("   (weights %.0f MB, state %.1f MB/seq, %s)\n", wb / 1e6, sb / 1e6,
         mbd_state_dtype_name(sd));
  fflush(stdout);
  rc = bench_ablate(name, be, dir, reps, t, &k) | bench_ops(name, &c, sd);
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
  static const char *usage = "usage: bench_mamba2_gpu [--state f32|bf16] [130m|1.3b|all] [reps]\n";
  mbd_state_dtype sd = MBD_STATE_F32;
  const char *pos[2] = {"all", "20"};
  int np = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--state")) {
      mbd_error e;
      mbd_error_clear(&e);
      if (i + 1 >= argc || mbd_state_dtype_parse(argv[i + 1], &sd, &e)) {
        fprintf(stderr, "--state: %s\n%s", i + 1 < argc ? e.msg : "needs f32 or bf16", usage);
        return 2;
      }
      i++;
    } else if (np < 2) {
      pos[np++] = argv[i];
    } else {
      fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  const char *which = pos[0];
  int reps = atoi(pos[1]);
  if (reps < 1) reps = 1;
  if (strcmp(which, "all") && strcmp(which, "130m") && strcmp(which, "1.3b")) {
    fprintf(stderr, "%s", usage);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  double bw = mbd_bench_copy_rate();
  printf("Mamba-2 bf16 deterministic, state %s, CUDA backend; device copy rate %.2f TB/s "
         "(read + write); tokens/s, median of up to %d runs (%.0f s budget per cell)\n",
         mbd_state_dtype_name(sd), bw / 1e12, reps, CELL_BUDGET_S);
  printf("%-5s %-10s | %12s %12s %12s %12s | %12s %12s\n", "model", "row", "dec b1", "dec b8",
         "dec b64", "dec b256", "pre b1 T2048", "pre b8 T2048");
  const char *shapes[2] = {"130m", "1.3b"};
  int rc = 0;
  for (int i = 0; i < 2; i++)
    if (!strcmp(which, "all") || !strcmp(which, shapes[i])) rc |= bench_shape(shapes[i], reps, bw, sd);
  return rc;
}
