/* Internal layout of mbd_mamba1_gpu, shared by the model's own files
 * (mamba1_gpu.cu: weights, workspace, slots; mamba1_gpu_run.cu: prefill and
 * decode) and the bench-only synthetic model
 * (kernels/cuda/bench/mamba1_gpu_random.cu); C++ only. Callers outside those
 * use kernels/cuda/mamba1_gpu.h. */
#ifndef MBD_MAMBA1_GPU_IMPL_H
#define MBD_MAMBA1_GPU_IMPL_H

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/decode_persistent.h"
#include "kernels/cuda/dev_arena.h"
#include "kernels/cuda/mamba1_gpu.h"
}

#define MBD_M1G_MAX_BUCKETS 16 /* decode graph buckets 1, 2, 4, .. 2^15 */

typedef mbd_dp_layer layer_d; /* one layer's device weights (decode_persistent.h) */

struct mbd_mamba1_gpu {
  mbd_gpu_ctx *ctx;
  cudaStream_t stream;
  mbd_mamba_config cfg;
  mbd_dtype dtype;       /* storage dtype = activation dtype of GEMM inputs */
  int max_rows, max_batch, use_graphs;
  mbd_decode_path decode; /* the context's route: may small decode batches run persistently */
  int64_t nslots;        /* real slots; index nslots is the padding scratch slot */
  layer_d *layers;
  void *emb;             /* [V, d] dtype */
  void *head;            /* LM head weight: emb when tied */
  float *norm_f;         /* [d] */
  mbd_dev_arena arena;    /* every device allocation, freed at destroy */
  float *conv_st;        /* [nslots + 1][L][K-1][di] */
  void *ssm_st;          /* [nslots + 1][L][di][N] of ssm_es bytes: f32, or bf16 on a
                            state=bf16 route */
  int ssm_es;            /* bytes of one SSM state entry: 4 or 2 */
  uint16_t *h_ssm;       /* bf16 state: pinned [ssm_slot], a slot's SSM state in transit */
  int64_t conv_slot, ssm_slot; /* entries per slot */
  /* workspace, `rows` = max(max_rows, max_batch) */
  int32_t *d_tok, *d_slots;
  float *resid, *xz, *xc, *dbl, *out, *logits; /* dbl: x_proj rows [dt_low | B | C] */
  void *hn, *xc_act, *y;
  void *sample_work;
  float *d_temp;
  uint64_t *d_seed, *d_step;
  /* pinned staging */
  int32_t *h_tok, *h_slots, *h_next;
  float *h_temp;
  uint64_t *h_seed, *h_step;
  void *h_in, *d_in;     /* one pinned block [tok|slots|temp|seed|step] and its device
                            mirror (same offsets): a step's inputs in one copy */
  size_t in_bytes;
  uint32_t *stamp;       /* host [nslots]: duplicate-slot check */
  uint32_t gen;
  mbd_gpu_graph *graphs[MBD_M1G_MAX_BUCKETS];
  mbd_dp_model dp;       /* the persistent decode's view of this model (zeroed: never runs) */
  uint32_t dp_epoch_wrap; /* options: tests' tag wrap (0: the largest) */
  cudaEvent_t step_ev[MBD_MAMBA1_GPU_STEP_EVENTS]; /* options: stage events, or all NULL */
  void *dp_trace;        /* options: the persistent decode's stage trace buffer, or NULL */
  int marking;           /* inside a persistent step_body with step events */
  int pending;           /* rows of a launched step not yet waited for (0: none) */
};

extern "C" {
/* A model of config cfg without weights: options checked, host tables
 * allocated, nothing on the device yet. */
int mbd_m1g_alloc(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg,
                  const mbd_mamba1_gpu_options *opts, mbd_mamba1_gpu **out, mbd_error *err);
/* cudaMalloc of `bytes` (at least 16) that destroy frees. */
int mbd_m1g_dalloc(mbd_mamba1_gpu *m, size_t bytes, void **out, mbd_error *err);
/* n host f32 values to a new device array: in the storage dtype (as_dtype 1)
 * or as f32 rounded through it (0); counted in the weight bytes. */
int mbd_m1g_upload(mbd_mamba1_gpu *m, const float *v, size_t n, int as_dtype, void **out,
                   mbd_error *err);
/* After the weights: state slots, workspace, staging and the persistent
 * decode's tables. */
int mbd_m1g_finish(mbd_mamba1_gpu *m, mbd_error *err);
/* MBD_E_INVALID for a slot outside 0..nslots-1. */
int mbd_m1g_check_slot(const mbd_mamba1_gpu *m, int64_t slot, mbd_error *err);
}

#endif
