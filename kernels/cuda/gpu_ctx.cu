/* GPU compute context: device validation, kernel loading from the embedded
 * fatbin, GEMM mode transitions (with cuBLAS math-mode rollback and the
 * unusable state), route identity, route recording, graph capture/replay
 * guards and frozen scratch. See gpu_ctx.h for the contract. */
#include <library_types.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gpu_ctx_impl.h"
extern "C" {
#include "common/sha256.h"
}

extern "C" const unsigned char mbd_gemm_fatbin[];
extern "C" const size_t mbd_gemm_fatbin_len;
extern "C" const unsigned char mbd_model_fatbin[]; /* the ops (ops/), then decode_persistent.cu */
extern "C" const size_t mbd_model_fatbin_len;
extern "C" const unsigned char mbd_model_host_src[]; /* mamba1_gpu*.cu, _impl.h, portable_math.h */
extern "C" const size_t mbd_model_host_src_len;

#ifndef MBD_CUDA_ARCHS
#define MBD_CUDA_ARCHS ""
#endif
#define MBD_CUDA_DISPATCH_REV 4 /* 3: sm_90a bf16/f16 on wgmma + TMA; 4: K in 256 chunks */

const char *const mbd_k_kernel_names[MBD_K_COUNT] = {
    "mbd_sgemm_f32_s",       "mbd_sgemm_f32_m",       "mbd_sgemm_f32_l",
    "mbd_sgemm_tf32_s",      "mbd_sgemm_tf32_m",      "mbd_sgemm_tf32_l",
    "mbd_hgemm_bf16_s_v",    "mbd_hgemm_bf16_m_v",    "mbd_hgemm_bf16_n_v",
    "mbd_hgemm_bf16_l_v",    "mbd_hgemm_bf16_s_e",    "mbd_hgemm_bf16_m_e",
    "mbd_hgemm_bf16_n_e",    "mbd_hgemm_bf16_l_e",    "mbd_hgemm_f16_s_v",
    "mbd_hgemm_f16_m_v",     "mbd_hgemm_f16_n_v",     "mbd_hgemm_f16_l_v",
    "mbd_hgemm_f16_s_e",     "mbd_hgemm_f16_m_e",     "mbd_hgemm_f16_n_e",
    "mbd_hgemm_f16_l_e",     "mbd_bcast_rows_u32",    "mbd_bcast_rows_u16",
    "mbd_bcast_rows_bf16_f32", "mbd_bcast_rows_f16_f32",
    "mbd_wgemm_bf16_0", "mbd_wgemm_bf16_1", "mbd_wgemm_bf16_2", "mbd_wgemm_bf16_3",
    "mbd_wgemm_bf16_4", "mbd_wgemm_bf16_5", "mbd_wgemm_bf16_6", "mbd_wgemm_bf16_7",
    "mbd_wgemm_bf16_8", "mbd_wgemm_bf16_9", "mbd_wgemm_bf16_10",
    "mbd_wgemm_f16_0",  "mbd_wgemm_f16_1",  "mbd_wgemm_f16_2",  "mbd_wgemm_f16_3",
    "mbd_wgemm_f16_4",  "mbd_wgemm_f16_5",  "mbd_wgemm_f16_6",  "mbd_wgemm_f16_7",
    "mbd_wgemm_f16_8",  "mbd_wgemm_f16_9",  "mbd_wgemm_f16_10",
    "mbd_mkgemm_bf16_8", "mbd_mkgemm_bf16_16", "mbd_mkgemm_f16_8", "mbd_mkgemm_f16_16",
    "mbd_mkrgemm_bf16", "mbd_mkrgemm_f16",
    "mbd_wgcl_bf16_0", "mbd_wgcl_bf16_1", "mbd_wgcl_bf16_2", "mbd_wgcl_bf16_3",
    "mbd_wgcl_bf16_4", "mbd_wgcl_bf16_5", "mbd_wgcl_bf16_6", "mbd_wgcl_bf16_7",
    "mbd_wgcl_bf16_8",
    "mbd_wgcl_f16_0",  "mbd_wgcl_f16_1",  "mbd_wgcl_f16_2",  "mbd_wgcl_f16_3",
    "mbd_wgcl_f16_4",  "mbd_wgcl_f16_5",  "mbd_wgcl_f16_6",  "mbd_wgcl_f16_7",
    "mbd_wgcl_f16_8",
    "mbd_wgks_bf16_0", "mbd_wgks_bf16_1", "mbd_wgks_bf16_2", "mbd_wgks_bf16_3",
    "mbd_wgks_f16_0",  "mbd_wgks_f16_1",  "mbd_wgks_f16_2",  "mbd_wgks_f16_3",
};

