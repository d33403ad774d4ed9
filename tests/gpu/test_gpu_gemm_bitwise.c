/* Deterministic GPU GEMM, bit-level contract:
 * - every M in 1..300, 1024, 4096, 8192 (from a shifted row offset, so the
 *   batch contents differ) gives rows memcmp-identical to the same rows
 *   computed alone (M=1), for f32, tf32, bf16 and f16, on the vectorised
 *   (K % 8 == 0) and the element-wise load paths; the shapes make the
 *   dispatcher use every tile configuration;
 * - on sm_90a (wgmma family) M=1 runs 64x16 tiles with the m64n16k16
 *   instruction and M=8192 runs 128x256 tiles with m64n256k16: the memcmp
 *   above is what proves the instruction's N does not change a column's bits;
 * - the tensor-copy (TMA) producer and the plain-load producer give the same
 *   bits (x passed 2 bytes off 16-byte alignment forces the plain loads);
 * - run to run, and eager vs CUDA-graph replay;
 * - f32 equals the CPU backend's mbd_cpu_gemm (NT) bit for bit; tf32 equals a
 *   host fmaf chain over tf32-rounded inputs bit for bit;
 * - bf16/f16 within |y - ref| <= (K/16 + K/256 + 3) * 2^-22 * sum_k |x_k w_k|
 *   + 2^-24 |y| of an f64 reference over the rounded inputs: products are
 *   exact in the tensor core and each of the K/16 chained mma accumulations,
 *   the K/256 chunk folds of the sm_90a route (and the bias add) rounds or
 *   truncates once in f32 relative to at most the running absolute sum;
 *   2^-22 allows truncation;
 * - a storage-dtype output equals the rounding of the f32 output;
 * - on sm_90a, M <= 16 runs mma.sync chunk chains (the streaming kernel)
 *   and larger M the wgmma tiles: the alone-vs-batched memcmp is what proves
 *   an m16n8k16 step has a wgmma k16 step's bits (K = 4096: 16 chunks; K =
 *   520 and 1040 end in a short chunk; N = 16856 makes each block walk many
 *   strips; K = 77 and unaligned x take the tiles at every M);
 * - w_static (programmatic launch) right after a GEMM that writes its x
 *   reads the finished x: same bits as two synchronised launches;
 * - the M = 1 GEMM that computes its x as a gated RMSNorm
 *   (mbd_gpu_gemm_gated) equals the norm kernel followed by the GEMM. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/gpu_util.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/ops/add_rmsnorm.h"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/gated_rmsnorm.h"

#define MAXM 8192
#define SHIFT 16 /* extra rows so offsets up to 12 stay in range */

static const int64_t k_extra_m[] = {1024, 4096, 8192};

typedef struct fixture {
  mbd_gpu_ctx *ctx;
  mbd_dtype dt;
  int64_t n, k;
  size_t es;
  void *hx, *hw, *hb;     /* host storage values */
  float *fx, *fw, *fb;    /* exact f32 values */
  void *dx, *dw, *db, *dy, *dr; /* device */
  float *alone, *got;     /* host copies */
} fixture;

