/* Internal layout of mbd_gpu_ctx shared by gpu_ctx.cu and gpu_gemm.cu (C++ only). */
#ifndef MBD_GPU_CTX_IMPL_H
#define MBD_GPU_CTX_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/gpu_check.h"
extern "C" {
#include "kernels/cuda/gpu_ctx.h"
}

/* Kernel slots: index = dtype row * config + variant (see k_kernel_names). */
enum {
  MBD_K_SGEMM_F32 = 0,   /* s, m, l */
  MBD_K_SGEMM_TF32 = 3,  /* s, m, l */
  MBD_K_HGEMM_BF16 = 6,  /* s,m,n,l vec then s,m,n,l elementwise */
  MBD_K_HGEMM_F16 = 14,
  MBD_K_BCAST_U32 = 22,
  MBD_K_BCAST_U16 = 23,
  MBD_K_BCAST_BF16_F32 = 24,
  MBD_K_BCAST_F16_F32 = 25,
  MBD_K_WGEMM_BF16 = 26, /* sm_90a wgmma configurations 0..10 (gpu_gemm.cu k_wtiles) */
  MBD_K_WGEMM_F16 = 37,
  MBD_K_MKGEMM_BF16 = 48, /* sm_90a M <= 8, M <= 16: mma.sync chunk chains */
  MBD_K_MKGEMM_F16 = 50,
  MBD_K_MKRGEMM_BF16 = 52, /* sm_90a M <= 16, ragged column ranges: bf16, f16 */
  MBD_K_WGCL_BF16 = 54, /* sm_90a cluster / persistent tiles 0..8 (gpu_gemm.cu k_wcltiles) */
  MBD_K_WGCL_F16 = 63,
  MBD_K_WGKS_BF16 = 72, /* sm_90a K split tiles 0..3 (gpu_gemm.cu k_wkstiles) */
  MBD_K_WGKS_F16 = 76,
  MBD_K_COUNT = 80,
};
extern const char *const mbd_k_kernel_names[MBD_K_COUNT];

#define MBD_CUBLAS_WORKSPACE (32u << 20) /* fixed: presized so capture never allocates */

struct mbd_gpu_ctx {
  int device;                  /* CUDA device index */
  cudaStream_t stream;         /* the one non-blocking stream */
  cudaLibrary_t lib;           /* embedded fatbin */
  cudaKernel_t k[MBD_K_COUNT]; /* kernels by slot */
  cublasHandle_t blas;         /* created on first entry into a cuBLAS mode */
  void *blas_ws;               /* cuBLAS workspace, MBD_CUBLAS_WORKSPACE bytes */
  mbd_gemm_mode mode;
  mbd_dtype_policy policy;
  mbd_family family;
  int64_t state_capacity;
  mbd_state_dtype state;       /* models' state storage dtype (route) */
  mbd_decode_path decode;      /* which decode kernels the model may run (route) */
  char digest[65];             /* SHA-256 of the embedded fatbin */
  char dev_name[96];
  int cc_major, cc_minor, sm_count;
  int smem_optin; /* max dynamic shared memory per block (bytes) */
  int ks_fit[MBD_K_WGKS_F16 - MBD_K_WGKS_BF16]; /* K split tiles: co-resident blocks, 0 unknown */
  int unusable;                /* poisoned: every GEMM/capture/replay returns diag */
  mbd_error diag;
  int recording, capturing;
  mbd_gpu_launch_rec *recs;    /* recorded launches (recording or capturing) */
  size_t nrec, caprec;
  void *scratch;
  size_t scratch_cap;
  int scratch_frozen;
  mbd_gpu_fault fault;
};

extern "C" {
/* Appends a launch record when recording or capturing. */
int mbd_gpu_ctx_note_launch(mbd_gpu_ctx *ctx, const mbd_gpu_launch_rec *r, mbd_error *err);
/* Common entry guard: unusable check + current device. */
int mbd_gpu_ctx_enter(mbd_gpu_ctx *ctx, mbd_error *err);
}

#endif
