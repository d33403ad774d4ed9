/* CUDA IPC helpers of libmambad (compiled only in builds with CUDA): export
 * a device allocation and an interprocess event as a request tensor ref, so a
 * GPU worker on the same host reads or writes the tensor in place. */
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