extern "C" void mbd_gpu_ctx_config_default(mbd_gpu_ctx_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->device = 0;
  cfg->mode = MBD_GEMM_DETERMINISTIC;
  cfg->policy = MBD_POLICY_BF16;
  cfg->family = MBD_FAMILY_INFERENCE;
  cfg->state_capacity = 1;
  cfg->state = MBD_STATE_F32;
  cfg->decode = MBD_DECODE_PERSISTENT;
}

extern "C" void mbd_gpu_kernel_digest(char out[65]) {
  /* GEMM fatbin, then the model kernels' fatbin and the model's host source:
   * a change to any of them changes the route. */
  uint8_t d[32];
  mbd_sha256_ctx h;
  mbd_sha256_init(&h);
  mbd_sha256_update(&h, mbd_gemm_fatbin, mbd_gemm_fatbin_len);
  mbd_sha256_update(&h, mbd_model_fatbin, mbd_model_fatbin_len);
  mbd_sha256_update(&h, mbd_model_host_src, mbd_model_host_src_len);
  mbd_sha256_final(&h, d);
  mbd_sha256_hex(d, out);
}

extern "C" int mbd_gpu_ctx_enter(mbd_gpu_ctx *ctx, mbd_error *err) {
  if (!ctx) return mbd_error_set(err, MBD_E_INVALID, "GPU context is NULL");
  if (ctx->unusable) {
    if (err) *err = ctx->diag;
    return MBD_E_UNUSABLE;
  }
  MBD_GPU_CHECK(cudaSetDevice(ctx->device), err);
  return MBD_OK;
}

/* Validates the device and fills identity fields. */
static int probe_device(mbd_gpu_ctx *ctx, int dev, mbd_error *err) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (!mbd_gpu_status_ok(e) || count == 0) {
    (void)cudaGetLastError(); /* clear the sticky-free error so later probes start clean */
    return mbd_error_set(err, MBD_E_DEVICE,
                         "no CUDA device: cudaGetDeviceCount returned %s (%s), %d devices; "
                         "run on a machine with an NVIDIA GPU and driver, or use the cpu backend",
                         mbd_gpu_status_name(e), cudaGetErrorString(e), count);
  }
  if (dev < 0 || dev >= count)
    return mbd_error_set(err, MBD_E_INVALID, "CUDA device %d does not exist (%d devices: 0..%d)",
                         dev, count, count - 1);
  MBD_GPU_CHECK(cudaSetDevice(dev), err);
  cudaDeviceProp prop;
  MBD_GPU_CHECK(cudaGetDeviceProperties(&prop, dev), err);
  int sm1 = 0, sm2 = 0;
  MBD_GPU_CHECK(cudaDeviceGetAttribute(&sm1, cudaDevAttrMultiProcessorCount, dev), err);
  MBD_GPU_CHECK(cudaDeviceGetAttribute(&sm2, cudaDevAttrMultiProcessorCount, dev), err);
  if (sm1 != sm2 || sm1 <= 0 || sm1 != prop.multiProcessorCount)
    return mbd_error_set(err, MBD_E_DEVICE,
                         "CUDA device %d reports an unstable SM count (%d, %d, %d): MIG or "
                         "driver change in progress; refusing to build a route on it",
                         dev, sm1, sm2, prop.multiProcessorCount);
  if (prop.major < 8)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "CUDA device %d (%s) has compute capability %d.%d; the kernels need "
                         ">= 8.0 (bf16 mma)", dev, prop.name, prop.major, prop.minor);
  ctx->device = dev;
  snprintf(ctx->dev_name, sizeof ctx->dev_name, "%.95s", prop.name);
  ctx->cc_major = prop.major;
  ctx->cc_minor = prop.minor;
  ctx->sm_count = sm1;
  return MBD_OK;
}

