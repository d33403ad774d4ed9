/* Mamba-1 GPU model throughput on synthetic random weights (generated on the
 * device): 130m (d768 L24) and 1.4b (d2048 L48) shapes, and 2.8b (d2560 L64)
 * when named; V 50280, bf16 and f32 storage, deterministic GEMM mode and
 * cublas-fast.
 *   decode: tokens/s of mbd_mamba1_gpu_step (graph replay, greedy pick on the
 *           device, tokens in and picks out included) at batch 1/8/64/256;
 *   prefill: tokens/s of one sequence of T=2048 (last-position logits);
 *   floor: HBM bound, (weight bytes + batch * state bytes * 2) per step over
 *          the measured device-to-device copy rate (bytes read + written).
 * Each number is the median of repeated runs timed with CUDA events on the
 * context's stream; "det/cublas" is deterministic over cublas-fast tokens/s.
 * Usage: bench_mamba1_gpu [--ops] [--per-op] [--trace] [--step-events] [--op-table]
 *                         [--state f32|bf16|all] [130m|1.4b|2.8b|all] [reps] [bf16|f32|all]
 *   --state: the recurrent state's storage dtype (the route's `state`,
 *            docs/route.md "Mamba-1 with a bf16 state"): f32 (the
 *            default), bf16, or all (both, f32 first, for each shape and
 *            dtype); a bf16 state never runs the persistent decode (the model
 *            decodes per op there); the state column names it; each state
 *            also runs "det, alt scan": deterministic with
 *            MBD_SCAN_STEP=other (kernels/cuda/ops/scan.cu's streaming
 *            decode step in the form the model's width does not pick; the
 *            same bits);
 *   --ops: first the per-launch time of each op of one 130m bf16 layer at M=1,
 *          with the separate conv and with the decode fusion (conv in x_proj
 *          and the scan);
 *   --per-op: contexts with the per-op decode path (no persistent decode);
 *   --trace: the persistent decode's time per stage at batch 1
 *            (decode_persistent.h's stage trace);
 *   --step-events: the device time of a batch-1 step's stages, from events
 *                  recorded in its graph (mamba1_gpu.h's step_events);
 *   --op-table: after each shape and dtype, us of each op of a forward in the
 *               model's order (embed; per layer add_rmsnorm, in_proj,
 *               conv_silu, x_proj, scan, out_proj; final norm, lm_head,
 *               sample), each launched 10 times in a row on random buffers of
 *               a context of its own (deterministic GEMM mode, the model's
 *               entry points and shapes): prefill b1 T=2048, decode
 *               b1/8/64/256 through the per-op decode path with the model's
 *               choice of the conv fusion (marked *; the model's persistent
 *               batches are named); then a layer's sum, the forward's sum
 *               (layers x layer + the rest) and the tokens/s it implies;
 *               last, outside the sums, the prefill scan again with
 *               MBD_SCAN_PREFILL=old (scan.cu's k_scan instead of
 *               scan_prefill.cu's kernel; the same bits), on 16-bit
 *               routes x_proj with MBD_XPROJ_TILE=0, 1, 4 (k_xproj for
 *               every M, the previous tiles from 32 rows, k_xproj_rows at
 *               every M; the same bits), and both scans
 *               over the other state dtype ("scan, state f32|bf16", whose
 *               decode columns take the model's conv fusion too), and the
 *               decode step with MBD_SCAN_STEP=other (k_scan_step's streaming
 *               kernel in the form the width does not pick, built for
 *               d_state 16 and bf16 only; the same bits; the table's state).
 * mbd_mops_conv_fused (kernels/cuda/ops/conv_xproj.h) picks the model's decode path;
 * MBD_BENCH_PROFILE_STEP: see profile_step. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu_util.h"
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
static int per_op, want_trace, want_step_events, want_op_table;
static int want_state[2] = {1, 0}; /* --state: f32, bf16 */

/* ---- the op table: one layer op by op ---- */

