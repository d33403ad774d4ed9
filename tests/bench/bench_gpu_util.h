/* Helpers shared by the GPU model benchmarks (bench_mamba1_gpu.c,
 * bench_mamba2_gpu.c): medians, the device copy rate that their HBM floors
 * divide by, zeroed device buffers and the mean time of an op launched
 * several times in a row. Bench code: no error objects, failures print and
 * return nonzero. */
#ifndef MBD_BENCH_GPU_UTIL_H
#define MBD_BENCH_GPU_UTIL_H

#include <stddef.h>

#include "common/status.h"

/* Median of v[0..n-1] (n >= 1; the upper one of the middle two for even n);
 * sorts v in place. */
float mbd_bench_median(float *v, int n);

/* Device-to-device copy rate in bytes (read + written) per second: the median
 * of 10 copies of 1 GiB after 2 warm-up copies, on the default stream; 0 when
 * the buffers cannot be allocated. */
double mbd_bench_copy_rate(void);

/* cudaMalloc of n bytes into *(void **)p, zeroed; nonzero on failure (*p may
 * then hold an allocation the caller frees). */
int mbd_bench_dzalloc(void *p, size_t n);

/* One launch of an op; 0 or a status with err set. */
typedef int (*mbd_bench_op_fn)(void *arg, mbd_error *err);

/* Mean microseconds per launch of `reps` calls of op(arg) in a row on stream
 * (a cudaStream_t), timed with CUDA events around them after one warm-up
 * call, into *us; 0 or the first failing call's status. */
int mbd_bench_op_us(void *stream, int reps, mbd_bench_op_fn op, void *arg, float *us,
                    mbd_error *err);

#endif