#define CHECK_OK(expr)                                  \
  do {                                                  \
    int rc__ = (expr);                                  \
    if (rc__ != 0) fail_msg("%s: %s", #expr, err.msg);  \
  } while (0)

static void setup(fixture *f, mbd_dtype_policy pol, int64_t n, int64_t k, uint64_t seed) {
  mbd_error err;
  mbd_error_clear(&err);
  memset(f, 0, sizeof *f);
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.policy = pol;
  CHECK_OK(mbd_gpu_ctx_new(&cfg, &f->ctx, &err));
  f->dt = pol == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : pol == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                                                          : MBD_DTYPE_F32;
  f->n = n;
  f->k = k;
  f->es = mbd_dtype_size(f->dt);
  size_t rows = MAXM + SHIFT;
  f->hx = malloc(rows * k * f->es);
  f->hw = malloc(n * k * f->es);
  f->hb = malloc(n * f->es);
  f->fx = malloc(rows * k * 4);
  f->fw = malloc(n * k * 4);
  f->fb = malloc(n * 4);
  f->alone = malloc(rows * n * 4);
  f->got = malloc(rows * n * 4);
  assert_non_null(f->got);
  gpu_test_fill(f->dt, rows * k, &seed, f->hx, f->fx);
  gpu_test_fill(f->dt, n * k, &seed, f->hw, f->fw);
  gpu_test_fill(f->dt, n, &seed, f->hb, f->fb);
  CHECK_OK(mbd_gpu_alloc(f->ctx, rows * k * f->es, &f->dx, &err));
  CHECK_OK(mbd_gpu_alloc(f->ctx, n * k * f->es, &f->dw, &err));
  CHECK_OK(mbd_gpu_alloc(f->ctx, n * f->es, &f->db, &err));
  CHECK_OK(mbd_gpu_alloc(f->ctx, rows * n * 4, &f->dy, &err));
  CHECK_OK(mbd_gpu_alloc(f->ctx, rows * n * 4, &f->dr, &err));
  CHECK_OK(mbd_gpu_upload(f->ctx, f->dx, f->hx, rows * k * f->es, &err));
  CHECK_OK(mbd_gpu_upload(f->ctx, f->dw, f->hw, n * k * f->es, &err));
  CHECK_OK(mbd_gpu_upload(f->ctx, f->db, f->hb, n * f->es, &err));
}

static void teardown_fx(fixture *f) {
  mbd_gpu_free(f->ctx, f->dx);
  mbd_gpu_free(f->ctx, f->dw);
  mbd_gpu_free(f->ctx, f->db);
  mbd_gpu_free(f->ctx, f->dy);
  mbd_gpu_free(f->ctx, f->dr);
  mbd_gpu_ctx_destroy(&f->ctx);
  free(f->hx); free(f->hw); free(f->hb); free(f->fx); free(f->fw); free(f->fb);
  free(f->alone); free(f->got);
}

static mbd_gpu_gemm_args args_for(fixture *f, int64_t row0, int64_t m, void *y) {
  mbd_gpu_gemm_args a = {f->dt, MBD_DTYPE_F32, m, f->n, f->k,
                         (const char *)f->dx + row0 * f->k * f->es, f->dw, f->db, y, 0};
  return a;
}

/* y rows [row0, row0+m) of the big GEMM into f->got (poisoned first). */
static void run_rows(fixture *f, int64_t row0, int64_t m) {
  mbd_error err;
  mbd_error_clear(&err);
  CHECK_OK(mbd_gpu_memset(f->ctx, f->dy, 0xff, (size_t)m * f->n * 4, &err));
  mbd_gpu_gemm_args a = args_for(f, row0, m, f->dy);
  CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
  CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
  CHECK_OK(mbd_gpu_download(f->ctx, f->got, f->dy, (size_t)m * f->n * 4, &err));
}

static void compute_alone(fixture *f) {
  mbd_error err;
  mbd_error_clear(&err);
  size_t rows = MAXM + SHIFT;
  CHECK_OK(mbd_gpu_memset(f->ctx, f->dr, 0xff, rows * f->n * 4, &err));
  for (size_t r = 0; r < rows; r++) {
    mbd_gpu_gemm_args a = args_for(f, (int64_t)r, 1, (float *)f->dr + r * f->n);
    CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
  }
  CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
  CHECK_OK(mbd_gpu_download(f->ctx, f->alone, f->dr, rows * f->n * 4, &err));
  for (size_t i = 0; i < rows * f->n; i++)
    if (isnan(f->alone[i])) fail_msg("alone row %zu col %zu unwritten/NaN", i / f->n, i % f->n);
}

/* Counts mismatching elements of m rows against the alone rows from row0 and
 * prints the first one; returns the count. */
static int64_t count_diff(fixture *f, int64_t row0, int64_t mm, const char *what) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < mm * f->n; i++)
    if (memcmp(&f->got[i], &f->alone[row0 * f->n + i], 4)) {
      if (first < 0) first = i;
      bad++;
    }
  if (bad)
    print_message("%s %s N=%lld K=%lld M=%lld: %lld elements differ; first row %lld col %lld: "
                  "%a != alone %a\n", what, mbd_dtype_name(f->dt), (long long)f->n,
                  (long long)f->k, (long long)mm, (long long)bad, (long long)(first / f->n),
                  (long long)(first % f->n), f->got[first], f->alone[row0 * f->n + first]);
  return bad;
}

/* Every M of 1..max_small, 1024, 4096, 8192; reports every failing M before
 * failing, so one run shows which tile configurations disagree. */
static void check_invariance(fixture *f, int64_t max_small) {
  int64_t failed = 0;
  for (int64_t m = 1; m <= max_small + 3; m++) {
    int64_t mm = m <= max_small ? m : k_extra_m[m - max_small - 1];
    int64_t row0 = mm % 13;
    run_rows(f, row0, mm);
    if (count_diff(f, row0, mm, "batched") && ++failed >= 40) break;
  }
  if (failed) fail_msg("%lld batch sizes were not bit-identical to rows alone", (long long)failed);
}

/* x at an address 2 bytes off 16-byte alignment: the plain-load producer
 * must reproduce the tensor-copy producer's bits (same shape, same rows). */
static void check_unaligned(fixture *f) {
  if (f->dt == MBD_DTYPE_F32) return;
  mbd_error err;
  mbd_error_clear(&err);
  size_t rows = MAXM + SHIFT, bytes = rows * f->k * f->es;
  char *buf = NULL;
  CHECK_OK(mbd_gpu_alloc(f->ctx, bytes + 16, (void **)&buf, &err));
  CHECK_OK(mbd_gpu_upload(f->ctx, buf + 2, f->hx, bytes, &err));
  static const int64_t ms[] = {1, 2, 17, 64, 65, 200, 300, 4096};
  int64_t failed = 0;
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    int64_t m = ms[i], row0 = 3;
    CHECK_OK(mbd_gpu_memset(f->ctx, f->dy, 0xff, (size_t)m * f->n * 4, &err));
    mbd_gpu_gemm_args a = args_for(f, row0, m, f->dy);
    a.x = buf + 2 + row0 * f->k * f->es;
    CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
    CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
    CHECK_OK(mbd_gpu_download(f->ctx, f->got, f->dy, (size_t)m * f->n * 4, &err));
    if (count_diff(f, row0, m, "unaligned")) failed++;
  }
  mbd_gpu_free(f->ctx, buf);
  if (failed) fail_msg("%lld unaligned batch sizes differ from the aligned path", (long long)failed);
}

