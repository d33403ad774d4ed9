/* Mamba-1 language model on one GPU context: weights on the device in the
 * storage dtype, recurrent state in preallocated device slots, batched prefill
 * and batched single-token decode (CUDA graphs per batch-size bucket), with
 * greedy or seeded sampling on the device. C header: no CUDA types.
 *
 * Arithmetic: the CPU reference's (kernels/model/mamba1.c) per-token roundings
 * (see kernels/cuda/mamba_ops.h); projections through mbd_gpu_gemm, so the
 * GEMM mode and dtype policy of the context decide their bits. On a bf16/f16
 * route the inputs of each GEMM are rounded to the storage dtype (the GEMM
 * family takes X and W in one dtype); state and the residual stream stay f32.
 *
 * Determinism (deterministic GEMM mode): a sequence's logits, sampled tokens
 * and state are bit-identical whatever slot it occupies, whatever else is in
 * the batch (1..max_batch), eager or graph-replayed, and whether its tokens
 * came by prefill (in any chunking) or one step at a time.
 *
 * Not reentrant: one call at a time, on the thread that owns the context. */
#ifndef MBD_MAMBA1_GPU_H
#define MBD_MAMBA1_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/mamba_config.h"
#include "common/progress.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cuda/gpu_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbd_mamba1_gpu mbd_mamba1_gpu;

/* Stage boundaries of a decode step that step_events mark (see below). */
#define MBD_MAMBA1_GPU_STEP_EVENTS 6

/* How the model is built and run. Which decode kernels may run is not here
 * but in the context's route (mbd_gpu_ctx_config.decode), so that the route
 * says it. The fields after use_graphs are for tests and benchmarks (zero in
 * service); none of them changes a bit. */
typedef struct mbd_mamba1_gpu_options {
  mbd_dtype dtype;  /* weight storage f32 / bf16 / f16; must suit the context's policy
                       (f32 for policies f32 and tf32) */
  int max_rows;     /* token rows per prefill chunk (device workspace); 0 = 2048 */
  int max_batch;    /* largest decode batch; rounded up to a power of two; 0 = 256 */
  int use_graphs;   /* 1: decode replays one CUDA graph per bucket 1,2,4,..; 0: eager */
  uint32_t dp_epoch_wrap; /* tests: the persistent decode's exchange words carry tags
                             (launch count x n_layer + layer + 1) and are re-zeroed, the
                             count restarting, when the count reaches the wrap. 0: the
                             largest wrap that keeps tags below 2^32 (every ~2^32 /
                             n_layer launches); n > 0: every n launches (1: at every
                             launch), never later than the largest */
  void *step_events[MBD_MAMBA1_GPU_STEP_EVENTS]; /* benchmarks: all NULL, or six cudaEvent_t
                             the caller created (and destroys after the model) that
                             persistent decode steps record at their stage boundaries,
                             eager or as nodes of the decode graphs: 0 start, 1 inputs
                             up, 2 layers done, 3 final add + norm done, 4 LM head
                             done, 5 picks out. Per-op steps record none (their
                             programmatic launches admit no event node between them) */
  void *dp_trace;   /* benchmarks: NULL, or a device buffer of mbd_dp_trace_bytes(n_layer)
                       bytes (kernels/cuda/decode_persistent.h) that every persistent
                       decode launch fills with its stage trace; the caller frees it
                       after the model. kernels/cuda/bench/mamba1_gpu_bench.h makes
                       both probes and prints them */
  const mbd_progress_opts *progress; /* loading progress; NULL (default): silent */
} mbd_mamba1_gpu_options;

/* f32 storage, 2048 rows, batch 256, graphs on, no test or benchmark hooks. */
void mbd_mamba1_gpu_options_default(mbd_mamba1_gpu_options *o);

/* Loads DIR/config.json and DIR/model.safetensors, or the shards listed in
 * DIR/model.safetensors.index.json (Hugging Face layout, mbd_st_dir_open),
 * onto ctx's device. State slots: the context's state capacity (route identity),
 * the SSM state kept in the route's state dtype (f32, or bf16 on a state=bf16
 * route: docs/route.md "Mamba-1 with a bf16 state"; the conv windows stay
 * f32). The model borrows ctx, which must outlive it. */
int mbd_mamba1_gpu_load(mbd_gpu_ctx *ctx, const char *dir, const mbd_mamba1_gpu_options *opts,
                        mbd_mamba1_gpu **out, mbd_error *err);
/* Frees device memory and graphs; NULL-safe; nulls *m. */
void mbd_mamba1_gpu_destroy(mbd_mamba1_gpu **m);

const mbd_mamba_config *mbd_mamba1_gpu_config(const mbd_mamba1_gpu *m);
mbd_dtype mbd_mamba1_gpu_dtype(const mbd_mamba1_gpu *m);
int64_t mbd_mamba1_gpu_slots(const mbd_mamba1_gpu *m);
/* Device bytes of weights (storage dtype, LM head counted once when tied). */
size_t mbd_mamba1_gpu_weight_bytes(const mbd_mamba1_gpu *m);
/* Bytes of one slot's state image (conv window + SSM state, all layers, f32
 * whatever the state dtype: a bf16 state is widened exactly). */
