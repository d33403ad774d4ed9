/* For the GPU tests: the device probe with the skip rule (exit 77 with a
 * printed reason when no device is present), seeded random data, dtype
 * rounding. */
#ifndef MBD_TEST_GPU_UTIL_H
#define MBD_TEST_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GPU tests use the context and the dtype conversions with these helpers. */
#include "common/half.h"
#include "common/tensor.h"
#include "kernels/cuda/gpu_ctx.h"

/* Exits 77 with a printed reason when no CUDA device can be used; any other
 * failure to create a context exits 1 with the message. */
void gpu_test_require_device(void);

/* splitmix64 step. */
uint64_t gpu_test_rng(uint64_t *s);

/* Uniform in [-1, 1), never all zeros. */
float gpu_test_uniform(uint64_t *s);

/* Fills n values of dtype dt into dst (host) and their exact f32 values into
 * f (may be NULL). */
void gpu_test_fill(mbd_dtype dt, size_t n, uint64_t *seed, void *dst, float *f);

/* cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero. */
float gpu_test_tf32(float v);

#endif
