/* The Mamba-2 recurrence for prefills of many rows
 * (kernels/cuda/ops/ssd_prefill.cu): the kernel mbd_mops_ssd_scan
 * (ssd_scan.h) hands launches of many tokens over many rows to. Internal to
 * kernels/cuda/ops; C header. */
#ifndef MBD_CUDA_OPS_SSD_PREFILL_H
#define MBD_CUDA_OPS_SSD_PREFILL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/ops/ssd_scan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Launches of at least MIN_T tokens over at least MIN_ROWS rows (sequences
 * x channels) go to mbd_mops_ssd_prefill_scan; fewer rows leave too few
 * warps (ssd_chunk.h's wavefront and ssd_scan.cu's wider lanes take them). */
#define MBD_MOPS_SSD_PREFILL_MIN_T 16
#define MBD_MOPS_SSD_PREFILL_MIN_ROWS 8192

/* Whether mbd_mops_ssd_prefill_scan takes a launch of nseq sequences of T
 * tokens of shape dm: the bounds above, d_state 64, 128 or 256, head_dim a
 * multiple of 16. */
bool mbd_mops_ssd_prefill_takes(int nseq, int T, const mbd_mops_ssd_dims *dm);

/* mbd_mops_ssd_scan's contract and arguments (ssd_scan.h), for a launch
 * mbd_mops_ssd_prefill_takes accepts (MBD_E_INVALID otherwise); the caller
 * has checked the shape. Parallel over sequences, channels and state
 * entries; the n chain of each output is handed from lane to lane of a
 * warp, one token per tick; a lane holds two channels, or eight at d_state
 * 128 when the launch still fills every scheduler with two warps. */
int mbd_mops_ssd_prefill_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                              const float *A, const float *D, const float *dt_bias, float lo,
                              float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                              int64_t ld_xbc, float *state, int64_t slot_stride,
                              const int32_t *slots, float *y, mbd_error *err);

/* mbd_mops_ssd_scan_bf16state's contract (ssd_scan.h) on this kernel: each
 * updated entry rounded to bf16 before it is stored and before the y chain
 * reads it; state bf16, slot_stride in entries. */
int mbd_mops_ssd_prefill_scan_bf16state(void *stream, int nseq, int T,
                                        const mbd_mops_ssd_dims *dm, const float *A,
                                        const float *D, const float *dt_bias, float lo, float hi,
                                        const float *dt_raw, int64_t ld_dt, const float *xbc,
                                        int64_t ld_xbc, void *state, int64_t slot_stride,
                                        const int32_t *slots, float *y, mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
