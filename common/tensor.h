/* Tensor descriptors: dtype + shape, byte sizes computed overflow-safe.
 * Descriptors are plain data; tensor views borrow their bytes. */
#ifndef MBD_TENSOR_H
#define MBD_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum mbd_dtype {
  MBD_DTYPE_F32 = 0,
  MBD_DTYPE_BF16 = 1,
  MBD_DTYPE_F16 = 2,
  MBD_DTYPE_I64 = 3,
} mbd_dtype;

#define MBD_MAX_DIMS 8

typedef struct mbd_tensor_desc {
  mbd_dtype dtype;
  int ndim;                     /* 0..MBD_MAX_DIMS */
  int64_t shape[MBD_MAX_DIMS];  /* each >= 0 */
} mbd_tensor_desc;

/* A descriptor plus borrowed bytes (row-major, contiguous). */
typedef struct mbd_tensor_view {
  mbd_tensor_desc desc;
  void *data;
} mbd_tensor_view;

/* Bytes per element (4, 2, 2, 8). */
size_t mbd_dtype_size(mbd_dtype dt);
/* Lower-case name as used in CLI and YAML: "f32", "bf16", "f16", "i64". */
const char *mbd_dtype_name(mbd_dtype dt);
/* Safetensors name: "F32", "BF16", "F16", "I64". */
const char *mbd_dtype_st_name(mbd_dtype dt);
/* Parses either spelling (case-insensitive); MBD_E_INVALID naming the valid
 * values otherwise. */
int mbd_dtype_parse(const char *s, mbd_dtype *out, mbd_error *err);

/* Builds a descriptor; ndim > MBD_MAX_DIMS or negative dims give MBD_E_SHAPE. */
int mbd_tensor_desc_make(mbd_tensor_desc *d, mbd_dtype dt, int ndim, const int64_t *shape,
                         mbd_error *err);
/* Element count and byte size; MBD_E_TOO_LARGE on size_t overflow. */
int mbd_tensor_desc_numel(const mbd_tensor_desc *d, size_t *out, mbd_error *err);
int mbd_tensor_desc_nbytes(const mbd_tensor_desc *d, size_t *out, mbd_error *err);
/* Writes "bf16[2,33,2048]" into buf (always NUL-terminated). */
void mbd_tensor_desc_format(const mbd_tensor_desc *d, char *buf, size_t cap);

#endif