/* The ops of a forward in the order mamba1_gpu_run.cu runs them: the
 * embedding, then per layer OT_NORM..OT_OUT, then the final norm, the LM head
 * and (decode) the pick. */
enum {
  OT_EMBED, OT_NORM, OT_IN, OT_CONV, OT_XPROJ, OT_SCAN, OT_OUT, OT_FNORM, OT_HEAD, OT_SAMPLE,
  OT_SCAN_OLD, OT_SCAN_ALT, OT_SCAN_OLD_ALT, OT_SCAN_STEP_OLD, OT_NOPS
};
static const char *const k_ot_names[OT_NOPS] = {
    "embed",     "add_rmsnorm",    "in_proj (gemm)", "conv_silu",         "x_proj",
    "scan (dt_proj+scan+D+gate)", "out_proj (gemm)", "final add_rmsnorm", "lm_head (gemm)",
    "sample", "scan, MBD_SCAN_PREFILL=old", NULL, NULL, /* the _ALT rows: ot_name */
    "scan, MBD_SCAN_STEP=other"};

enum { OT_COLS = 5, OT_REPS = 10, OT_ROWS = 2048, OT_SLOTS = 256 };
static const int k_ot_nseq[OT_COLS] = {1, 1, 8, 64, 256}, k_ot_T[OT_COLS] = {OT_ROWS, 1, 1, 1, 1};

/* One layer's weights, workspace and states on a context of its own (the
 * model's layout, mamba1_gpu_impl.h), for up to OT_ROWS rows and OT_SLOTS
 * slots; matrices and inputs random, vectors as the synthetic model's. */
typedef struct op_bench {
  mbd_gpu_ctx *ctx;
  void *stream;
  mbd_mamba_config c;
  mbd_dtype dt;                    /* storage = activation dtype */
  mbd_state_dtype sd;              /* the table's state dtype (its sums); _ALT rows: the other */
  float *resid, *out, *xz, *xc, *dbl, *logits;
  void *hn, *xc_act, *y;           /* dtype dt; xc_act is xc when dt is f32 */
  float *norm, *conv_w, *conv_b, *A, *D;
  void *in_w, *x_w, *dt_w, *dt_b, *out_w, *head; /* dtype dt */
  float *conv_st, *ssm_st;         /* [OT_SLOTS][K-1][di], [OT_SLOTS][di][N] */
  void *ssm16;                     /* [OT_SLOTS][di][N] bf16: the bf16 state */
  int32_t *tok, *slots, *next;     /* [OT_ROWS], [OT_SLOTS], [OT_SLOTS] */
  void *work;                      /* the sampling's workspace for OT_SLOTS rows */
  int op, nseq, T;                 /* the launch run_op makes */
} op_bench;

static int ot_gemm(op_bench *o, int64_t M, int64_t N, int64_t K, const void *x, const void *w,
                   float *y, mbd_error *err) {
  mbd_gpu_gemm_args a;
  memset(&a, 0, sizeof a);
  a.dtype = o->dt;
  a.out_dtype = MBD_DTYPE_F32;
  a.m = M, a.n = N, a.k = K;
  a.x = x, a.w = w, a.y = y;
  a.w_static = 1;
  return mbd_gpu_gemm(o->ctx, &a, err);
}

/* Whether the model runs op on nseq x T rows: the decode fusion folds the
 * conv into x_proj and the scan; only decode picks tokens. */
static int ot_fused(const op_bench *o, int nseq, int T) {
  return mbd_mops_conv_fused(nseq, T, o->c.d_conv, o->c.d_inner, o->dt);
}
static int ot_runs(const op_bench *o, int op, int nseq, int T) {
  if (op == OT_CONV) return !ot_fused(o, nseq, T);
  if (op == OT_SAMPLE) return T == 1;
  if (op == OT_SCAN_OLD || op == OT_SCAN_OLD_ALT) return T > 1;
  if (op == OT_SCAN_STEP_OLD) return T == 1;
  return 1;
}
/* The row's name (the _ALT rows name their state dtype). */
static const char *ot_name(const op_bench *o, int op) {
  static char nm[2][40];
  if (op < OT_SCAN_ALT || op > OT_SCAN_OLD_ALT) return k_ot_names[op];
  const char *other =
      mbd_state_dtype_name(o->sd == MBD_STATE_BF16 ? MBD_STATE_F32 : MBD_STATE_BF16);
  snprintf(nm[op - OT_SCAN_ALT], sizeof nm[0], "%s, state %s",
           op == OT_SCAN_ALT ? "scan" : "scan old", other);
  return nm[op - OT_SCAN_ALT];
}

