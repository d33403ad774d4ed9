/* Next-token sampling on the GPU (kernels/cuda/ops/sample.cu). C header; the
 * conventions shared by the model ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_SAMPLE_H
#define MBD_CUDA_OPS_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* Bytes of the sampler's device workspace for n rows. It must be zero-filled
 * once before its first use; every launch leaves it zero-filled again. */
size_t mbd_mops_sample_work_bytes(int n);

/* Next token per row r < n of logits [n, ld] (V columns):
 *   temp[r] <= 0: greedy argmax (lowest index among equal maxima; NaN ignored);
 *   temp[r] > 0 : Gumbel-max sampling: argmax of l / temp + g, with
 *     g = -logf(-logf(u)), u = mbd_sample_uniform(seed[r], step[r], index).
 * The draw depends only on (seed, step, index) and the row's logits, so it is
 * batch-invariant; the row is split over several blocks, and the winner (the
 * lowest-index maximum) does not depend on the reduction order. temp, seed,
 * step may be NULL (all greedy). work: mbd_mops_sample_work_bytes(n) bytes;
 * launches sharing one workspace must be stream-ordered. */
int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                    const float *temp, const uint64_t *seed, const uint64_t *step, void *work,
                    int32_t *out, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
