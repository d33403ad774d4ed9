/* Deterministic CPU GEMM: C[M,N] = op(A) op(B) (+ bias[N]).
 *
 * Contract (the f32 route's definition): every input is widened to f32
 * (exact), then C[m,n] = fmaf chain over k = 0..K-1 in ascending order into an
 * f32 accumulator that starts at +0, and bias[n] is added once after the sum.
 * Vector code runs across output columns, never across K, so each element's
 * bits depend only on its own row of op(A) and column of op(B): a row computes
 * the same bits whatever M is, whichever rows surround it, however many
 * threads run, and on the portable path and the AVX2 path alike (fma is
 * exactly rounded). */
#ifndef MBD_CPU_GEMM_H
#define MBD_CPU_GEMM_H

#include <stdint.h>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/cpu_ctx.h"

/* First letter: op(A); second: op(B). N = as stored, T = transposed.
 *   op(A) N: A stored [M,K], lda >= K      T: A stored [K,M], lda >= M
 *   op(B) N: B stored [K,N], ldb >= N      T: B stored [N,K], ldb >= K
 * NT with B = W[out,in] is y = x W^T, the Hugging Face linear layer. */
typedef enum mbd_gemm_layout {
  MBD_GEMM_NN = 0,
  MBD_GEMM_TN = 1,
  MBD_GEMM_NT = 2,
} mbd_gemm_layout;

/* Output columns per packed panel (two AVX2 registers). */
#define MBD_GEMM_NR 16

/* General GEMM. A and B may each be f32, bf16 or f16; C is f32 with row stride
 * ldc >= N; bias may be NULL. M, N, K >= 0 (K == 0 gives bias or zeros).
 * Errors: MBD_E_INVALID for bad strides/dtypes/NULL data. */
int mbd_cpu_gemm(mbd_cpu_ctx *ctx, mbd_gemm_layout layout, int64_t M, int64_t N, int64_t K,
                 mbd_dtype a_dtype, const void *A, int64_t lda, mbd_dtype b_dtype,
                 const void *B, int64_t ldb, const float *bias, float *C, int64_t ldc,
                 mbd_error *err);

/* Per-thread scratch a GEMM with inner dimension K needs; callers that must
 * not allocate later (model forward) reserve it up front with
 * mbd_cpu_ctx_reserve. */
size_t mbd_cpu_gemm_scratch_bytes(int64_t K);

/* A weight W[N,K] (Hugging Face [out,in]) converted once to a storage dtype
 * and laid out in panels of MBD_GEMM_NR output columns ([K][NR] each, zero
 * padded), so decode-time GEMMs stream it without repacking. */
typedef struct mbd_cpu_wpack mbd_cpu_wpack;

/* Packs W (src_dtype, row stride ldw >= K) into storage dtype `dtype`
 * (round-to-nearest-even when narrowing). */
int mbd_cpu_wpack_new(mbd_dtype dtype, int64_t N, int64_t K, mbd_dtype src_dtype, const void *W,
                      int64_t ldw, mbd_cpu_wpack **out, mbd_error *err);
void mbd_cpu_wpack_destroy(mbd_cpu_wpack **w);
int64_t mbd_cpu_wpack_rows(const mbd_cpu_wpack *w); /* N */
int64_t mbd_cpu_wpack_cols(const mbd_cpu_wpack *w); /* K */
mbd_dtype mbd_cpu_wpack_dtype(const mbd_cpu_wpack *w);
/* Bytes of packed storage (for memory reports). */
size_t mbd_cpu_wpack_nbytes(const mbd_cpu_wpack *w);
/* Row n of W as stored (widened to f32) into out[K]: embedding lookups. */
void mbd_cpu_wpack_row(const mbd_cpu_wpack *w, int64_t n, float *out);

/* C[M,N] = A[M,K] W^T (+ bias): same contract and bits as mbd_cpu_gemm with
 * layout NT on W's storage-dtype values. A is f32 with row stride lda >= K. */
int mbd_cpu_gemm_packed(mbd_cpu_ctx *ctx, int64_t M, const float *A, int64_t lda,
                        const mbd_cpu_wpack *W, const float *bias, float *C, int64_t ldc,
                        mbd_error *err);

#endif