/* The scan as the model calls it, over the f32 or the bf16 state. */
static int ot_scan(op_bench *o, mbd_state_dtype sd, const mbd_mops_conv *conv, mbd_error *err) {
  const mbd_mamba_config *c = &o->c;
  const int64_t di = c->d_inner, N = c->d_state, R = c->dt_rank, sslot = di * N;
  if (sd == MBD_STATE_BF16)
    return mbd_mops_scan_bf16state(o->stream, o->nseq, o->T, (int)di, (int)N, (int)R, o->xc,
                                   o->dbl, o->dt, o->dt_w, o->dt_b, o->A, o->D, o->xz, 2 * di,
                                   di, o->ssm16, sslot, o->slots, conv, o->dt, o->y, err);
  return mbd_mops_scan(o->stream, o->nseq, o->T, (int)di, (int)N, (int)R, o->xc, o->dbl, o->dt,
                       o->dt_w, o->dt_b, o->A, o->D, o->xz, 2 * di, di, o->ssm_st, sslot,
                       o->slots, conv, o->dt, o->y, err);
}

/* Op o->op over o->nseq sequences of o->T rows, with the arguments
 * mamba1_gpu_run.cu's layers() and forward() give it (a layer after the
 * first; every slot its own). */
static int run_op(void *arg, mbd_error *err) {
  op_bench *o = arg;
  const mbd_mamba_config *c = &o->c;
  const int nseq = o->nseq, T = o->T;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, di = c->d_inner, N = c->d_state;
  const int64_t R = c->dt_rank, K = c->d_conv, cslot = (K - 1) * di;
  const mbd_state_dtype alt = o->sd == MBD_STATE_BF16 ? MBD_STATE_F32 : MBD_STATE_BF16;
  const mbd_mops_conv conv = {c->d_conv, o->conv_w, o->conv_b, o->conv_st, cslot};
  const int fused = ot_fused(o, nseq, T);
  void *s = o->stream;
  switch (o->op) {
  case OT_EMBED: return mbd_mops_embed(s, M, (int)d, o->tok, o->dt, o->head, o->resid, err);
  case OT_NORM:
    return mbd_mops_add_rmsnorm(s, M, (int)d, 1, 0, o->resid, o->out, o->norm, c->norm_eps, o->dt,
                                o->hn, err);
  case OT_IN: return ot_gemm(o, M, 2 * di, d, o->hn, o->in_w, o->xz, err);
  case OT_CONV:
    return mbd_mops_conv_silu(s, nseq, T, (int)di, c->d_conv, o->xz, 2 * di, o->conv_w, o->conv_b,
                              o->conv_st, cslot, o->slots, o->xc, o->dt,
                              o->dt == MBD_DTYPE_F32 ? NULL : o->xc_act, err);
  case OT_XPROJ:
    if (fused)
      return mbd_mops_conv_xproj(s, nseq, (int)di, &conv, o->xz, 2 * di, o->slots,
                                 (int)(R + 2 * N), o->dt, o->x_w, o->dbl, err);
    return mbd_mops_xproj(s, M, (int)di, (int)(R + 2 * N), o->dt, o->xc_act, o->x_w, o->dbl, err);
  case OT_SCAN_OLD:
  case OT_SCAN_OLD_ALT: {
    setenv("MBD_SCAN_PREFILL", "old", 1);
    int rc = ot_scan(o, o->op == OT_SCAN_OLD ? o->sd : alt, NULL, err);
    unsetenv("MBD_SCAN_PREFILL");
    return rc;
  }
  case OT_SCAN_STEP_OLD: {
    setenv("MBD_SCAN_STEP", "other", 1);
    int rc = ot_scan(o, o->sd, fused ? &conv : NULL, err);
    unsetenv("MBD_SCAN_STEP");
    return rc;
  }
  case OT_SCAN: return ot_scan(o, o->sd, fused ? &conv : NULL, err);
  case OT_SCAN_ALT: return ot_scan(o, alt, fused ? &conv : NULL, err);
  case OT_OUT: return ot_gemm(o, M, d, di, o->y, o->out_w, o->out, err);
  case OT_FNORM: /* each sequence's last row (prefill), every row (decode) */
    return mbd_mops_add_rmsnorm(s, nseq, (int)d, T, T - 1, o->resid, o->out, o->norm,
                                c->norm_eps, o->dt, o->hn, err);
  case OT_HEAD: return ot_gemm(o, nseq, c->vocab_size, d, o->hn, o->head, o->logits, err);
  default:
    return mbd_mops_sample(s, nseq, c->vocab_size, o->logits, c->vocab_size, NULL, NULL, NULL,
                           o->work, o->next, err);
  }
}

