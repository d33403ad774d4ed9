/* The CUDA path of mambad-run: drives kernels/cuda/gpu_ctx.h and
 * kernels/cuda/mamba1_gpu.h the way the GPU worker (kernels/cuda/backend_cuda.c)
 * does, but for one batch of prompt rows in this process: reset slots,
 * prefill with all logits, then one batched decode step per generated token
 * with the next tokens picked on the device (greedy) or by the CPU sampler. */
#include "worker/run_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/mamba1_gpu.h"

/* The default GPU worker's sizes (worker.c: --capacity 64, --max-batch 64;
 * backend_cuda.c: state capacity = sessions + one forward chunk), so both
 * processes report the same route id. */
#define RUN_SESSIONS 64
#define RUN_BATCH 64

struct mbd_run_cuda {
  mbd_gpu_ctx *ctx;
  mbd_mamba1_gpu *m;
  int64_t vocab;
  char route_id[65];
  char device_name[96];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mbd_run_cuda_destroy(mbd_run_cuda **r) {
  if (!r || !*r) return;
  mbd_mamba1_gpu_destroy(&(*r)->m);
  mbd_gpu_ctx_destroy(&(*r)->ctx);
  free(*r);
  *r = NULL;
}

int mbd_run_cuda_new(const char *dir, const mbd_run_cuda_opts *opts, mbd_run_cuda **out,
                     mbd_error *err) {
  *out = NULL;
  mbd_run_cuda *r = calloc(1, sizeof *r);
  if (!r) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the CUDA run");
  mbd_gpu_ctx_config cfg;
  mbd_gpu_ctx_config_default(&cfg);
  cfg.device = opts->device;
  cfg.mode = opts->mode;
  cfg.policy = opts->policy;
  cfg.family = MBD_FAMILY_INFERENCE;
  cfg.state_capacity = RUN_SESSIONS + RUN_BATCH;
  mbd_route_identity route;
  int rc = mbd_gpu_ctx_new(&cfg, &r->ctx, err);
  if (!rc) rc = mbd_gpu_ctx_route(r->ctx, &route, err);
  if (rc) {
    mbd_error_prefix(err, "cuda:%d", opts->device);
    goto fail;
  }
  mbd_route_id_hex(&route, r->route_id);
  snprintf(r->device_name, sizeof r->device_name, "%s", route.device_name);
  mbd_mamba1_gpu_options o;
  mbd_mamba1_gpu_options_default(&o);
  o.dtype = opts->policy == MBD_POLICY_BF16  ? MBD_DTYPE_BF16
            : opts->policy == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                             : MBD_DTYPE_F32; /* f32 and tf32 */
  o.max_batch = RUN_BATCH;
  o.use_graphs = 1;
  if ((rc = mbd_mamba1_gpu_load(r->ctx, dir, &o, &r->m, err))) goto fail;
  r->vocab = mbd_mamba1_gpu_config(r->m)->vocab_size;
  *out = r;
  return MBD_OK;
fail:
  mbd_run_cuda_destroy(&r);
  return rc;
}

int64_t mbd_run_cuda_vocab(const mbd_run_cuda *r) { return r->vocab; }
const char *mbd_run_cuda_route_id(const mbd_run_cuda *r) { return r->route_id; }
const char *mbd_run_cuda_device_name(const mbd_run_cuda *r) { return r->device_name; }

static int is_stop(const mbd_run_cuda_gen *g, int32_t tok) {
  for (int i = 0; i < g->nstop; i++)
    if (g->stop[i] == tok) return 1;
  return 0;
}

/* Scratch of one chunk's generation loop, indexed by position in the active
 * list (rows leave it at a stop token; the others' bits do not change). */
typedef struct gen_scratch {
  int32_t row[RUN_BATCH];  /* chunk row of each active entry */
  int32_t slot[RUN_BATCH]; /* its state slot */
  int32_t feed[RUN_BATCH]; /* token fed by the next step */
  int32_t next[RUN_BATCH]; /* device-picked tokens of the last step (greedy) */
  float *logits;           /* [RUN_BATCH, V] last step's logits (sampling only) */
} gen_scratch;

/* Generates for the n rows of one chunk whose states sit in slots 0..n-1 just
 * past their prompts; first[i * first_stride] are row i's next-token logits. */
static int gen_chunk(mbd_run_cuda *r, int n, const mbd_run_cuda_gen *g, const float *first,
                     int64_t first_stride, mbd_sampler *smp, gen_scratch *s, int32_t *gen,
                     mbd_error *err) {
  const int64_t N = g->n_new, V = r->vocab;
  const int sampled = g->sampling.temperature > 0.0f;
  int nact = n, rc;
  for (int i = 0; i < n; i++) s->row[i] = s->slot[i] = i;
  for (int64_t step = 0; step < N && nact > 0; step++) {
    int k = 0;
    for (int i = 0; i < nact; i++) {
      int32_t tok;
      if (step == 0 || sampled) {
        const float *l = step == 0 ? first + (int64_t)s->row[i] * first_stride : s->logits + i * V;
        if ((rc = mbd_sampler_pick(smp, &g->sampling, (uint64_t)step, l, &tok, err))) return rc;
      } else {
        tok = s->next[i];
      }
      gen[(int64_t)s->row[i] * N + step] = tok;
      if (is_stop(g, tok)) continue; /* the rest of the row stays -1 */
      s->row[k] = s->row[i];
      s->slot[k] = s->slot[i];
      s->feed[k++] = tok;
    }
    nact = k;
    if (step + 1 < N && nact > 0 &&
        (rc = mbd_mamba1_gpu_step(r->m, nact, s->feed, s->slot, NULL, sampled ? NULL : s->next,
                                  sampled ? s->logits : NULL, err)))
      return rc;
  }
  return MBD_OK;
}

int mbd_run_cuda_run(mbd_run_cuda *r, int64_t B, int64_t T, const int32_t *ids,
                     const mbd_run_cuda_gen *g, float *logits, int32_t *gen, double *t_prefill,
                     double *t_gen, mbd_error *err) {
  const int64_t V = r->vocab, N = g ? g->n_new : 0;
  if (B < 1 || T < 1 || T > INT32_MAX / 2)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "a CUDA run needs B >= 1 and 1 <= T < 2^30 (got %lld x %lld)",
                         (long long)B, (long long)T);
  if (N < 0 || (N > 0 && !gen))
    return mbd_error_set(err, MBD_E_INVALID, "generation needs n_new >= 0 and an output buffer");
  double tp = 0, tg = 0;
  int rc = MBD_OK;
  mbd_sampler *smp = NULL;
  gen_scratch s = {.logits = NULL};
  int32_t slots[RUN_BATCH];
  for (int i = 0; i < RUN_BATCH; i++) slots[i] = i;
  if (N > 0) {
    if ((rc = mbd_sampler_new(V, &smp, err))) goto fail;
    if (g->sampling.temperature > 0.0f &&
        !(s.logits = malloc((size_t)RUN_BATCH * (size_t)V * sizeof(float)))) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for %d x %lld step logits", RUN_BATCH,
                         (long long)V);
      goto fail;
    }
    for (int64_t i = 0; i < B * N; i++) gen[i] = -1;
  }
  for (int64_t r0 = 0; r0 < B; r0 += RUN_BATCH) {
    int n = (int)(B - r0 < RUN_BATCH ? B - r0 : RUN_BATCH);
    float *lg = logits + r0 * T * V;
    double t0 = now_s();
    for (int i = 0; i < n && !rc; i++) rc = mbd_mamba1_gpu_slot_reset(r->m, slots[i], err);
    if (rc || (rc = mbd_mamba1_gpu_prefill(r->m, n, (int)T, ids + r0 * T, slots,
                                           MBD_MAMBA1_GPU_LOGITS_ALL, lg, err)))
      goto fail;
    double t1 = now_s();
    tp += t1 - t0;
    if (N > 0 && (rc = gen_chunk(r, n, g, lg + (T - 1) * V, T * V, smp, &s, gen + r0 * N, err)))
      goto fail;
    tg += now_s() - t1;
  }
  if (t_prefill) *t_prefill = tp;
  if (t_gen) *t_gen = tg;
fail:
  free(s.logits);
  mbd_sampler_destroy(&smp);
  return rc;
}
