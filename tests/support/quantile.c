/* Nearest-rank quantiles. See quantile.h. */
#include "support/quantile.h"

#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double quantile_of(double *v, size_t n, double q) {
  qsort(v, n, sizeof *v, cmp_double);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}
