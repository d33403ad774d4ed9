/* kernels/portable_math.h: accuracy against the double-precision libm over
 * dense sweeps of the ranges the Mamba-1 ops use, exact special cases, fixed
 * output bits (a compiler or flag change that alters any rounding fails
 * here, and the GPU test then proves the device makes the same bits), and
 * that the CPU ops (kernels/cpu/mamba_ops.c) compute with exactly these
 * functions on both ISA paths.
 *
 * The sweeps step through the bit patterns with a stride (a few million
 * points per function); MBD_PM_EXHAUSTIVE=1 in the environment checks every
 * float of each domain instead (about a minute in Release) and prints the
 * worst input: that is how the numbers in the header were measured. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/portable_math.h"

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* |got - ref| in ulps of the f32 result ref rounds to (denormal ulp 2^-149
 * below 2^-126). Infinities and NaN must match exactly (else +inf). */
static double ulp_err(float got, double ref) {
  if (isnan(ref)) return isnan(got) ? 0.0 : INFINITY;
  float rf = (float)ref;
  if (isinf(rf) || isinf(got)) return got == rf ? 0.0 : INFINITY;
  int e;
  frexp(fabs(ref), &e); /* |ref| in [2^(e-1), 2^e) */
  int ue = e - 24 < -149 ? -149 : e - 24;
  return fabs((double)got - ref) / ldexp(1.0, ue);
}

typedef float (*f32_fn)(float);
typedef double (*f64_fn)(double);

typedef struct sweep_result {
  double max_ulp;
  float worst_x;
  uint64_t n;
} sweep_result;

static int exhaustive(void) {
  const char *e = getenv("MBD_PM_EXHAUSTIVE");
  return e && e[0] == '1';
}

/* Every stride-th float of [lo, hi] (lo <= 0 <= hi or both on one side),
 * plus both ends. */
static void sweep_range(f32_fn f, f64_fn ref, float lo, float hi, uint32_t stride,
                        sweep_result *r) {
  /* walk the magnitudes of the non-negative part and the negative part */
  for (int side = 0; side < 2; side++) {
    float a = side ? (hi < 0 ? -hi : 0.0f) : (lo > 0 ? lo : 0.0f);
    float b = side ? (lo < 0 ? -lo : -1.0f) : (hi >= 0 ? hi : -1.0f);
    if (b < 0) continue;
    uint32_t sign = side ? 0x80000000u : 0u;
    uint32_t ua = bits_of(a), ub = bits_of(b);
    for (uint64_t u = ua; u <= ub; u += (u + stride > ub && u != ub) ? ub - u : stride) {
      float x = float_of((uint32_t)u | sign);
      double e = ulp_err(f(x), ref((double)x));
      r->n++;
      if (e > r->max_ulp || (isnan(e) && !isnan(r->max_ulp))) {
        r->max_ulp = e;
        r->worst_x = x;
      }
      if (u == ub) break;
    }
  }
}

static sweep_result sweep(const char *name, f32_fn f, f64_fn ref, float lo, float hi) {
  sweep_result r = {0, 0, 0};
  sweep_range(f, ref, lo, hi, exhaustive() ? 1u : 997u, &r);
  printf("%-14s [%g, %g]: %llu points, max %.3f ulp at %a\n", name, (double)lo, (double)hi,
         (unsigned long long)r.n, r.max_ulp, (double)r.worst_x);
  return r;
}

static double ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static float pm_expf(float x) { return mbd_pm_expf(x); }
static float pm_log1pf(float x) { return mbd_pm_log1pf(x); }
static float pm_softplus(float x) { return mbd_pm_softplus(x); }
static float pm_silu(float x) { return mbd_pm_silu(x); }

/* ---------------------------------------------------------------- accuracy */

