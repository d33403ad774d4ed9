/* Synthetic weights on the GPU (kernels/cuda/ops/fill_uniform.cu). C header;
 * the conventions shared by the model ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_FILL_UNIFORM_H
#define MBD_CUDA_OPS_FILL_UNIFORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* p[i] = uniform in [-scale, scale) from a hash of (seed, i), stored in dt.
 * Synthetic weights for benchmarks and tests: no host round trip. */
int mbd_mops_fill_uniform(void *stream, mbd_dtype dt, void *p, int64_t n, uint64_t seed,
                          float scale, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