/* The kernel one M-row GEMM of f's shape runs (the launch record's name). */
static void kernel_of(fixture *f, int64_t m, char *out, size_t cap) {
  mbd_error err;
  mbd_error_clear(&err);
  CHECK_OK(mbd_gpu_record_begin(f->ctx, &err));
  mbd_gpu_gemm_args a = args_for(f, 0, m, f->dy);
  CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
  CHECK_OK(mbd_gpu_record_end(f->ctx, &err));
  CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
  assert_int_equal(mbd_gpu_record_count(f->ctx), 1);
  snprintf(out, cap, "%s", mbd_gpu_record_at(f->ctx, 0)->kernel);
}

/* M <= 16 where the ragged-range kernel (mbd_mkrgemm) runs: the strided
 * kernel it replaces (MBD_GEMM_RAGGED=0) gives the same bits at every M of
 * 1..16. want_ragged: the shape must take it at M = 1 when the streaming
 * kernels run at all (the shapes the model dispatch relies on), so the
 * comparison cannot pass vacuously. */
static void check_ragged(fixture *f, int want_ragged) {
  if (f->dt == MBD_DTYPE_F32) return;
  char name[64];
  kernel_of(f, 1, name, sizeof name);
  const int ragged = strstr(name, "mkrgemm") != NULL;
  if (want_ragged && !ragged && strstr(name, "mkgemm"))
    fail_msg("N=%lld K=%lld M=1 ran %s, not the ragged kernel", (long long)f->n,
             (long long)f->k, name);
  if (!ragged) return;
  assert_int_equal(setenv("MBD_GEMM_RAGGED", "0", 1), 0);
  kernel_of(f, 1, name, sizeof name);
  if (strstr(name, "mkrgemm")) fail_msg("MBD_GEMM_RAGGED=0 still ran %s", name);
  int64_t failed = 0;
  for (int64_t m = 1; m <= 16; m++) {
    const int64_t row0 = (m * 7) % 13;
    run_rows(f, row0, m);
    if (count_diff(f, row0, m, "strided vs ragged")) failed++;
  }
  assert_int_equal(unsetenv("MBD_GEMM_RAGGED"), 0);
  if (failed)
    fail_msg("%lld batch sizes differ between the strided and ragged kernels", (long long)failed);
}

static void check_repeat_and_graph(fixture *f) {
  mbd_error err;
  mbd_error_clear(&err);
  run_rows(f, 3, 4096);
  assert_memory_equal(f->got, f->alone + 3 * f->n, (size_t)4096 * f->n * 4);
  run_rows(f, 3, 4096);
  assert_memory_equal(f->got, f->alone + 3 * f->n, (size_t)4096 * f->n * 4);
  /* graph capture of two GEMMs, replayed twice */
  CHECK_OK(mbd_gpu_memset(f->ctx, f->dy, 0xff, (size_t)300 * f->n * 4, &err));
  CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
  mbd_gpu_graph *g = NULL;
  CHECK_OK(mbd_gpu_graph_begin(f->ctx, &err));
  mbd_gpu_gemm_args a = args_for(f, 5, 300, f->dy);
  mbd_gpu_gemm_args b = args_for(f, 1, 1, (float *)f->dy + 300 * f->n);
  CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
  CHECK_OK(mbd_gpu_gemm(f->ctx, &b, &err));
  CHECK_OK(mbd_gpu_graph_end(f->ctx, &g, &err));
  assert_int_equal(mbd_gpu_graph_launch_count(g), 2);
  for (int rep = 0; rep < 2; rep++) {
    CHECK_OK(mbd_gpu_memset(f->ctx, f->dy, 0xff, (size_t)301 * f->n * 4, &err));
    CHECK_OK(mbd_gpu_graph_launch(f->ctx, g, &err));
    CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
    CHECK_OK(mbd_gpu_download(f->ctx, f->got, f->dy, (size_t)301 * f->n * 4, &err));
    assert_memory_equal(f->got, f->alone + 5 * f->n, (size_t)300 * f->n * 4);
    assert_memory_equal(f->got + 300 * f->n, f->alone + 1 * f->n, (size_t)f->n * 4);
  }
  mbd_gpu_graph_destroy(&g);
  assert_null(g);
}

/* Storage-dtype output == rounding of the f32 output (same accumulation). */
static void check_storage_output(fixture *f) {
  if (f->dt == MBD_DTYPE_F32) return;
  mbd_error err;
  mbd_error_clear(&err);
  int64_t m = 77;
  mbd_gpu_gemm_args a = args_for(f, 0, m, f->dy);
  a.out_dtype = f->dt;
  CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
  uint16_t *h = malloc((size_t)m * f->n * 2);
  CHECK_OK(mbd_gpu_download(f->ctx, h, f->dy, (size_t)m * f->n * 2, &err));
  for (int64_t i = 0; i < m * f->n; i++) {
    uint16_t want = f->dt == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(f->alone[i]) : mbd_f32_to_f16(f->alone[i]);
    if (h[i] != want) fail_msg("storage output %lld: 0x%04x != 0x%04x", (long long)i, h[i], want);
  }
  free(h);
}

