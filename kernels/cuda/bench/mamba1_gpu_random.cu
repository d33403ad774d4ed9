/* Mamba-1 GPU model with synthetic random weights (see mamba1_gpu_bench.h):
 * matrices filled on the device, small vectors on the host, then the model's
 * own workspace set-up. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/gpu_check.h"
#include "kernels/cuda/mamba1_gpu_impl.h"
extern "C" {
#include "kernels/cuda/bench/mamba1_gpu_bench.h"
#include "kernels/cuda/mamba_ops.h"
}

extern "C" int mbd_mamba1_gpu_new_random(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg,
                                         uint64_t seed, const mbd_mamba1_gpu_options *opts,
                                         mbd_mamba1_gpu **out, mbd_error *err) {
  *out = NULL;
  mbd_mamba1_gpu *m = NULL;
  float *h = NULL;
  int rc = mbd_m1g_alloc(ctx, cfg, opts, &m, err);
  if (rc) return rc;
  const int64_t d = cfg->d_model, di = cfg->d_inner, N = cfg->d_state, R = cfg->dt_rank;
  const int64_t K = cfg->d_conv, V = cfg->vocab_size;
  const size_t es = mbd_dtype_size(m->dtype);
  size_t hmax = (size_t)(di * N + K * di + d);
  h = (float *)malloc(hmax * sizeof(float));
  if (!h) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
    goto fail;
  }
#define MAT(ptr, rows, cols)                                                               \
  do {                                                                                   \
    if ((rc = mbd_m1g_dalloc(m, (size_t)(rows) * (size_t)(cols) * es, &(ptr), err)))     \
      goto fail;                                                                         \
    if ((rc = mbd_mops_fill_uniform(m->stream, m->dtype, (ptr), (int64_t)(rows) * (cols), \
                                    seed++, 1.0f / sqrtf((float)(cols)), err)))            \
      goto fail;                                                                         \
    m->arena.param_bytes += (size_t)(rows) * (size_t)(cols) * es;                             \
  } while (0)
#define VEC(ptr, n, as_dtype, expr)                                                         \
  do {                                                                                    \
    for (int64_t i_ = 0; i_ < (n); i_++) h[i_] = (expr);                                  \
    if ((rc = mbd_m1g_upload(m, h, (size_t)(n), (as_dtype), (void **)&(ptr), err))) goto fail; \
  } while (0)
  MAT(m->emb, V, d);
  m->head = m->emb;
  for (int l = 0; l < cfg->n_layer; l++) {
    layer_d *L = &m->layers[l];
    VEC(L->norm, d, 0, 1.0f);
    MAT(L->in_w, 2 * di, d);
    VEC(L->conv_w, K * di, 0, 0.5f * (float)((i_ * 7 + l) % 5 - 2) / (float)K);
    if (cfg->conv_bias) VEC(L->conv_b, di, 0, 0.01f * (float)(i_ % 3));
    MAT(L->x_w, R + 2 * N, di);
    MAT(L->dt_w, di, R);
    /* dt = softplus(bias) spread log-uniformly over [0.001, 0.1] */
    VEC(L->dt_b, di, 1,
        logf(expm1f(expf(logf(0.001f) + (logf(0.1f) - logf(0.001f)) *
                                          (float)(i_ % 97) / 96.0f))));
    {
      mbd_dtype keep = m->dtype;
      m->dtype = MBD_DTYPE_F32;
      VEC(L->A, di * N, 0, -(float)(i_ % N + 1));
      m->dtype = keep;
    }
    VEC(L->D, di, 0, 1.0f);
    MAT(L->out_w, d, di);
  }
  VEC(m->norm_f, d, 0, 1.0f);
#undef MAT
#undef VEC
  if ((rc = mbd_m1g_finish(m, err))) goto fail;
  MBD_GPU_TRY(cudaStreamSynchronize(m->stream), err);
  free(h);
  *out = m;
  return 0;
fail:
  free(h);
  mbd_mamba1_gpu_destroy(&m);
  return rc;
}