static int load_kernels(mbd_gpu_ctx *ctx, mbd_error *err) {
  cudaError_t e = cudaLibraryLoadData(&ctx->lib, mbd_gemm_fatbin, NULL, NULL, 0, NULL, NULL, 0);
  if (!mbd_gpu_status_ok(e))
    return mbd_error_set(err, MBD_E_DEVICE,
                         "loading the embedded GEMM kernels failed: %s; built for CUDA archs "
                         "'%s', device is sm_%d%d: rebuild with -DCMAKE_CUDA_ARCHITECTURES "
                         "covering it", mbd_gpu_status_name(e), MBD_CUDA_ARCHS, ctx->cc_major,
                         ctx->cc_minor);
  int max_optin = 0;
  MBD_GPU_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       ctx->device), err);
  ctx->smem_optin = max_optin;
  for (int i = 0; i < MBD_K_COUNT; i++) {
    MBD_GPU_CHECK(cudaLibraryGetKernel(&ctx->k[i], ctx->lib, mbd_k_kernel_names[i]), err);
    if ((i >= MBD_K_HGEMM_BF16 && i < MBD_K_BCAST_U32) || i >= MBD_K_WGEMM_BF16)
      MBD_GPU_CHECK(cudaFuncSetAttribute((const void *)ctx->k[i],
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max_optin),
                    err);
  }
  return MBD_OK;
}

static int math_mode_for(mbd_gemm_mode m) {
  return m == MBD_GEMM_CUBLAS_PEDANTIC ? (int)CUBLAS_PEDANTIC_MATH
                                       : (int)CUBLAS_TF32_TENSOR_OP_MATH;
}

/* Reads the handle's math mode; the verify fault makes a verification read lie. */
static int read_math(mbd_gpu_ctx *ctx, cublasMath_t *out, int verify, mbd_error *err) {
  MBD_GPU_CHECK(cublasGetMathMode(ctx->blas, out), err);
  if (verify && ctx->fault.math_verify_wrong > 0) {
    ctx->fault.math_verify_wrong--;
    *out = (cublasMath_t)((int)*out ^ 0x40);
  }
  return MBD_OK;
}

/* Sets the math mode; the set fault applies a bogus mode and then "fails". */
static int write_math(mbd_gpu_ctx *ctx, cublasMath_t m, mbd_error *err) {
  if (ctx->fault.math_set_fails > 0) {
    ctx->fault.math_set_fails--;
    (void)cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH);
    return mbd_error_set(err, MBD_E_DEVICE,
                         "cublasSetMathMode(%d) failed: CUBLAS_STATUS_INTERNAL_ERROR (injected)",
                         (int)m);
  }
  MBD_GPU_CHECK(cublasSetMathMode(ctx->blas, m), err);
  return MBD_OK;
}

static int ensure_blas(mbd_gpu_ctx *ctx, mbd_error *err) {
  int rc = MBD_OK;
  if (ctx->blas) return MBD_OK;
  MBD_GPU_TRY(cudaMalloc(&ctx->blas_ws, MBD_CUBLAS_WORKSPACE), err);
  MBD_GPU_TRY(cublasCreate(&ctx->blas), err);
  MBD_GPU_TRY(cublasSetStream(ctx->blas, ctx->stream), err);
  MBD_GPU_TRY(cublasSetWorkspace(ctx->blas, ctx->blas_ws, MBD_CUBLAS_WORKSPACE), err);
  return MBD_OK;
fail:
  if (ctx->blas) cublasDestroy(ctx->blas);
  ctx->blas = NULL;
  cudaFree(ctx->blas_ws);
  ctx->blas_ws = NULL;
  return rc;
}

/* Moves into a cuBLAS mode: read, set, verify; on failure restore and verify,
 * else poison the context. */
