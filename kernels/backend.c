/* Backend-independent parts of the backend interface (backend.h): the
 * destructor and the helpers every implementation shares. */
#include "kernels/backend.h"

int mbd_backend_new(mbd_backend_kind kind, const mbd_backend_opts *opts, mbd_backend **out,
                    mbd_error *err) {
  *out = NULL;
  if (kind == MBD_BACKEND_CPU) return mbd_backend_cpu_new(opts, out, err);
  if (kind != MBD_BACKEND_CUDA)
    return mbd_error_set(err, MBD_E_INVALID, "unknown backend kind %d", (int)kind);
#ifdef MBD_HAVE_CUDA
  return mbd_backend_cuda_new(opts, out, err);
#else
  return mbd_error_set(err, MBD_E_UNSUPPORTED,
                       "this build has no CUDA backend (it was configured without the CUDA "
                       "toolkit; rebuild with -DMBD_CUDA=ON where nvcc exists) - use the cpu "
                       "backend");
#endif
}

int mbd_backend_prefill_batch(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states, int64_t n,
                              const int64_t *ids, int64_t T, bool last_only, float *logits,
                              mbd_error *err) {
  if (b->ops->prefill_batch)
    return b->ops->prefill_batch(b, m, states, n, ids, T, last_only, logits, err);
  if (n < 1 || T < 1 || T > INT64_MAX / n)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill needs rows >= 1 and T >= 1");
  size_t per = (size_t)(last_only ? 1 : T) * (size_t)b->ops->model_vocab(m);
  for (int64_t i = 0; i < n; i++) {
    int rc = b->ops->prefill(b, m, states[i], ids + i * T, T, last_only, logits + (size_t)i * per,
                             err);
    if (rc) return rc;
  }
  return MBD_OK;
}

bool mbd_backend_picks(const mbd_backend *b) {
  return b->ops->step_greedy != NULL || b->ops->step_launch != NULL;
}

int mbd_backend_step_launch(mbd_backend *b, mbd_bmodel *m, mbd_bstate *const *states,
                            const int64_t *tokens, int64_t n, int64_t *next, float *logits,
                            int64_t nlogits, mbd_error *err) {
  if (b->ops->step_launch)
    return b->ops->step_launch(b, m, states, tokens, n, next, logits, nlogits, err);
  if (next && b->ops->step_greedy)
    return b->ops->step_greedy(b, m, states, tokens, n, next, nlogits > 0 ? logits : NULL, err);
  return b->ops->step(b, m, states, tokens, n, logits, err);
}

int mbd_backend_step_wait(mbd_backend *b, mbd_error *err) {
  return b->ops->step_wait ? b->ops->step_wait(b, err) : MBD_OK;
}

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
