/* What the CPU families share of their typed API and their vtable
 * (kernels/model/family.h), for a family whose typed API follows the common
 * naming: mbd_<fam>_model, whose mbd_trunk is its member `t`
 * (kernels/model/trunk.h), mbd_<fam>_state, an mbd_seq_state behind the
 * family's opaque name (kernels/model/seq_state.h), and mbd_<fam>_options
 * with dtype, threads, isa and progress. Every function here only forwards
 * to the trunk or the state module and casts the opaque pointers, so it is
 * written once for every family.
 *
 *   MBD_CPU_FAMILY_API(fam, sel_t)    the functions of mbd_<fam>.h that are
 *                                     not the family's own: destroy, vocab,
 *                                     dtype, isa, weight_bytes, the state's
 *                                     new, destroy, reset, position,
 *                                     export_size, export, import, and
 *                                     prefill (logits selector of type
 *                                     sel_t) and step
 *   MBD_CPU_FAMILY_LOAD(fam)          static fam_load from mbd_<fam>_load
 *   MBD_CPU_FAMILY_OPS(fam, load_fn)  const mbd_cpu_model_ops mbd_<fam>_cpu_ops */
#ifndef MBD_KERNELS_MODEL_FAMILY_OPS_H
#define MBD_KERNELS_MODEL_FAMILY_OPS_H

#include <stdlib.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/model/family.h"
#include "kernels/model/rows.h"
#include "kernels/model/seq_state.h"
#include "kernels/model/trunk.h"

#define MBD_CPU_FAMILY_API(fam, sel_t)                                                           \
  void mbd_##fam##_destroy(mbd_##fam##_model **pm) {                                             \
    if (!pm || !*pm) return;                                                                     \
    mbd_trunk_free(&(*pm)->t);                                                                   \
    free(*pm);                                                                                   \
    *pm = NULL;                                                                                  \
  }                                                                                              \
  int mbd_##fam##_vocab(const mbd_##fam##_model *m) { return (int)m->t.V; }                      \
  mbd_dtype mbd_##fam##_dtype(const mbd_##fam##_model *m) { return m->t.dtype; }                 \
  const char *mbd_##fam##_isa(const mbd_##fam##_model *m) {                                      \
    return mbd_cpu_isa_name(mbd_cpu_ctx_isa(m->t.ctx));                                          \
  }                                                                                              \
  size_t mbd_##fam##_weight_bytes(const mbd_##fam##_model *m) { return m->t.weight_bytes; }      \
  int mbd_##fam##_state_new(const mbd_##fam##_model *m, mbd_##fam##_state **out,                 \
                            mbd_error *err) {                                                    \
    mbd_seq_state *s = NULL;                                                                     \
    int rc = mbd_seq_state_new(&m->t.state, &s, err);                                            \
    *out = (mbd_##fam##_state *)s;                                                               \
    return rc;                                                                                   \
  }                                                                                              \
  void mbd_##fam##_state_destroy(mbd_##fam##_state **ps) {                                       \
    if (!ps) return;                                                                             \
    mbd_seq_state *s = (mbd_seq_state *)*ps;                                                     \
    mbd_seq_state_destroy(&s);                                                                   \
    *ps = NULL;                                                                                  \
  }                                                                                              \
  void mbd_##fam##_state_reset(mbd_##fam##_state *s) { mbd_seq_state_reset((mbd_seq_state *)s); } \
  int64_t mbd_##fam##_state_position(const mbd_##fam##_state *s) {                               \
    return ((const mbd_seq_state *)s)->pos;                                                      \
  }                                                                                              \
  size_t mbd_##fam##_state_export_size(const mbd_##fam##_state *s) {                             \
    return mbd_seq_state_export_size((const mbd_seq_state *)s);                                  \
  }                                                                                              \
  int mbd_##fam##_state_export(const mbd_##fam##_state *s, void *buf, size_t cap, size_t *len,   \
                               mbd_error *err) {                                                 \
    return mbd_seq_state_export((const mbd_seq_state *)s, buf, cap, len, err);                   \
  }                                                                                              \
  int mbd_##fam##_state_import(mbd_##fam##_state *s, const void *buf, size_t len,                \
                               mbd_error *err) {                                                 \
    return mbd_seq_state_import((mbd_seq_state *)s, buf, len, err);                              \
  }                                                                                              \
  int mbd_##fam##_prefill(mbd_##fam##_model *m, mbd_##fam##_state *const *states, int batch,    \
                          const int32_t *const *tokens, const int64_t *lens, sel_t which,        \
                          float *logits, mbd_error *err) {                                       \
    return mbd_rows_prefill(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, lens,   \
                            (mbd_logits_sel)which, logits, err);                                 \
  }                                                                                              \
  int mbd_##fam##_step(mbd_##fam##_model *m, mbd_##fam##_state *const *states, int batch,       \
                       const int32_t *tokens, float *logits, mbd_error *err) {                   \
    return mbd_rows_step(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, logits,    \
                         err);                                                                   \
  }

#define MBD_CPU_FAMILY_LOAD(fam)                                                                 \
  static int fam_load(const char *dir, const mbd_cpu_model_opts *o, void **model,               \
                      mbd_error *err) {                                                          \
    mbd_##fam##_options mo;                                                                      \
    mbd_##fam##_options_default(&mo);                                                            \
    mo.dtype = o->dtype;                                                                         \
    mo.threads = o->threads;                                                                     \
    mo.isa = o->isa;                                                                             \
    mo.progress = o->progress;                                                                   \
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
      .state_load = fam##_ops_state_load,                                                        \
      .state_save = fam##_ops_state_save,                                                        \
      .prefill = fam##_ops_prefill,                                                              \
      .step = fam##_ops_step,                                                                    \
  }

#endif
