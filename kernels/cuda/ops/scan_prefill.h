/* The chunked prefill kernel of the selective scan (T > 1), behind
 * mbd_mops_scan (kernels/cuda/ops/scan.h), which states the arithmetic: the
 * same roundings in the same order as scan.cu's kernels, so a sequence's bits
 * do not depend on which of them ran. C header, internal to the scan. */
#ifndef MBD_CUDA_OPS_SCAN_PREFILL_H
#define MBD_CUDA_OPS_SCAN_PREFILL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* Whether mbd_mops_scan_prefill runs d_state N at dt rank R over the x_proj
 * output dbl: N in {8, 16}, R a multiple of 4, dbl 16-byte aligned (its rows
 * are staged in 16-byte pieces) and the kernel's shared memory (about 88 KiB
 * at R = 128) within the device's per-block limit. */
int mbd_mops_scan_prefill_fits(int N, int R, const float *dbl);

/* mbd_mops_scan for T > 1 without a fused conv, on a shape that
 * mbd_mops_scan_prefill_fits; arguments as there (weights in `act`). */
int mbd_mops_scan_prefill(void *stream, int nseq, int T, int di, int N, int R, const float *xc,
                          const float *dbl, const void *dt_w, const void *dt_b, const float *A,
                          const float *D, const float *xz, int64_t ldxz, int64_t zoff,
                          float *ssm_state, int64_t slot_stride, const int32_t *slots,
                          mbd_dtype act, void *y, mbd_error *err);
/* The same over a bf16 state (mbd_mops_scan_bf16state, scan.h). */
int mbd_mops_scan_prefill_bf16state(void *stream, int nseq, int T, int di, int N, int R,
                                    const float *xc, const float *dbl, const void *dt_w,
                                    const void *dt_b, const float *A, const float *D,
                                    const float *xz, int64_t ldxz, int64_t zoff, void *ssm_state,
                                    int64_t slot_stride, const int32_t *slots, mbd_dtype act,
                                    void *y, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