static void op_bench_free(op_bench *o) {
  void *p[] = {o->resid, o->out,  o->xz,    o->xc,     o->dbl,  o->logits, o->hn,
               o->y,     o->norm, o->conv_w, o->conv_b, o->A,    o->D,      o->in_w,
               o->x_w,   o->dt_w, o->dt_b,  o->out_w,  o->head, o->conv_st, o->ssm_st,
               o->tok,   o->slots, o->next, o->work, o->ssm16};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cudaFree(p[i]);
  if (o->xc_act != o->xc) cudaFree(o->xc_act);
  mbd_gpu_ctx_destroy(&o->ctx);
}

/* n host floats to the device array p. */
static int ot_up(float *p, const float *h, size_t n) {
  return cudaMemcpy(p, h, n * 4, cudaMemcpyHostToDevice) != cudaSuccess;
}

/* Allocates and fills the op table's buffers; nonzero on failure. */
static int op_bench_init(op_bench *o, mbd_error *err) {
  const mbd_mamba_config *c = &o->c;
  const size_t d = (size_t)c->d_model, di = (size_t)c->d_inner, N = (size_t)c->d_state;
  const size_t R = (size_t)c->dt_rank, K = (size_t)c->d_conv, V = (size_t)c->vocab_size;
  const size_t M = OT_ROWS, S = OT_SLOTS, es = mbd_dtype_size(o->dt), NO = R + 2 * N;
  if (mbd_bench_dzalloc(&o->resid, M * d * 4) || mbd_bench_dzalloc(&o->out, M * d * 4) ||
      mbd_bench_dzalloc(&o->xz, M * 2 * di * 4) || mbd_bench_dzalloc(&o->xc, M * di * 4) ||
      mbd_bench_dzalloc(&o->dbl, M * NO * 4) || mbd_bench_dzalloc(&o->logits, S * V * 4) ||
      mbd_bench_dzalloc(&o->hn, M * d * es) || mbd_bench_dzalloc(&o->y, M * di * es) ||
      mbd_bench_dzalloc(&o->norm, d * 4) || mbd_bench_dzalloc(&o->conv_w, K * di * 4) ||
      mbd_bench_dzalloc(&o->conv_b, di * 4) || mbd_bench_dzalloc(&o->A, di * N * 4) ||
      mbd_bench_dzalloc(&o->D, di * 4) || mbd_bench_dzalloc(&o->in_w, 2 * di * d * es) ||
      mbd_bench_dzalloc(&o->x_w, NO * di * es) || mbd_bench_dzalloc(&o->dt_w, di * R * es) ||
      mbd_bench_dzalloc(&o->dt_b, di * es) || mbd_bench_dzalloc(&o->out_w, d * di * es) ||
      mbd_bench_dzalloc(&o->head, V * d * es) ||
      mbd_bench_dzalloc(&o->conv_st, S * (K - 1) * di * 4) ||
      mbd_bench_dzalloc(&o->ssm_st, S * di * N * 4) ||
      mbd_bench_dzalloc(&o->ssm16, S * di * N * 2) ||
      mbd_bench_dzalloc(&o->tok, M * 4) ||
      mbd_bench_dzalloc(&o->slots, S * 4) || mbd_bench_dzalloc(&o->next, S * 4) ||
      mbd_bench_dzalloc(&o->work, mbd_mops_sample_work_bytes(OT_SLOTS)))
    return mbd_error_set(err, MBD_E_NOMEM, "out of device memory");
  if (o->dt == MBD_DTYPE_F32)
    o->xc_act = o->xc;
  else if (mbd_bench_dzalloc(&o->xc_act, M * di * es))
    return mbd_error_set(err, MBD_E_NOMEM, "out of device memory");
  /* matrices as the synthetic model's (scale 1 / sqrt(in)), the layer's
   * inputs and states random; dt = softplus(dt_b) near 0.7 */
  const struct {
    void *p;
    mbd_dtype dt;
    size_t n;
    float scale;
  } fill[] = {{o->in_w, o->dt, 2 * di * d, 1.0f / sqrtf((float)d)},
              {o->x_w, o->dt, NO * di, 1.0f / sqrtf((float)di)},
              {o->dt_w, o->dt, di * R, 1.0f / sqrtf((float)R)},
              {o->dt_b, o->dt, di, 0.1f},
              {o->out_w, o->dt, d * di, 1.0f / sqrtf((float)di)},
              {o->head, o->dt, V * d, 1.0f / sqrtf((float)d)},
              {o->resid, MBD_DTYPE_F32, M * d, 1.0f},
              {o->out, MBD_DTYPE_F32, M * d, 1.0f},
              {o->conv_st, MBD_DTYPE_F32, S * (K - 1) * di, 1.0f},
              {o->ssm_st, MBD_DTYPE_F32, S * di * N, 1.0f},
              {o->ssm16, MBD_DTYPE_BF16, S * di * N, 1.0f}};
  for (size_t i = 0; i < sizeof fill / sizeof fill[0]; i++) {
    int rc = mbd_mops_fill_uniform(o->stream, fill[i].dt, fill[i].p, (int64_t)fill[i].n, 7 + i,
                                   fill[i].scale, err);
    if (rc) return rc;
  }
  const size_t hn = di * N > M ? di * N : M;
  float *h = malloc(hn * 4);
  int32_t *hi = (int32_t *)h;
  if (!h) return mbd_error_set(err, MBD_E_NOMEM, "out of host memory");
  int bad = 0;
  for (size_t i = 0; i < d; i++) h[i] = 1.0f;
  bad |= ot_up(o->norm, h, d);
  for (size_t i = 0; i < di; i++) h[i] = 1.0f;
  bad |= ot_up(o->D, h, di);
  for (size_t i = 0; i < di; i++) h[i] = 0.01f * (float)(i % 3);
  bad |= ot_up(o->conv_b, h, di);
  for (size_t i = 0; i < K * di; i++) h[i] = 0.5f * (float)((int)(i * 7 % 5) - 2) / (float)K;
  bad |= ot_up(o->conv_w, h, K * di);
  for (size_t i = 0; i < di * N; i++) h[i] = -(float)(i % N + 1);
  bad |= ot_up(o->A, h, di * N);
  uint64_t rs = 99;
  for (size_t i = 0; i < M; i++)
    hi[i] = (int32_t)(((rs = rs * 6364136223846793005ull + 1) >> 40) % (uint64_t)V);
  bad |= cudaMemcpy(o->tok, hi, M * 4, cudaMemcpyHostToDevice) != cudaSuccess;
  for (int i = 0; i < OT_SLOTS; i++) hi[i] = i;
  bad |= cudaMemcpy(o->slots, hi, S * 4, cudaMemcpyHostToDevice) != cudaSuccess;
  free(h);
  if (bad || cudaStreamSynchronize((cudaStream_t)o->stream) != cudaSuccess)
    return mbd_error_set(err, MBD_E_DEVICE, "uploading the op table's vectors failed");
  return 0;
}

