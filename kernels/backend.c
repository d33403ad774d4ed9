/* Backend-independent parts of the backend interface (backend.h): the
 * destructor and the helpers every implementation shares. */
#include "kernels/backend.h"

void mbd_backend_destroy(mbd_backend **b) {
  if (!b || !*b) return;
  (*b)->ops->destroy(*b);
  *b = NULL;
}

int mbd_backend_tokens_i32(const int64_t *ids, int64_t n, int64_t vocab, int32_t *out,
                           mbd_error *err) {
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= vocab)
      return mbd_error_set(err, MBD_E_INVALID, "token id %lld at position %lld is outside [0, %lld)",
                           (long long)ids[i], (long long)i, (long long)vocab);
    out[i] = (int32_t)ids[i];
  }
  return MBD_OK;
}
