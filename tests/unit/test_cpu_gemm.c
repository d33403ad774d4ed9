/* CPU GEMM contract tests: batch invariance (every M in 1..300, each row's bits
 * equal the row computed alone), AVX2 == portable bits, threads don't matter,
 * accuracy against an f64 reference, bias, odd shapes, packed weights and
 * bad-argument errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/half.h"
#include "kernels/cpu/gemm.h"

#define MAXM 300
#define GN 37 /* not a multiple of the 16-column panel */
#define GK 45 /* not a multiple of anything */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float rng_float(uint64_t *s) { return (float)((rng_next(s) >> 40) * 0x1p-24 * 2.0 - 1.0); }

/* Fills n elements of dtype dt with values in [-1,1); returns them widened too. */
static void *fill(mbd_dtype dt, size_t n, uint64_t seed, float *wide) {
  void *p = malloc(n * mbd_dtype_size(dt));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    float v = rng_float(&seed);
    if (dt == MBD_DTYPE_F32) {
      ((float *)p)[i] = v;
    } else if (dt == MBD_DTYPE_BF16) {
      ((uint16_t *)p)[i] = mbd_f32_to_bf16(v);
      v = mbd_bf16_to_f32(((uint16_t *)p)[i]);
    } else {
      ((uint16_t *)p)[i] = mbd_f32_to_f16(v);
      v = mbd_f16_to_f32(((uint16_t *)p)[i]);
    }
    wide[i] = v;
  }
  return p;
}

typedef struct operands {
  mbd_gemm_layout layout;
  mbd_dtype dt;
  void *A, *B;   /* stored operands, sized for MAXM rows */
  float *Aw, *Bw; /* widened copies */
  int64_t lda, ldb;
  float bias[GN];
} operands;

static void make_operands(operands *o, mbd_gemm_layout layout, mbd_dtype dt, uint64_t seed) {
  o->layout = layout;
  o->dt = dt;
  size_t na = (size_t)MAXM * GK, nb = (size_t)GK * GN;
  o->Aw = malloc(na * sizeof(float));
  o->Bw = malloc(nb * sizeof(float));
  o->A = fill(dt, na, seed, o->Aw);
  o->B = fill(dt, nb, seed + 1, o->Bw);
  o->lda = layout == MBD_GEMM_TN ? MAXM : GK;
  o->ldb = layout == MBD_GEMM_NT ? GK : GN;
  uint64_t s = seed + 2;
  for (int n = 0; n < GN; n++) o->bias[n] = rng_float(&s);
}
static void free_operands(operands *o) {
  free(o->A);
  free(o->B);
  free(o->Aw);
  free(o->Bw);
}
static float a_at(const operands *o, int64_t m, int64_t k) {
  return o->layout == MBD_GEMM_TN ? o->Aw[k * o->lda + m] : o->Aw[m * o->lda + k];
}
static float b_at(const operands *o, int64_t k, int64_t n) {
  return o->layout == MBD_GEMM_NT ? o->Bw[n * o->ldb + k] : o->Bw[k * o->ldb + n];
}

/* Runs op(A)[row0 : row0+M] op(B): for TN the rows are columns of the stored A. */
static void run(mbd_cpu_ctx *ctx, const operands *o, int64_t row0, int64_t M, const float *bias,
                float *C) {
  size_t es = mbd_dtype_size(o->dt);
  const char *a = (const char *)o->A + (size_t)row0 * (o->layout == MBD_GEMM_TN ? 1 : (size_t)o->lda) * es;
  mbd_error err = {0};
  int rc = mbd_cpu_gemm(ctx, o->layout, M, GN, GK, o->dt, a, o->lda, o->dt, o->B, o->ldb, bias, C,
                        GN, &err);
  if (rc) fail_msg("gemm failed: %s", err.msg);
}

static const mbd_gemm_layout layouts[3] = {MBD_GEMM_NN, MBD_GEMM_TN, MBD_GEMM_NT};
static const mbd_dtype dtypes[3] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16};

