/* Mamba-3 SISO language model on one GPU context (the CUDA model of the
 * mamba3 family, kernels/model/mamba3.h being the CPU one): f32 weights on the
 * device, the recurrent states of every slot of the context's state capacity
 * in one device array laid out as the CPU state image's payload, prefill and
 * step through the f32 GEMM contract and the ops of kernels/cuda/ops/
 * m3_mixer.h. The arithmetic is the CPU model's, statement for statement, so
 * f32 logits and states are meant to be bit-identical to the CPU backend's
 * (tests/gpu/test_mamba3_gpu.c checks it with memcmp). f32 storage only
 * (bf16/f16: MBD_E_UNSUPPORTED), no out-proj norm. Plain C: the model drives
 * the device through gpu_ctx.h, gpu_gemm.h and the ops' C entries. */
#ifndef MBD_MAMBA3_GPU_H
#define MBD_MAMBA3_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/gpu_family.h"
#include "kernels/model/family.h"
#include "kernels/model/mamba3.h"

typedef struct mbd_mamba3_gpu mbd_mamba3_gpu;

/* Loads DIR on ctx (borrowed; must outlive the model) with decode batches up
 * to max_batch (<= 0: 256). The state is f32 (a context with another state
 * dtype is the caller's to refuse: gpu_family.h state_dtypes). */
int mbd_mamba3_gpu_load(mbd_gpu_ctx *ctx, const char *dir, mbd_dtype dtype, int max_batch,
                        mbd_mamba3_gpu **out, mbd_error *err);
void mbd_mamba3_gpu_destroy(mbd_mamba3_gpu **m);

const mbd_mamba3_config *mbd_mamba3_gpu_config(const mbd_mamba3_gpu *m);
int64_t mbd_mamba3_gpu_slots(const mbd_mamba3_gpu *m);
size_t mbd_mamba3_gpu_state_bytes(const mbd_mamba3_gpu *m); /* payload bytes per slot */

int mbd_mamba3_gpu_slot_reset(mbd_mamba3_gpu *m, int64_t slot, mbd_error *err);
/* The slot's payload (the CPU state image's bytes after its header). */
int mbd_mamba3_gpu_slot_read(mbd_mamba3_gpu *m, int64_t slot, void *buf, size_t cap,
                             mbd_error *err);
int mbd_mamba3_gpu_slot_write(mbd_mamba3_gpu *m, int64_t slot, const void *buf, size_t len,
                              mbd_error *err);

/* tokens [nseq, T] (host) into slots[nseq] (distinct); logits as sel
 * ([nseq, T, V] for ALL, [nseq, V] for LAST), host or device memory. */
int mbd_mamba3_gpu_prefill(mbd_mamba3_gpu *m, int nseq, int T, const int32_t *tokens,
                           const int32_t *slots, mbd_logits_sel sel, float *logits,
                           mbd_error *err);
/* One token per slot; greedy next[n] (lowest index of the maximum; may be
 * NULL) and logits [n, V] (may be NULL). */
int mbd_mamba3_gpu_step(mbd_mamba3_gpu *m, int n, const int32_t *tokens, const int32_t *slots,
                        int32_t *next, float *logits, mbd_error *err);

/* The mamba3 family on the CUDA backend (kernels/cuda/gpu_family.h). */
extern const mbd_gpu_model_ops mbd_mamba3_gpu_ops;

#endif