static void test_expf_accuracy(void **state) {
  (void)state;
  /* the model: exp(dt * A) <= 1, exp(-x) in SiLU, exp(x) in softplus (x <= 20) */
  assert_true(sweep("expf", pm_expf, exp, -100.0f, 20.0f).max_ulp <= 1.0);
  /* the whole finite range, denormal results and overflow included */
  assert_true(sweep("expf", pm_expf, exp, -120.0f, 100.0f).max_ulp <= 1.0);
  assert_true(sweep("expf", pm_expf, exp, -1.0f, 1.0f).max_ulp <= 1.0);
}

static void test_log1pf_accuracy(void **state) {
  (void)state;
  /* softplus feeds it e^x for x <= 20: (0, 4.9e8] */
  assert_true(sweep("log1pf", pm_log1pf, log1p, 0.0f, 4.9e8f).max_ulp <= 1.0);
  assert_true(sweep("log1pf", pm_log1pf, log1p, -0x1.fffffep-1f, 3.4e38f).max_ulp <= 1.0);
}

static void test_softplus_silu_accuracy(void **state) {
  (void)state;
  assert_true(sweep("softplus", pm_softplus, ref_softplus, -100.0f, 20.0f).max_ulp <= 2.0);
  assert_true(sweep("softplus", pm_softplus, ref_softplus, 0x1.400002p+4f, 1e30f).max_ulp == 0.0);
  /* below -88.7 e^-x overflows f32 and the formula gives -0 (as torch's f32
   * SiLU; checked in test_special_cases) */
  assert_true(sweep("silu", pm_silu, ref_silu, -88.0f, 100.0f).max_ulp <= 2.0);
}

/* ---------------------------------------------------------------- special cases */

static void assert_bits(float got, uint32_t want) {
  if (bits_of(got) != want) fail_msg("got %a (0x%08x), want 0x%08x", (double)got, bits_of(got), want);
}

static void test_special_cases(void **state) {
  (void)state;
  const float inf = float_of(0x7f800000u), nan_in = float_of(0x7fc01234u);
  /* expf */
  assert_bits(mbd_pm_expf(0.0f), 0x3f800000u);
  assert_bits(mbd_pm_expf(-0.0f), 0x3f800000u);
  assert_bits(mbd_pm_expf(-inf), 0x00000000u);
  assert_bits(mbd_pm_expf(inf), 0x7f800000u);
  assert_bits(mbd_pm_expf(nan_in), 0x7fc01234u); /* NaN passed through unchanged */
  assert_bits(mbd_pm_expf(-1000.0f), 0x00000000u);
  assert_bits(mbd_pm_expf(-104.0f), 0x00000000u); /* e^-104 < 2^-150 */
  assert_bits(mbd_pm_expf(1000.0f), 0x7f800000u);
  assert_bits(mbd_pm_expf(0x1.62e42ep6f), (uint32_t)bits_of((float)exp(0x1.62e42ep6)));
  assert_bits(mbd_pm_expf(0x1.62e430p6f), 0x7f800000u); /* first overflowing float */
  assert_true(mbd_pm_expf(0x1.62e42ep6f) < inf);
  /* denormal results: exactly the correctly rounded values at these points */
  const float den[] = {-87.5f, -90.0f, -95.25f, -100.0f, -103.0f, -103.9f};
  for (size_t i = 0; i < sizeof den / sizeof den[0]; i++) {
    float want = (float)exp((double)den[i]);
    assert_true(want < 0x1p-126f);
    assert_true(ulp_err(mbd_pm_expf(den[i]), exp((double)den[i])) <= 1.0);
  }
  assert_true(mbd_pm_expf(-103.9f) > 0.0f);
  /* tiny arguments */
  assert_bits(mbd_pm_expf(0x1p-30f), 0x3f800000u);
  assert_bits(mbd_pm_expf(-0x1p-30f), 0x3f800000u);
  assert_bits(mbd_pm_expf(0x1p-149f), 0x3f800000u);
  /* log1pf */
  assert_bits(mbd_pm_log1pf(0.0f), 0x00000000u);
  assert_bits(mbd_pm_log1pf(-0.0f), 0x80000000u);
  assert_bits(mbd_pm_log1pf(0x1p-149f), 0x00000001u);
  assert_bits(mbd_pm_log1pf(0x1p-30f), bits_of(0x1p-30f));
  assert_bits(mbd_pm_log1pf(-1.0f), 0xff800000u);
  assert_true(isnan(mbd_pm_log1pf(-2.0f)));
  assert_true(isnan(mbd_pm_log1pf(-inf)));
  assert_bits(mbd_pm_log1pf(inf), 0x7f800000u);
  assert_bits(mbd_pm_log1pf(nan_in), 0x7fc01234u);
  assert_bits(mbd_pm_log1pf(1.0f), bits_of((float)log(2.0)));
  /* softplus: the threshold and its tails */
  assert_bits(mbd_pm_softplus(20.5f), bits_of(20.5f));
  assert_bits(mbd_pm_softplus(inf), 0x7f800000u);
  assert_bits(mbd_pm_softplus(-inf), 0x00000000u);
  assert_true(mbd_pm_softplus(-100.0f) > 0.0f); /* e^-100 is a denormal, log1p keeps it */
  /* silu: large negative -> -0, large positive -> x */
  assert_bits(mbd_pm_silu(-200.0f), 0x80000000u);
  assert_bits(mbd_pm_silu(200.0f), bits_of(200.0f));
  assert_bits(mbd_pm_silu(0.0f), 0x00000000u);
}