static mbd_cpu_ctx *ctx_or_fail(int threads, mbd_cpu_isa isa) {
  mbd_cpu_ctx *ctx = NULL;
  mbd_error err = {0};
  if (mbd_cpu_ctx_new(threads, isa, &ctx, &err)) fail_msg("ctx: %s", err.msg);
  return ctx;
}

/* For every M in 1..300, rows computed in a batch of M (starting at row 0 and
 * at an odd offset) are bit-identical to each row computed alone. */
static void test_batch_invariance(void **state) {
  (void)state;
  mbd_cpu_ctx *ctx = ctx_or_fail(2, MBD_CPU_ISA_AUTO);
  float *alone = malloc((size_t)MAXM * GN * sizeof(float));
  float *C = malloc((size_t)MAXM * GN * sizeof(float));
  for (int l = 0; l < 3; l++) {
    for (int d = 0; d < 3; d++) {
      operands o;
      make_operands(&o, layouts[l], dtypes[d], 100 + (uint64_t)(l * 3 + d));
      for (int64_t m = 0; m < MAXM; m++) run(ctx, &o, m, 1, o.bias, alone + m * GN);
      for (int64_t M = 1; M <= MAXM; M++) {
        run(ctx, &o, 0, M, o.bias, C);
        if (memcmp(C, alone, (size_t)M * GN * sizeof(float)) != 0)
          fail_msg("layout %d dtype %s M=%lld: batch rows differ from rows alone", l,
                   mbd_dtype_name(dtypes[d]), (long long)M);
        int64_t off = (M * 7) % (MAXM - M + 1); /* another window: other slots */
        run(ctx, &o, off, M, o.bias, C);
        if (memcmp(C, alone + off * GN, (size_t)M * GN * sizeof(float)) != 0)
          fail_msg("layout %d dtype %s M=%lld offset %lld: rows differ", l,
                   mbd_dtype_name(dtypes[d]), (long long)M, (long long)off);
      }
      free_operands(&o);
    }
  }
  free(alone);
  free(C);
  mbd_cpu_ctx_destroy(&ctx);
  assert_null(ctx);
}

/* Accuracy: |C - ref64| <= (K+2) u sum|a b| + u |bias|, u = 2^-24 (fma chain
 * error bound gamma_K, plus the bias add). Also checks no-bias == bias-free sum
 * and bias applied after the sum (C_bias == fl(C_nobias + bias)). */
static void test_reference_and_bias(void **state) {
  (void)state;
  mbd_cpu_ctx *ctx = ctx_or_fail(2, MBD_CPU_ISA_AUTO);
  const int64_t M = 77;
  float *C = malloc((size_t)M * GN * sizeof(float));
  float *C0 = malloc((size_t)M * GN * sizeof(float));
  double worst = 0.0;
  for (int l = 0; l < 3; l++) {
    for (int d = 0; d < 3; d++) {
      operands o;
      make_operands(&o, layouts[l], dtypes[d], 500 + (uint64_t)(l * 3 + d));
      run(ctx, &o, 0, M, o.bias, C);
      run(ctx, &o, 0, M, NULL, C0);
      for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < GN; n++) {
          double ref = 0.0, mag = 0.0;
          for (int64_t k = 0; k < GK; k++) {
            double p = (double)a_at(&o, m, k) * (double)b_at(&o, k, n);
            ref += p;
            mag += fabs(p);
          }
          double bound = (GK + 2) * 0x1p-24 * mag + 0x1p-24 * fabs(o.bias[n]) + 1e-30;
          double e = fabs((double)C0[m * GN + n] - ref);
          if (e > (GK + 2) * 0x1p-24 * mag + 1e-30)
            fail_msg("no-bias element (%lld,%lld) error %g > bound", (long long)m, (long long)n, e);
          e = fabs((double)C[m * GN + n] - (ref + o.bias[n]));
          if (e > bound) fail_msg("bias element error %g > bound %g", e, bound);
          if (e / bound > worst) worst = e / bound;
          float expect = C0[m * GN + n] + o.bias[n];
          if (memcmp(&expect, &C[m * GN + n], 4) != 0) fail_msg("bias not added after the sum");
        }
      }
      free_operands(&o);
    }
  }
  print_message("worst error / bound = %.3f\n", worst);
  free(C);
  free(C0);
  mbd_cpu_ctx_destroy(&ctx);
}

