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
 * - on sm_90a the cluster tile kernels (2 x 1 and 2 x 2 thread-block
 *   clusters multicasting the W / X tiles, mbd_wgcl_*) give the rows-alone
 *   bits at M with even and odd M tile counts (a block past the last tile)
 *   and partial N tiles, under MBD_GEMM_MCAST=0 (no clusters), 4 (2 x 2)
 *   and 2 (2 x 1), each also persistent (MBD_GEMM_PERSIST=1), and the
 *   default (2 x 1 only for narrow N at many M tiles); each form must run
 *   on some shape;
 * - on sm_90a each MBD_GEMM_SCHED setting (old: the 128 x 128 tiles; w192f:
 *   the 128 x 192 tiles wherever those run; unset: 128 x 192 where its waves
 *   allow) gives the rows-alone bits; each setting's kernel must run on some
 *   shape;
 * - on sm_90a each MBD_GEMM_KSPLIT setting (0: never; 1..4: each K split
 *   tile, a cluster of blocks sharing one tile along K, wherever K exceeds a
 *   chunk; unset: tile 1 for narrow N and long K) gives the rows-alone bits;
 *   each tile must run, and the default must take the split somewhere;
 * - on sm_90a each MBD_GEMM_WTILE setting (one tile configuration alone)
 *   gives the rows-alone bits; each configuration must run on some shape. */
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

/* Where the ragged-range kernel (mbd_mkrgemm, dispatched at M = 1) runs:
 * the strided kernel it replaces (MBD_GEMM_RAGGED=0) gives the same bits at
 * every M of 1..16 (the alone rows are the ragged kernel's). want_ragged: the shape must take it at M = 1 when the streaming
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

/* MBD_GEMM_MCAST settings, each also persistent (MBD_GEMM_PERSIST=1; with
 * MBD_GEMM_MCAST=0 the persistent tiles alone): every one gives the
 * rows-alone bits at M that pair 128-row tiles (129, 256), leave an odd tile
 * count (520: 5, 1100: 9, 2047: 16 with a partial last tile, 1000: 8) or
 * many tiles (4096). seen[0], seen[1]: runs of a 2 x 1 and a 2 x 2 cluster
 * tile kernel (mbd_wgcl_*_1 and _6 are the 2 x 2 ones); seen[2]: of wgmma
 * tile kernels (the sm_90a family, whose large-M tiles the cluster kernels
 * replace); seen[3]: of a persistent tile kernel (mbd_wgcl_*_4.._8). */
static void check_mcast(fixture *f, int seen[4]) {
  if (f->dt == MBD_DTYPE_F32) return;
  /* MBD_GEMM_MCAST, MBD_GEMM_PERSIST */
  static const char *const modes[][2] = {{"0", "0"}, {"4", "0"}, {"2", "0"},
                                         {"0", "1"}, {"2", "1"}, {"4", "1"}};
  static const int64_t ms[] = {129, 256, 520, 1000, 1100, 2047, 4096};
  int64_t failed = 0;
  for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
    assert_int_equal(setenv("MBD_GEMM_MCAST", modes[mi][0], 1), 0);
    assert_int_equal(setenv("MBD_GEMM_PERSIST", modes[mi][1], 1), 0);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      char name[64];
      kernel_of(f, ms[i], name, sizeof name);
      const char *cl = strstr(name, "wgcl_");
      if (modes[mi][0][0] == '0' && modes[mi][1][0] == '0' && cl)
        fail_msg("MBD_GEMM_MCAST=0 ran %s", name);
      if (cl) {
        const int idx = atoi(strrchr(name, '_') + 1);
        if (idx >= 4) seen[3]++;
        if (idx != 4 && idx != 7) seen[idx == 1 || idx == 6 ? 1 : 0]++;
      }
      if (strstr(name, "wgemm")) seen[2]++;
      const int64_t row0 = ms[i] % 11;
      run_rows(f, row0, ms[i]);
      char what[128];
      snprintf(what, sizeof what, "MBD_GEMM_MCAST=%s MBD_GEMM_PERSIST=%s %s", modes[mi][0],
               modes[mi][1], name);
      if (count_diff(f, row0, ms[i], what)) failed++;
    }
  }
  assert_int_equal(unsetenv("MBD_GEMM_MCAST"), 0);
  assert_int_equal(unsetenv("MBD_GEMM_PERSIST"), 0);
  if (failed) fail_msg("%lld cluster-setting runs differ from rows alone", (long long)failed);
}