/* ---------------------------------------------------------------- fixed bits */

/* The results on this host for these inputs; the GPU (tests/gpu/
 * test_mamba1_gpu.c, through whole models) must produce the same. A change
 * here means every route's bits changed: regenerate deliberately (print the
 * table with MBD_PM_PRINT=1) and say so in the commit. */
typedef struct fixed_case {
  uint32_t x, expf, log1pf, softplus, silu;
} fixed_case;

static const fixed_case fixed[] = {
    {0xc2c80000u, 0x0000001bu, 0x4093af11u, 0x0000001bu, 0x80000000u}, /* -0x1.9p+6 */
    {0xc2af0000u, 0x006cb2bcu, 0x408f74c2u, 0x006cb2bcu, 0x83949c5du}, /* -0x1.5ep+6 */
    {0xc2490000u, 0x1b35981cu, 0x407bf326u, 0x1b35981cu, 0x9e0e946fu}, /* -0x1.92p+5 */
    {0xc1a00000u, 0x310da433u, 0x4042d975u, 0x310da433u, 0xb3310d40u}, /* -0x1.4p+4 */
    {0xc0b00000u, 0x3b85ea53u, 0x3fef9737u, 0x3b85a476u, 0xbcb76256u}, /* -0x1.6p+2 */
    {0xbf800000u, 0x3ebc5ab2u, 0x3f317218u, 0x3ea063d6u, 0xbe89b2b1u}, /* -0x1p+0 */
    {0xbeb1719fu, 0x3f35051eu, 0xbed9ddbdu, 0x3f08e8c0u, 0xbe12ffe6u}, /* -0x1.62e33ep-2 */
    {0xbe99999au, 0x3f3da643u, 0xbeb69e1au, 0x3f0dea3au, 0xbe02bb34u}, /* -0x1.333334p-2 */
    {0xba83126fu, 0x3f7fbe7fu, 0xba832339u, 0x3f315155u, 0xba0301a8u}, /* -0x1.0624dep-10 */
    {0xb5c00000u, 0x3f7fffe8u, 0xb5c00009u, 0x3f31720cu, 0xb53ffff7u}, /* -0x1.8p-20 */
    {0x00000000u, 0x3f800000u, 0x00000000u, 0x3f317218u, 0x00000000u}, /* 0x0p+0 */
    {0x33800000u, 0x3f800000u, 0x33800000u, 0x3f317218u, 0x33000000u}, /* 0x1p-24 */
    {0x3dcccccdu, 0x3f8d763eu, 0x3dc331fcu, 0x3f3e90c8u, 0x3d57080fu}, /* 0x1.99999ap-4 */
    {0x3f000000u, 0x3fd3094cu, 0x3ecf991fu, 0x3f795d1cu, 0x3e9f597fu}, /* 0x1p-1 */
    {0x3f317218u, 0x40000000u, 0x3f06ce8au, 0x3f8c9f54u, 0x3eec9820u}, /* 0x1.62e43p-1 */
    {0x3f800000u, 0x402df854u, 0x3f317218u, 0x3fa818f5u, 0x3f3b26a8u}, /* 0x1p+0 */
    {0x40200000u, 0x4142eb7fu, 0x3fa05a8au, 0x40250c88u, 0x4013dcd9u}, /* 0x1.4p+1 */
    {0x40e00000u, 0x44891443u, 0x40051592u, 0x40e00778u, 0x40dfcbc2u}, /* 0x1.cp+2 */
    {0x4155eb85u, 0x491c5f12u, 0x402a91b3u, 0x4155eb87u, 0x4155eb6fu}, /* 0x1.abd70ap+3 */
    {0x419f3333u, 0x4dd15450u, 0x40428b40u, 0x419f3333u, 0x419f3333u}, /* 0x1.3e6666p+4 */
    {0x41a00000u, 0x4de75844u, 0x4042d975u, 0x41a00000u, 0x41a00000u}, /* 0x1.4p+4 */
    {0x41c80000u, 0x51861e9du, 0x405084a7u, 0x41c80000u, 0x41c80000u}, /* 0x1.9p+4 */
    {0x42b16666u, 0x7f7a37fcu, 0x408fe317u, 0x42b16666u, 0x42b16666u}, /* 0x1.62ccccp+6 */
    {0xbc4985f0u, 0x3f7cded8u, 0xbc4ac5d7u, 0x3f2fe049u, 0xbbc848abu}, /* -0x1.930bep-7 */
    {0xc06ccccdu, 0x3cca88feu, 0x3fc61687u, 0x3cc8126bu, 0xbdb6d32du}, /* -0x1.d9999ap+1 */
    {0xbf400000u, 0x3ef1da07u, 0xbfb17218u, 0x3ec613f5u, 0xbe766408u}, /* -0x1.8p-1 */
};