/* Exactly the fmaf chain: compare against a scalar emulation bit for bit. */
static void test_exact_fma_chain(void **state) {
  (void)state;
  mbd_cpu_ctx *ctx = ctx_or_fail(1, MBD_CPU_ISA_AUTO);
  operands o;
  make_operands(&o, MBD_GEMM_NT, MBD_DTYPE_F32, 9);
  float C[5 * GN];
  run(ctx, &o, 0, 5, o.bias, C);
  for (int m = 0; m < 5; m++)
    for (int n = 0; n < GN; n++) {
      float acc = 0.0f;
      for (int k = 0; k < GK; k++) acc = fmaf(a_at(&o, m, k), b_at(&o, k, n), acc);
      acc = acc + o.bias[n];
      if (memcmp(&acc, &C[m * GN + n], 4) != 0) fail_msg("(%d,%d) not the fmaf chain", m, n);
    }
  free_operands(&o);
  mbd_cpu_ctx_destroy(&ctx);
}

/* Portable and AVX2 kernels, and 1 vs 3 threads, give identical bits. */
static void test_isa_and_threads(void **state) {
  (void)state;
  mbd_cpu_ctx *p1 = ctx_or_fail(1, MBD_CPU_ISA_PORTABLE);
  mbd_cpu_ctx *a3 = ctx_or_fail(3, MBD_CPU_ISA_AUTO);
  print_message("detected ISA: %s\n", mbd_cpu_isa_name(mbd_cpu_isa_detect()));
  float *C1 = malloc((size_t)MAXM * GN * sizeof(float));
  float *C2 = malloc((size_t)MAXM * GN * sizeof(float));
  for (int l = 0; l < 3; l++)
    for (int d = 0; d < 3; d++) {
      operands o;
      make_operands(&o, layouts[l], dtypes[d], 900 + (uint64_t)(l * 3 + d));
      run(p1, &o, 0, MAXM, o.bias, C1);
      run(a3, &o, 0, MAXM, o.bias, C2);
      assert_memory_equal(C1, C2, (size_t)MAXM * GN * sizeof(float));
      free_operands(&o);
    }
  free(C1);
  free(C2);
  mbd_cpu_ctx_destroy(&p1);
  mbd_cpu_ctx_destroy(&a3);
}

/* Packed weights (with conversion at pack time) equal the general NT GEMM on
 * the converted values; bigger odd shapes; rows read back exactly. */
static void test_packed(void **state) {
  (void)state;
  mbd_cpu_ctx *ctx = ctx_or_fail(2, MBD_CPU_ISA_AUTO);
  const int64_t M = 19, N = 131, K = 257;
  float *Aw = malloc((size_t)M * K * 4), *Ww = malloc((size_t)N * K * 4);
  float *A = fill(MBD_DTYPE_F32, (size_t)M * K, 1, Aw);
  float *W = fill(MBD_DTYPE_F32, (size_t)N * K, 2, Ww);
  float *bias = malloc((size_t)N * 4);
  uint64_t s = 3;
  for (int64_t n = 0; n < N; n++) bias[n] = rng_float(&s);
  float *C1 = malloc((size_t)M * N * 4), *C2 = malloc((size_t)M * N * 4);
  float *row = malloc((size_t)K * 4);
  uint16_t *conv = malloc((size_t)N * K * 2);
  for (int d = 0; d < 3; d++) {
    mbd_cpu_wpack *wp = NULL;
    mbd_error err = {0};
    assert_int_equal(mbd_cpu_wpack_new(dtypes[d], N, K, MBD_DTYPE_F32, W, K, &wp, &err), 0);
    assert_int_equal(mbd_cpu_gemm_packed(ctx, M, A, K, wp, bias, C1, N, &err), 0);
    const void *Bsrc = W;
    if (dtypes[d] != MBD_DTYPE_F32) {
      for (int64_t i = 0; i < N * K; i++)
        conv[i] = dtypes[d] == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(W[i]) : mbd_f32_to_f16(W[i]);
      Bsrc = conv;
    }
    assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NT, M, N, K, MBD_DTYPE_F32, A, K, dtypes[d], Bsrc,
                                  K, bias, C2, N, &err),
                     0);
    assert_memory_equal(C1, C2, (size_t)M * N * 4);
    for (int64_t n = 0; n < N; n += 13) {
      mbd_cpu_wpack_row(wp, n, row);
      for (int64_t k = 0; k < K; k++) {
        float v = dtypes[d] == MBD_DTYPE_F32    ? W[n * K + k]
                  : dtypes[d] == MBD_DTYPE_BF16 ? mbd_bf16_to_f32(conv[n * K + k])
                                                : mbd_f16_to_f32(conv[n * K + k]);
        assert_memory_equal(&v, &row[k], 4);
      }
    }
    mbd_cpu_wpack_destroy(&wp);
    assert_null(wp);
  }
  free(A);
  free(W);
  free(Aw);
  free(Ww);
  free(bias);
  free(C1);
  free(C2);
  free(row);
  free(conv);
  mbd_cpu_ctx_destroy(&ctx);
}