/* MBD_GEMM_SCHED settings (gpu_gemm.cu sched_tile): old (the 128 x 128 TMA
 * tile always), w192f (the 128 x 192 tile, whose consumers take the producer
 * warpgroup's registers, wherever the 128 x 128 tile would run) and unset
 * (128 x 192 where its waves allow): each gives the rows-alone bits at M with
 * 5, 9, 16 (a partial last one) and 32 tiles of 128 rows. seen[i]: runs of
 * k_sched_kernel[i] (the end of the kernel's name) under setting i, so the
 * comparison cannot pass vacuously (run_policy requires each). */
static const char *const k_sched[] = {"old", "w192f", NULL};
static const char *const k_sched_kernel[] = {"wgemm_*_5", "wgemm_*_10", "wgemm_*_10"};
#define N_SCHED (sizeof k_sched / sizeof k_sched[0])

/* Sets the environment variable name to v, or unsets it for v = NULL. */
static void env_setting(const char *name, const char *v) {
  assert_int_equal(v ? setenv(name, v, 1) : unsetenv(name), 0);
}

/* name is mbd_<family>_<dtype>_<index> and pat is "<family>_*_<index>". */
static int kernel_is(const char *name, const char *pat) {
  const char *star = strchr(pat, '*'), *fam = strstr(name, "mbd_");
  if (!star || !fam) return 0;
  fam += 4;
  const size_t fl = (size_t)(star - pat);
  const char *idx = strrchr(name, '_');
  return strncmp(fam, pat, fl) == 0 && idx && strcmp(idx, star + 1) == 0;
}

static void check_sched(fixture *f, int seen[N_SCHED]) {
  if (f->dt == MBD_DTYPE_F32) return;
  static const int64_t ms[] = {520, 1100, 2047, 4096};
  int64_t failed = 0;
  for (size_t si = 0; si < N_SCHED; si++) {
    env_setting("MBD_GEMM_SCHED", k_sched[si]);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      char name[64];
      kernel_of(f, ms[i], name, sizeof name);
      if (kernel_is(name, k_sched_kernel[si])) seen[si]++;
      const int64_t row0 = ms[i] % 7;
      run_rows(f, row0, ms[i]);
      char what[128];
      snprintf(what, sizeof what, "MBD_GEMM_SCHED=%s %s", k_sched[si] ? k_sched[si] : "(unset)",
               name);
      if (count_diff(f, row0, ms[i], what)) failed++;
    }
  }
  assert_int_equal(unsetenv("MBD_GEMM_SCHED"), 0);
  if (failed) fail_msg("%lld schedule-setting runs differ from rows alone", (long long)failed);
}

/* MBD_GEMM_KSPLIT settings (gpu_gemm.cu pick_wkstile): 0 (never), 1..4 (K
 * split tile 0..3 wherever K exceeds one chunk: clusters of 4, 8, 2 and 4
 * blocks on 128 x 128 and 64 x 128 tiles) and unset (tile 1 where N is
 * narrow and K long): each gives the rows-alone bits at M of one partial
 * tile (17, 64), two (65), several (129, 300) and many (1024). Where the
 * chunks are fewer than the cluster's blocks (K = 520: 3 chunks), some
 * blocks run no chain and only fold. seen[i]: runs of K split tile i under setting i + 1;
 * seen[N_KS_TILES]: K split runs under the unset setting (the default). */
#define N_KS_TILES 4
static const char *const k_ksplit[] = {"0", "1", "2", "3", "4", NULL};
#define N_KSPLIT (sizeof k_ksplit / sizeof k_ksplit[0])

static void check_ksplit(fixture *f, int seen[N_KS_TILES + 1]) {
  if (f->dt == MBD_DTYPE_F32 || f->k <= 256) return;
  static const int64_t ms[] = {17, 64, 65, 129, 300, 1024};
  int64_t failed = 0;
  for (size_t si = 0; si < N_KSPLIT; si++) {
    env_setting("MBD_GEMM_KSPLIT", k_ksplit[si]);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      char name[64];
      kernel_of(f, ms[i], name, sizeof name);
      const char *ks = strstr(name, "wgks_");
      if (k_ksplit[si] && k_ksplit[si][0] == '0' && ks) fail_msg("MBD_GEMM_KSPLIT=0 ran %s", name);
      const int forced = k_ksplit[si] && k_ksplit[si][1] == 0 ? k_ksplit[si][0] - '1' : -1;
      if (ks && forced >= 0 && atoi(strrchr(name, '_') + 1) == forced) seen[forced]++;
      if (ks && !k_ksplit[si]) seen[N_KS_TILES]++;
      const int64_t row0 = ms[i] % 5;
      run_rows(f, row0, ms[i]);
      char what[128];
      snprintf(what, sizeof what, "MBD_GEMM_KSPLIT=%s %s",
               k_ksplit[si] ? k_ksplit[si] : "(unset)", name);
      if (count_diff(f, row0, ms[i], what)) failed++;
    }
  }
  assert_int_equal(unsetenv("MBD_GEMM_KSPLIT"), 0);
  if (failed) fail_msg("%lld K split setting runs differ from rows alone", (long long)failed);
}

