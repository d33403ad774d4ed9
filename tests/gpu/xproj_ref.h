/* A plain reference of the 16-bit routes' x_proj contract (docs/route.md,
 * "Model kernels", x_proj), for the GPU tests only (tests/gpu/xproj_ref.cu):
 * one warp per output, one mma.m16n8k16 step per group with the output's w
 * row and x row alone in the fragments, the class sums in group order, then
 * the xor butterfly. */
#ifndef MBD_TEST_XPROJ_REF_H
#define MBD_TEST_XPROJ_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[r, o] (f32 [M, NO]) for x [M, K] (row stride ldx elements) and w
 * [NO, K], both bf16 (bf16 = 1) or f16 (bf16 = 0) in device memory; on the
 * default stream, synchronised. Returns 0, or -1 with a message on stderr. */
int xproj_ref(int bf16, int M, int K, int NO, const void *x, int64_t ldx, const void *w,
              float *out);

#ifdef __cplusplus
}
#endif
#endif
