/* Tensor descriptors (names, parsing, overflow-checked sizes, formatting) and
 * the bf16/f16 conversions in half.h: round-to-nearest-even at every tie,
 * overflow to inf, subnormals, NaN, and the exhaustive f16 -> f32 -> f16 round
 * trip. f16 results are checked against the compiler's _Float16 (an
 * independent IEEE implementation) where available; bf16 against a
 * distance-based reference in double. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/half.h"
#include "common/tensor.h"

/* ---- descriptors ---- */

static void test_dtype_names(void **state) {
  (void)state;
  static const struct {
    mbd_dtype dt;
    size_t size;
    const char *name, *st;
  } k[] = {{MBD_DTYPE_F32, 4, "f32", "F32"},
           {MBD_DTYPE_BF16, 2, "bf16", "BF16"},
           {MBD_DTYPE_F16, 2, "f16", "F16"},
           {MBD_DTYPE_I64, 8, "i64", "I64"}};
  for (size_t i = 0; i < 4; i++) {
    mbd_dtype got;
    mbd_error err = {0};
    assert_int_equal(mbd_dtype_size(k[i].dt), k[i].size);
    assert_string_equal(mbd_dtype_name(k[i].dt), k[i].name);
    assert_string_equal(mbd_dtype_st_name(k[i].dt), k[i].st);
    got = (mbd_dtype)-1;
    assert_int_equal(mbd_dtype_parse(k[i].name, &got, &err), MBD_OK);
    assert_int_equal(got, k[i].dt);
    got = (mbd_dtype)-1;
    assert_int_equal(mbd_dtype_parse(k[i].st, &got, &err), MBD_OK);
    assert_int_equal(got, k[i].dt);
  }
  mbd_dtype got = MBD_DTYPE_F32;
  mbd_error err = {0};
  assert_int_equal(mbd_dtype_parse("f64", &got, &err), MBD_E_INVALID);
  assert_int_equal(err.code, MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "'f64'"));
  assert_non_null(strstr(err.msg, "f32, bf16, f16, i64"));
  assert_int_equal(mbd_dtype_parse("", &got, &err), MBD_E_INVALID);
  assert_int_equal(mbd_dtype_parse(NULL, &got, &err), MBD_E_INVALID);
  assert_int_equal(mbd_dtype_parse("f32 ", &got, &err), MBD_E_INVALID);
  assert_int_equal(mbd_dtype_size((mbd_dtype)99), 0);
  assert_string_equal(mbd_dtype_name((mbd_dtype)99), "?");
}

static void test_desc_sizes(void **state) {
  (void)state;
  mbd_tensor_desc d;
  mbd_error err = {0};
  size_t n;
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_BF16, 3, (int64_t[]){2, 33, 2048}, &err), 0);
  assert_int_equal(mbd_tensor_desc_numel(&d, &n, &err), 0);
  assert_int_equal(n, 2 * 33 * 2048);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), 0);
  assert_int_equal(n, 2 * 33 * 2048 * 2);
  for (int i = 3; i < MBD_MAX_DIMS; i++) assert_int_equal(d.shape[i], 0);
  /* Scalars have one element; a zero dim gives zero. */
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 0, NULL, &err), 0);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), 0);
  assert_int_equal(n, 8);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){0, INT64_MAX}, &err), 0);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), 0);
  assert_int_equal(n, 0);
  /* Errors. */
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, MBD_MAX_DIMS + 1,
                                        (int64_t[MBD_MAX_DIMS + 1]){0}, &err),
                   MBD_E_SHAPE);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, -1, NULL, &err), MBD_E_SHAPE);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){3, -1}, &err),
                   MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "dim 1"));
  /* Element-count overflow, and byte-size overflow with a representable count. */
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){1LL << 32, 1LL << 32}, &err),
                   0);
  assert_int_equal(mbd_tensor_desc_numel(&d, &n, &err), MBD_E_TOO_LARGE);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), MBD_E_TOO_LARGE);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 1, (int64_t[]){1LL << 61}, &err), 0);
  assert_int_equal(mbd_tensor_desc_numel(&d, &n, &err), 0);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), MBD_E_TOO_LARGE);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 1, (int64_t[]){(1LL << 60) - 1}, &err), 0);
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), 0);
  assert_int_equal(n, ((1ULL << 60) - 1) * 8);
  /* Hand-made invalid descriptors are refused, not trusted. */
  d.ndim = MBD_MAX_DIMS + 3;
  assert_int_equal(mbd_tensor_desc_numel(&d, &n, &err), MBD_E_SHAPE);
  d.ndim = 1;
  d.shape[0] = -5;
  assert_int_equal(mbd_tensor_desc_numel(&d, &n, &err), MBD_E_SHAPE);
  d.shape[0] = 5;
  d.dtype = (mbd_dtype)7;
  assert_int_equal(mbd_tensor_desc_nbytes(&d, &n, &err), MBD_E_INVALID);
}