/* GEMM 1 writes y1 = x W1^T (storage dtype, poisoned first; W1 = the first
 * 1024 rows of W); GEMM 2 reads y1 as its x (K = 1024; M <= 16 runs the
 * mma.sync chunk kernel, which streams W before its dependency wait) with
 * w_static set, so it may launch while GEMM 1 runs and must wait for it
 * before loading x. Compared with the same pair synchronised. */
static void check_pdl_chain(fixture *f) {
  if (f->dt == MBD_DTYPE_F32 || f->n < 1024) return;
  mbd_error err;
  mbd_error_clear(&err);
  const int64_t n1 = 1024, n2 = 512; /* W viewed as [512, 1024] for GEMM 2 */
  void *y1 = NULL, *y2 = NULL;
  CHECK_OK(mbd_gpu_alloc(f->ctx, (size_t)300 * n1 * f->es, &y1, &err));
  CHECK_OK(mbd_gpu_alloc(f->ctx, (size_t)300 * n2 * 4, &y2, &err));
  float *want = malloc((size_t)300 * n2 * 4), *got = malloc((size_t)300 * n2 * 4);
  static const int64_t ms[] = {1, 5, 300};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    const int64_t m = ms[i];
    for (int pass = 0; pass < 2; pass++) {
      CHECK_OK(mbd_gpu_memset(f->ctx, y1, 0xff, (size_t)m * n1 * f->es, &err));
      CHECK_OK(mbd_gpu_memset(f->ctx, y2, 0xff, (size_t)m * n2 * 4, &err));
      mbd_gpu_gemm_args a = {f->dt, f->dt, m, n1, f->k, f->dx, f->dw, NULL, y1, 1};
      CHECK_OK(mbd_gpu_gemm(f->ctx, &a, &err));
      if (pass == 0) CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
      mbd_gpu_gemm_args b = {f->dt, MBD_DTYPE_F32, m, n2, n1, y1, f->dw, NULL, y2, pass};
      CHECK_OK(mbd_gpu_gemm(f->ctx, &b, &err));
      CHECK_OK(mbd_gpu_ctx_sync(f->ctx, &err));
      CHECK_OK(mbd_gpu_download(f->ctx, pass ? got : want, y2, (size_t)m * n2 * 4, &err));
    }
    for (int64_t e = 0; e < m * n2; e++)
      if (isnan(want[e])) fail_msg("pdl chain M=%lld: unwritten output %lld", (long long)m, (long long)e);
    if (memcmp(want, got, (size_t)m * n2 * 4))
      fail_msg("pdl chain M=%lld: programmatic launch differs from synchronised", (long long)m);
  }
  free(want);
  free(got);
  mbd_gpu_free(f->ctx, y1);
  mbd_gpu_free(f->ctx, y2);
}

static void check_reference(fixture *f, mbd_dtype_policy pol, int64_t rows) {
  mbd_error err;
  mbd_error_clear(&err);
  if (pol == MBD_POLICY_F32) {
    mbd_cpu_ctx *cpu = NULL;
    CHECK_OK(mbd_cpu_ctx_new(0, MBD_CPU_ISA_AUTO, &cpu, &err));
    float *c = malloc((size_t)rows * f->n * 4);
    CHECK_OK(mbd_cpu_gemm(cpu, MBD_GEMM_NT, rows, f->n, f->k, MBD_DTYPE_F32, f->hx, f->k,
                          MBD_DTYPE_F32, f->hw, f->k, f->fb, c, f->n, &err));
    for (int64_t i = 0; i < rows * f->n; i++)
      if (memcmp(&c[i], &f->alone[i], 4))
        fail_msg("f32 GPU != CPU at row %lld col %lld: %a vs %a", (long long)(i / f->n),
                 (long long)(i % f->n), f->alone[i], c[i]);
    free(c);
    mbd_cpu_ctx_destroy(&cpu);
    return;
  }
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t n = 0; n < f->n; n++) {
      const float *x = f->fx + r * f->k, *w = f->fw + n * f->k;
      float got = f->alone[r * f->n + n];
      if (pol == MBD_POLICY_TF32) {
        float acc = 0.0f;
        for (int64_t k = 0; k < f->k; k++) acc = fmaf(gpu_test_tf32(x[k]), gpu_test_tf32(w[k]), acc);
        acc = acc + f->fb[n];
        if (memcmp(&acc, &got, 4))
          fail_msg("tf32 row %lld col %lld: %a != host %a", (long long)r, (long long)n, got, acc);
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < f->k; k++) {
        ref += (double)x[k] * w[k];
        mag += fabs((double)x[k] * w[k]);
      }
      ref += f->fb[n];
      double bound = ((double)(f->k / 16) + (double)(f->k / 256) + 3) * ldexp(1.0, -22) *
                         (mag + fabs(f->fb[n])) +
                     ldexp(fabs(ref), -24);
      if (!(fabs(got - ref) <= bound))
        fail_msg("%s row %lld col %lld: %.9g vs f64 %.9g (bound %.3g)", mbd_dtype_name(f->dt),
                 (long long)r, (long long)n, got, ref, bound);
    }
  }
}