/* Below the op table: x_proj at each column with MBD_XPROJ_TILE=0 (k_xproj
 * for every M), =1 (the previous many-row tiles from 32 rows) and =4
 * (k_xproj_rows, the default from 128 rows, at every M), beside the table's
 * default choice (kernels/cuda/ops/xproj.cu; the same bits). */
static int ot_xproj_variants(op_bench *o, const char *name, const char *tag, mbd_error *err) {
  static const char *const vals[] = {"0", "1", "4"};
  for (int v = 0; v < 3; v++) {
    float us[OT_COLS];
    setenv("MBD_XPROJ_TILE", vals[v], 1);
    for (int col = 0; col < OT_COLS; col++) {
      o->op = OT_XPROJ, o->nseq = k_ot_nseq[col], o->T = k_ot_T[col];
      if (mbd_bench_op_us(o->stream, OT_REPS, run_op, o, &us[col], err)) {
        unsetenv("MBD_XPROJ_TILE");
        return -1;
      }
    }
    unsetenv("MBD_XPROJ_TILE");
    char what[40];
    snprintf(what, sizeof what, "x_proj, MBD_XPROJ_TILE=%s", vals[v]);
    printf("%-5s %-4s %-31s |", name, tag, what);
    for (int col = 0; col < OT_COLS; col++) {
      const int star = ot_fused(o, k_ot_nseq[col], k_ot_T[col]);
      printf(" %8.1f%c%s", us[col], star ? '*' : ' ', col == 0 ? " |" : "");
    }
    printf("\n");
  }
  return 0;
}