/* MBD_GEMM_WTILE=i (gpu_gemm.cu forced_wtile): tile configuration i alone
 * gives the rows-alone bits at M of one partial tile (17), a few tiles (65,
 * 300). seen[i]: runs of mbd_wgemm_*_i under setting i (run_policy requires
 * each of 0..10 somewhere: 6, 128 x 256, only where K is one chunk). */
#define N_WTILE 11
static void check_wtile(fixture *f, int seen[N_WTILE]) {
  if (f->dt == MBD_DTYPE_F32) return;
  static const int64_t ms[] = {17, 65, 300};
  int64_t failed = 0;
  for (int ti = 0; ti < N_WTILE; ti++) {
    char v[8];
    snprintf(v, sizeof v, "%d", ti);
    env_setting("MBD_GEMM_WTILE", v);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      char name[64], pat[16];
      kernel_of(f, ms[i], name, sizeof name);
      snprintf(pat, sizeof pat, "wgemm_*_%d", ti);
      if (kernel_is(name, pat)) seen[ti]++;
      const int64_t row0 = ms[i] % 3;
      run_rows(f, row0, ms[i]);
      char what[128];
      snprintf(what, sizeof what, "MBD_GEMM_WTILE=%d %s", ti, name);
      if (count_diff(f, row0, ms[i], what)) failed++;
    }
  }
  assert_int_equal(unsetenv("MBD_GEMM_WTILE"), 0);
  if (failed) fail_msg("%lld forced-tile runs differ from rows alone", (long long)failed);
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
   * kernel at M = 1 (gemm_mkr; on a 132-SM device also 80 x 136, 5120, 3072
   * and 6144): N=8512, K=2048 (Mamba-2 1.3b in_proj: 72 or 64
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
  int seen[4] = {0, 0, 0, 0}, seen_sched[N_SCHED] = {0}, seen_ks[N_KS_TILES + 1] = {0},
      seen_wt[N_WTILE] = {0};
  for (int s = 0; s < 16; s++) {
    if (s >= 3 && (pol == MBD_POLICY_F32 || pol == MBD_POLICY_TF32)) continue;
    fixture f;
    setup(&f, pol, shapes[s][0], shapes[s][1], 1234 + (uint64_t)pol * 7 + (uint64_t)s);
    compute_alone(&f);
    check_invariance(&f, shapes[s][2]);
    if (s != 1) check_unaligned(&f);
    check_ragged(&f, (int)shapes[s][3]);
    check_mcast(&f, seen);
    check_sched(&f, seen_sched);
    check_ksplit(&f, seen_ks);
    check_wtile(&f, seen_wt);
    if (s == 0) {
      check_repeat_and_graph(&f);
      check_storage_output(&f);
      check_pdl_chain(&f);
    }
    check_reference(&f, pol, pol == MBD_POLICY_F32 ? 300 : 64);
    teardown_fx(&f);
  }
  if (seen[2] && (!seen[0] || !seen[1] || !seen[3]))
    fail_msg("the cluster kernels did not run (2 x 1: %d, 2 x 2: %d, persistent: %d runs)",
             seen[0], seen[1], seen[3]);
  for (int i = 0; seen[2] && i < N_KS_TILES; i++)
    if (!seen_ks[i]) fail_msg("MBD_GEMM_KSPLIT=%d never ran mbd_wgks_*_%d", i + 1, i);
  for (int i = 0; seen[2] && i < N_WTILE; i++)
    if (!seen_wt[i]) fail_msg("MBD_GEMM_WTILE=%d never ran mbd_wgemm_*_%d", i, i);
  if (seen[2] && !seen_ks[N_KS_TILES]) fail_msg("the default dispatch never took a K split tile");
  for (size_t si = 0; seen[2] && si < N_SCHED; si++)
    if (!seen_sched[si])
      fail_msg("MBD_GEMM_SCHED=%s never ran %s", k_sched[si] ? k_sched[si] : "(unset)",
               k_sched_kernel[si]);
}

static void test_f32(void **st) { (void)st; run_policy(MBD_POLICY_F32); }
static void test_tf32(void **st) { (void)st; run_policy(MBD_POLICY_TF32); }
static void test_bf16(void **st) { (void)st; run_policy(MBD_POLICY_BF16); }
static void test_f16(void **st) { (void)st; run_policy(MBD_POLICY_F16); }

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f32), cmocka_unit_test(test_tf32), cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_f16)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
