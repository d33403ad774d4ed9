/* Next-token sampling (see sample.h): greedy argmax or Gumbel-max, a row split
 * over SAMPLE_BLOCKS blocks whose winners the last block folds. */
#include "kernels/cuda/ops/common.cuh"
#include "kernels/cuda/ops/sample.h"

/* (v, i) beats (bv, bi) when larger, or equal with a lower index; NaN never
 * wins. The winner is the unique lowest-index maximum, so the reduction tree
 * (and the number of blocks) cannot change it. */
__device__ __forceinline__ void better(float v, int i, float &bv, int &bi) {
  if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

#define SAMPLE_BLOCKS 32 /* blocks per row: each scans V / 32 logits */
#define SAMPLE_THREADS 256
#define SAMPLE_ROW_BYTES (16 + 8 * SAMPLE_BLOCKS)

/* Block-wide winner of (bv, bi); valid in thread 0. */
__device__ __forceinline__ void block_best(float &bv, int &bi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    better(ov, oi, bv, bi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) better(sv[k], si[k], bv, bi);
}

/* Grid (SAMPLE_BLOCKS, n). Each block writes its slice's winner to the
 * workspace; the last block of a row to finish (counter) picks the row's
 * winner and re-zeroes the counter for the next launch. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(int V, const float *__restrict__ logits, int64_t ld, const float *__restrict__ temp,
             const uint64_t *__restrict__ seed, const uint64_t *__restrict__ step,
             unsigned char *__restrict__ work, int32_t *__restrict__ out) {
  const int r = blockIdx.y, blk = blockIdx.x;
  pdl_wait();
  pdl_trigger();
  /* Row r's workspace block: counter, then the blocks' values and indices. Its
   * place depends on r alone, not on n, so launches of any size share it. */
  unsigned char *wr = work + (size_t)r * SAMPLE_ROW_BYTES;
  unsigned *cnt = (unsigned *)wr;
  float *pv = (float *)(wr + 16);
  int *pi = (int *)(wr + 16 + 4 * SAMPLE_BLOCKS);
  const float *l = logits + (int64_t)r * ld;
  const float tp = temp ? temp[r] : 0.0f;
  const bool greedy = !(tp > 0.0f);
  const uint64_t sd = seed ? seed[r] : 0, sp = step ? step[r] : 0;
  const int per = (V + SAMPLE_BLOCKS - 1) / SAMPLE_BLOCKS;
  const int i0 = blk * per, i1 = min(V, i0 + per);
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = i0 + threadIdx.x; i < i1; i += SAMPLE_THREADS) {
    float v = l[i];
    if (!greedy) {
      const float u = sample_uniform(sd, sp, (uint64_t)i);
      v = __fadd_rn(__fdiv_rn(v, tp), -logf(-logf(u)));
    }
    better(v, i, bv, bi);
  }
  block_best(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    pv[blk] = bv;
    pi[blk] = bi;
    __threadfence();
    last = atomicAdd(cnt, 1u) == SAMPLE_BLOCKS - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x < 32) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    if (threadIdx.x < SAMPLE_BLOCKS) {
      v = __ldcg(pv + threadIdx.x);
      i = __ldcg(pi + threadIdx.x);
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, v, o);
      int oi = __shfl_xor_sync(0xffffffffu, i, o);
      better(ov, oi, v, i);
    }
    if (threadIdx.x == 0) {
      out[r] = i == 0x7fffffff ? 0 : i; /* all NaN / -inf: token 0 */
      *cnt = 0;
    }
  }
}

extern "C" size_t mbd_mops_sample_work_bytes(int n) {
  return n <= 0 ? 0 : (size_t)n * SAMPLE_ROW_BYTES;
}

static int sample_launch(cudaStream_t s, int n, int V, const float *logits, int64_t ld,
                         const float *temp, const uint64_t *seed, const uint64_t *step,
                         unsigned char *work, int32_t *out, mbd_error *err) {
  const dim3 grid(SAMPLE_BLOCKS, (unsigned)n);
  return launch_pdl("sampling", k_sample, grid, dim3(SAMPLE_THREADS), 0, s, err, V, logits, ld,
                    temp, seed, step, work, out);
}

extern "C" int mbd_mops_sample(void *stream, int n, int V, const float *logits, int64_t ld,
                               const float *temp, const uint64_t *seed, const uint64_t *step,
                               void *work, int32_t *out, mbd_error *err) {
  if (n <= 0) return 0;
  if (n > 65535 || V <= 0 || !work)
    return mbd_error_set(err, MBD_E_INVALID, "sampling: %d rows, vocabulary %d, workspace %p", n,
                         V, work);
  if (ld < V)
    return mbd_error_set(err, MBD_E_INVALID, "sampling: row stride %lld < vocabulary %d",
                         (long long)ld, V);
  return sample_launch((cudaStream_t)stream, n, V, logits, ld, temp, seed, step,
                       (unsigned char *)work, out, err);
}
