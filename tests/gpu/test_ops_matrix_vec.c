/* The vector kernels of two CUDA ops against the kernels they replace, by
 * memcmp: the conv + SiLU (k_conv_tile for the prefill, k_conv_step4 for
 * the decode step, with grouped SiLUs or, MBD_CONV_STEP=plain, one
 * mbd_pm_silu per value; kernels/cuda/ops/conv_silu.cu) against
 * k_conv_silu, and the gated RMSNorm (k_gated_rmsnorm4 with four and eight
 * quads a thread, kernels/cuda/ops/gated_rmsnorm.cu) against
 * k_gated_rmsnorm. The old kernels are what MBD_CONV_PREFILL=old,
 * MBD_CONV_STEP=old and MBD_GATED_NORM=old select (read at each launch);
 * test_ops_matrix.c ties those to the CPU ops. Same inputs, row counts on
 * both sides of the kernels' tiles, blocks and the model's chunks (1, 255,
 * 256, 2048, 2049, 16384), channel counts that leave a warp or a block
 * partly idle, every conv width, gated-norm widths on both sides of d_inner
 * 4096 (where the quads a thread go from four to eight), all three output
 * dtypes, inputs that take the grouped SiLU's slow path (silu_group.cuh);
 * the conv also compares the state it leaves.
 *
 * Skips (exit 77) with a printed reason when no CUDA device is present. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/gated_rmsnorm.h"
#include "kernels/portable_math.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_op_test.h"

static cudaStream_t g_stream;

/* Every stride-th of the n values (from a start that varies with n) set to
 * one of the inputs where the kernels' grouped SiLU leaves its fast
 * sequence (e^-x near or past overflow, huge or tiny |x|, signed zeros,
 * infinities, NaN), so that both of its paths meet the old kernels'. */
static void sprinkle(float *v, size_t n, size_t stride) {
  static const float special[] = {-1000.0f, -100.0f, -88.5f, -50.0f, -44.0f, 1000.0f,
                                  1e25f,    -1e25f,  1e-30f, -1e-30f, 0.0f,   -0.0f,
                                  INFINITY, -INFINITY, NAN};
  const size_t ns = sizeof special / sizeof special[0];
  for (size_t i = n % stride, j = 0; i < n; i += stride, j++) v[i] = special[j % ns];
}

/* Sets (val != NULL) or unsets the variable. */
static void set_var(const char *var, const char *val) {
  if (val)
    setenv(var, val, 1);
  else
    unsetenv(var);
}

/* ---- the grouped SiLU's division (host) ------------------------------------ */

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* silu_group.cuh's quotient x / d (silu_div_fast) from a reciprocal estimate
 * y0, as the device computes it. */
static float div_fast(float x, float d, float y0) {
  const float e = fmaf(-d, y0, 1.0f), y1 = fmaf(y0, e, y0), q0 = x * y1;
  return copysignf(fmaf(y1, fmaf(-d, q0, x), q0), x);
}

/* Where silu_div_fast_ok holds, div_fast is the IEEE quotient for every
 * reciprocal estimate within 3 ulp of 1 / d (rcp.approx.ftz.f32 is within
 * 1): on SiLU's own operands (d = 1 + mbd_pm_expf(-x)), on x and d from
 * the whole range, and on quotients next to a rounding boundary. */
static void test_silu_div_host(void **state) {
  (void)state;
  uint64_t seed = 79;
  long cases = 0;
  for (long it = 0; it < 3000000; it++) {
    const uint32_t a = (uint32_t)(gpu_test_uniform(&seed) * 0.5f * 16777216.0f + 8388608.0f);
    const uint32_t b = (uint32_t)(gpu_test_uniform(&seed) * 0.5f * 16777216.0f + 8388608.0f);
    float x, d;
    switch (it % 3) {
    case 0: /* SiLU's operands, x in [-60, 60] */
      x = 60.0f * gpu_test_uniform(&seed);
      d = 1.0f + mbd_pm_expf(-x);
      break;
    case 1: /* d in [1, 2^64), |x| in [2^-60, 2^60) */
      d = f_of((uint32_t)(127 + a % 64) << 23 | (b & 0x7fffffu));
      x = f_of((uint32_t)(67 + b % 120) << 23 | (a & 0x7fffffu));
      if (a & 1) x = -x;
      break;
    default: { /* x = d q with q half an ulp off a float, then +-1 ulp */
      d = f_of((uint32_t)(127 + a % 40) << 23 | (b & 0x7fffffu));
      const double q = (double)f_of((uint32_t)(77 + b % 100) << 23 | (a & 0x7fffffu)) *
                       (1.0 + ((a >> 7) & 1 ? 0x1p-24 : -0x1p-24));
      x = f_of(u_of((float)((double)d * q)) + (uint32_t)(b >> 30 & 1) - (uint32_t)(a >> 30 & 1));
    }
    }
    const float ax = fabsf(x);
    if (!(d >= 1.0f && d <= 0x1p64f && ax <= 0x1p60f && (ax >= 0x1p-60f || x == 0.0f))) continue;
    const float want = x / d, y = 1.0f / d;
    for (int k = -3; k <= 3; k++) {
      const float got = div_fast(x, d, f_of(u_of(y) + (uint32_t)k));
      if (u_of(got) != u_of(want))
        fail_msg("x %a / d %a with 1/d %+d ulp: %a, IEEE %a", x, d, k, got, want);
      cases++;
    }
  }
  for (int z = 0; z < 2; z++) { /* signed zeros */
    const float x = z ? -0.0f : 0.0f, d = 1.0f + mbd_pm_expf(-x);
    assert_true(u_of(div_fast(x, d, 1.0f / d)) == u_of(mbd_pm_silu(x)));
  }
  assert_true(cases > 10000000);
}