static int apply_blas_mode(mbd_gpu_ctx *ctx, mbd_gemm_mode mode, mbd_error *err) {
  int rc = ensure_blas(ctx, err);
  if (rc < 0) return rc;
  cublasMath_t prev, now;
  rc = read_math(ctx, &prev, 0, err);
  if (rc < 0) return rc;
  cublasMath_t want = (cublasMath_t)math_mode_for(mode);
  mbd_error why;
  mbd_error_clear(&why);
  rc = write_math(ctx, want, &why);
  if (rc == MBD_OK) {
    rc = read_math(ctx, &now, 1, &why);
    if (rc == MBD_OK && now != want)
      rc = mbd_error_set(&why, MBD_E_DEVICE, "cuBLAS math mode reads back %d after setting %d",
                         (int)now, (int)want);
    if (rc == MBD_OK) return MBD_OK;
  }
  /* Roll back and prove it. */
  mbd_error rb;
  mbd_error_clear(&rb);
  int rrc = write_math(ctx, prev, &rb);
  if (rrc == MBD_OK) rrc = read_math(ctx, &now, 1, &rb);
  if (rrc == MBD_OK && now != prev)
    rrc = mbd_error_set(&rb, MBD_E_DEVICE, "math mode reads back %d, expected %d", (int)now,
                        (int)prev);
  if (rrc == MBD_OK)
    return mbd_error_set(err, MBD_E_DEVICE,
                         "changing GEMM mode %s -> %s failed (%s); cuBLAS math mode restored "
                         "and verified, mode unchanged", mbd_gemm_mode_name(ctx->mode),
                         mbd_gemm_mode_name(mode), why.msg);
  ctx->unusable = 1;
  mbd_error_set(&ctx->diag, MBD_E_UNUSABLE,
                "GPU context unusable: changing GEMM mode %s -> %s failed (%s) and restoring "
                "the cuBLAS math mode could not be verified (%s); destroy and recreate the "
                "context", mbd_gemm_mode_name(ctx->mode), mbd_gemm_mode_name(mode), why.msg,
                rb.msg);
  if (err) *err = ctx->diag;
  return MBD_E_UNUSABLE;
}

extern "C" int mbd_gpu_ctx_set_mode(mbd_gpu_ctx *ctx, mbd_gemm_mode mode, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  if ((int)mode < 0 || (int)mode > (int)MBD_GEMM_CUBLAS_PEDANTIC)
    return mbd_error_set(err, MBD_E_INVALID, "invalid GEMM mode %d", (int)mode);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  MBD_GPU_CHECK(cudaStreamIsCapturing(ctx->stream, &cs), err);
  if (ctx->capturing || cs != cudaStreamCaptureStatusNone)
    return mbd_error_set(err, MBD_E_STATE,
                         "GEMM mode change to %s refused: a CUDA graph is being captured on "
                         "this context; end the capture first", mbd_gemm_mode_name(mode));
  if (ctx->recording)
    return mbd_error_set(err, MBD_E_STATE,
                         "GEMM mode change to %s refused: GEMM routes are being recorded; call "
                         "mbd_gpu_record_end first", mbd_gemm_mode_name(mode));
  if (mode == ctx->mode) return MBD_OK;
  if (mode != MBD_GEMM_DETERMINISTIC) {
    rc = apply_blas_mode(ctx, mode, err);
    if (rc < 0) return rc;
  }
  /* Entering deterministic touches no cuBLAS state: cuBLAS is simply never called. */
  ctx->mode = mode;
  return MBD_OK;
}

extern "C" mbd_gemm_mode mbd_gpu_ctx_mode(const mbd_gpu_ctx *ctx) { return ctx->mode; }

extern "C" int mbd_gpu_ctx_unusable(const mbd_gpu_ctx *ctx, mbd_error *err) {
  if (ctx->unusable && err) *err = ctx->diag;
  return ctx->unusable;
}

extern "C" void *mbd_gpu_ctx_stream(mbd_gpu_ctx *ctx) { return (void *)ctx->stream; }

extern "C" int mbd_gpu_ctx_sync(mbd_gpu_ctx *ctx, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  MBD_GPU_CHECK(cudaStreamSynchronize(ctx->stream), err);
  return MBD_OK;
}

