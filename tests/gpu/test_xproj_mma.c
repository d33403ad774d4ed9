/* The 16-bit routes' x_proj contract (docs/route.md, "Model kernels",
 * x_proj: one m16n8k16 step per group of 16 channels, class sums in group
 * order, the xor butterfly) across every kernel that produces x_proj
 * outputs, against the plain reference of tests/gpu/xproj_ref.cu (one warp
 * per output, the output's rows alone in the fragments), by memcmp:
 * - mbd_mops_xproj: k_xproj (M = 1..31, and M >= 32 with MBD_XPROJ_TILE=0),
 *   the previous many-row tiles (M = 32, 33, 64, 256, 300, 1024, 2048 with
 *   MBD_XPROJ_TILE=1: every tile shape), and k_xproj_rows (the default
 *   from 1024 rows, there at those M; MBD_XPROJ_TILE=4: every M, M = 1, 7,
 *   64, 256, 301, 600, 2048, 2049: every block shape and stage count; and
 *   4100 rows), at the model shapes N = 80 / K = 1536,
 *   N = 160 / K = 4096, N = 192 / K = 5120, and at K = 1000 (not a multiple
 *   of 16 or 512) and K = 777 (odd: element loads), bf16 and f16, and an x
 *   that is not 4-byte aligned;
 * - mbd_mops_conv_xproj (the decode fusion) against mbd_mops_conv_silu's
 *   xc_act through the reference, 1..64 rows.
 * The persistent decode's partials are pinned by test_mamba1_gpu (persistent
 * vs per-op logits and states by memcmp). Inputs span exponents 2^-8..2^8
 * with exact zeros, so that an mma step's alignment and rounding of its 16
 * products matter. Skips (exit 77) with a printed reason without a GPU. */
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

#include "kernels/cuda/mamba_ops.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_op_test.h"
#include "tests/gpu/xproj_ref.h"

static cudaStream_t g_stream;
static const mbd_dtype k_dt[] = {MBD_DTYPE_BF16, MBD_DTYPE_F16};

/* n 16-bit values of dt: u * 2^e, u uniform in [-1, 1), e in -8..8, one in
 * sixteen exactly zero. */
static uint16_t *fill16(mbd_dtype dt, size_t n, uint64_t *seed) {
  uint16_t *h = malloc(n * 2 + 16);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) {
    const uint64_t r = gpu_test_rng(seed);
    float v = (r & 15) == 0 ? 0.0f : ldexpf(gpu_test_uniform(seed), (int)((r >> 4) % 17) - 8);
    h[i] = dt == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(v) : mbd_f32_to_f16(v);
  }
  return h;
}

static void same_bits(const char *what, const float *got, const float *want, int M, int NO) {
  if (!memcmp(got, want, (size_t)M * NO * 4)) return;
  for (int i = 0; i < M * NO; i++)
    if (memcmp(got + i, want + i, 4)) {
      uint32_t g, w;
      memcpy(&g, got + i, 4);
      memcpy(&w, want + i, 4);
      fail_msg("%s: out[%d][%d] = 0x%08x (%.9g), reference 0x%08x (%.9g)", what, i / NO, i % NO,
               g, (double)got[i], w, (double)want[i]);
    }
}

/* mbd_mops_xproj at M rows against the reference; xoff: x starts that many
 * elements into its buffer. */
static void xproj_case(mbd_dtype dt, int M, int K, int NO, int xoff, uint64_t *seed) {
  uint16_t *x = fill16(dt, (size_t)M * K + xoff, seed), *w = fill16(dt, (size_t)NO * K, seed);
  uint16_t *dx = dput(x, ((size_t)M * K + xoff) * 2), *dw = dput(w, (size_t)NO * K * 2);
  float *dout = NULL, *dref = NULL;
  CK(cudaMalloc((void **)&dout, (size_t)M * NO * 4));
  CK(cudaMalloc((void **)&dref, (size_t)M * NO * 4));
  CK(cudaMemset(dout, 0xff, (size_t)M * NO * 4));
  OP(mbd_mops_xproj(g_stream, M, K, NO, dt, dx + xoff, dw, dout, &err));
  assert_int_equal(xproj_ref(dt == MBD_DTYPE_BF16, M, K, NO, dx + xoff, K, dw, dref), 0);
  float *got = malloc((size_t)M * NO * 4), *want = malloc((size_t)M * NO * 4);
  CK(cudaMemcpy(got, dout, (size_t)M * NO * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want, dref, (size_t)M * NO * 4, cudaMemcpyDeviceToHost));
  char what[96];
  const char *env = getenv("MBD_XPROJ_TILE");
  snprintf(what, sizeof what, "x_proj %s M=%d K=%d N=%d x+%d MBD_XPROJ_TILE=%s",
           mbd_dtype_name(dt), M, K, NO, xoff, env ? env : "(unset)");
  same_bits(what, got, want, M, NO);
  CK(cudaFree(dx));
  CK(cudaFree(dw));
  CK(cudaFree(dout));
  CK(cudaFree(dref));
  free(x);
  free(w);
  free(got);
  free(want);
}

