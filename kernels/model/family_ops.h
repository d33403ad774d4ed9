/* The CPU family vtable (kernels/model/family.h) of a family whose typed API
 * follows the common naming: mbd_<fam>_model / _state, _destroy, _vocab,
 * _isa, _state_new / _destroy / _export_size / _export / _import, _prefill,
 * _step, and mbd_<fam>_options with dtype, threads and isa. The adapters only
 * cast the opaque pointers, so every family's table is written once, here.
 *
 *   MBD_CPU_FAMILY_LOAD(fam)          static fam_load from mbd_<fam>_load
 *   MBD_CPU_FAMILY_OPS(fam, load_fn)  const mbd_cpu_model_ops mbd_<fam>_cpu_ops */
#ifndef MBD_KERNELS_MODEL_FAMILY_OPS_H
#define MBD_KERNELS_MODEL_FAMILY_OPS_H

#include "kernels/model/family.h"

#define MBD_CPU_FAMILY_LOAD(fam)                                                                 \
  static int fam_load(const char *dir, const mbd_cpu_model_opts *o, void **model,               \
                      mbd_error *err) {                                                          \
    mbd_##fam##_options mo;                                                                      \
    mbd_##fam##_options_default(&mo);                                                            \
    mo.dtype = o->dtype;                                                                         \
    mo.threads = o->threads;                                                                     \
    mo.isa = o->isa;                                                                             \
    mbd_##fam##_model *m = NULL;                                                                 \
    int rc = mbd_##fam##_load(dir, &mo, &m, err);                                                \
    *model = m;                                                                                  \
    return rc;                                                                                   \
  }

#define MBD_CPU_FAMILY_OPS(fam, load_fn)                                                         \
  static void fam##_ops_destroy(void *model) {                                                   \
    mbd_##fam##_model *m = model;                                                                \
    mbd_##fam##_destroy(&m);                                                                     \
  }                                                                                              \
  static int64_t fam##_ops_vocab(const void *model) { return mbd_##fam##_vocab(model); }        \
  static const char *fam##_ops_isa(const void *model) { return mbd_##fam##_isa(model); }        \
  static int fam##_ops_state_new(const void *model, void **state, mbd_error *err) {             \
    mbd_##fam##_state *s = NULL;                                                                 \
    int rc = mbd_##fam##_state_new(model, &s, err);                                              \
    *state = s;                                                                                  \
    return rc;                                                                                   \
  }                                                                                              \
  static void fam##_ops_state_free(void *state) {                                               \
    mbd_##fam##_state *s = state;                                                                \
    mbd_##fam##_state_destroy(&s);                                                               \
  }                                                                                              \
  static size_t fam##_ops_state_bytes(const void *state) {                                       \
    return mbd_##fam##_state_export_size(state);                                                 \
  }                                                                                              \
  static int fam##_ops_state_save(const void *state, void *dst, size_t cap, mbd_error *err) {   \
    return mbd_##fam##_state_export(state, dst, cap, NULL, err);                                 \
  }                                                                                              \
  static int fam##_ops_state_load(void *state, const void *src, size_t len, mbd_error *err) {   \
    return mbd_##fam##_state_import(state, src, len, err);                                       \
  }                                                                                              \
  static int fam##_ops_prefill(void *model, void *const *states, int n,                          \
                               const int32_t *const *tokens, const int64_t *lens,                \
                               mbd_logits_sel sel, float *logits, mbd_error *err) {              \
    return mbd_##fam##_prefill(model, (mbd_##fam##_state *const *)states, n, tokens, lens,       \
                               (int)sel, logits, err);                                           \
  }                                                                                              \
  static int fam##_ops_step(void *model, void *const *states, int n, const int32_t *tokens,     \
                            float *logits, mbd_error *err) {                                     \
    return mbd_##fam##_step(model, (mbd_##fam##_state *const *)states, n, tokens, logits, err);  \
  }                                                                                              \
  const mbd_cpu_model_ops mbd_##fam##_cpu_ops = {                                                \
      .load = load_fn,                                                                           \
      .destroy = fam##_ops_destroy,                                                              \
      .vocab = fam##_ops_vocab,                                                                  \
      .isa = fam##_ops_isa,                                                                      \
      .state_new = fam##_ops_state_new,                                                          \
      .state_free = fam##_ops_state_free,                                                        \
      .state_bytes = fam##_ops_state_bytes,                                                      \
      .state_save = fam##_ops_state_save,                                                        \
      .state_load = fam##_ops_state_load,                                                        \
      .prefill = fam##_ops_prefill,                                                              \
      .step = fam##_ops_step,                                                                    \
  }

#endif
