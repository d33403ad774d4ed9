/* The CUDA path of mambad-run (worker/run_cli.c): one GPU context on cuda:N,
 * the Mamba-1 GPU model on it, a batched prefill of every prompt row and an
 * optional generation loop. Only built with the CUDA backend (MBD_HAVE_CUDA).
 *
 * The context is sized like a default `mambad worker --backend cuda` (state
 * capacity 64 sessions + 64 forward rows, decode batch 64), so on the same
 * device, build, GEMM mode and dtype the route id is the worker's: its bits
 * are the service's bits. */
#ifndef MBD_RUN_CUDA_H
#define MBD_RUN_CUDA_H

#include <stdint.h>

#include "common/route.h"
#include "common/status.h"
#include "kernels/model/sampler.h"

typedef struct mbd_run_cuda mbd_run_cuda;

typedef struct mbd_run_cuda_opts {
  int device;              /* CUDA device index (cuda:N) */
  mbd_gemm_mode mode;      /* GEMM mode of the context */
  mbd_dtype_policy policy; /* f32 / tf32 (f32 weights) / bf16 / f16 */
} mbd_run_cuda_opts;

/* What a generation does after the prefill. */
typedef struct mbd_run_cuda_gen {
  int64_t n_new;         /* tokens per row; 0 = prefill only */
  mbd_sampling sampling; /* temperature <= 0: greedy, picked on the device */
  const int32_t *stop;   /* stop tokens (kept in the output), may be NULL */
  int nstop;
} mbd_run_cuda_gen;

/* Creates the context on opts->device and loads the checkpoint in dir
 * (config.json + model.safetensors) onto it. MBD_E_DEVICE "no CUDA device..."
 * without a GPU, MBD_E_INVALID for a device index that does not exist; the
 * message is prefixed with "cuda:N". */
int mbd_run_cuda_new(const char *dir, const mbd_run_cuda_opts *opts, mbd_run_cuda **out,
                     mbd_error *err);
/* NULL-safe; nulls *r. */
void mbd_run_cuda_destroy(mbd_run_cuda **r);

int64_t mbd_run_cuda_vocab(const mbd_run_cuda *r);
/* Route id (64 hex) of the context; borrowed, lives as long as r. */
const char *mbd_run_cuda_route_id(const mbd_run_cuda *r);
/* Device name ("NVIDIA H200"); borrowed. */
const char *mbd_run_cuda_device_name(const mbd_run_cuda *r);

/* Runs ids [B,T] (host, each in [0, vocab)) from zero state: logits [B,T,V]
 * (host, F32) for every position and, when g->n_new > 0, gen [B, n_new]
 * (host): the generated tokens, -1 after a stop token. Rows go in chunks of
 * the decode batch (64); chunking changes no bits (batch invariance).
 * Greedy rows take each next token from the device's argmax; sampled rows
 * use the CPU sampler (kernels/model/sampler.h, step = generated-token
 * number, the same seed for every row) on the downloaded logits, so tokens
 * are those of `--backend cpu` and of the service's GENERATE whenever the
 * logits are. The first token is picked on the host from the prefill's
 * logits, as the worker does. t_prefill / t_gen (may be NULL) get seconds. */
int mbd_run_cuda_run(mbd_run_cuda *r, int64_t B, int64_t T, const int32_t *ids,
                     const mbd_run_cuda_gen *g, float *logits, int32_t *gen, double *t_prefill,
                     double *t_gen, mbd_error *err);

#endif