extern "C" int mbd_gpu_ctx_new(const mbd_gpu_ctx_config *cfg, mbd_gpu_ctx **out,
                               mbd_error *err) {
  int rc = MBD_OK;
  mbd_gpu_ctx *ctx = NULL;
  if (!cfg || !out) return mbd_error_set(err, MBD_E_INVALID, "mbd_gpu_ctx_new: NULL argument");
  *out = NULL;
  if ((int)cfg->mode < 0 || (int)cfg->mode > (int)MBD_GEMM_CUBLAS_PEDANTIC ||
      (int)cfg->policy < 0 || (int)cfg->policy > (int)MBD_POLICY_F16)
    return mbd_error_set(err, MBD_E_INVALID, "GPU context config: invalid mode %d or policy %d",
                         (int)cfg->mode, (int)cfg->policy);
  if (cfg->family != MBD_FAMILY_INFERENCE)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "GPU context: family '%s' is not implemented by the CUDA backend yet "
                         "(only 'inference')", mbd_family_name(cfg->family));
  if (cfg->state_capacity < 0)
    return mbd_error_set(err, MBD_E_INVALID, "GPU context: state_capacity %lld < 0",
                         (long long)cfg->state_capacity);
  if (cfg->decode != MBD_DECODE_PER_OP && cfg->decode != MBD_DECODE_PERSISTENT)
    return mbd_error_set(err, MBD_E_INVALID, "GPU context config: invalid decode path %d",
                         (int)cfg->decode);
  if (cfg->state != MBD_STATE_F32 && cfg->state != MBD_STATE_BF16)
    return mbd_error_set(err, MBD_E_INVALID, "GPU context config: invalid state dtype %d",
                         (int)cfg->state);
  ctx = (mbd_gpu_ctx *)calloc(1, sizeof *ctx);
  if (!ctx) return mbd_error_set(err, MBD_E_NOMEM, "GPU context: out of host memory");
  ctx->mode = MBD_GEMM_DETERMINISTIC;
  ctx->policy = cfg->policy;
  ctx->family = cfg->family;
  ctx->state_capacity = cfg->state_capacity;
  ctx->state = cfg->state;
  ctx->decode = cfg->decode;
  ctx->fault = cfg->fault;
  mbd_gpu_kernel_digest(ctx->digest);
  rc = probe_device(ctx, cfg->device, err);
  if (rc < 0) goto fail;
  MBD_GPU_TRY(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking), err);
  rc = load_kernels(ctx, err);
  if (rc < 0) goto fail;
  if (cfg->scratch_bytes) {
    MBD_GPU_TRY(cudaMalloc(&ctx->scratch, cfg->scratch_bytes), err);
    ctx->scratch_cap = cfg->scratch_bytes;
  }
  if (cfg->mode != MBD_GEMM_DETERMINISTIC) {
    rc = mbd_gpu_ctx_set_mode(ctx, cfg->mode, err);
    if (rc < 0) goto fail;
  }
  *out = ctx;
  return MBD_OK;
fail:
  mbd_gpu_ctx_destroy(&ctx);
  return rc;
}

extern "C" void mbd_gpu_ctx_destroy(mbd_gpu_ctx **pctx) {
  if (!pctx || !*pctx) return;
  mbd_gpu_ctx *ctx = *pctx;
  if (ctx->sm_count > 0) (void)cudaSetDevice(ctx->device);
  if (ctx->stream) {
    if (ctx->capturing) {
      cudaGraph_t g = NULL;
      (void)cudaStreamEndCapture(ctx->stream, &g);
      if (g) cudaGraphDestroy(g);
    }
    (void)cudaStreamSynchronize(ctx->stream);
  }
  if (ctx->blas) cublasDestroy(ctx->blas);
  cudaFree(ctx->blas_ws);
  cudaFree(ctx->scratch);
  if (ctx->lib) cudaLibraryUnload(ctx->lib);
  if (ctx->stream) cudaStreamDestroy(ctx->stream);
  free(ctx->recs);
  free(ctx);
  *pctx = NULL;
}

/* ---- memory helpers ---- */

extern "C" int mbd_gpu_alloc(mbd_gpu_ctx *ctx, size_t bytes, void **out, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  *out = NULL;
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
  if (!mbd_gpu_status_ok(e))
    return mbd_error_set(err, e == cudaErrorMemoryAllocation ? MBD_E_NOMEM : MBD_E_DEVICE,
                         "cudaMalloc(%zu bytes) on device %d failed: %s", bytes, ctx->device,
                         mbd_gpu_status_name(e));
  return MBD_OK;
}