static void run_policy(mbd_dtype_policy pol) {
  /* N=1100, K=520: partial N and K tiles (K % 64 != 0), vectorised loads,
   * every tile used. N=200, K=77: element-wise path (K % 8 != 0).
   * N=80, K=136 (x_proj-like skinny N, K % 16 != 0). N=160, K=4096: 16
   * chunks (x_proj of 1.4b; on sm_90a two ring slots per 8-column strip).
   * On sm_90a at M <= 16 (the streaming kernel, gpu_gemm.cu gemm_mk picks the
   * form and strip width): N=16856, K=1040: wide strips, the last chunk has
   * one k16 step of data; N=5120, K=160: 64-column strips folded in
   * registers; N=192, K=5120: at M = 15..16 X leaves room for a one-slot ring
   * only; N=1800, K=2056 (M <= 8): W as the A operand, 16-column strips of 8
   * chunks a slot folded in shared memory, a partial last strip and a last
   * chunk of 8 k (the copy engine's zero fill past K); N=3072, K=768 (130m
   * in_proj): 8-column strips, ~3 a block, so the two partial buffers
   * alternate and each strip reloads its bias; N=6144, K=1536: the same with
   * W as the A operand at M <= 8 (16-column strips) and 16-column strips of
   * 4 chunks at M > 8; N=4096, K=1024: W as the A operand in 32-column strips.
   * N for which no strip width spreads over the SMs take the ragged-range
   * kernel (gemm_mkr; on a 132-SM device also 80 x 136, 5120, 3072, 6144,
   * and 16856 at M > 8): N=8512, K=2048 (Mamba-2 1.3b in_proj: 72 or 64
   * columns a block, 8 chunks); N=2120, K=1040 (24 or 16 columns, a short
   * last chunk); N=9000, K=264 (72 or 64 columns, the last chunk one k tile
   * with 8 k of data); at M = 17..20 N=8512 and N=9000 run the 64 x 72 wgmma
   * tiles (m64n72k16). N=3352, K=768 and N=2048, K=4096 (Mamba-2 130m
   * in_proj, 1.3b out_proj) stay strided on 132 SMs. Every shape also runs
   * check_ragged (strided vs ragged at M = 1..16 where ragged runs).
   * f32 policies skip all but the first three (their chain is not chunked
   * and the host reference is slow). */
  static const int64_t shapes[16][4] = {
      {1100, 520, 300, 0},  {200, 77, 40, 0},     {80, 136, 300, 0},   {160, 4096, 40, 0},
      {16856, 1040, 20, 0}, {5120, 160, 20, 0},   {192, 5120, 20, 0},  {1800, 2056, 20, 0},
      {3072, 768, 20, 0},   {6144, 1536, 20, 0},  {4096, 1024, 20, 0}, {8512, 2048, 20, 1},
      {2120, 1040, 20, 1},  {9000, 264, 20, 1},   {3352, 768, 20, 0},  {2048, 4096, 20, 0}};
  for (int s = 0; s < 16; s++) {
    if (s >= 3 && (pol == MBD_POLICY_F32 || pol == MBD_POLICY_TF32)) continue;
    fixture f;
    setup(&f, pol, shapes[s][0], shapes[s][1], 1234 + (uint64_t)pol * 7 + (uint64_t)s);
    compute_alone(&f);
    check_invariance(&f, shapes[s][2]);
    if (s != 1) check_unaligned(&f);
    check_ragged(&f, (int)shapes[s][3]);
    if (s == 0) {
      check_repeat_and_graph(&f);
      check_storage_output(&f);
      check_pdl_chain(&f);
    }
    check_reference(&f, pol, pol == MBD_POLICY_F32 ? 300 : 64);
    teardown_fx(&f);
  }
}

/* mbd_gpu_gemm_gated (M = 1, x = the gated RMSNorm computed inside the
 * streaming kernel) == mbd_mops_gated_rmsnorm into x, then mbd_gpu_gemm, by
 * memcmp, both gate orders, with and without a bias; likewise
 * mbd_gpu_gemm_resnorm == mbd_mops_add_rmsnorm then mbd_gpu_gemm, with and
 * without a delta (x_out == the updated residual, x untouched). Shapes: the
 * Mamba-2 out_proj (130m N=768 K=1536, 1.3b N=2048 K=4096) and in_proj
 * (1.3b N=8512 K=2048: the ragged kernel; 130m N=3352 K=768) projections, a
 * K that ends inside a chunk and a tile (K=1040) and a partial last strip
 * (N=1100). On sm_90a the fused kernels must run (rc 0); elsewhere rc 1 and
 * nothing runs. */
