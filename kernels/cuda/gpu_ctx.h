/* CUDA compute context of one worker: device, one non-blocking stream, the
 * deterministic GEMM kernels (embedded fatbin), a lazily created cuBLAS handle
 * and workspace, the GEMM mode, storage dtype policy and family, route
 * recording, CUDA-graph capture/replay with route guards, and frozen scratch.
 *
 * C-callable; no CUDA types leak. Pointers passed to GEMMs are device pointers.
 * One context is used by one thread at a time (the worker's compute thread). */
#ifndef MBD_GPU_CTX_H
#define MBD_GPU_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "common/route.h"
#include "common/status.h"
#include "common/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbd_gpu_ctx mbd_gpu_ctx;
typedef struct mbd_gpu_graph mbd_gpu_graph;

/* Test-only fault injection (all zero in production). Counters are consumed
 * one per event. */
typedef struct mbd_gpu_fault {
  int math_set_fails;     /* next N cublasSetMathMode calls "fail" (after applying a bogus mode) */
  int math_verify_wrong;  /* next N math-mode verification reads return a wrong value */
} mbd_gpu_fault;

typedef struct mbd_gpu_ctx_config {
  int device;               /* CUDA device index */
  mbd_gemm_mode mode;       /* deterministic (default), cublas-fast, cublas-pedantic */
  mbd_dtype_policy policy;  /* storage dtype policy; GEMM dtypes must match it */
  mbd_family family;        /* only MBD_FAMILY_INFERENCE is implemented */
  int64_t state_capacity;   /* session state slots (part of the route identity) */
  mbd_state_dtype state;    /* storage dtype of the models' recurrent state (part of the
                               route identity); a family that cannot store it refuses to load */
  mbd_decode_path decode;   /* which decode kernels a model on this context may run (part
                               of the route identity): MBD_DECODE_PERSISTENT lets
                               kernels/cuda/mamba1_gpu.h run small decode batches in the
                               persistent launch where it fits, MBD_DECODE_PER_OP never;
                               the bits are the same either way */
  size_t scratch_bytes;     /* scratch presized at construction (may grow until frozen) */
  mbd_gpu_fault fault;      /* tests only */
} mbd_gpu_ctx_config;

/* Defaults: device 0, deterministic, bf16, inference, capacity 1, f32 state,
 * persistent decode, no scratch. */
void mbd_gpu_ctx_config_default(mbd_gpu_ctx_config *cfg);

/* Creates a context. Validates the device (present, compute capability covered
 * by the embedded kernels, SM count read twice agrees) and loads the kernels.
 * MBD_E_DEVICE "no CUDA device: cudaGetDeviceCount returned ..." without GPU. */
int mbd_gpu_ctx_new(const mbd_gpu_ctx_config *cfg, mbd_gpu_ctx **out, mbd_error *err);
void mbd_gpu_ctx_destroy(mbd_gpu_ctx **ctx);

/* Changes the GEMM mode. MBD_E_STATE while capturing or recording. Entering a
 * cuBLAS mode reads the handle's math mode, sets the new one and verifies it;
 * on failure the old one is restored and verified (MBD_E_DEVICE, mode
 * unchanged); if the restore cannot be verified the context becomes unusable
 * and this and every later GEMM/capture/replay returns MBD_E_UNUSABLE with the
 * stored diagnostic. */
int mbd_gpu_ctx_set_mode(mbd_gpu_ctx *ctx, mbd_gemm_mode mode, mbd_error *err);
mbd_gemm_mode mbd_gpu_ctx_mode(const mbd_gpu_ctx *ctx);
/* 1 when poisoned; the stored diagnostic is copied to err when non-NULL. */
int mbd_gpu_ctx_unusable(const mbd_gpu_ctx *ctx, mbd_error *err);
/* The context's stream as an opaque pointer (a cudaStream_t for .cu callers). */
void *mbd_gpu_ctx_stream(mbd_gpu_ctx *ctx);
/* Waits for the stream; device errors are reported. */
int mbd_gpu_ctx_sync(mbd_gpu_ctx *ctx, mbd_error *err);