size_t mbd_mamba1_gpu_state_bytes(const mbd_mamba1_gpu *m);

/* Zeroes a slot (start of a sequence). MBD_E_INVALID for a slot out of range. */
int mbd_mamba1_gpu_slot_reset(mbd_mamba1_gpu *m, int64_t slot, mbd_error *err);
/* Copies a slot's state to the host as f32 conv[n_layer][d_conv-1][d_inner]
 * then ssm[n_layer][d_inner][d_state] (the CPU model's export payload; a
 * bf16 state widened exactly); cap >= state bytes, else MBD_E_TOO_LARGE.
 * Synchronous. */
int mbd_mamba1_gpu_slot_read(mbd_mamba1_gpu *m, int64_t slot, void *buf, size_t cap,
                             mbd_error *err);
/* Replaces a slot's state with a payload of exactly state bytes (layout as
 * above; into a bf16 state rounded to nearest even, exact for an image a
 * bf16-state route wrote). */
int mbd_mamba1_gpu_slot_write(mbd_mamba1_gpu *m, int64_t slot, const void *buf, size_t len,
                              mbd_error *err);
/* The two device arrays of a slot's state, in the payload's order: conv
 * window then SSM state (ptr[2], bytes[2]; the SSM state in its stored
 * dtype, so bf16 regions are half the f32 ones). */
int mbd_mamba1_gpu_slot_regions(mbd_mamba1_gpu *m, int64_t slot, void **ptr, size_t *bytes,
                                mbd_error *err);

/* Which logits a prefill returns. */
typedef enum mbd_mamba1_gpu_logits {
  MBD_MAMBA1_GPU_LOGITS_NONE = 0, /* only advance the states */
  MBD_MAMBA1_GPU_LOGITS_LAST = 1, /* [nseq, V]: each sequence's last position */
  MBD_MAMBA1_GPU_LOGITS_ALL = 2,  /* [nseq, T, V] */
} mbd_mamba1_gpu_logits;

/* Feeds tokens [nseq, T] (host, row-major) to the sequences in slots[nseq]
 * (host, distinct, each < slots), continuing from their states; logits as
 * `which` says, into host memory or device memory the model's device can
 * address (a CUDA IPC mapping of a client's buffer). Chunked internally by max_rows rows; synchronous. Token ids
 * outside [0, vocab) or bad slots are MBD_E_INVALID and nothing runs. */
int mbd_mamba1_gpu_prefill(mbd_mamba1_gpu *m, int nseq, int T, const int32_t *tokens,
                           const int32_t *slots, mbd_mamba1_gpu_logits which, float *logits,
                           mbd_error *err);

/* How row r of a decode step picks its next token. temperature <= 0: greedy
 * (argmax, lowest index on ties); else Gumbel-max sampling whose draw is a
 * pure function of (seed, step, token index) (kernels/cuda/mamba_ops.h). */
typedef struct mbd_mamba1_gpu_pick {
  float temperature;
  uint64_t seed;
  uint64_t step; /* the sequence's own generated-token counter */
} mbd_mamba1_gpu_pick;

/* One token per sequence: tokens[n], slots[n] (host; distinct), 1 <= n <=
 * max_batch. Writes next[n] (may be NULL) picked per picks[n] (NULL: greedy)
 * and logits [n, V] (host; may be NULL). With graphs on, the step replays the
 * graph of the smallest bucket >= n (captured on first use; padding rows run on
 * a scratch slot and never touch real slots). Synchronous. */
int mbd_mamba1_gpu_step(mbd_mamba1_gpu *m, int n, const int32_t *tokens, const int32_t *slots,
                        const mbd_mamba1_gpu_pick *picks, int32_t *next, float *logits,
                        mbd_error *err);

/* mbd_mamba1_gpu_step in two halves: launch enqueues the step (inputs read
 * before it returns) and the copy of logits rows [0, nlogits) into host
 * logits (0: none), and returns; wait waits for it and writes next[n] (may
 * be NULL). Between the two nothing else may run on m. */
int mbd_mamba1_gpu_step_launch(mbd_mamba1_gpu *m, int n, const int32_t *tokens,
                               const int32_t *slots, const mbd_mamba1_gpu_pick *picks,
                               float *logits, int nlogits, mbd_error *err);
int mbd_mamba1_gpu_step_wait(mbd_mamba1_gpu *m, int32_t *next, mbd_error *err);

/* Turns graph replay on or off; off also destroys the captured graphs (needed
 * after a GEMM-mode change, since a graph replays only under its route). */
void mbd_mamba1_gpu_set_graphs(mbd_mamba1_gpu *m, int on);

/* 1 when a decode step of `rows` rows runs every layer in one persistent
 * launch (the context's decode path MBD_DECODE_PERSISTENT, and
 * decode_persistent.h: small batches, deterministic mode, sm_90a, bf16/f16,
 * shapes that fit), else 0. The bits are the same either way. */
int mbd_mamba1_gpu_persistent(const mbd_mamba1_gpu *m, int rows);

#ifdef __cplusplus
}
#endif
#endif