static void test_fixed_bits(void **state) {
  (void)state;
  const char *pr = getenv("MBD_PM_PRINT");
  if (pr && pr[0] == '1') {
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
      float x = float_of(fixed[i].x);
      float l = x > -1.0f ? x : -x;
      printf("    {0x%08xu, 0x%08xu, 0x%08xu, 0x%08xu, 0x%08xu}, /* %a */\n", fixed[i].x,
             bits_of(mbd_pm_expf(x)), bits_of(mbd_pm_log1pf(l)), bits_of(mbd_pm_softplus(x)),
             bits_of(mbd_pm_silu(x)), (double)x);
    }
  }
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    float x = float_of(fixed[i].x);
    float l = x > -1.0f ? x : -x; /* log1pf takes |x| where x <= -1 */
    assert_bits(mbd_pm_expf(x), fixed[i].expf);
    assert_bits(mbd_pm_log1pf(l), fixed[i].log1pf);
    assert_bits(mbd_pm_softplus(x), fixed[i].softplus);
    assert_bits(mbd_pm_silu(x), fixed[i].silu);
  }
}

/* ---------------------------------------------------------------- CPU ops */

static uint64_t rng(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}
static float urand(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(rng(s) >> 29) / 16777216.0);
}

/* mbd_cpu_silu / mbd_cpu_softplus are these functions, bit for bit. */
static void test_cpu_activations(void **state) {
  (void)state;
  for (uint32_t u = 0; u < 0xffffffffu - 4093u; u += 4093u) {
    float x = float_of(u);
    assert_int_equal(bits_of(mbd_cpu_silu(x)), bits_of(mbd_pm_silu(x)));
    assert_int_equal(bits_of(mbd_cpu_softplus(x)), bits_of(mbd_pm_softplus(x)));
  }
}

/* mbd_cpu_scan_step and mbd_cpu_conv_step against their documented formulas
 * written here with the portable functions, on every ISA path the machine
 * runs: memcmp. */
