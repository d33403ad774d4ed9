/* Device memory a GPU model owns: every allocation is recorded and freed
 * together, and host f32 weights are uploaded in the storage dtype or as f32
 * rounded through it. Shared by the GPU models of every family; C-callable. */
#ifndef MBD_CUDA_DEV_ARENA_H
#define MBD_CUDA_DEV_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"

typedef struct mbd_dev_arena {
  void **ptrs;        /* every device allocation, freed by mbd_dev_arena_free */
  int n, cap;  /* entries of ptrs in use / allocated */
  size_t param_bytes; /* parameters uploaded so far, counted in their storage dtype */
} mbd_dev_arena;

/* cudaMalloc of bytes (at least 16), recorded in a. MBD_E_NOMEM names the size. */
int mbd_dev_arena_alloc(mbd_dev_arena *a, size_t bytes, void **out, mbd_error *err);
/* Frees every allocation and the record; a is empty afterwards. */
void mbd_dev_arena_free(mbd_dev_arena *a);
/* v rounded through dt (bf16/f16 and back; f32 unchanged). */
float mbd_dev_round_to(mbd_dtype dt, float v);
/* Host v[n] -> a new device buffer *out: in the storage dtype dt when
 * as_dtype (GEMM weights and biases), else as f32 rounded through dt (the CPU
 * model's small parameters). */
int mbd_dev_arena_upload(mbd_dev_arena *a, mbd_dtype dt, const float *v, size_t n, int as_dtype,
                         void **out, mbd_error *err);
/* Tensor `name` of the given shape read through the checkpoint reader
 * (common/safetensors.h) and uploaded as mbd_dev_arena_upload says. */
int mbd_dev_arena_load(mbd_dev_arena *a, mbd_dtype dt, const mbd_st_dir *st, const char *name,
                       int ndim, const int64_t *shape, int as_dtype, void **out, mbd_error *err);

#ifdef __cplusplus
}
#endif

#endif
