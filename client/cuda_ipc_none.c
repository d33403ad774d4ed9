/* The CUDA IPC calls of libmambad in builds without CUDA (cuda_ipc.c holds
 * the real ones): device tensors are refused with a message saying why. */
#include <string.h>

#include "client/mambad.h"
#include "common/host_id.h"

void mbd_client_host_id(char *buf, size_t cap) { mbd_host_id_get(buf, cap); }

int mbd_tensor_device(const void *ptr, const mbd_tensor_desc *desc, void *cuda_event,
                      mbd_tensor_in *out, mbd_error *err) {
  (void)ptr, (void)desc, (void)cuda_event;
  memset(out, 0, sizeof *out);
  return mbd_error_set(err, MBD_E_UNSUPPORTED,
                       "device tensors need a libmambad built with CUDA (this one is not): send "
                       "host bytes or shm");
}

int mbd_cuda_ipc_ref(const void *alloc_base, size_t alloc_bytes, uint64_t offset,
                     const mbd_tensor_desc *desc, const char *name, void *cuda_event,
                     struct mbd_tensor_ref *out, mbd_error *err) {
  (void)alloc_base, (void)alloc_bytes, (void)offset, (void)desc, (void)name, (void)cuda_event,
      (void)out;
  return mbd_error_set(err, MBD_E_UNSUPPORTED,
                       "CUDA IPC refs need a libmambad built with CUDA (this one is not)");
}
