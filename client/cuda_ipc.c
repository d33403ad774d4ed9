/* CUDA IPC helpers of libmambad (compiled only in builds with CUDA; see
 * cuda_ipc_none.c): export a device allocation and an interprocess event as
 * a request tensor, so a GPU worker on the same host reads or writes the
 * tensor in place.
 *
 * Legacy cudaIpcGetMemHandle handles, not CUDA VMM shareable handles
 * (cuMemExportToShareableHandle): a legacy handle is 64 bytes that travel
 * in the request body, works for every cudaMalloc allocation (what PyTorch's
 * and most callers' allocators hand out) and is opened by the worker with
 * one call; a VMM POSIX fd must be passed over a unix socket with
 * SCM_RIGHTS, which the broker's ZeroMQ hop cannot carry, and works only for
 * memory created with cuMemCreate and a shareable handle type
 * (docs/security.md, "CUDA IPC"). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "client/mambad.h"
#include "common/host_id.h"
#include "common/protocol.h"

int mbd_cuda_ipc_ref(const void *alloc_base, size_t alloc_bytes, uint64_t offset,
                     const mbd_tensor_desc *desc, const char *name, void *cuda_event,
                     mbd_tensor_ref *out, mbd_error *err) {
  size_t nbytes = 0;
  int rc = mbd_tensor_desc_nbytes(desc, &nbytes, err);
  if (rc) return rc;
  if (!alloc_base || offset > alloc_bytes || nbytes > alloc_bytes - offset)
    return mbd_error_set(err, MBD_E_INVALID,
                         "IPC tensor '%s': %zu bytes at offset %llu do not fit the %zu-byte "
                         "allocation",
                         name ? name : "", nbytes, (unsigned long long)offset, alloc_bytes);
  struct cudaPointerAttributes at;
  cudaError_t ce = cudaPointerGetAttributes(&at, alloc_base);
  if (ce != cudaSuccess || at.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return mbd_error_set(err, MBD_E_INVALID,
                         "IPC tensor '%s': the pointer is not device memory from cudaMalloc",
                         name ? name : "");
  }
  cudaIpcMemHandle_t h;
  if ((ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)alloc_base)) != cudaSuccess) {
    cudaGetLastError();
    return mbd_error_set(err, MBD_E_DEVICE, "cudaIpcGetMemHandle: %s", cudaGetErrorString(ce));
  }
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", name ? name : "");
  out->desc = *desc;
  out->kind = MBD_TREF_CUDA_IPC;
  out->device = at.device;
  out->offset = offset;
  out->size = nbytes;
  _Static_assert(sizeof h <= MBD_IPC_HANDLE_BYTES, "IPC handle size");
  memcpy(out->ipc_handle, &h, sizeof h);
  if (cuda_event) {
    cudaIpcEventHandle_t eh;
    if ((ce = cudaIpcGetEventHandle(&eh, (cudaEvent_t)cuda_event)) != cudaSuccess) {
      cudaGetLastError();
      return mbd_error_set(err, MBD_E_DEVICE,
                           "cudaIpcGetEventHandle: %s (create the event with "
                           "cudaEventInterprocess | cudaEventDisableTiming)",
                           cudaGetErrorString(ce));
    }
    _Static_assert(sizeof eh <= MBD_IPC_HANDLE_BYTES, "IPC event handle size");
    memcpy(out->ipc_event, &eh, sizeof eh);
    out->has_event = true;
  }
  return MBD_OK;
}

void mbd_client_host_id(char *buf, size_t cap) { mbd_host_id_get(buf, cap); }

typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

int mbd_tensor_device(const void *ptr, const mbd_tensor_desc *desc, void *cuda_event,
                      mbd_tensor_in *out, mbd_error *err) {
  mbd_tensor_desc d = *desc; /* desc may point into *out */
  memset(out, 0, sizeof *out);
  size_t nbytes = 0;
  int rc = mbd_tensor_desc_nbytes(&d, &nbytes, err);
  if (rc) return rc;
  struct cudaPointerAttributes at;
  cudaError_t ce = ptr ? cudaPointerGetAttributes(&at, ptr) : cudaErrorInvalidValue;
  if (ce != cudaSuccess || at.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return mbd_error_set(err, MBD_E_INVALID,
                         "device tensor: %p is not CUDA device memory of this process (%s)", ptr,
                         ce == cudaSuccess ? "host or managed memory" : cudaGetErrorName(ce));
  }
  /* The allocation's base and size: the handle names the whole allocation,
   * the worker adds the offset. Resolved through the runtime, so libmambad
   * does not link libcuda. */
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !fn) {
    cudaGetLastError();
    return mbd_error_set(err, MBD_E_DEVICE, "device tensor: cuMemGetAddressRange is unavailable");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult cr = ((addr_range_fn)fn)(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  if (cr != CUDA_SUCCESS)
    return mbd_error_set(err, MBD_E_INVALID,
                         "device tensor: %p is in no device allocation (CUresult %d)", ptr, (int)cr);
  uint64_t off = (uint64_t)((uintptr_t)ptr - (uintptr_t)base);
  if (off > size || nbytes > size - off)
    return mbd_error_set(err, MBD_E_INVALID,
                         "device tensor: %zu bytes at %p run past the end of its %zu-byte "
                         "allocation",
                         nbytes, ptr, size);
  cudaIpcMemHandle_t h;
  if ((ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base)) != cudaSuccess) {
    cudaGetLastError();
    return mbd_error_set(err, MBD_E_DEVICE,
                         "cudaIpcGetMemHandle: %s (the memory must come from cudaMalloc, not a "
                         "VMM or async-pool allocation)",
                         cudaGetErrorString(ce));
  }
  _Static_assert(sizeof h <= sizeof out->ipc_.mem, "IPC handle size");
  memcpy(out->ipc_.mem, &h, sizeof h);
  if (cuda_event) {
    cudaIpcEventHandle_t eh;
    if ((ce = cudaIpcGetEventHandle(&eh, (cudaEvent_t)cuda_event)) != cudaSuccess) {
      cudaGetLastError();
      return mbd_error_set(err, MBD_E_DEVICE,
                           "cudaIpcGetEventHandle: %s (create the event with "
                           "cudaEventInterprocess | cudaEventDisableTiming)",
                           cudaGetErrorString(ce));
    }
    _Static_assert(sizeof eh <= sizeof out->ipc_.event, "IPC event handle size");
    memcpy(out->ipc_.event, &eh, sizeof eh);
    out->ipc_.has_event = true;
  }
  out->desc = d;
  out->device = ptr;
  out->ipc_.offset = off;
  out->ipc_.device = at.device;
  return MBD_OK;
}
