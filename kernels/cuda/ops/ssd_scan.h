/* The Mamba-2 recurrence on the GPU, prefill and decode
 * (kernels/cuda/ops/ssd_scan.cu). C header; the conventions shared by the
 * model ops are in kernels/cuda/mamba_ops.h. */
#ifndef MBD_CUDA_OPS_SSD_SCAN_H
#define MBD_CUDA_OPS_SSD_SCAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "common/tensor.h"

/* Shapes of one layer: H heads of P channels, state N, G groups for B/C. */
typedef struct mbd_mops_ssd_dims {
  int heads, head_dim, d_state, n_groups;
} mbd_mops_ssd_dims;

/* Largest d_state the scan takes. */
#define MBD_MOPS_SSD_MAX_STATE 256

/* nseq sequences of T tokens (row s*T+t), each token through
 * mbd_cpu_ssd_step's arithmetic (kernels/cpu/ssd_step.h) in time order:
 * dt_raw[row * ld_dt + h] (before dt_bias), xbc[row * ld_xbc + ...] = x
 * [H P] | B [G N] | C [G N]; A, D, dt_bias [H] f32; clamp [lo, hi]; state of
 * sequence s at state + slots[s] * slot_stride, [H P][N] (updated in place);
 * y f32 [M, H P] (D skip included, not gated). d_state 1..
 * MBD_MOPS_SSD_MAX_STATE, any head_dim; MBD_E_INVALID otherwise. Parallel
 * over sequences, heads, channels and state entries (a channel's entries
 * split over up to 32 lanes, the n chain handed from lane to lane; long
 * launches that mbd_mops_ssd_chunk_takes go to ssd_chunk.h's wavefront
 * kernel, those that mbd_mops_ssd_prefill_takes to ssd_prefill.h's lane
 * pipeline); each state entry's steps and each output's n chain run in the
 * CPU's order, so any T, any chunking and any batch give the same bits. */
int mbd_mops_ssd_scan(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                      const float *A, const float *D, const float *dt_bias, float lo, float hi,
                      const float *dt_raw, int64_t ld_dt, const float *xbc, int64_t ld_xbc,
                      float *state, int64_t slot_stride, const int32_t *slots, float *y,
                      mbd_error *err);

/* mbd_mops_ssd_scan over a bf16 state (state: device bf16 [H P][N] per
 * slot, slot_stride in entries): the same steps in f32, each updated state
 * entry rounded to bf16 (round to nearest even) before it is stored and
 * before the y chain reads it, s = bf16(fmaf(dA, s, (dt * B) * x)), y =
 * fmaf(s, C, y); so any T, chunking and batch still give the same bits. */
int mbd_mops_ssd_scan_bf16state(void *stream, int nseq, int T, const mbd_mops_ssd_dims *dm,
                                const float *A, const float *D, const float *dt_bias, float lo,
                                float hi, const float *dt_raw, int64_t ld_dt, const float *xbc,
                                int64_t ld_xbc, void *state, int64_t slot_stride,
                                const int32_t *slots, float *y, mbd_error *err);

/* The causal conv + SiLU of the xBC channels folded into a decode step, with
 * mbd_mops_conv_silu's arithmetic (kernels/cuda/ops/conv_silu.h): raw inputs
 * xin[s * ld_xin + c] for c < H P + 2 G N (x | B | C), weights w
 * [K][channels] tap-major, bias [channels] or NULL, the window of sequence s
 * at state + slots[s] * slot_stride, [K - 1][channels] oldest first
 * (advanced in place), K 2..8. tickets: [nseq * G] device ints, zero before
 * the call and left zero. */
typedef struct mbd_mops_ssd_conv {
  int K;
  const float *w, *bias;
  float *state;
  int64_t slot_stride;
  const float *xin;
  int64_t ld_xin;
  int32_t *tickets;
} mbd_mops_ssd_conv;

/* One token per sequence (T = 1): mbd_mops_conv_silu then mbd_mops_ssd_scan
 * in one launch, the same bits (xbc is not written). Not on the model's
 * path: on the H200 it took as long as the two launches it replaces. A group's B and C
 * windows are read by all of its blocks; the last of them to finish reading
 * (a ticket per sequence and group) advances them. */
int mbd_mops_ssd_scan_conv(void *stream, int nseq, const mbd_mops_ssd_dims *dm, const float *A,
                           const float *D, const float *dt_bias, float lo, float hi,
                           const float *dt_raw, int64_t ld_dt, const mbd_mops_ssd_conv *conv,
                           float *state, int64_t slot_stride, const int32_t *slots, float *y,
                           mbd_error *err);

#ifdef __cplusplus
}
#endif
#endif
