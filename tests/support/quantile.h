/* Quantiles of measured samples (latencies, rates) for the tests that bound
 * them and the benches that print them: one definition of p50 and p99. */
#ifndef MBD_TEST_QUANTILE_H
#define MBD_TEST_QUANTILE_H

#include <stddef.h>

/* Sorts v[n] ascending and returns its q-quantile, q in [0, 1], by nearest
 * rank: v[round(q * (n - 1))]. n must be > 0. */
double quantile_of(double *v, size_t n, double q);

#endif
