/* The CUDA backend's family table (see gpu_family.h): Mamba-1 over
 * kernels/cuda/mamba1_gpu.h. */
#include "kernels/cuda/gpu_family.h"

#include <string.h>

#include "kernels/cuda/mamba1_gpu.h"
#include "kernels/cuda/mamba2_gpu.h"
#include "kernels/cuda/mamba3_gpu.h"
#include "kernels/model/mamba1.h"

_Static_assert((int)MBD_MAMBA1_GPU_LOGITS_NONE == (int)MBD_LOGITS_NONE &&
                   (int)MBD_MAMBA1_GPU_LOGITS_LAST == (int)MBD_LOGITS_LAST &&
                   (int)MBD_MAMBA1_GPU_LOGITS_ALL == (int)MBD_LOGITS_ALL,
               "mbd_mamba1_gpu_logits mirrors mbd_logits_sel");

static int m1_load(mbd_gpu_ctx *ctx, const char *dir, const mbd_gpu_model_opts *o, void **model,
                   mbd_error *err) {
  mbd_mamba1_gpu_options mo;
  mbd_mamba1_gpu_options_default(&mo);
  mo.dtype = o->dtype;
  mo.max_batch = o->max_batch;
  mo.use_graphs = o->use_graphs;
  mo.progress = o->progress;
  mbd_mamba1_gpu *m = NULL;
  int rc = mbd_mamba1_gpu_load(ctx, dir, &mo, &m, err);
  *model = m;
  return rc;
}

static void m1_destroy(void *model) {
  mbd_mamba1_gpu *m = model;
  mbd_mamba1_gpu_destroy(&m);
}

static int64_t m1_vocab(const void *model) { return mbd_mamba1_gpu_config(model)->vocab_size; }
static int64_t m1_slots(const void *model) { return mbd_mamba1_gpu_slots(model); }

static mbd_state_shape m1_state_shape(const void *model) {
  return mbd_mamba1_state_shape(mbd_mamba1_gpu_config(model));
}

static size_t m1_state_payload(const void *model) { return mbd_mamba1_gpu_state_bytes(model); }

static int m1_slot_reset(void *model, int64_t slot, mbd_error *err) {
  return mbd_mamba1_gpu_slot_reset(model, slot, err);
}

static int m1_slot_read(void *model, int64_t slot, void *buf, size_t cap, mbd_error *err) {
  return mbd_mamba1_gpu_slot_read(model, slot, buf, cap, err);
}

static int m1_slot_write(void *model, int64_t slot, const void *buf, size_t len, mbd_error *err) {
  return mbd_mamba1_gpu_slot_write(model, slot, buf, len, err);
}

static int m1_prefill(void *model, int nseq, int T, const int32_t *tokens, const int32_t *slots,
                      mbd_logits_sel sel, float *logits, mbd_error *err) {
  return mbd_mamba1_gpu_prefill(model, nseq, T, tokens, slots, (mbd_mamba1_gpu_logits)sel, logits,
                                err);
}

static int m1_step(void *model, int n, const int32_t *tokens, const int32_t *slots, int32_t *next,
                   float *logits, mbd_error *err) {
  return mbd_mamba1_gpu_step(model, n, tokens, slots, NULL, next, logits, err);
}

static int m1_step_launch(void *model, int n, const int32_t *tokens, const int32_t *slots,
                          float *logits, int nlogits, mbd_error *err) {
  return mbd_mamba1_gpu_step_launch(model, n, tokens, slots, NULL, logits, nlogits, err);
}

static int m1_step_wait(void *model, int32_t *next, mbd_error *err) {
  return mbd_mamba1_gpu_step_wait(model, next, err);
}

static int m1_slot_regions(void *model, int64_t slot, mbd_gpu_region *out, mbd_error *err) {
  void *ptr[2];
  size_t bytes[2];
  int rc = mbd_mamba1_gpu_slot_regions(model, slot, ptr, bytes, err);
  if (rc) return rc;
  for (int i = 0; i < 2; i++) out[i] = (mbd_gpu_region){.ptr = ptr[i], .bytes = bytes[i]};
  return 2;
}

static const mbd_gpu_model_ops k_mamba1 = {
    .name = "mamba1",
    .load = m1_load,
    .destroy = m1_destroy,
    .vocab = m1_vocab,
    .slots = m1_slots,
    .state_shape = m1_state_shape,
    .state_payload = m1_state_payload,
    .slot_reset = m1_slot_reset,
    .slot_read = m1_slot_read,
    .slot_write = m1_slot_write,
    .prefill = m1_prefill,
    .step = m1_step,
    .slot_regions = m1_slot_regions,
    .step_launch = m1_step_launch,
    .step_wait = m1_step_wait,
    .state_dtypes = (1u << MBD_STATE_F32) | (1u << MBD_STATE_BF16),
};

static const mbd_gpu_model_ops *const k_families[] = {&k_mamba1, &mbd_mamba2_gpu_ops,
                                                      &mbd_mamba3_gpu_ops};

const mbd_gpu_model_ops *mbd_gpu_model_ops_find(const char *name) {
  for (size_t i = 0; name && i < sizeof k_families / sizeof k_families[0]; i++)
    if (!strcmp(k_families[i]->name, name)) return k_families[i];
  return NULL;
}
