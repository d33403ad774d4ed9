/* Mamba-1 element-wise and recurrent ops on the GPU (everything except the
 * projections, which go through mbd_gpu_gemm), one op per file in
 * kernels/cuda/ops/: this header includes their C headers. Streams are
 * passed as opaque pointers (a cudaStream_t), every buffer is a device
 * pointer.
 *
 * Arithmetic contract: each op performs, per element, exactly the roundings of
 * the CPU reference in kernels/cpu/mamba_ops.c (x_proj and dt_proj have their
 * own summation orders, stated in their headers) (same expression order, same
 * fmaf placement, IEEE division and square root, and exp/log1p/SiLU/softplus
 * from kernels/portable_math.h on both sides, not CUDA's or the C library's),
 * so on f32 routes the model's logits and states are bit-identical to the CPU
 * backend's. Prefill and decode run the same kernels: a prefill over T tokens makes
 * the same roundings as T single steps (bit-identical states and logits), and
 * one sequence's bits never depend on which other sequences share the launch.
 *
 * Activation dtype `act`: the dtype in which an op writes the input of the
 * next GEMM (F32, or the storage dtype BF16/F16, rounded to nearest even).
 * Recurrent state and everything else stays f32.
 *
 * All entries check their shapes and dtypes, enqueue asynchronously and
 * return 0 or MBD_E_DEVICE (launch error) / MBD_E_INVALID (unsupported size
 * or dtype) with a message in err.
 *
 * Launches use programmatic dependent launch (also inside captured graphs): a
 * kernel may start while the previous kernel on the stream is finishing and
 * read its weights (conv, dt_proj, A, D) before that kernel has completed;
 * every activation, state, token or slot input is read only after it. Weights
 * written by a kernel must therefore be complete (stream synchronised) before
 * an op that uses them is enqueued. */
#ifndef MBD_CUDA_MAMBA_OPS_H
#define MBD_CUDA_MAMBA_OPS_H

#include "kernels/cuda/ops/add_rmsnorm.h"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/conv_xproj.h"
#include "kernels/cuda/ops/embed.h"
#include "kernels/cuda/ops/fill_uniform.h"
#include "kernels/cuda/ops/sample.h"
#include "kernels/cuda/ops/scan.h"
#include "kernels/cuda/ops/xproj.h"

#endif