/* The op table of one shape and dtype: us per op (mean of OT_REPS launches
 * in a row on the context's stream, deterministic GEMM mode) at prefill b1
 * T=2048 (one chunk, as the model runs it with max_rows 2048) and decode
 * b1/8/64/256 through the per-op decode path; then one layer's sum and the
 * whole forward (embed + layers x layer + final norm + head + sample).
 * persistent[k]: the model runs decode column k in the persistent decode
 * instead (flagged). sd: the state dtype of the sums (the scan rows after
 * them: the other one too). */
static int op_table(const shape *sh, const mbd_mamba_config *c, mbd_dtype dt, mbd_state_dtype sd,
                    const int persistent[OT_COLS]) {
  op_bench o;
  memset(&o, 0, sizeof o);
  o.c = *c;
  o.dt = dt;
  o.sd = sd;
  mbd_error err;
  mbd_error_clear(&err);
  mbd_gpu_ctx_config cc;
  mbd_gpu_ctx_config_default(&cc);
  cc.policy = dt == MBD_DTYPE_BF16 ? MBD_POLICY_BF16 : MBD_POLICY_F32;
  int rc = 1;
  float us[OT_NOPS][OT_COLS];
  if (mbd_gpu_ctx_new(&cc, &o.ctx, &err)) goto done;
  o.stream = mbd_gpu_ctx_stream(o.ctx);
  if (op_bench_init(&o, &err)) goto done;
  for (int col = 0; col < OT_COLS; col++)
    for (int op = 0; op < OT_NOPS; op++) {
      us[op][col] = 0;
      if (!ot_runs(&o, op, k_ot_nseq[col], k_ot_T[col])) continue;
      o.op = op, o.nseq = k_ot_nseq[col], o.T = k_ot_T[col];
      if (mbd_bench_op_us(o.stream, OT_REPS, run_op, &o, &us[op][col], &err)) goto done;
    }
  char tag[16];
  snprintf(tag, sizeof tag, "%s/%s", mbd_dtype_name(dt), mbd_state_dtype_name(sd));
  printf("%-5s %-9s per-op us (mean of %d in a row) | %9s | %9s %9s %9s %9s\n", sh->name, tag,
         OT_REPS, "pre T2048", "dec b1", "dec b8", "dec b64", "dec b256");
  float layer[OT_COLS] = {0}, total[OT_COLS] = {0};
  for (int op = 0; op < OT_NOPS; op++) {
    printf("%-5s %-9s %-31s |", sh->name, tag, ot_name(&o, op));
    for (int col = 0; col < OT_COLS; col++) {
      const int nseq = k_ot_nseq[col], T = k_ot_T[col];
      const int star =
          (op == OT_XPROJ || op == OT_SCAN || op == OT_SCAN_ALT ||
           op == OT_SCAN_STEP_OLD) && ot_fused(&o, nseq, T);
      if (ot_runs(&o, op, nseq, T))
        printf(" %8.1f%c", us[op][col], star ? '*' : ' ');
      else
        printf(" %8s ", op == OT_CONV ? "(in *)" : "-");
      printf("%s", col == 0 ? " |" : "");
      if (op >= OT_NORM && op <= OT_OUT) layer[col] += us[op][col];
      if (op < OT_SCAN_OLD)
        total[col] +=
            op >= OT_NORM && op <= OT_OUT ? us[op][col] * (float)c->n_layer : us[op][col];
    }
    printf("\n");
  }
  printf("%-5s %-9s %-31s |", sh->name, tag, "layer (add_rmsnorm..out_proj)");
  for (int col = 0; col < OT_COLS; col++) printf(" %8.1f %s", layer[col], col == 0 ? " |" : "");
  printf("\n%-5s %-9s %-31s |", sh->name, tag, "forward (layers x layer + rest)");
  for (int col = 0; col < OT_COLS; col++) printf(" %8.0f %s", total[col], col == 0 ? " |" : "");
  printf("\n%-5s %-9s %-31s |", sh->name, tag, "tokens/s at that sum");
  for (int col = 0; col < OT_COLS; col++)
    printf(" %8.0f %s", (double)k_ot_nseq[col] * k_ot_T[col] / (total[col] * 1e-6),
           col == 0 ? " |" : "");
  printf("\n%-5s %-9s %-31s |", sh->name, tag, "model's decode path");
  for (int col = 0; col < OT_COLS; col++)
    printf(" %9s%s", col == 0 ? "-" : persistent[col] ? "persist." : "per-op", col == 0 ? " |" : "");
  printf("\n      (* conv folded into x_proj and the scan: mbd_mops_conv_fused; persist.: the "
         "model runs that batch in one persistent launch, the column shows the per-op path)\n");
  if (dt != MBD_DTYPE_F32 && ot_xproj_variants(&o, sh->name, tag, &err)) goto done;
  fflush(stdout);
  rc = 0;
done:
  if (rc) fprintf(stderr, "%s %s op table: %s\n", sh->name, mbd_dtype_name(dt), err.msg);
  op_bench_free(&o);
  return rc;
}