/* ---- conv + SiLU ---------------------------------------------------------- */

/* One conv case: nseq sequences of T steps over di channels, width K, rows
 * ldxz floats apart (16-byte multiples, the input 16 bytes past an
 * allocation's start as the Mamba-2 model's xBC columns), states in permuted
 * slots of stride sstride; the kernels MBD_CONV_STEP=step selects (NULL:
 * unset, the defaults) against MBD_CONV_PREFILL=old MBD_CONV_STEP=old. */
static void conv_case(const char *step, int nseq, int T, int di, int K, mbd_dtype act,
                      uint64_t *seed) {
  enum { NSLOT = 11 };
  const int64_t M = (int64_t)nseq * T, ldxz = di + 12, sstride = (int64_t)(K - 1) * di + 8;
  int32_t slots[16];
  for (int s = 0; s < nseq; s++) slots[s] = (int32_t)((s * 7 + 3) % NSLOT);
  float *xz = fillf((size_t)(M * ldxz + 4), seed, -2.0f, 2.0f);
  sprinkle(xz, (size_t)(M * ldxz + 4), 1009); /* sums past SiLU's fast range, NaN */
  float *w = fillf((size_t)K * di, seed, -0.6f, 0.6f), *b = fillf((size_t)di, seed, -0.3f, 0.3f);
  float *st = fillf((size_t)NSLOT * sstride, seed, -1.0f, 1.0f);
  float *dxz = dput(xz, (size_t)(M * ldxz + 4) * 4), *dw = dput(w, (size_t)K * di * 4);
  float *db = dput(b, (size_t)di * 4), *dst = dzero((size_t)NSLOT * sstride * 4);
  int32_t *dsl = dput(slots, sizeof slots);
  float *dxc = dzero((size_t)(M * di) * 4);
  void *dact = act == MBD_DTYPE_F32 ? NULL : dzero((size_t)(M * di) * dsize(act));
  const size_t nxc = (size_t)(M * di) * 4, nact = (size_t)(M * di) * dsize(act),
               nst = (size_t)NSLOT * sstride * 4;
  char *want = malloc(nxc + nact + nst), *got = malloc(nxc + nact + nst);
  assert_non_null(want);
  assert_non_null(got);
  for (int v = 0; v < 2; v++) { /* v = 0: the old kernel */
    set_var("MBD_CONV_PREFILL", v ? NULL : "old");
    set_var("MBD_CONV_STEP", v ? step : "old");
    CK(cudaMemcpy(dst, st, nst, cudaMemcpyHostToDevice));
    CK(cudaMemset(dxc, 0xff, nxc));
    if (dact) CK(cudaMemset(dact, 0xff, nact));
    OP(mbd_mops_conv_silu(g_stream, nseq, T, di, K, dxz + 4, ldxz, dw, db, dst, sstride, dsl,
                          dxc, act, dact, &err));
    char *h = v ? got : want;
    dget(h, dxc, nxc);
    if (dact) dget(h + nxc, dact, nact);
    dget(h + nxc + nact, dst, nst);
  }
  char what[128];
  snprintf(what, sizeof what, "conv_silu %s nseq=%d T=%d di=%d K=%d %s",
           step ? step : "default", nseq, T, di, K, mbd_dtype_name(act));
  same_bytes(what, got, want, nxc / 4, 4);
  if (dact) same_bytes(what, got + nxc, want + nxc, nact / dsize(act), dsize(act));
  same_bytes(what, got + nxc + nact, want + nxc + nact, nst / 4, 4);
  unsetenv("MBD_CONV_PREFILL");
  unsetenv("MBD_CONV_STEP");
  CK(cudaFree(dxz));
  CK(cudaFree(dw));
  CK(cudaFree(db));
  CK(cudaFree(dst));
  CK(cudaFree(dsl));
  CK(cudaFree(dxc));
  if (dact) CK(cudaFree(dact));
  free(xz);
  free(w);
  free(b);
  free(st);
  free(want);
  free(got);
}

/* The kernels MBD_CONV_STEP=step selects over the shapes (the same inputs
 * each time); with a step value, only the decode step's (T = 1). */