static void test_errors_and_edges(void **state) {
  (void)state;
  mbd_cpu_ctx *ctx = ctx_or_fail(1, MBD_CPU_ISA_AUTO);
  mbd_error err = {0};
  float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4], bias[2] = {0.5f, -0.5f};
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 2, 2, 2, MBD_DTYPE_F32, A, 1, MBD_DTYPE_F32, B,
                                2, NULL, C, 2, &err),
                   MBD_E_SHAPE);
  assert_true(strstr(err.msg, "lda") != NULL);
  assert_int_equal(mbd_cpu_gemm(ctx, (mbd_gemm_layout)7, 2, 2, 2, MBD_DTYPE_F32, A, 2,
                                MBD_DTYPE_F32, B, 2, NULL, C, 2, &err),
                   MBD_E_INVALID);
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 2, 2, 2, MBD_DTYPE_I64, A, 2, MBD_DTYPE_F32, B,
                                2, NULL, C, 2, &err),
                   MBD_E_INVALID);
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 2, 2, 2, MBD_DTYPE_F32, NULL, 2, MBD_DTYPE_F32,
                                B, 2, NULL, C, 2, &err),
                   MBD_E_INVALID);
  assert_int_equal(mbd_cpu_gemm(NULL, MBD_GEMM_NN, 2, 2, 2, MBD_DTYPE_F32, A, 2, MBD_DTYPE_F32, B,
                                2, NULL, C, 2, &err),
                   MBD_E_INVALID);
  /* K == 0: bias only. M == 0: nothing written, OK. */
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 2, 2, 0, MBD_DTYPE_F32, NULL, 0, MBD_DTYPE_F32,
                                NULL, 2, bias, C, 2, &err),
                   0);
  assert_true(C[0] == 0.5f && C[1] == -0.5f && C[2] == 0.5f && C[3] == -0.5f);
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 0, 2, 2, MBD_DTYPE_F32, A, 2, MBD_DTYPE_F32, B,
                                2, NULL, NULL, 2, &err),
                   0);
  /* identity */
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NN, 2, 2, 2, MBD_DTYPE_F32, A, 2, MBD_DTYPE_F32, B,
                                2, NULL, C, 2, &err),
                   0);
  assert_memory_equal(A, C, sizeof(A));
  mbd_cpu_ctx_destroy(&ctx);
  mbd_cpu_ctx_destroy(&ctx); /* NULL-safe */
  assert_int_equal(mbd_cpu_ctx_new(100000, MBD_CPU_ISA_AUTO, &ctx, &err), MBD_E_INVALID);
  assert_null(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_reference_and_bias),
      cmocka_unit_test(test_exact_fma_chain),  cmocka_unit_test(test_isa_and_threads),
      cmocka_unit_test(test_packed),           cmocka_unit_test(test_errors_and_edges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