extern "C" void mbd_gpu_free(mbd_gpu_ctx *ctx, void *p) {
  if (!p) return;
  if (ctx) (void)cudaSetDevice(ctx->device);
  cudaFree(p);
}

extern "C" int mbd_gpu_upload(mbd_gpu_ctx *ctx, void *dst, const void *src, size_t bytes,
                              mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  MBD_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err);
  MBD_GPU_CHECK(cudaStreamSynchronize(ctx->stream), err);
  return MBD_OK;
}

extern "C" int mbd_gpu_download(mbd_gpu_ctx *ctx, void *dst, const void *src, size_t bytes,
                                mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  MBD_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx->stream), err);
  MBD_GPU_CHECK(cudaStreamSynchronize(ctx->stream), err);
  return MBD_OK;
}

extern "C" int mbd_gpu_memset(mbd_gpu_ctx *ctx, void *dst, int byte, size_t bytes,
                              mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  MBD_GPU_CHECK(cudaMemsetAsync(dst, byte, bytes, ctx->stream), err);
  return MBD_OK;
}

/* ---- route identity ---- */

static void isa_name(const mbd_gpu_ctx *ctx, char *buf, size_t cap) {
  char want[16];
  snprintf(want, sizeof want, "%d%da", ctx->cc_major, ctx->cc_minor);
  /* The arch-specific target ("90a") is what loads when the build has it. */
  const char *archs = MBD_CUDA_ARCHS;
  const char *p = strstr(archs, want);
  int has_a = p && (p == archs || p[-1] == ';' || p[-1] == ' ');
  snprintf(buf, cap, "sm_%d%d%s", ctx->cc_major, ctx->cc_minor, has_a ? "a" : "");
}

extern "C" int mbd_gpu_ctx_route(const mbd_gpu_ctx *ctx, mbd_route_identity *r, mbd_error *err) {
  if (!ctx || !r) return mbd_error_set(err, MBD_E_INVALID, "mbd_gpu_ctx_route: NULL argument");
  memset(r, 0, sizeof *r);
  r->mode = ctx->mode;
  r->policy = ctx->policy;
  r->state = ctx->state;
  r->family = ctx->family;
  r->backend = MBD_BACKEND_CUDA;
  isa_name(ctx, r->isa, sizeof r->isa);
  memcpy(r->kernel_digest, ctx->digest, sizeof r->kernel_digest);
  snprintf(r->compiler, sizeof r->compiler, "nvcc %d.%d.%d", __CUDACC_VER_MAJOR__,
           __CUDACC_VER_MINOR__, __CUDACC_VER_BUILD__);
  snprintf(r->device_name, sizeof r->device_name, "%.95s", ctx->dev_name);
  r->cc_major = ctx->cc_major;
  r->cc_minor = ctx->cc_minor;
  r->sm_count = ctx->sm_count;
  if (ctx->mode != MBD_GEMM_DETERMINISTIC) {
    int ma = 0, mi = 0, pa = 0;
    MBD_GPU_CHECK(cublasGetProperty(MAJOR_VERSION, &ma), err);
    MBD_GPU_CHECK(cublasGetProperty(MINOR_VERSION, &mi), err);
    MBD_GPU_CHECK(cublasGetProperty(PATCH_LEVEL, &pa), err);
    snprintf(r->libraries, sizeof r->libraries, "cublas %d.%d.%d", ma, mi, pa);
  }
  r->dispatch_rev = MBD_CUDA_DISPATCH_REV;
  r->decode = ctx->decode;
  r->state_capacity = ctx->state_capacity;
  return MBD_OK;
}

/* ---- recording ---- */

extern "C" int mbd_gpu_ctx_note_launch(mbd_gpu_ctx *ctx, const mbd_gpu_launch_rec *r,
                                       mbd_error *err) {
  if (!ctx->recording && !ctx->capturing) return MBD_OK;
  if (ctx->nrec == ctx->caprec) {
    size_t cap = ctx->caprec ? ctx->caprec * 2 : 64;
    mbd_gpu_launch_rec *n =
        (mbd_gpu_launch_rec *)realloc(ctx->recs, cap * sizeof *n);
    if (!n) return mbd_error_set(err, MBD_E_NOMEM, "route recording: out of host memory");
    ctx->recs = n;
    ctx->caprec = cap;
  }
  ctx->recs[ctx->nrec++] = *r;
  return MBD_OK;
}