static void test_cpu_ops_formula(void **state) {
  (void)state;
  enum { DI = 37, DS = 16, DC = 4, STEPS = 5 };
  uint64_t s = 7;
  float A[DI * DS], D[DI], dt_raw[DI], B[DS], C[DS], x[DI], z[DI];
  float w[DC * DI], bias[DI], xin[DI];
  for (int i = 0; i < DI * DS; i++) A[i] = -urand(&s, 0.5f, 16.0f);
  for (int i = 0; i < DI; i++) {
    D[i] = urand(&s, -1, 1);
    bias[i] = urand(&s, -0.5f, 0.5f);
  }
  for (int i = 0; i < DC * DI; i++) w[i] = urand(&s, -1, 1);
  mbd_cpu_isa isas[2] = {MBD_CPU_ISA_PORTABLE, MBD_CPU_ISA_AVX2};
  int nisa = mbd_cpu_isa_detect() == MBD_CPU_ISA_AVX2 ? 2 : 1;
  for (int ii = 0; ii < nisa; ii++) {
    float h[DI * DS], href[DI * DS], out[DI], ref[DI];
    float cst[(DC - 1) * DI], cref[(DC - 1) * DI], cout[DI], coref[DI];
    memset(h, 0, sizeof h);
    memset(href, 0, sizeof href);
    memset(cst, 0, sizeof cst);
    memset(cref, 0, sizeof cref);
    uint64_t s2 = 99;
    for (int t = 0; t < STEPS; t++) {
      for (int i = 0; i < DI; i++) {
        dt_raw[i] = urand(&s2, -8.0f, 24.0f); /* both sides of the softplus threshold */
        x[i] = urand(&s2, -3, 3);
        z[i] = urand(&s2, -12, 12);
        xin[i] = urand(&s2, -3, 3);
      }
      for (int n = 0; n < DS; n++) {
        B[n] = urand(&s2, -2, 2);
        C[n] = urand(&s2, -2, 2);
      }
      mbd_cpu_scan_step(isas[ii], 0, DI, DS, A, D, dt_raw, B, C, x, z, h, out);
      for (int c = 0; c < DI; c++) {
        float dt = mbd_pm_softplus(dt_raw[c]), y = 0.0f;
        for (int n = 0; n < DS; n++) {
          float dA = mbd_pm_expf(dt * A[c * DS + n]);
          float dbx = (dt * B[n]) * x[c];
          href[c * DS + n] = fmaf(dA, href[c * DS + n], dbx);
          y = fmaf(href[c * DS + n], C[n], y);
        }
        y = fmaf(D[c], x[c], y);
        ref[c] = y * mbd_pm_silu(z[c]);
      }
      assert_memory_equal(out, ref, sizeof out);
      assert_memory_equal(h, href, sizeof h);

      mbd_cpu_conv_step(isas[ii], 0, DI, DI, DC, w, bias, cst, xin, cout);
      for (int c = 0; c < DI; c++) {
        float acc = 0.0f;
        for (int j = 0; j < DC - 1; j++) acc = fmaf(w[j * DI + c], cref[j * DI + c], acc);
        acc = fmaf(w[(DC - 1) * DI + c], xin[c], acc);
        acc = acc + bias[c];
        for (int j = 0; j + 1 < DC - 1; j++) cref[j * DI + c] = cref[(j + 1) * DI + c];
        cref[(DC - 2) * DI + c] = xin[c];
        coref[c] = mbd_pm_silu(acc);
      }
      assert_memory_equal(cout, coref, sizeof cout);
      assert_memory_equal(cst, cref, sizeof cst);
    }
    printf("CPU ops (%s): scan and conv steps equal the portable formulas\n",
           mbd_cpu_isa_name(isas[ii]));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_special_cases),  cmocka_unit_test(test_fixed_bits),
      cmocka_unit_test(test_expf_accuracy),  cmocka_unit_test(test_log1pf_accuracy),
      cmocka_unit_test(test_softplus_silu_accuracy), cmocka_unit_test(test_cpu_activations),
      cmocka_unit_test(test_cpu_ops_formula),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
