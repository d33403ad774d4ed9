/* Checkpoint tensors for the CPU models: looked up by name in the one
 * checkpoint reader (common/safetensors.h) with their shape checked, and
 * converted to the model's storage dtype. Every family loads its weights
 * through these, so a bf16 or f16 model rounds its parameters the same way
 * whatever its architecture. */
#ifndef MBD_KERNELS_MODEL_WEIGHTS_H
#define MBD_KERNELS_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/gemm.h"

/* The tensor `name` of shape [ndim] as a new f32 array (caller frees) whose
 * values are rounded through dt. Adds its storage size in dt to *bytes when
 * bytes is not NULL. Errors name the tensor. */
int mbd_weights_vec(const mbd_st_dir *s, const char *name, int ndim, const int64_t *shape,
                    mbd_dtype dt, float **out, size_t *bytes, mbd_error *err);

/* The matrix `name` [rows, cols] packed for the GEMM in storage dtype dt
 * (caller destroys). Adds its packed size to *bytes when bytes is not NULL. */
int mbd_weights_mat(const mbd_st_dir *s, const char *name, int64_t rows, int64_t cols,
                    mbd_dtype dt, mbd_cpu_wpack **out, size_t *bytes, mbd_error *err);


/* ---- a layer's tensors, by table ---- */

typedef enum mbd_weight_kind {
  MBD_WEIGHT_VEC,  /* float * field: mbd_weights_vec */
  MBD_WEIGHT_MAT,  /* mbd_cpu_wpack * field: mbd_weights_mat */
  MBD_WEIGHT_CONV, /* float * field: [taps][channels], tap-major (mbd_cpu_conv_step) */
} mbd_weight_kind;

/* One tensor of a layer: its checkpoint name and shape, and the field of the
 * family's layer struct that holds it. A family lists its layer once, and
 * the one table both loads and frees it, so the two cannot drift apart. */
typedef struct mbd_weight_spec {
  const char *suffix;   /* the name after "backbone.layers.<i>." */
  mbd_weight_kind kind;
  size_t offset;        /* offsetof the field in the layer struct */
  int ndim;             /* VEC: the rank of shape */
  int64_t shape[3];     /* VEC: the shape; MAT: rows, cols; CONV: channels, taps */
  bool f32;             /* VEC: kept in f32 whatever the storage dtype */
  bool neg_exp;         /* VEC: holds -exp(stored) (A from A_log), after the rounding */
} mbd_weight_spec;

/* Table rows for a field of layer struct T. VEC's shape is 1 to 3 dims,
 * counted as the size of an int64_t array of them; VEC_F32 keeps f32,
 * NEG_EXP holds -exp of the stored values. */
#define MBD_WEIGHT_VEC_WITH(T, field, name, flag, ...)                                          \
  ((mbd_weight_spec){.suffix = (name), .kind = MBD_WEIGHT_VEC, .offset = offsetof(T, field),    \
                     .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),        \
                     .shape = {__VA_ARGS__}, flag})
#define MBD_WEIGHT_VEC(T, field, name, ...)                                                     \
  MBD_WEIGHT_VEC_WITH(T, field, name, .f32 = false, __VA_ARGS__)
#define MBD_WEIGHT_VEC_F32(T, field, name, ...)                                                 \
  MBD_WEIGHT_VEC_WITH(T, field, name, .f32 = true, __VA_ARGS__)
#define MBD_WEIGHT_NEG_EXP(T, field, name, ...)                                                 \
  MBD_WEIGHT_VEC_WITH(T, field, name, .neg_exp = true, __VA_ARGS__)
#define MBD_WEIGHT_MAT(T, field, name, rows, cols)                                              \
  ((mbd_weight_spec){.suffix = (name), .kind = MBD_WEIGHT_MAT, .offset = offsetof(T, field),    \
                     .shape = {(rows), (cols)}})
#define MBD_WEIGHT_CONV(T, field, name, channels, taps)                                         \
  ((mbd_weight_spec){.suffix = (name), .kind = MBD_WEIGHT_CONV, .offset = offsetof(T, field),   \
                     .shape = {(channels), (taps)}})

/* Loads the n tensors of table w for layer i into the layer struct at
 * layer, in storage dtype dt (f32 where the row says so); *bytes as
 * mbd_weights_vec. -exp is the portable one (kernels/portable_math.h), as
 * the GPU models compute it, so A has the same bits on every backend. */
int mbd_weights_load_layer(const mbd_st_dir *s, int i, const mbd_weight_spec *w, size_t n,
                           mbd_dtype dt, void *layer, size_t *bytes, mbd_error *err);
/* Frees the fields of table w in the layer struct at layer and nulls them
 * (NULL fields are fine: a layer that failed half-way). */
void mbd_weights_free_layer(const mbd_weight_spec *w, size_t n, void *layer);

#endif