static int bench_one(const shape *sh, mbd_dtype dt, mbd_state_dtype sd, int reps, double bw) {
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
  cc.state = sd;
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
  int persistent[OT_COLS] = {0}; /* the model's decode path at the op table's batches */
  for (int k = 1; k < OT_COLS; k++) persistent[k] = mbd_mamba1_gpu_persistent(m, k_ot_nseq[k]);
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
  /* a slot's bytes on the device: conv windows f32, SSM state in the state dtype */
  void *rp[2];
  size_t rb[2];
  CK(mbd_mamba1_gpu_slot_regions(m, 0, rp, rb, &err));
  const size_t wb = mbd_mamba1_gpu_weight_bytes(m), sb = rb[0] + rb[1];
  const char *st = mbd_state_dtype_name(sd);
  double res[2][5] = {{0}};
  /* mode 2: deterministic again with MBD_SCAN_STEP=other,
   * the decode graphs captured anew with the other decode step */
  const int nmodes = 3;
  for (int mode = 0; mode < nmodes; mode++) {
    if (mode == 1) {
      if (mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_CUBLAS_FAST, &err)) {
        printf("  cublas-fast unavailable: %s\n", err.msg);
        break;
      }
      mbd_mamba1_gpu_set_graphs(m, 0); /* graphs replay only under their route */
      mbd_mamba1_gpu_set_graphs(m, 1);
    }
    if (mode == 2) {
      CK(mbd_gpu_ctx_set_mode(ctx, MBD_GEMM_DETERMINISTIC, &err));
      setenv("MBD_SCAN_STEP", "other", 1);
      mbd_mamba1_gpu_set_graphs(m, 0);
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
      dec[k] = b / (mbd_bench_median(t, reps) * 1e-3);
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
    pre = 2048 / (mbd_bench_median(t, pr) * 1e-3);
    const char *mname = mode == 2 ? "det, alt scan" : mode ? "cublas-fast" : "deterministic";
    printf("%-5s %-4s %-5s %-13s | %9.0f %9.0f %9.0f %9.0f | %9.0f\n", sh->name,
           mbd_dtype_name(dt), st, mname, dec[0], dec[1], dec[2], dec[3], pre);
    if (mode < 2)
      for (int k = 0; k < 4; k++) res[mode][k] = dec[k];
    if (probes && mode == 0) mbd_m1g_probes_print_trace(probes); /* batch 1's last step */
    if (mode < 2) res[mode][4] = pre;
    fflush(stdout);
  }
  unsetenv("MBD_SCAN_STEP");
  if (res[1][0] > 0) {
    printf("%-5s %-4s %-5s %-13s |", sh->name, mbd_dtype_name(dt), st, "det/cublas");
    for (int k = 0; k < 5; k++) printf(" %9.2f%s", res[0][k] / res[1][k], k == 3 ? " |" : "");
    printf("\n");
  }
  printf("%-5s %-4s %-5s %-13s |", sh->name, mbd_dtype_name(dt), st, "HBM floor");
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
  return want_op_table ? op_table(sh, &c, dt, sd, persistent) : 0;
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
    } else if (!strcmp(argv[1], "--op-table")) {
      want_op_table = 1;
    } else if (!strcmp(argv[1], "--state") && argc > 2) {
      const char *v = argv[2];
      want_state[0] = !strcmp(v, "f32") || !strcmp(v, "all");
      want_state[1] = !strcmp(v, "bf16") || !strcmp(v, "all");
      if (!want_state[0] && !want_state[1]) {
        fprintf(stderr, "bench_mamba1_gpu: --state %s (valid: f32, bf16, all)\n", v);
        return 2;
      }
      argc--, argv++;
    } else {
      fprintf(stderr, "bench_mamba1_gpu: unknown option %s (valid: --ops, --per-op, --trace, "
              "--step-events, --op-table, --state f32|bf16|all)\n", argv[1]);
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
  double bw = mbd_bench_copy_rate();
  printf("device copy rate %.2f TB/s (read + write); tokens/s, median of %d\n", bw / 1e12, reps);
  printf("%-5s %-4s %-5s %-13s | %9s %9s %9s %9s | %9s\n", "model", "dt", "state", "mode",
         "dec b1", "dec b8", "dec b64", "dec b256", "pre T2048");
  /* "all" is the first two; 2.8b runs only when named */
  const shape shapes[3] = {{"130m", 768, 24}, {"1.4b", 2048, 48}, {"2.8b", 2560, 64}};
  const mbd_dtype dts[2] = {MBD_DTYPE_BF16, MBD_DTYPE_F32};
  for (int i = 0; i < 3; i++) {
    if (strcmp(which, shapes[i].name) && (strcmp(which, "all") || i == 2)) continue;
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 2; k++)
        if (want_state[k] && (!strcmp(dtw, "all") || !strcmp(dtw, mbd_dtype_name(dts[j]))))
          rc |= bench_one(&shapes[i], dts[j], k ? MBD_STATE_BF16 : MBD_STATE_F32, reps, bw);
  }
  return rc;
}