static void conv_cases(const char *step) {
  uint64_t seed = 71;
  static const mbd_dtype acts[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16};
  /* (nseq, T): rows 1 and 8 (the step kernel), 255, 256, 2048 as the b8
   * chunk and as one sequence, 2049, 16384; short sequences against the window */
  static const int rows[][2] = {{1, 1},    {8, 1},    {1, 255}, {1, 256}, {8, 256}, {1, 2048},
                                {1, 2049}, {8, 2048}, {3, 2},   {5, 3},   {2, 17}};
  static const int dis[] = {4352, 1792, 132, 36}; /* 1.3b, 130m xBC; 33 and 9 quads */
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
    for (size_t q = 0; q < sizeof dis / sizeof dis[0]; q++)
      for (int a = 0; a < 3; a++) {
        const int nseq = rows[r][0], T = rows[r][1], di = dis[q];
        if ((int64_t)nseq * T * di > (int64_t)16384 * 1792) continue; /* memory and time */
        if (step && T != 1) continue;
        conv_case(step, nseq, T, di, 4, acts[a], &seed);
      }
  /* the other widths: the step, short and tile-crossing lengths */
  for (int K = 2; K <= 8; K++)
    for (int a = 0; a < 3; a++) {
      conv_case(step, 4, 1, 132, K, acts[a], &seed);
      if (step) continue;
      conv_case(step, 3, 2, 132, K, acts[a], &seed);
      conv_case(step, 2, 37, 132, K, acts[a], &seed);
      conv_case(step, 1, 300, 36, K, acts[a], &seed);
    }
}
static void test_conv_vec(void **state) {
  (void)state;
  conv_cases(NULL);
}
static void test_conv_step_plain(void **state) {
  (void)state;
  conv_cases("plain");
}

/* ---- gated RMSNorm -------------------------------------------------------- */

/* M rows of n channels in groups of `group`, gate rows ldz floats apart;
 * the default kernel against MBD_GATED_NORM=old, both gate orders. */
static void gnorm_case(int64_t M, int n, int group, mbd_dtype act, uint64_t *seed) {
  const int64_t ldz = n + 8;
  float *y = fillf((size_t)(M * n), seed, -2.0f, 2.0f), *z = fillf((size_t)(M * ldz), seed, -3, 3);
  sprinkle(z, (size_t)(M * ldz), 4099); /* gates past SiLU's fast range, NaN */
  float *w = fillf((size_t)n, seed, 0.5f, 1.5f);
  float *dy = dput(y, (size_t)(M * n) * 4), *dz = dput(z, (size_t)(M * ldz) * 4);
  float *dw = dput(w, (size_t)n * 4);
  const size_t nb = (size_t)(M * n) * dsize(act);
  void *dout = dzero(nb);
  char *want = malloc(nb), *got = malloc(nb);
  assert_non_null(want);
  assert_non_null(got);
  for (int nbg = 0; nbg < 2; nbg++) {
    for (int v = 0; v < 2; v++) { /* v = 0: the old kernel */
      set_var("MBD_GATED_NORM", v ? NULL : "old");
      CK(cudaMemset(dout, 0xff, nb));
      OP(mbd_mops_gated_rmsnorm(g_stream, M, n, group, dy, dz, ldz, dw, 1e-5f, nbg, act, dout,
                                &err));
      dget(v ? got : want, dout, nb);
    }
    char what[128];
    snprintf(what, sizeof what, "gated_rmsnorm M=%lld n=%d group=%d nbg=%d %s", (long long)M, n,
             group, nbg, mbd_dtype_name(act));
    same_bytes(what, got, want, nb / dsize(act), dsize(act));
  }
  unsetenv("MBD_GATED_NORM");
  CK(cudaFree(dy));
  CK(cudaFree(dz));
  CK(cudaFree(dw));
  CK(cudaFree(dout));
  free(y);
  free(z);
  free(w);
  free(want);
  free(got);
}

static void test_gated_norm_vec(void **state) {
  (void)state;
  uint64_t seed = 73;
  static const mbd_dtype acts[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16};
  /* 1.3b and 130m (one group: four quads a thread), groups of 512, groups
   * that are not whole quads, a row narrower than a warp's quads; eight
   * quads a thread: 2.7b's width, one quad past 4096, groups of 768, the
   * widest row the vector kernel takes */
  static const int shapes[][2] = {{4096, 4096}, {1536, 1536}, {4096, 512}, {60, 6},
                                  {40, 40},     {5120, 5120}, {4100, 4100}, {6144, 768},
                                  {8192, 8192}};
  static const int64_t rows[] = {1, 255, 256, 2048, 2049, 16384};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      for (int a = 0; a < 3; a++) {
        const int n = shapes[si][0];
        /* f32 routes chain a whole group on one thread: keep those launches short */
        const int64_t cap = acts[a] == MBD_DTYPE_F32 ? 2049 : 16384;
        if (rows[r] > cap || rows[r] * n > (int64_t)16384 * 1536) continue;
        gnorm_case(rows[r], n, shapes[si][1], acts[a], &seed);
      }
}

static int setup(void **state) {
  (void)state;
  return cudaStreamCreate(&g_stream) == cudaSuccess ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  cudaStreamDestroy(g_stream);
  return 0;
}

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_silu_div_host),
      cmocka_unit_test(test_conv_vec),
      cmocka_unit_test(test_conv_step_plain),
      cmocka_unit_test(test_gated_norm_vec),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
