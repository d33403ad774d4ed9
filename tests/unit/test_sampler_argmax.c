/* mbd_sampler_argmax (lanes merged by value, then index) against the rule
 * written one element at a time: largest logit, lowest index on ties, NaN
 * never wins (index 0 when every logit is NaN), over random vectors of
 * special values (signed zeros, infinities, NaN, ties) of every length up
 * to a few lanes past a multiple of the lane count, and one vocabulary-sized
 * vector. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/model/sampler.h"

static int32_t reference(const float *x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
  return (int32_t)best;
}

static uint64_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static void test_special_values(void **state) {
  (void)state;
  const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 2.0f, 1.0f};
  float x[64];
  uint64_t s = 1;
  for (int it = 0; it < 200000; it++) {
    int64_t V = 1 + (int64_t)(next(&s) % 40);
    for (int64_t i = 0; i < V; i++) x[i] = vals[next(&s) % 9];
    assert_int_equal(mbd_sampler_argmax(x, V), reference(x, V));
  }
}

static void test_vocabulary(void **state) {
  (void)state;
  const int64_t V = 50277; /* not a multiple of the lanes */
  float *x = malloc((size_t)V * sizeof *x);
  assert_non_null(x);
  uint64_t s = 7;
  for (int rep = 0; rep < 20; rep++) {
    for (int64_t i = 0; i < V; i++) x[i] = (float)(next(&s) % 4000) / 16.0f - 100.0f;
    if (rep % 3 == 0) x[next(&s) % V] = NAN;
    if (rep % 4 == 1) x[V - 1] = 1e9f; /* the tail past the last full lane group */
    assert_int_equal(mbd_sampler_argmax(x, V), reference(x, V));
  }
  free(x);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_special_values),
                                     cmocka_unit_test(test_vocabulary)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