static const struct {
  int NO, K;
} k_shapes[] = {{80, 1536}, {160, 4096}, {192, 5120}, {160, 1000}, {80, 777}};

static void test_xproj_few_rows(void **state) {
  (void)state;
  uint64_t seed = 41;
  for (size_t d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
      for (int M = 1; M <= 31; M++) xproj_case(k_dt[d], M, k_shapes[s].K, k_shapes[s].NO, 0, &seed);
}

/* M = 32..2048 with MBD_XPROJ_TILE = env (NULL: the default choice). */
static void many_rows(const char *env, uint64_t seed) {
  const int Ms[] = {32, 33, 64, 256, 300, 1024, 2048};
  if (env) setenv("MBD_XPROJ_TILE", env, 1);
  for (size_t d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
      for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
        xproj_case(k_dt[d], Ms[m], k_shapes[s].K, k_shapes[s].NO, 0, &seed);
  unsetenv("MBD_XPROJ_TILE");
}

/* The default choice; MBD_XPROJ_TILE=1: the tiles at every M >= 32 (every
 * tile shape). */
static void test_xproj_many_rows(void **state) {
  (void)state;
  many_rows(NULL, 42);
}
static void test_xproj_tiles(void **state) {
  (void)state;
  many_rows("1", 46);
}

/* MBD_XPROJ_TILE=4: k_xproj_rows at every M: narrow blocks (16 rows, one
 * to ten output warps: M = 1, 7, 64, 256, 301), 32-row wide blocks (600),
 * 64-row wide blocks (2048, 2049: a partial tile), at each shape's FA and
 * two to four stages; unaligned x (element loads); and the default choice
 * at 4100 rows (several waves). */
static void test_xproj_rows(void **state) {
  (void)state;
  uint64_t seed = 49;
  const int Ms[] = {1, 7, 64, 256, 301, 600, 2048, 2049};
  setenv("MBD_XPROJ_TILE", "4", 1);
  for (size_t d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
      for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
        xproj_case(k_dt[d], Ms[m], k_shapes[s].K, k_shapes[s].NO, 0, &seed);
  for (size_t d = 0; d < 2; d++) {
    xproj_case(k_dt[d], 7, 4096, 160, 1, &seed);
    xproj_case(k_dt[d], 600, 1536, 80, 1, &seed);
  }
  unsetenv("MBD_XPROJ_TILE");
  xproj_case(MBD_DTYPE_BF16, 4100, 1536, 80, 0, &seed);
}

/* MBD_XPROJ_TILE=0: k_xproj at many rows as well; the same bits. */
static void test_xproj_no_tiles(void **state) {
  (void)state;
  uint64_t seed = 45;
  const int Ms[] = {32, 33, 256};
  setenv("MBD_XPROJ_TILE", "0", 1);
  for (size_t d = 0; d < 2; d++)
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
      xproj_case(k_dt[d], Ms[m], 4096, 160, 0, &seed);
  unsetenv("MBD_XPROJ_TILE");
}

/* x one element past 4-byte alignment: element loads, the same bits. */
static void test_xproj_unaligned(void **state) {
  (void)state;
  uint64_t seed = 43;
  const int Ms[] = {1, 5, 31, 32, 300};
  for (size_t d = 0; d < 2; d++)
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
      xproj_case(k_dt[d], Ms[m], 1536, 80, 1, &seed);
}

/* mbd_mops_conv_xproj against mbd_mops_conv_silu (xc_act) then the
 * reference: nseq rows in slots nseq - 1 - s of nseq + 1. */
static void conv_case(mbd_dtype dt, int nseq, int di, int NO, uint64_t *seed) {
  const int KC = 4, nslot = nseq + 1;
  const int64_t ldxz = 2 * (int64_t)di + 3, cstride = (int64_t)(KC - 1) * di + 5;
  float *xz = malloc((size_t)nseq * ldxz * 4), *cw = malloc((size_t)KC * di * 4);
  float *cb = malloc((size_t)di * 4), *cst = malloc((size_t)nslot * cstride * 4);
  for (size_t i = 0; i < (size_t)nseq * ldxz; i++) xz[i] = 2.0f * gpu_test_uniform(seed);
  for (size_t i = 0; i < (size_t)KC * di; i++) cw[i] = 0.6f * gpu_test_uniform(seed);
  for (int i = 0; i < di; i++) cb[i] = 0.3f * gpu_test_uniform(seed);
  for (size_t i = 0; i < (size_t)nslot * cstride; i++) cst[i] = gpu_test_uniform(seed);
  int32_t *slots = malloc((size_t)nseq * 4);
  for (int s = 0; s < nseq; s++) slots[s] = nseq - 1 - s;
  uint16_t *w = fill16(dt, (size_t)NO * di, seed);
  float *dxz = dput(xz, (size_t)nseq * ldxz * 4), *dcw = dput(cw, (size_t)KC * di * 4);
  float *dcb = dput(cb, (size_t)di * 4), *dcst = dput(cst, (size_t)nslot * cstride * 4);
  int32_t *dsl = dput(slots, (size_t)nseq * 4);
  uint16_t *dw = dput(w, (size_t)NO * di * 2);
  float *dout = NULL, *dref = NULL, *dxc = NULL;
  uint16_t *dxa = NULL;
  CK(cudaMalloc((void **)&dout, (size_t)nseq * NO * 4));
  CK(cudaMalloc((void **)&dref, (size_t)nseq * NO * 4));
  CK(cudaMalloc((void **)&dxc, (size_t)nseq * di * 4));
  CK(cudaMalloc((void **)&dxa, (size_t)nseq * di * 2));
  mbd_mops_conv conv = {.K = KC, .w = dcw, .bias = dcb, .state = dcst, .slot_stride = cstride};
  /* the fusion first: it reads the state, conv_silu then shifts it */
  OP(mbd_mops_conv_xproj(g_stream, nseq, di, &conv, dxz, ldxz, dsl, NO, dt, dw, dout, &err));
  OP(mbd_mops_conv_silu(g_stream, nseq, 1, di, KC, dxz, ldxz, dcw, dcb, dcst, cstride, dsl, dxc, dt,
                        dxa, &err));
  assert_int_equal(xproj_ref(dt == MBD_DTYPE_BF16, nseq, di, NO, dxa, di, dw, dref), 0);
  float *got = malloc((size_t)nseq * NO * 4), *want = malloc((size_t)nseq * NO * 4);
  CK(cudaMemcpy(got, dout, (size_t)nseq * NO * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want, dref, (size_t)nseq * NO * 4, cudaMemcpyDeviceToHost));
  char what[96];
  snprintf(what, sizeof what, "conv + x_proj %s nseq=%d di=%d N=%d", mbd_dtype_name(dt), nseq,
           di, NO);
  same_bits(what, got, want, nseq, NO);
  void *bufs[] = {dxz, dcw, dcb, dcst, dsl, dw, dout, dref, dxc, dxa};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
  free(xz);
  free(cw);
  free(cb);
  free(cst);
  free(slots);
  free(w);
  free(got);
  free(want);
}

static void test_conv_xproj(void **state) {
  (void)state;
  uint64_t seed = 44;
  const int rows[] = {1, 2, 3, 4, 5, 8, 17, 64};
  const struct {
    int NO, di;
  } sh[] = {{80, 1536}, {160, 4096}, {192, 5120}, {80, 1000}, {37, 130}};
  for (size_t d = 0; d < 2; d++)
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
      for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        conv_case(k_dt[d], rows[r], sh[s].di, sh[s].NO, &seed);
}

int main(void) {
  gpu_test_require_device();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_xproj_few_rows),
      cmocka_unit_test(test_xproj_many_rows),
      cmocka_unit_test(test_xproj_tiles),
      cmocka_unit_test(test_xproj_rows),
      cmocka_unit_test(test_xproj_no_tiles),
      cmocka_unit_test(test_xproj_unaligned),
      cmocka_unit_test(test_conv_xproj),
  };
  if (cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  const int rc = cmocka_run_group_tests(tests, NULL, NULL);
  cudaStreamDestroy(g_stream);
  return rc;
}
