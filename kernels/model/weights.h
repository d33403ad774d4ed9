/* Checkpoint tensors for the CPU models: looked up by name in the one
 * checkpoint reader (common/safetensors.h) with their shape checked, and
 * converted to the model's storage dtype. Every family loads its weights
 * through these, so a bf16 or f16 model rounds its parameters the same way
 * whatever its architecture. */
#ifndef MBD_KERNELS_MODEL_WEIGHTS_H
#define MBD_KERNELS_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cpu/gemm.h"

/* v rounded through storage dtype dt (f32: v itself). */
float mbd_weights_round(mbd_dtype dt, float v);

/* The tensor `name` of shape [ndim] as a new f32 array (caller frees) whose
 * values are rounded through dt. Adds its storage size in dt to *bytes when
 * bytes is not NULL. Errors name the tensor. */
int mbd_weights_vec(const mbd_st_dir *s, const char *name, int ndim, const int64_t *shape,
                    mbd_dtype dt, float **out, size_t *bytes, mbd_error *err);

/* The matrix `name` [rows, cols] packed for the GEMM in storage dtype dt
 * (caller destroys). Adds its packed size to *bytes when bytes is not NULL. */
int mbd_weights_mat(const mbd_st_dir *s, const char *name, int64_t rows, int64_t cols,
                    mbd_dtype dt, mbd_cpu_wpack **out, size_t *bytes, mbd_error *err);

/* The depthwise conv weight `name` [channels, 1, dc] as a new f32 array
 * [dc][channels], tap-major (the layout of mbd_cpu_conv_step), rounded
 * through dt; *bytes as mbd_weights_vec. */
int mbd_weights_conv(const mbd_st_dir *s, const char *name, int64_t channels, int64_t dc,
                     mbd_dtype dt, float **out, size_t *bytes, mbd_error *err);

#endif
