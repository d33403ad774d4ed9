/* Mamba-2 language model on one GPU context (kernels/cuda/mamba2_gpu.cu),
 * the CUDA model of the Mamba-2 family behind kernels/cuda/gpu_family.h.
 * C header: no CUDA types.
 *
 * Arithmetic: the CPU model's (kernels/model/mamba2.c) per-token roundings,
 * through the ops in kernels/cuda/ops/ (embed, add_rmsnorm, conv_silu,
 * ssd_scan, gated_rmsnorm, sample) and mbd_gpu_gemm for the projections; on
 * f32 routes in deterministic mode the logits and states are bit-identical
 * to the CPU backend's. On bf16/f16 routes the GEMM inputs are rounded to
 * the storage dtype. Prefill and decode run the same kernels, so any
 * chunking gives the bits of decoding token by token; a sequence's bits do
 * not depend on its slot or on the other sequences of a launch. With
 * mbd_gpu_model_opts.use_graphs, decode steps replay one CUDA graph per
 * batch bucket (powers of two up to max_batch, captured on first use), the
 * same bits as the eager step. State slots: the context's state capacity
 * (plus one internal scratch slot for padded rows); their payload is the CPU
 * model's state image payload. */
#ifndef MBD_MAMBA2_GPU_H
#define MBD_MAMBA2_GPU_H

#include "kernels/cuda/gpu_family.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The Mamba-2 family on the CUDA backend. */
extern const mbd_gpu_model_ops mbd_mamba2_gpu_ops;

#ifdef __cplusplus
}
#endif
#endif