static void run_gated(mbd_dtype_policy pol) {
  static const int64_t shapes[6][2] = {{768, 1536}, {2048, 4096}, {1100, 1040},
                                       {200, 4096},  {8512, 2048}, {3352, 768}};
  mbd_error err;
  mbd_error_clear(&err);
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.policy = pol;
  mbd_gpu_ctx *ctx = NULL;
  CHECK_OK(mbd_gpu_ctx_new(&cfg, &ctx, &err));
  const mbd_dtype dt = pol == MBD_POLICY_BF16 ? MBD_DTYPE_BF16 : MBD_DTYPE_F16;
  mbd_route_identity rid;
  CHECK_OK(mbd_gpu_ctx_route(ctx, &rid, &err));
  const int sm90a = strcmp(rid.isa, "sm_90a") == 0;
  uint64_t seed = 99 + (uint64_t)pol;
  for (int s = 0; s < 6; s++) {
    const int64_t n = shapes[s][0], k = shapes[s][1];
    float *hy = malloc(k * 4), *hz = malloc(k * 4), *hg = malloc(k * 4), *f = malloc(k * 4);
    void *hw = malloc(n * k * 2), *hb = malloc(n * 2);
    float *want = malloc(n * 4), *got = malloc(n * 4);
    float *fw = malloc(n * k * 4), *fb = malloc(n * 4);
    assert_non_null(fb);
    gpu_test_fill(MBD_DTYPE_F32, k, &seed, hy, f);
    gpu_test_fill(MBD_DTYPE_F32, k, &seed, hz, f);
    gpu_test_fill(MBD_DTYPE_F32, k, &seed, hg, f);
    for (int64_t i = 0; i < k; i++) hy[i] *= 3.0f, hz[i] *= 4.0f, hg[i] += 1.0f;
    gpu_test_fill(dt, n * k, &seed, hw, fw);
    gpu_test_fill(dt, n, &seed, hb, fb);
    void *dy, *dz, *dg, *dw, *db, *dx, *dout;
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &dy, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &dz, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &dg, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, n * k * 2, &dw, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, n * 2, &db, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, k * 2, &dx, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, n * 4, &dout, &err));
    CHECK_OK(mbd_gpu_upload(ctx, dy, hy, k * 4, &err));
    CHECK_OK(mbd_gpu_upload(ctx, dz, hz, k * 4, &err));
    CHECK_OK(mbd_gpu_upload(ctx, dg, hg, k * 4, &err));
    CHECK_OK(mbd_gpu_upload(ctx, dw, hw, n * k * 2, &err));
    CHECK_OK(mbd_gpu_upload(ctx, db, hb, n * 2, &err));
    for (int v = 0; v < 4; v++) {
      const int nbg = v & 1;
      const void *bias = v & 2 ? db : NULL;
      mbd_gpu_gemm_args a = {dt, MBD_DTYPE_F32, 1, n, k, dx, dw, bias, dout, 1};
      CHECK_OK(mbd_gpu_memset(ctx, dx, 0xff, k * 2, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dout, 0xff, n * 4, &err));
      CHECK_OK(mbd_mops_gated_rmsnorm(mbd_gpu_ctx_stream(ctx), 1, (int)k, (int)k, dy, dz, k, dg,
                                      1e-5f, nbg, dt, dx, &err));
      CHECK_OK(mbd_gpu_gemm(ctx, &a, &err));
      CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
      CHECK_OK(mbd_gpu_download(ctx, want, dout, n * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dx, 0xff, k * 2, &err)); /* the fused GEMM must not read x */
      CHECK_OK(mbd_gpu_memset(ctx, dout, 0xff, n * 4, &err));
      const mbd_gpu_gated_norm g = {dy, dz, dg, 1e-5f, nbg};
      CHECK_OK(mbd_gpu_record_begin(ctx, &err));
      const int rc = mbd_gpu_gemm_gated(ctx, &a, &g, &err);
      CHECK_OK(mbd_gpu_record_end(ctx, &err));
      if (rc < 0) fail_msg("mbd_gpu_gemm_gated: %s", err.msg);
      if (!sm90a) {
        assert_int_equal(rc, 1);
        assert_int_equal(mbd_gpu_record_count(ctx), 0);
        continue;
      }
      assert_int_equal(rc, 0);
      assert_int_equal(mbd_gpu_record_count(ctx), 1);
      CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
      CHECK_OK(mbd_gpu_download(ctx, got, dout, n * 4, &err));
      for (int64_t i = 0; i < n; i++)
        if (isnan(want[i]) || memcmp(&want[i], &got[i], 4))
          fail_msg("gated %s N=%lld K=%lld nbg=%d bias=%d col %lld: %a != unfused %a (%s)",
                   mbd_dtype_name(dt), (long long)n, (long long)k, nbg, bias != NULL,
                   (long long)i, got[i], want[i], mbd_gpu_record_at(ctx, 0)->kernel);
    }
    /* mbd_gpu_gemm_resnorm: resid = y, delta = z or none; the reference
     * add_rmsnorm updates its own copy of resid in place */
    void *dra, *drb, *dro;
    float *hr = malloc(k * 4), *hr2 = malloc(k * 4);
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &dra, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &drb, &err));
    CHECK_OK(mbd_gpu_alloc(ctx, k * 4, &dro, &err));
    for (int v = 0; v < 4; v++) {
      const int with_delta = v & 1;
      const void *bias = v & 2 ? db : NULL;
      const float *delta = with_delta ? (const float *)dz : NULL;
      mbd_gpu_gemm_args a = {dt, MBD_DTYPE_F32, 1, n, k, dx, dw, bias, dout, 1};
      CHECK_OK(mbd_gpu_upload(ctx, dra, hy, k * 4, &err));
      CHECK_OK(mbd_gpu_upload(ctx, drb, hy, k * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dro, 0xff, k * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dx, 0xff, k * 2, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dout, 0xff, n * 4, &err));
      CHECK_OK(mbd_mops_add_rmsnorm(mbd_gpu_ctx_stream(ctx), 1, (int)k, 1, 0, dra, delta, dg,
                                    1e-5f, dt, dx, &err));
      CHECK_OK(mbd_gpu_gemm(ctx, &a, &err));
      CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
      CHECK_OK(mbd_gpu_download(ctx, want, dout, n * 4, &err));
      CHECK_OK(mbd_gpu_download(ctx, hr, dra, k * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dx, 0xff, k * 2, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dout, 0xff, n * 4, &err));
      const mbd_gpu_res_norm g = {drb, delta, dg, 1e-5f, with_delta ? (float *)dro : NULL, NULL};
      CHECK_OK(mbd_gpu_record_begin(ctx, &err));
      const int rc = mbd_gpu_gemm_resnorm(ctx, &a, &g, &err);
      CHECK_OK(mbd_gpu_record_end(ctx, &err));
      if (rc < 0) fail_msg("mbd_gpu_gemm_resnorm: %s", err.msg);
      if (!sm90a) {
        assert_int_equal(rc, 1);
        continue;
      }
      assert_int_equal(rc, 0);
      CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
      CHECK_OK(mbd_gpu_download(ctx, got, dout, n * 4, &err));
      for (int64_t i = 0; i < n; i++)
        if (isnan(want[i]) || memcmp(&want[i], &got[i], 4))
          fail_msg("resnorm %s N=%lld K=%lld delta=%d bias=%d col %lld: %a != unfused %a (%s)",
                   mbd_dtype_name(dt), (long long)n, (long long)k, with_delta, bias != NULL,
                   (long long)i, got[i], want[i], mbd_gpu_record_at(ctx, 0)->kernel);
      CHECK_OK(mbd_gpu_download(ctx, hr2, drb, k * 4, &err));
      if (memcmp(hr2, hy, k * 4)) fail_msg("resnorm N=%lld K=%lld: x was written", (long long)n, (long long)k);
      if (with_delta) {
        CHECK_OK(mbd_gpu_download(ctx, hr2, dro, k * 4, &err));
        if (memcmp(hr2, hr, k * 4))
          fail_msg("resnorm N=%lld K=%lld: x_out != add_rmsnorm's updated residual",
                   (long long)n, (long long)k);
      }
    }
    /* with the decode conv step on columns [lo, lo + cn) (the Mamba-2 in_proj's
     * xBC: 8512 = 4096 + 4352 + 64): == mbd_mops_conv_silu on the unfused
     * output, outputs and windows (slot 1 of 2); only the ragged kernel has it */
    {
      const int64_t lo = n == 8512 ? 4096 : n / 4, cn = n == 8512 ? 4352 : n / 2;
      const int64_t ss = 3 * cn + 8; /* slot stride */
      float *hcw = malloc(4 * cn * 4), *hcb = malloc(cn * 4), *hst = malloc(2 * ss * 4);
      float *wst = malloc(2 * ss * 4), *gst = malloc(2 * ss * 4);
      float *wxc = malloc(cn * 4), *gxc = malloc(cn * 4);
      assert_non_null(gxc);
      gpu_test_fill(MBD_DTYPE_F32, 4 * cn, &seed, hcw, hcw);
      for (int64_t i = 0; i < cn; i++) hcb[i] = 0.01f * (float)(i % 7) - 0.03f;
      for (int64_t i = 0; i < 2 * ss; i++) hst[i] = 0.5f * (float)((i * 37) % 11) - 2.0f;
      void *dcw, *dcb, *dst, *dxc, *dsl;
      const int32_t slot1 = 1;
      CHECK_OK(mbd_gpu_alloc(ctx, 4 * cn * 4, &dcw, &err));
      CHECK_OK(mbd_gpu_alloc(ctx, cn * 4, &dcb, &err));
      CHECK_OK(mbd_gpu_alloc(ctx, 2 * ss * 4, &dst, &err));
      CHECK_OK(mbd_gpu_alloc(ctx, cn * 4, &dxc, &err));
      CHECK_OK(mbd_gpu_alloc(ctx, 4, &dsl, &err));
      CHECK_OK(mbd_gpu_upload(ctx, dcw, hcw, 4 * cn * 4, &err));
      CHECK_OK(mbd_gpu_upload(ctx, dcb, hcb, cn * 4, &err));
      CHECK_OK(mbd_gpu_upload(ctx, dsl, &slot1, 4, &err));
      mbd_gpu_gemm_args a = {dt, MBD_DTYPE_F32, 1, n, k, dx, dw, db, dout, 1};
      /* unfused: add_rmsnorm, GEMM, conv */
      CHECK_OK(mbd_gpu_upload(ctx, dra, hy, k * 4, &err));
      CHECK_OK(mbd_gpu_upload(ctx, dst, hst, 2 * ss * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dxc, 0xff, cn * 4, &err));
      CHECK_OK(mbd_mops_add_rmsnorm(mbd_gpu_ctx_stream(ctx), 1, (int)k, 1, 0, dra, dz, dg, 1e-5f,
                                    dt, dx, &err));
      CHECK_OK(mbd_gpu_gemm(ctx, &a, &err));
      CHECK_OK(mbd_mops_conv_silu(mbd_gpu_ctx_stream(ctx), 1, 1, (int)cn, 4, (float *)dout + lo,
                                  n, dcw, dcb, dst, ss, dsl, dxc, MBD_DTYPE_F32, NULL, &err));
      CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
      CHECK_OK(mbd_gpu_download(ctx, want, dout, n * 4, &err));
      CHECK_OK(mbd_gpu_download(ctx, wxc, dxc, cn * 4, &err));
      CHECK_OK(mbd_gpu_download(ctx, wst, dst, 2 * ss * 4, &err));
      /* fused */
      CHECK_OK(mbd_gpu_upload(ctx, drb, hy, k * 4, &err));
      CHECK_OK(mbd_gpu_upload(ctx, dst, hst, 2 * ss * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dxc, 0xff, cn * 4, &err));
      CHECK_OK(mbd_gpu_memset(ctx, dout, 0xff, n * 4, &err));
      const mbd_gpu_conv_step cv = {dcw, dcb, dst, ss, dsl, dxc, lo, cn, 4};
      const mbd_gpu_res_norm g = {drb, dz, dg, 1e-5f, dro, &cv};
      CHECK_OK(mbd_gpu_record_begin(ctx, &err));
      const int rc = mbd_gpu_gemm_resnorm(ctx, &a, &g, &err);
      CHECK_OK(mbd_gpu_record_end(ctx, &err));
      if (rc < 0) fail_msg("mbd_gpu_gemm_resnorm (conv): %s", err.msg);
      if (rc == 0) {
        assert_non_null(strstr(mbd_gpu_record_at(ctx, 0)->kernel, "mkrgemm"));
        CHECK_OK(mbd_gpu_ctx_sync(ctx, &err));
        CHECK_OK(mbd_gpu_download(ctx, got, dout, n * 4, &err));
        CHECK_OK(mbd_gpu_download(ctx, gxc, dxc, cn * 4, &err));
        CHECK_OK(mbd_gpu_download(ctx, gst, dst, 2 * ss * 4, &err));
        if (memcmp(want, got, n * 4) || memcmp(wxc, gxc, cn * 4) || memcmp(wst, gst, 2 * ss * 4))
          fail_msg("resnorm+conv %s N=%lld K=%lld: output %d, conv out %d, windows %d differ",
                   mbd_dtype_name(dt), (long long)n, (long long)k, memcmp(want, got, n * 4) != 0,
                   memcmp(wxc, gxc, cn * 4) != 0, memcmp(wst, gst, 2 * ss * 4) != 0);
      } else {
        assert_int_equal(mbd_gpu_record_count(ctx), 0);
      }
      if (sm90a && n == 8512) assert_int_equal(rc, 0); /* the model's shape must fuse */
      mbd_gpu_free(ctx, dcw);
      mbd_gpu_free(ctx, dcb);
      mbd_gpu_free(ctx, dst);
      mbd_gpu_free(ctx, dxc);
      mbd_gpu_free(ctx, dsl);
      free(hcw); free(hcb); free(hst); free(wst); free(gst); free(wxc); free(gxc);
    }
    mbd_gpu_free(ctx, dra);
    mbd_gpu_free(ctx, drb);
    mbd_gpu_free(ctx, dro);
    free(hr);
    free(hr2);
    mbd_gpu_free(ctx, dy);
    mbd_gpu_free(ctx, dz);
    mbd_gpu_free(ctx, dg);
    mbd_gpu_free(ctx, dw);
    mbd_gpu_free(ctx, db);
    mbd_gpu_free(ctx, dx);
    mbd_gpu_free(ctx, dout);
    free(hy); free(hz); free(hg); free(f); free(hw); free(hb); free(want); free(got);
    free(fw); free(fb);
  }
  mbd_gpu_ctx_destroy(&ctx);
}

static void test_gated_bf16(void **st) { (void)st; run_gated(MBD_POLICY_BF16); }
static void test_gated_f16(void **st) { (void)st; run_gated(MBD_POLICY_F16); }

static void test_f32(void **st) { (void)st; run_policy(MBD_POLICY_F32); }
static void test_tf32(void **st) { (void)st; run_policy(MBD_POLICY_TF32); }
static void test_bf16(void **st) { (void)st; run_policy(MBD_POLICY_BF16); }
static void test_f16(void **st) { (void)st; run_policy(MBD_POLICY_F16); }

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32), cmocka_unit_test(test_tf32), cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_f16), cmocka_unit_test(test_gated_bf16),
      cmocka_unit_test(test_gated_f16)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
