/* Embedding gather on the GPU (kernels/cuda/ops/embed.cu). C header; the
 * conventions shared by the model ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_EMBED_H
#define MBD_CUDA_OPS_EMBED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* out[r, :] = table[tok[r], :] widened to f32, r < M. tok must be in range
 * (callers validate on the host). table has dtype `dt` and d columns. */
int mbd_mops_embed(void *stream, int64_t M, int d, const int32_t *tok, mbd_dtype dt,
                   const void *table, float *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
