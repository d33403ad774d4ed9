/* What the per-op kernels of kernels/cuda/ops/ share: the launch helpers,
 * the activation-dtype dispatch, the counter-based uniform of the sampler and
 * the synthetic weights, and the shapes of the decode fusion of the conv into
 * x_proj and the scan. The per-element arithmetic itself is in
 * kernels/cuda/mops_arith.cuh (shared with the persistent decode).
 *
 * Every rounding is spelled with an _rn intrinsic (__fmul_rn, __fadd_rn,
 * __fmaf_rn, __fdiv_rn, __fsqrt_rn) so nvcc can neither contract nor reorder
 * it, whatever --fmad says: that is what keeps these kernels on the CPU
 * reference's expression order. exp, log1p, SiLU and softplus are the
 * functions of kernels/portable_math.h, which the CPU ops also use (not CUDA's
 * expf/log1pf): f32 results are bit-identical to the CPU backend's.
 * Parallelism is only across independent elements (rows, sequences,
 * channels, state entries); each element's time steps and reductions run in
 * one fixed order.
 *
 * Each op file has three layers: the kernel, a launcher taking a stream and
 * typed pointers, and the exported C entry (declared in the op's C header)
 * that checks shapes and dtypes and dispatches. Internal to kernels/cuda/ops
 * (C++ only). */
#ifndef MBD_OPS_COMMON_CUH
#define MBD_OPS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <utility>

#include "kernels/cuda/gpu_check.h"
#include "kernels/cuda/mops_arith.cuh"
extern "C" {
#include "common/status.h"
#include "common/tensor.h"
}

/* k<<<grid, block, sh, s>>>(args...), with the programmatic-serialisation
 * attribute when pdl (kept by stream capture as a programmatic graph edge;
 * see pdl_wait in mops_arith.cuh). A launch error is not sticky: it is
 * cleared here and reported in err as "launching <what>: ...". */
template <typename... KArgs, typename... Args>
static int launch_ex(bool pdl, const char *what, void (*k)(KArgs...), dim3 grid, dim3 block,
                     size_t sh, cudaStream_t s, mbd_error *err, Args &&...args) {
  int rc = 0;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = sh;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  MBD_GPU_TRY(cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...), err);
  MBD_GPU_TRY(cudaGetLastError(), err);
  return 0;
fail:
  (void)cudaGetLastError();
  mbd_error_prefix(err, "launching %s", what);
  return rc;
}

/* The model kernels' launch: programmatic dependent launch (mamba_ops.h). */
template <typename... KArgs, typename... Args>
static int launch_pdl(const char *what, void (*k)(KArgs...), dim3 grid, dim3 block, size_t sh,
                      cudaStream_t s, mbd_error *err, Args &&...args) {
  return launch_ex(true, what, k, grid, block, sh, s, err, std::forward<Args>(args)...);
}

/* Where a model kernel lets its successor launch (pdl_enter): after its own
 * dependency wait (the default), or before it (the environment variable
 * MBD_PDL_EARLY=1), so the successor's blocks become resident and run their
 * prologue while this kernel still waits; measured slower in the Mamba-2
 * decode (docs/benchmarks.md), since the early blocks hold SM resources the
 * running kernel could use. Either order keeps the chain fully ordered:
 * every kernel still waits for its predecessor's completion before touching
 * its outputs, so the bits are the same. */
static inline bool pdl_early() {
  const char *e = getenv("MBD_PDL_EARLY");
  return e && e[0] == '1';
}
__device__ __forceinline__ void pdl_enter(bool early) {
  if (early) pdl_trigger();
  pdl_wait();
  if (!early) pdl_trigger();
}

/* Lets kernel k take sh bytes of dynamic shared memory (above the default 48 KiB). */
template <typename... KArgs>
static int allow_smem(void (*k)(KArgs...), size_t sh, mbd_error *err) {
  if (sh > 48 * 1024)
    MBD_GPU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh),
                  err);
  return 0;
}

/* Dispatches on the activation dtype: F(type) is instantiated for the three. */
#define MBD_ACT_DISPATCH(act, F)                                                        \
  switch (act) {                                                                        \
  case MBD_DTYPE_F32: F(float); break;                                                  \
  case MBD_DTYPE_BF16: F(__nv_bfloat16); break;                                         \
  case MBD_DTYPE_F16: F(__half); break;                                                 \
  default: return mbd_error_set(err, MBD_E_INVALID, "activation dtype %s unsupported", \
                                mbd_dtype_name(act));                                   \
  }

/* Counter-based uniform in (0, 1): splitmix64 finaliser over (seed, step,
 * index), top 24 bits, centred. Pure function of its inputs. */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float sample_uniform(uint64_t seed, uint64_t step, uint64_t idx) {
  uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull);
  z = mix64(z ^ (step * 0xd1b54a32d192ed03ull));
  z = mix64(z ^ (idx * 0x8cb92ba72f3d8dd7ull));
  return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* The decode fusion of the conv into x_proj and the scan (conv_xproj.cu,
 * scan.cu with a conv): its conv width, and the shapes it supports. */
#define XPF_KC 4
static inline bool conv_fusable(int T, int K, mbd_dtype act) {
  return T == 1 && K == XPF_KC && (act == MBD_DTYPE_BF16 || act == MBD_DTYPE_F16);
}

#endif
