/* For the GPU op tests (test_ops_matrix.c, test_ops_matrix_vec.c,
 * test_xproj_mma.c): the CUDA and op-entry checks that fail the running
 * cmocka test with the call and its message, device buffers, and the host
 * side of the activation dtypes (rounding, stores, seeded fills, bitwise
 * comparison). Each failure ends the test through cmocka's fail_msg. */
#ifndef MBD_TESTS_GPU_OP_TEST_H
#define MBD_TESTS_GPU_OP_TEST_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "common/tensor.h"

/* Fails the test with the call and the CUDA error when call does not succeed. */
#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

/* Runs an op entry whose last argument is &err, fails the test with its
 * message, then waits for the device (so a kernel's fault fails here). The
 * wait before the call matters as much: the tests' ops run on a
 * non-blocking stream, which does not wait for the legacy stream's
 * cudaMemset, nor for the DMA of a cudaMemcpy from pageable memory (it may
 * return before the bytes land), so without it an op can read inputs being
 * copied or have its output overwritten by the set that precedes it. */
#define OP(call)                                         \
  do {                                                   \
    mbd_error err = {0};                                 \
    CK(cudaDeviceSynchronize());                         \
    if ((call) != 0) fail_msg("%s: %s", #call, err.msg); \
    CK(cudaDeviceSynchronize());                         \
  } while (0)

/* A device copy of the n bytes at h (16 bytes allocated for n = 0); the
 * caller frees it (dfree). */
void *dput(const void *h, size_t n);
/* n zeroed device bytes (16 for n = 0); the caller frees them (dfree). */
void *dzero(size_t n);
/* The n device bytes at d into h. */
void dget(void *h, const void *d, size_t n);
/* Frees a device buffer; NULL is a no-op. */
void dfree(void *d);

/* Bytes of one element of dt (f32, bf16 or f16). */
size_t dsize(mbd_dtype dt);
/* v rounded to nearest even in dt and widened back (a store then a load). */
float round_to(mbd_dtype dt, float v);
/* buf[i] = v rounded to nearest even in dt. */
void store(mbd_dtype dt, void *buf, size_t i, float v);
/* buf[i] widened to f32. */
float load(mbd_dtype dt, const void *buf, size_t i);
/* n values uniform in [lo, hi) stored in dt (16 bytes of slack past them),
 * their exact f32 values in f (may be NULL); the caller frees the result. */
void *fill(mbd_dtype dt, size_t n, uint64_t *seed, float lo, float hi, float *f);
/* fill in f32. */
float *fillf(size_t n, uint64_t *seed, float lo, float hi);

/* Fails the test naming the first differing element (its bits, got then
 * want) when the n elements of es bytes at got and want differ. */
void same_bytes(const char *what, const void *got, const void *want, size_t n, size_t es);

#endif