static void test_desc_format(void **state) {
  (void)state;
  mbd_tensor_desc d;
  char buf[128];
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_BF16, 3, (int64_t[]){2, 33, 2048}, NULL), 0);
  mbd_tensor_desc_format(&d, buf, sizeof buf);
  assert_string_equal(buf, "bf16[2,33,2048]");
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 0, NULL, NULL), 0);
  mbd_tensor_desc_format(&d, buf, sizeof buf);
  assert_string_equal(buf, "f32[]");
  int64_t big[MBD_MAX_DIMS];
  for (int i = 0; i < MBD_MAX_DIMS; i++) big[i] = INT64_MAX;
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_I64, MBD_MAX_DIMS, big, NULL), 0);
  char full[256];
  mbd_tensor_desc_format(&d, full, sizeof full);
  assert_int_equal(strlen(full), 4 + 8 * 19 + 7 + 1); /* "i64[" digits commas "]" */
  /* Every truncation is a NUL-terminated prefix; nothing written past cap. */
  for (size_t cap = 1; cap <= strlen(full) + 1; cap++) {
    char t[256];
    memset(t, 'Z', sizeof t);
    mbd_tensor_desc_format(&d, t, cap);
    assert_int_equal(strlen(t), cap - 1);
    assert_memory_equal(t, full, cap - 1);
    assert_int_equal(t[cap], 'Z');
  }
  char z = 'Z';
  mbd_tensor_desc_format(&d, &z, 0);
  assert_int_equal(z, 'Z');
}

/* ---- half.h ---- */

static uint32_t fbits(float f) { return mbd_f32_to_bits(f); }

/* Reference bf16 rounding: nearest of the two neighbouring bf16 values by
 * exact distance in double, ties to the even mantissa. */
static uint16_t ref_bf16(float f) {
  uint32_t u = fbits(f);
  uint16_t lo = (uint16_t)(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  uint16_t hi = (uint16_t)(lo + 1);
  double x = fabs((double)f);
  double a = fabs((double)mbd_bf16_to_f32(lo));
  double b = ((hi & 0x7fffu) == 0x7f80u) ? ldexp(1.0, 128) : fabs((double)mbd_bf16_to_f32(hi));
  double da = x - a, db = b - x;
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1u) ? hi : lo;
}

static void test_bf16(void **state) {
  (void)state;
  /* Exact values and named cases. */
  assert_int_equal(mbd_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(mbd_f32_to_bf16(-2.0f), 0xc000);
  assert_int_equal(mbd_f32_to_bf16(0.0f), 0x0000);
  assert_int_equal(mbd_f32_to_bf16(-0.0f), 0x8000);
  assert_int_equal(mbd_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(mbd_f32_to_bf16(-INFINITY), 0xff80);
  /* Ties: 1 + 2^-8 sits halfway between 1 (even) and 1 + 2^-7: goes down;
   * 1 + 3 * 2^-8 is halfway between odd and even: goes up. */
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x3f808000u)), 0x3f80);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x3f818000u)), 0x3f82);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x3f808001u)), 0x3f81);
  /* Largest finite f32 overflows to inf; max bf16 + less than half ulp stays. */
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x7f7fffffu)), 0x7f80);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x7f7f7fffu)), 0x7f7f);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x7f7f8000u)), 0x7f80); /* tie, odd -> up */
  /* Subnormals round like normals; the smallest f32 subnormal goes to 0. */
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x00000001u)), 0x0000);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x00008000u)), 0x0000); /* tie to even 0 */
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x00018000u)), 0x0002);
  assert_int_equal(mbd_f32_to_bf16(mbd_bits_to_f32(0x807fffffu)), 0x8080); /* up to min normal */
  /* NaN stays NaN (quiet, sign kept) whatever its payload; never becomes inf. */
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu,
                           0xffc00001u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = mbd_f32_to_bf16(mbd_bits_to_f32(nans[i]));
    assert_true((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0);
    assert_int_equal(h & 0x40u, 0x40u);
    assert_int_equal(h >> 15, nans[i] >> 31);
    assert_true(isnan(mbd_bf16_to_f32(h)));
  }
  /* bf16 -> f32 -> bf16 is the identity for every non-NaN value. */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mbd_bf16_to_f32((uint16_t)h);
    assert_int_equal(fbits(f), h << 16);
    if (!isnan(f)) assert_int_equal(mbd_f32_to_bf16(f), h);
  }
  /* Every tie and its neighbours, for every upper half, against the reference. */
  for (uint32_t hi = 0; hi < 65536; hi++) {
    const uint32_t lows[] = {0x7fff, 0x8000, 0x8001, 0x0001, 0xffff};
    for (size_t j = 0; j < 5; j++) {
      uint32_t u = hi << 16 | lows[j];
      float f = mbd_bits_to_f32(u);
      if (isnan(f)) continue;
      uint16_t got = mbd_f32_to_bf16(f), want = ref_bf16(f);
      if (got != want) fail_msg("bf16(0x%08x) = 0x%04x, want 0x%04x", u, got, want);
    }
  }
  /* A strided sweep over all 2^32 patterns. */
  for (uint64_t u = 0; u < (1ull << 32); u += 40499) {
    float f = mbd_bits_to_f32((uint32_t)u);
    if (isnan(f)) continue;
    uint16_t got = mbd_f32_to_bf16(f), want = ref_bf16(f);
    if (got != want) fail_msg("bf16(0x%08x) = 0x%04x, want 0x%04x", (uint32_t)u, got, want);
  }
}