/* Device memory helpers (plain cudaMalloc; copies are synchronous on the
 * context's stream) so C callers and tests need no CUDA headers. */
int mbd_gpu_alloc(mbd_gpu_ctx *ctx, size_t bytes, void **out, mbd_error *err);
void mbd_gpu_free(mbd_gpu_ctx *ctx, void *p);
int mbd_gpu_upload(mbd_gpu_ctx *ctx, void *dst, const void *src, size_t bytes, mbd_error *err);
/* dst may also be device memory (the copy's direction follows the pointers). */
int mbd_gpu_download(mbd_gpu_ctx *ctx, void *dst, const void *src, size_t bytes, mbd_error *err);
/* Fills device bytes with `byte` (poisoning outputs in tests). */
int mbd_gpu_memset(mbd_gpu_ctx *ctx, void *dst, int byte, size_t bytes, mbd_error *err);

/* Fills the route identity of the context as it is now. */
int mbd_gpu_ctx_route(const mbd_gpu_ctx *ctx, mbd_route_identity *out, mbd_error *err);
/* Hex SHA-256 over the embedded GEMM fatbin, the model kernels' fatbin and the
 * model's host source (the kernel_digest); no device needed. */
void mbd_gpu_kernel_digest(char out[65]);

/* Route recording: the ordered list of GEMM launches of an eager pass. */
typedef struct mbd_gpu_launch_rec {
  char kernel[32];   /* kernel name ("mbd_hgemm_bf16_l_v", "cublasGemmEx") */
  int64_t m, n, k;
  mbd_dtype dtype, out_dtype;
  int has_bias;
  mbd_gemm_mode mode;
} mbd_gpu_launch_rec;

int mbd_gpu_record_begin(mbd_gpu_ctx *ctx, mbd_error *err);
/* Stops recording; the list stays readable until the next begin. */
int mbd_gpu_record_end(mbd_gpu_ctx *ctx, mbd_error *err);
size_t mbd_gpu_record_count(const mbd_gpu_ctx *ctx);
const mbd_gpu_launch_rec *mbd_gpu_record_at(const mbd_gpu_ctx *ctx, size_t i);

/* Graph capture of everything enqueued between begin and end on the context's
 * stream. The graph keeps the route id and the launch manifest. */
int mbd_gpu_graph_begin(mbd_gpu_ctx *ctx, mbd_error *err);
int mbd_gpu_graph_end(mbd_gpu_ctx *ctx, mbd_gpu_graph **out, mbd_error *err);
/* Replays; MBD_E_STATE naming both ids when the context's route changed, or
 * when g belongs to another context. */
int mbd_gpu_graph_launch(mbd_gpu_ctx *ctx, const mbd_gpu_graph *g, mbd_error *err);
const char *mbd_gpu_graph_route_id(const mbd_gpu_graph *g);
size_t mbd_gpu_graph_launch_count(const mbd_gpu_graph *g);
const mbd_gpu_launch_rec *mbd_gpu_graph_launch_at(const mbd_gpu_graph *g, size_t i);
void mbd_gpu_graph_destroy(mbd_gpu_graph **g);
/* body(arg) on the context's stream: run directly when use_graph is 0, else
 * captured into *g on the first call and replayed from then on. A body that
 * fails during the capture leaves *g NULL and its error prefixed with
 * "capturing <what>: ". */
int mbd_gpu_graph_run(mbd_gpu_ctx *ctx, int use_graph, mbd_gpu_graph **g,
                      int (*body)(void *arg, mbd_error *err), void *arg, const char *what,
                      mbd_error *err);

/* Scratch: one device buffer, presized before capture and frozen by the first
 * capture. Returns a pointer to at least `bytes`; grows while not frozen; when
 * frozen and too small, MBD_E_STATE naming `what` (the shape that needed it). */
int mbd_gpu_scratch(mbd_gpu_ctx *ctx, size_t bytes, const char *what, void **out,
                    mbd_error *err);
size_t mbd_gpu_scratch_capacity(const mbd_gpu_ctx *ctx);
int mbd_gpu_scratch_frozen(const mbd_gpu_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