extern "C" int mbd_gpu_record_begin(mbd_gpu_ctx *ctx, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  if (ctx->capturing)
    return mbd_error_set(err, MBD_E_STATE, "route recording cannot start during graph capture");
  if (ctx->recording) return mbd_error_set(err, MBD_E_STATE, "route recording already active");
  ctx->recording = 1;
  ctx->nrec = 0;
  return MBD_OK;
}

extern "C" int mbd_gpu_record_end(mbd_gpu_ctx *ctx, mbd_error *err) {
  if (!ctx) return mbd_error_set(err, MBD_E_INVALID, "GPU context is NULL");
  if (!ctx->recording) return mbd_error_set(err, MBD_E_STATE, "route recording is not active");
  ctx->recording = 0;
  return MBD_OK;
}

extern "C" size_t mbd_gpu_record_count(const mbd_gpu_ctx *ctx) { return ctx->nrec; }
extern "C" const mbd_gpu_launch_rec *mbd_gpu_record_at(const mbd_gpu_ctx *ctx, size_t i) {
  return i < ctx->nrec ? &ctx->recs[i] : NULL;
}

/* ---- graphs ---- */

struct mbd_gpu_graph {
  const mbd_gpu_ctx *owner;
  cudaGraphExec_t exec;
  char route_id[65];
  mbd_gpu_launch_rec *recs;
  size_t nrec;
};

static int route_id_of(const mbd_gpu_ctx *ctx, char id[65], mbd_error *err) {
  mbd_route_identity r;
  int rc = mbd_gpu_ctx_route(ctx, &r, err);
  if (rc < 0) return rc;
  mbd_route_id_hex(&r, id);
  return MBD_OK;
}

extern "C" int mbd_gpu_graph_begin(mbd_gpu_ctx *ctx, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  if (ctx->capturing) return mbd_error_set(err, MBD_E_STATE, "graph capture already active");
  if (ctx->recording)
    return mbd_error_set(err, MBD_E_STATE, "graph capture cannot start while recording routes");
  MBD_GPU_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal), err);
  ctx->capturing = 1;
  ctx->nrec = 0;
  ctx->scratch_frozen = 1; /* pointers baked into the graph must never move */
  return MBD_OK;
}

extern "C" int mbd_gpu_graph_end(mbd_gpu_ctx *ctx, mbd_gpu_graph **out, mbd_error *err) {
  int rc = MBD_OK;
  cudaGraph_t g = NULL;
  mbd_gpu_graph *gr = NULL;
  if (!ctx || !out) return mbd_error_set(err, MBD_E_INVALID, "mbd_gpu_graph_end: NULL argument");
  *out = NULL;
  if (!ctx->capturing) return mbd_error_set(err, MBD_E_STATE, "no graph capture is active");
  ctx->capturing = 0;
  MBD_GPU_TRY(cudaSetDevice(ctx->device), err);
  MBD_GPU_TRY(cudaStreamEndCapture(ctx->stream, &g), err);
  if (ctx->unusable) {
    if (err) *err = ctx->diag;
    rc = MBD_E_UNUSABLE;
    goto fail;
  }
  gr = (mbd_gpu_graph *)calloc(1, sizeof *gr);
  if (!gr) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "graph: out of host memory");
    goto fail;
  }
  gr->owner = ctx;
  rc = route_id_of(ctx, gr->route_id, err);
  if (rc < 0) goto fail;
  if (ctx->nrec) {
    gr->recs = (mbd_gpu_launch_rec *)malloc(ctx->nrec * sizeof *gr->recs);
    if (!gr->recs) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "graph: out of host memory");
      goto fail;
    }
    memcpy(gr->recs, ctx->recs, ctx->nrec * sizeof *gr->recs);
    gr->nrec = ctx->nrec;
  }
  MBD_GPU_TRY(cudaGraphInstantiate(&gr->exec, g, 0), err);
  cudaGraphDestroy(g);
  *out = gr;
  return MBD_OK;
