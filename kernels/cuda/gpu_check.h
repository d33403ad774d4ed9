/* One status-check generator for the CUDA runtime, the driver and cuBLAS.
 * Internal to the .cu files of kernels/cuda (C++ only): MBD_GPU_TRY(expr, err) runs
 * expr, and on failure records "<expr> failed: <name> (<code>) at file:line"
 * as MBD_E_DEVICE in err and jumps to the enclosing function's `fail:` label
 * with rc set; MBD_GPU_CHECK returns the status instead of jumping. A check
 * whose failure is not that error (a start-up message that says what to do,
 * MBD_E_NOMEM, a fallback) tests the status with mbd_gpu_status_ok and names
 * it with mbd_gpu_status_name, the same overloads. */
#ifndef MBD_GPU_CHECK_H
#define MBD_GPU_CHECK_H

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/status.h"
}

/* The three kinds share one shape: ok value and a name function. */
static inline const char *mbd_gpu_status_name(cudaError_t e) { return cudaGetErrorName(e); }
static inline const char *mbd_gpu_status_name(cublasStatus_t s) { return cublasGetStatusName(s); }
/* The driver is never linked (its entry points are not needed); name by number. */
static inline const char *mbd_gpu_status_name(CUresult r) {
  return r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUresult";
}
static inline bool mbd_gpu_status_ok(cudaError_t e) { return e == cudaSuccess; }
static inline bool mbd_gpu_status_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
static inline bool mbd_gpu_status_ok(CUresult r) { return r == CUDA_SUCCESS; }

template <typename S>
static inline int mbd_gpu_status_record(S s, const char *expr, const char *file, int line,
                                        mbd_error *err) {
  return mbd_error_set(err, MBD_E_DEVICE, "%s failed: %s (%d) at %s:%d", expr,
                       mbd_gpu_status_name(s), (int)s, file, line);
}

#define MBD_GPU_CHECK(expr, err)                                                       \
  do {                                                                                 \
    auto mbd_s_ = (expr);                                                              \
    if (!mbd_gpu_status_ok(mbd_s_))                                                    \
      return mbd_gpu_status_record(mbd_s_, #expr, __FILE__, __LINE__, (err));          \
  } while (0)

#define MBD_GPU_TRY(expr, err)                                                         \
  do {                                                                                 \
    auto mbd_s_ = (expr);                                                              \
    if (!mbd_gpu_status_ok(mbd_s_)) {                                                  \
      rc = mbd_gpu_status_record(mbd_s_, #expr, __FILE__, __LINE__, (err));            \
      goto fail;                                                                       \
    }                                                                                  \
  } while (0)

#endif