/* f16 -> f32 by formula (independent of half.h's bit manipulation). */
static double f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * ldexp(m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * ldexp(1024 + m, e - 25);
}

static void test_f16_exhaustive_round_trip(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mbd_f16_to_f32((uint16_t)h);
    double want = f16_value((uint16_t)h);
    uint16_t back = mbd_f32_to_f16(f);
    if (isnan(want)) {
      assert_true(isnan(f));
      assert_int_equal(fbits(f) >> 31, h >> 15);
      assert_true((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu) != 0);
      assert_int_equal(back >> 15, h >> 15);
      continue;
    }
    if ((double)f != want) fail_msg("f16_to_f32(0x%04x) = %a, want %a", h, (double)f, want);
    if (h == 0x8000) assert_int_equal(fbits(f), 0x80000000u); /* -0 keeps its sign */
    if (back != h) fail_msg("f16 0x%04x -> %a -> 0x%04x", h, (double)f, back);
  }
}

static void test_f16_rounding(void **state) {
  (void)state;
  assert_int_equal(mbd_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(mbd_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(mbd_f32_to_f16(65519.99f), 0x7bff);
  assert_int_equal(mbd_f32_to_f16(65520.0f), 0x7c00); /* tie with odd max -> inf */
  assert_int_equal(mbd_f32_to_f16(-1e30f), 0xfc00);
  assert_int_equal(mbd_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(mbd_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);  /* min subnormal */
  assert_int_equal(mbd_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);  /* tie -> even 0 */
  assert_int_equal(mbd_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
  assert_int_equal(mbd_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);  /* 1.5 ulp tie -> even 2 */
  assert_int_equal(mbd_f32_to_f16(-ldexpf(1.0f, -26)), 0x8000); /* underflow keeps sign */
  assert_int_equal(mbd_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* rounds up into normal */
  assert_int_equal(mbd_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie, even */
  assert_int_equal(mbd_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02); /* tie, odd -> up */
  /* Every midpoint between adjacent f16 values (exact in f32), and one f32
   * ulp either side, against the independent formula. */
  for (uint32_t h = 0; h < 0x7c00; h++) {
    double a = f16_value((uint16_t)h), b = (h + 1 == 0x7c00) ? 65536.0 : f16_value((uint16_t)(h + 1));
    float mid = (float)((a + b) / 2);
    assert_true((double)mid == (a + b) / 2);
    uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
    assert_int_equal(mbd_f32_to_f16(mid), even);
    assert_int_equal(mbd_f32_to_f16(-mid), even | 0x8000);
    assert_int_equal(mbd_f32_to_f16(nextafterf(mid, 0.0f)), h);
    assert_int_equal(mbd_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
  }
#ifdef __FLT16_MAX__
  /* The compiler's IEEE binary16 conversion as an oracle over a strided sweep
   * of all float bit patterns. */
  for (uint64_t u = 0; u < (1ull << 32); u += 30011) {
    float f = mbd_bits_to_f32((uint32_t)u);
    if (isnan(f)) continue;
    _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, 2);
    uint16_t got = mbd_f32_to_f16(f);
    if (got != want) fail_msg("f16(0x%08x) = 0x%04x, want 0x%04x", (uint32_t)u, got, want);
  }
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_names),
      cmocka_unit_test(test_desc_sizes),
      cmocka_unit_test(test_desc_format),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_f16_exhaustive_round_trip),
      cmocka_unit_test(test_f16_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