fail:
  if (gr) {
    free(gr->recs);
    free(gr);
  }
  if (g) cudaGraphDestroy(g);
  return rc;
}

extern "C" int mbd_gpu_graph_launch(mbd_gpu_ctx *ctx, const mbd_gpu_graph *g, mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  if (!g) return mbd_error_set(err, MBD_E_INVALID, "graph is NULL");
  if (g->owner != ctx)
    return mbd_error_set(err, MBD_E_STATE, "graph was captured on another GPU context");
  if (ctx->capturing)
    return mbd_error_set(err, MBD_E_STATE, "graph replay refused during a capture");
  char now[65];
  rc = route_id_of(ctx, now, err);
  if (rc < 0) return rc;
  if (strcmp(now, g->route_id) != 0)
    return mbd_error_set(err, MBD_E_STATE,
                         "graph replay refused: captured under route %.16s, context now on "
                         "route %.16s (mode %s); capture the graph again",
                         g->route_id, now, mbd_gemm_mode_name(ctx->mode));
  MBD_GPU_CHECK(cudaGraphLaunch(g->exec, ctx->stream), err);
  return MBD_OK;
}

extern "C" const char *mbd_gpu_graph_route_id(const mbd_gpu_graph *g) { return g->route_id; }
extern "C" size_t mbd_gpu_graph_launch_count(const mbd_gpu_graph *g) { return g->nrec; }
extern "C" const mbd_gpu_launch_rec *mbd_gpu_graph_launch_at(const mbd_gpu_graph *g, size_t i) {
  return i < g->nrec ? &g->recs[i] : NULL;
}

extern "C" void mbd_gpu_graph_destroy(mbd_gpu_graph **pg) {
  if (!pg || !*pg) return;
  if ((*pg)->exec) cudaGraphExecDestroy((*pg)->exec);
  free((*pg)->recs);
  free(*pg);
  *pg = NULL;
}

extern "C" int mbd_gpu_graph_run(mbd_gpu_ctx *ctx, int use_graph, mbd_gpu_graph **g,
                                 int (*body)(void *arg, mbd_error *err), void *arg,
                                 const char *what, mbd_error *err) {
  if (!use_graph) return body(arg, err);
  if (!*g) {
    int rc = mbd_gpu_graph_begin(ctx, err);
    if (rc) return rc;
    const int brc = body(arg, err);
    mbd_error ignored;
    const int erc = mbd_gpu_graph_end(ctx, g, brc ? &ignored : err);
    if (brc) { /* the body's error is the one to report; the capture is dropped */
      mbd_gpu_graph_destroy(g);
      return mbd_error_prefix(err, "capturing %s", what);
    }
    if (erc) return erc;
  }
  return mbd_gpu_graph_launch(ctx, *g, err);
}

/* ---- scratch ---- */

extern "C" int mbd_gpu_scratch(mbd_gpu_ctx *ctx, size_t bytes, const char *what, void **out,
                               mbd_error *err) {
  int rc = mbd_gpu_ctx_enter(ctx, err);
  if (rc < 0) return rc;
  if (bytes <= ctx->scratch_cap) {
    *out = ctx->scratch;
    return MBD_OK;
  }
  if (ctx->scratch_frozen || ctx->capturing)
    return mbd_error_set(err, MBD_E_STATE,
                         "scratch is frozen at %zu bytes (a graph was captured) but %s needs %zu "
                         "bytes; presize scratch_bytes before capture", ctx->scratch_cap,
                         what ? what : "a call", bytes);
  void *p = NULL;
  MBD_GPU_CHECK(cudaStreamSynchronize(ctx->stream), err);
  MBD_GPU_CHECK(cudaMalloc(&p, bytes), err);
  cudaFree(ctx->scratch);
  ctx->scratch = p;
  ctx->scratch_cap = bytes;
  *out = p;
  return MBD_OK;
}

extern "C" size_t mbd_gpu_scratch_capacity(const mbd_gpu_ctx *ctx) { return ctx->scratch_cap; }
extern "C" int mbd_gpu_scratch_frozen(const mbd_gpu_ctx *ctx) { return ctx->scratch_frozen; }
