/* Mamba-2 model on a GPU context (see mamba2_gpu.h): weights, state slots,
 * workspace, prefill and decode steps, and the family vtable.
 *
 * A call's tokens run in chunks of at most max_rows rows: a group of
 * sequences and a time window of each, rows sequence-major (row s * tw + t),
 * which is the layout the conv and the recurrence take. Device memory is
 * allocated at load; nothing is allocated per token.
 *
 * A decode step is one routine (step_body: staged tokens and slots up, the
 * layers, the head, the greedy pick into pinned memory); with graphs on it
 * is captured once per batch bucket (powers of two) and replayed, the rows
 * beyond the batch padded with token 0 on a scratch slot. Every kernel and
 * GEMM is row-invariant, so a row's bits depend neither on the bucket nor on
 * the padding, and the graph replays the eager step's bits.
 *
 * The SSM state is stored in the route's state dtype (f32, or bf16 on a
 * state=bf16 route; the conv windows stay f32 either way); the state image
 * is f32 on both: slot_read widens bf16 exactly, slot_write rounds to
 * nearest even (exact for an image a bf16-state route wrote). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/dev_arena.h"
#include "kernels/cuda/gpu_check.h"
extern "C" {
#include "common/half.h"
#include "common/route.h"
#include "common/safetensors.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/mamba2_gpu.h"
#include "kernels/cuda/ops/add_rmsnorm.h"
#include "kernels/cuda/ops/conv_silu.h"
#include "kernels/cuda/ops/embed.h"
#include "kernels/cuda/ops/gated_rmsnorm.h"
#include "kernels/cuda/ops/sample.h"
#include "kernels/cuda/ops/ssd_scan.h"
#include "kernels/model/mamba2.h"
}
#include "kernels/portable_math.h"

#define M2G_MAX_ROWS 2048
#define M2G_MAX_BUCKETS 16 /* decode graph buckets 1, 2, 4, .. 2^15 */

typedef struct layer2_d {
  float *norm;      /* [d] */
  void *in_w;       /* [Pin, d] dtype */
  void *in_b;       /* [Pin] dtype or NULL */
  float *conv_w;    /* [K][cd] tap-major */
  float *conv_b;    /* [cd] or NULL */
  float *dt_bias;   /* [H] */
  float *A;         /* [H], = -exp(A_log) */
  float *D;         /* [H] */
  float *gnorm;     /* [di] */
  void *out_w;      /* [d, di] dtype */
  void *out_b;      /* [d] dtype or NULL */
} layer2_d;

typedef struct m2gpu {
  mbd_gpu_ctx *ctx;
  cudaStream_t stream;
  mbd_mamba2_config cfg;
  mbd_dtype dtype;
  int64_t V, pin, cd;
  int max_rows, max_batch;
  int bucket_max;    /* largest decode bucket: max_batch rounded up to a power of two */
  int use_graphs;    /* 1: decode steps replay graphs */
  int64_t nslots;    /* real slots; index nslots is the padding rows' scratch slot */
  layer2_d *layers;
  void *emb, *head;
  float *norm_f;
  mbd_dev_arena arena; /* every device allocation, freed at destroy */
  float *conv_st;     /* [nslots][L][K-1][cd] */
  void *ssm_st;       /* [nslots][L][H P][N] of ssm_es bytes: f32, or bf16 on a bf16 route */
  int ssm_es;         /* bytes of one SSM state entry: 4 or 2 */
  uint16_t *h_ssm;    /* bf16 routes: pinned [ssm_slot], a slot's SSM state in transit */
  int64_t conv_slot, ssm_slot; /* entries per slot */
  int32_t *d_tok, *d_slots, *h_tok, *h_slots; /* prefill chunk staging [max_rows] */
  int32_t *d_step, *h_step; /* decode staging [2 bucket_max]: tokens, then slots */
  int32_t *h_next;          /* pinned [bucket_max]: the step's greedy picks */
  float *resid, *zx, *xbc, *y, *out, *logits;
  void *hn, *y_act;
  void *sample_work;
  mbd_gpu_graph *graphs[M2G_MAX_BUCKETS]; /* decode graph of bucket 2^i, captured on first use */
} m2gpu;

static int dalloc(m2gpu *m, size_t bytes, void **out, mbd_error *err) {
  return mbd_dev_arena_alloc(&m->arena, bytes, out, err);
}

/* Host f32 -> device: in the storage dtype (as_dtype 1: GEMM weights and
 * biases) or f32 rounded through it (0: the CPU model's load_vec). */
static int upload(m2gpu *m, const float *v, size_t n, int as_dtype, void **out,
                  mbd_error *err) {
  return mbd_dev_arena_upload(&m->arena, m->dtype, v, n, as_dtype, out, err);
}

static int load_one(m2gpu *m, const mbd_st_dir *st, const char *name, int ndim,
                    const int64_t *shape, int as_dtype, void **out, mbd_error *err) {
  return mbd_dev_arena_load(&m->arena, m->dtype, st, name, ndim, shape, as_dtype, out, err);
}

static int load_layer(m2gpu *m, const mbd_st_dir *st, int i, mbd_error *err) {
  const mbd_mamba2_config *c = &m->cfg;
  layer2_d *L = &m->layers[i];
  const int64_t d = c->d_model, di = c->d_inner, H = c->n_heads, K = c->d_conv, cd = m->cd;
  char nm[256];
  int rc;
  float *v = NULL;
  size_t n = 0;
#define NAME(suffix) (snprintf(nm, sizeof nm, "backbone.layers.%d.%s", i, suffix), nm)
  int64_t sh_d[1] = {d}, sh_di[1] = {di}, sh_H[1] = {H}, sh_pin[1] = {m->pin}, sh_cd[1] = {cd};
  int64_t sh_in[2] = {m->pin, d}, sh_out[2] = {d, di}, sh_conv[3] = {cd, 1, K};
  if ((rc = load_one(m, st, NAME("norm.weight"), 1, sh_d, 0, (void **)&L->norm, err)) ||
      (rc = load_one(m, st, NAME("mixer.in_proj.weight"), 2, sh_in, 1, &L->in_w, err)) ||
      (c->proj_bias &&
       (rc = load_one(m, st, NAME("mixer.in_proj.bias"), 1, sh_pin, 1, &L->in_b, err))) ||
      (c->conv_bias &&
       (rc = load_one(m, st, NAME("mixer.conv1d.bias"), 1, sh_cd, 0, (void **)&L->conv_b, err))) ||
      (rc = load_one(m, st, NAME("mixer.dt_bias"), 1, sh_H, 0, (void **)&L->dt_bias, err)) ||
      (rc = load_one(m, st, NAME("mixer.D"), 1, sh_H, 0, (void **)&L->D, err)) ||
      (rc = load_one(m, st, NAME("mixer.norm.weight"), 1, sh_di, 0, (void **)&L->gnorm, err)) ||
      (rc = load_one(m, st, NAME("mixer.out_proj.weight"), 2, sh_out, 1, &L->out_w, err)) ||
      (c->proj_bias &&
       (rc = load_one(m, st, NAME("mixer.out_proj.bias"), 1, sh_d, 1, &L->out_b, err))))
    return rc;
  /* conv weights tap-major, rounded through the dtype (the CPU model's) */
  if ((rc = mbd_st_dir_read_f32(st, NAME("mixer.conv1d.weight"), 3, sh_conv, &v, &n, err)))
    return rc;
  float *tw = (float *)malloc((size_t)(cd * K) * sizeof(float));
  if (!tw) {
    free(v);
    return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  }
  for (int64_t ch = 0; ch < cd; ch++)
    for (int64_t j = 0; j < K; j++) tw[j * cd + ch] = v[ch * K + j];
  free(v);
  rc = upload(m, tw, (size_t)(cd * K), 0, (void **)&L->conv_w, err);
  free(tw);
  if (rc) return rc;
  /* A = -exp(A_log) on the host with the portable exp, as the CPU model */
  if ((rc = mbd_st_dir_read_f32(st, NAME("mixer.A_log"), 1, sh_H, &v, &n, err))) return rc;
  for (size_t k = 0; k < n; k++) v[k] = -mbd_pm_expf(mbd_dev_round_to(m->dtype, v[k]));
  {
    mbd_dtype keep = m->dtype;
    m->dtype = MBD_DTYPE_F32;
    rc = upload(m, v, n, 0, (void **)&L->A, err);
    m->dtype = keep;
  }
  free(v);
#undef NAME
  return rc;
}

static void m2_destroy(void *model) {
  m2gpu *m = (m2gpu *)model;
  if (!m) return;
  if (m->stream) cudaStreamSynchronize(m->stream);
  for (int i = 0; i < M2G_MAX_BUCKETS; i++) mbd_gpu_graph_destroy(&m->graphs[i]);
  mbd_dev_arena_free(&m->arena);
  cudaFreeHost(m->h_tok);
  cudaFreeHost(m->h_step);
  cudaFreeHost(m->h_ssm);
  free(m->layers);
  free(m);
}

static int alloc_runtime(m2gpu *m, mbd_error *err) {
  const mbd_mamba2_config *c = &m->cfg;
  int rc = 0;
  const size_t L = (size_t)c->n_layer, di = (size_t)c->d_inner, d = (size_t)c->d_model;
  const size_t N = (size_t)c->d_state, K = (size_t)c->d_conv, V = (size_t)m->V;
  const size_t es = mbd_dtype_size(m->dtype), cd = (size_t)m->cd, pin = (size_t)m->pin;
  m->conv_slot = (int64_t)(L * (K - 1) * cd);
  m->ssm_slot = (int64_t)(L * di * N);
  const size_t ns = (size_t)m->nslots + 1; /* + the scratch slot */
  const size_t rows = (size_t)m->max_rows, bm = (size_t)m->bucket_max;
  void *p;
#define DA(ptr, bytes)                                 \
  do {                                                 \
    if ((rc = dalloc(m, (bytes), &p, err))) return rc; \
    *(void **)&(ptr) = p;                              \
  } while (0)
  DA(m->conv_st, ns * (size_t)m->conv_slot * 4);
  DA(m->ssm_st, ns * (size_t)m->ssm_slot * (size_t)m->ssm_es);
  MBD_GPU_CHECK(cudaMemset(m->conv_st, 0, ns * (size_t)m->conv_slot * 4), err);
  MBD_GPU_CHECK(cudaMemset(m->ssm_st, 0, ns * (size_t)m->ssm_slot * (size_t)m->ssm_es), err);
  if (m->ssm_es == 2)
    MBD_GPU_CHECK(cudaMallocHost((void **)&m->h_ssm, (size_t)m->ssm_slot * 2), err);
  DA(m->d_tok, rows * 4);
  DA(m->d_slots, rows * 4);
  DA(m->d_step, 2 * bm * 4);
  MBD_GPU_CHECK(cudaMallocHost((void **)&m->h_tok, 2 * rows * 4), err);
  m->h_slots = m->h_tok + rows;
  MBD_GPU_CHECK(cudaMallocHost((void **)&m->h_step, 3 * bm * 4), err);
  m->h_next = m->h_step + 2 * bm;
  DA(m->resid, rows * d * 4);
  DA(m->hn, rows * d * es);
  DA(m->zx, rows * pin * 4);
  DA(m->xbc, rows * cd * 4);
  DA(m->y, rows * di * 4);
  DA(m->y_act, rows * di * es);
  DA(m->out, rows * d * 4);
  DA(m->logits, rows * V * 4);
  DA(m->sample_work, mbd_mops_sample_work_bytes((int)rows));
  MBD_GPU_CHECK(cudaMemset(m->sample_work, 0, mbd_mops_sample_work_bytes((int)rows)), err);
#undef DA
  return 0;
}

static int m2_load(mbd_gpu_ctx *ctx, const char *dir, const mbd_gpu_model_opts *o, void **model,
                   mbd_error *err) {
  *model = NULL;
  mbd_route_identity rid;
  int rc = mbd_gpu_ctx_route(ctx, &rid, err);
  if (rc) return rc;
  mbd_dtype want = rid.policy == MBD_POLICY_BF16 ? MBD_DTYPE_BF16
                   : rid.policy == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                                  : MBD_DTYPE_F32;
  if (o->dtype != want)
    return mbd_error_set(err, MBD_E_INVALID,
                         "model: storage dtype %s does not fit the context's dtype policy %s",
                         mbd_dtype_name(o->dtype), mbd_dtype_policy_name(rid.policy));
  if (rid.state_capacity < 1)
    return mbd_error_set(err, MBD_E_INVALID, "model: context state capacity %lld < 1",
                         (long long)rid.state_capacity);
  m2gpu *m = (m2gpu *)calloc(1, sizeof *m);
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  mbd_st_dir *st = NULL;
  if ((rc = mbd_mamba2_config_load(dir, &m->cfg, err))) goto fail;
  m->ctx = ctx;
  m->stream = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  m->dtype = o->dtype;
  m->nslots = rid.state_capacity;
  m->ssm_es = rid.state == MBD_STATE_BF16 ? 2 : 4;
  m->max_batch = o->max_batch > 0 ? o->max_batch : 256;
  if (m->max_batch > 1 << (M2G_MAX_BUCKETS - 1)) {
    rc = mbd_error_set(err, MBD_E_INVALID, "model: max_batch %d above %d", m->max_batch,
                       1 << (M2G_MAX_BUCKETS - 1));
    goto fail;
  }
  m->bucket_max = 1;
  while (m->bucket_max < m->max_batch) m->bucket_max <<= 1;
  m->max_rows = m->bucket_max > M2G_MAX_ROWS ? m->bucket_max : M2G_MAX_ROWS;
  m->use_graphs = o->use_graphs;
  m->cd = (int64_t)m->cfg.d_inner + 2 * (int64_t)m->cfg.n_groups * m->cfg.d_state;
  m->pin = (int64_t)m->cfg.d_inner + m->cd + m->cfg.n_heads;
  if (m->cfg.d_conv < 2 || m->cfg.d_conv > 8) {
    rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "model: conv_kernel %d outside 2..8",
                       m->cfg.d_conv);
    goto fail;
  }
  if ((rc = mbd_st_dir_open(dir, &st, err))) goto fail;
  {
    const mbd_st_entry *e = mbd_st_dir_find(st, "backbone.embeddings.weight");
    m->V = e && e->desc.ndim == 2 ? e->desc.shape[0] : m->cfg.vocab_size;
    int64_t sh_emb[2] = {m->V, m->cfg.d_model}, sh_d[1] = {m->cfg.d_model};
    m->layers = (layer2_d *)calloc((size_t)m->cfg.n_layer, sizeof(layer2_d));
    if (!m->layers) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
      goto fail;
    }
    if ((rc = load_one(m, st, "backbone.embeddings.weight", 2, sh_emb, 1, &m->emb, err)))
      goto fail;
    m->head = m->emb;
    for (int i = 0; i < m->cfg.n_layer; i++)
      if ((rc = load_layer(m, st, i, err))) goto fail;
    if ((rc = load_one(m, st, "backbone.norm_f.weight", 1, sh_d, 0, (void **)&m->norm_f, err)))
      goto fail;
    if (!m->cfg.tie_embeddings && mbd_st_dir_find(st, "lm_head.weight") &&
        (rc = load_one(m, st, "lm_head.weight", 2, sh_emb, 1, &m->head, err)))
      goto fail;
  }
  if ((rc = alloc_runtime(m, err))) goto fail;
  mbd_st_dir_destroy(&st);
  *model = m;
  return 0;
fail:
  mbd_st_dir_destroy(&st);
  m2_destroy(m);
  return rc;
}

/* ---- running ---- */

static int gemm(m2gpu *m, int64_t rows, int64_t n, int64_t k, const void *x, const void *w,
                const void *bias, float *y, mbd_error *err) {
  mbd_gpu_gemm_args a;
  memset(&a, 0, sizeof a);
  a.dtype = m->dtype;
  a.out_dtype = MBD_DTYPE_F32;
  a.m = rows;
  a.n = n;
  a.k = k;
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.y = y;
  a.w_static = 1; /* weights and biases never change after load */
  return mbd_gpu_gemm(m->ctx, &a, err);
}

/* The layers over rows = ns sequences x tw steps already embedded in resid
 * (slots: their device slot indices); leaves resid with the last layer's
 * output not yet added (m->out holds it). */
static int run_layers(m2gpu *m, int ns, int tw, const int32_t *slots, mbd_error *err) {
  const mbd_mamba2_config *c = &m->cfg;
  const int64_t rows = (int64_t)ns * tw, d = c->d_model, di = c->d_inner;
  const mbd_mops_ssd_dims dm = {c->n_heads, c->head_dim, c->d_state, c->n_groups};
  int rc = 0;
  for (int l = 0; l < c->n_layer; l++) {
    const layer2_d *L = &m->layers[l];
    float *conv_st = m->conv_st + (int64_t)l * (c->d_conv - 1) * m->cd;
    char *ssm_st = (char *)m->ssm_st + (size_t)l * (size_t)(di * c->d_state) * (size_t)m->ssm_es;
    if ((rc = mbd_mops_add_rmsnorm(m->stream, rows, (int)d, 1, 0, m->resid, l ? m->out : NULL,
                                   L->norm, c->norm_eps, m->dtype, m->hn, err)) ||
        (rc = gemm(m, rows, m->pin, d, m->hn, L->in_w, L->in_b, m->zx, err)))
      return rc;
    if (!(rc = mbd_mops_conv_silu(m->stream, ns, tw, (int)m->cd, c->d_conv, m->zx + di, m->pin,
                                  L->conv_w, L->conv_b, conv_st, m->conv_slot, slots, m->xbc,
                                  MBD_DTYPE_F32, NULL, err))) {
      if (m->ssm_es == 2)
        rc = mbd_mops_ssd_scan_bf16state(m->stream, ns, tw, &dm, L->A, L->D, L->dt_bias, c->dt_min,
                                         c->dt_max, m->zx + di + m->cd, m->pin, m->xbc, m->cd,
                                         ssm_st, m->ssm_slot, slots, m->y, err);
      else
        rc = mbd_mops_ssd_scan(m->stream, ns, tw, &dm, L->A, L->D, L->dt_bias, c->dt_min,
                               c->dt_max, m->zx + di + m->cd, m->pin, m->xbc, m->cd,
                               (float *)ssm_st, m->ssm_slot, slots, m->y, err);
    }
    if (rc ||
        (rc = mbd_mops_gated_rmsnorm(m->stream, rows, (int)di, (int)(di / c->n_groups), m->y,
                                     m->zx, m->pin, L->gnorm, c->norm_eps, c->norm_before_gate,
                                     m->dtype, m->y_act, err)) ||
        (rc = gemm(m, rows, d, di, m->y_act, L->out_w, L->out_b, m->out, err)))
      return rc;
  }
  return 0;
}

static int check_slots(const m2gpu *m, int n, const int32_t *slots, mbd_error *err) {
  for (int i = 0; i < n; i++) {
    if (slots[i] < 0 || slots[i] >= m->nslots)
      return mbd_error_set(err, MBD_E_INVALID, "slot %d outside 0..%lld", slots[i],
                           (long long)m->nslots - 1);
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i])
        return mbd_error_set(err, MBD_E_INVALID, "slot %d given twice", slots[i]);
  }
  return 0;
}

static int check_tokens(const m2gpu *m, int64_t n, const int32_t *tokens, mbd_error *err) {
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= m->V)
      return mbd_error_set(err, MBD_E_INVALID, "token %d outside vocabulary [0, %lld)", tokens[i],
                           (long long)m->V);
  return 0;
}

/* The prefill: chunks of at most max_rows rows, eager, synchronous. */
static int prefill_impl(m2gpu *m, int nseq, int T, const int32_t *tokens, const int32_t *slots,
                        mbd_logits_sel sel, float *logits, mbd_error *err) {
  int rc = check_slots(m, nseq, slots, err);
  if (rc) return rc;
  if ((rc = check_tokens(m, (int64_t)nseq * T, tokens, err))) return rc;
  const int64_t d = m->cfg.d_model, V = m->V;
  for (int g0 = 0; g0 < nseq; g0 += m->max_rows) {
    const int ns = nseq - g0 < m->max_rows ? nseq - g0 : m->max_rows;
    const int tw_max = m->max_rows / ns;
    for (int t0 = 0; t0 < T; t0 += tw_max) {
      const int tw = T - t0 < tw_max ? T - t0 : tw_max;
      const int64_t rows = (int64_t)ns * tw;
      for (int s = 0; s < ns; s++) {
        m->h_slots[s] = slots[g0 + s];
        memcpy(m->h_tok + (int64_t)s * tw, tokens + (int64_t)(g0 + s) * T + t0,
               (size_t)tw * 4);
      }
      MBD_GPU_CHECK(cudaMemcpyAsync(m->d_tok, m->h_tok, (size_t)rows * 4,
                                    cudaMemcpyHostToDevice, m->stream),
                    err);
      MBD_GPU_CHECK(cudaMemcpyAsync(m->d_slots, m->h_slots, (size_t)ns * 4,
                                    cudaMemcpyHostToDevice, m->stream),
                    err);
      if ((rc = mbd_mops_embed(m->stream, rows, (int)d, m->d_tok, m->dtype, m->emb, m->resid,
                               err)) ||
          (rc = run_layers(m, ns, tw, m->d_slots, err)))
        return rc;
      if (sel == MBD_LOGITS_ALL) {
        if ((rc = mbd_mops_add_rmsnorm(m->stream, rows, (int)d, 1, 0, m->resid, m->out,
                                       m->norm_f, m->cfg.norm_eps, m->dtype, m->hn, err)) ||
            (rc = gemm(m, rows, V, d, m->hn, m->head, NULL, m->logits, err)))
          return rc;
        for (int s = 0; s < ns; s++)
          MBD_GPU_CHECK(cudaMemcpyAsync(logits + ((int64_t)(g0 + s) * T + t0) * V,
                                        m->logits + (int64_t)s * tw * V, (size_t)(tw * V) * 4,
                                        cudaMemcpyDefault, m->stream),
                        err);
      } else if (sel == MBD_LOGITS_LAST && t0 + tw == T) {
        if ((rc = mbd_mops_add_rmsnorm(m->stream, ns, (int)d, tw, tw - 1, m->resid, m->out,
                                       m->norm_f, m->cfg.norm_eps, m->dtype, m->hn, err)) ||
            (rc = gemm(m, ns, V, d, m->hn, m->head, NULL, m->logits, err)))
          return rc;
        MBD_GPU_CHECK(cudaMemcpyAsync(logits + (int64_t)g0 * V, m->logits,
                                      (size_t)(ns * V) * 4, cudaMemcpyDefault, m->stream),
                      err);
      }
      MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
    }
  }
  return 0;
}

static int m2_prefill(void *model, int nseq, int T, const int32_t *tokens, const int32_t *slots,
                      mbd_logits_sel sel, float *logits, mbd_error *err) {
  if (nseq <= 0 || T <= 0) return 0;
  if (sel != MBD_LOGITS_NONE && !logits)
    return mbd_error_set(err, MBD_E_INVALID, "prefill: logits requested but no buffer given");
  return prefill_impl((m2gpu *)model, nseq, T, tokens, slots, sel, logits, err);
}

/* One decode step of `rows` rows staged in h_step (tokens, then slots): up
 * in one copy, the embedding, the layers, the final norm, the head into
 * m->logits and the greedy picks into pinned h_next. Enqueue only; a graph
 * replays all of it. */
static int step_body(m2gpu *m, int rows, mbd_error *err) {
  const int64_t d = m->cfg.d_model, V = m->V;
  int rc;
  MBD_GPU_CHECK(cudaMemcpyAsync(m->d_step, m->h_step, (size_t)rows * 2 * 4,
                                cudaMemcpyHostToDevice, m->stream),
                err);
  if ((rc = mbd_mops_embed(m->stream, rows, (int)d, m->d_step, m->dtype, m->emb, m->resid,
                           err)) ||
      (rc = run_layers(m, rows, 1, m->d_step + rows, err)) ||
      (rc = mbd_mops_add_rmsnorm(m->stream, rows, (int)d, 1, 0, m->resid, m->out, m->norm_f,
                                 m->cfg.norm_eps, m->dtype, m->hn, err)) ||
      (rc = gemm(m, rows, V, d, m->hn, m->head, NULL, m->logits, err)))
    return rc;
  return mbd_mops_sample(m->stream, rows, (int)V, m->logits, V, NULL, NULL, NULL, m->sample_work,
                         m->h_next, err);
}

/* step_body through mbd_gpu_graph_run */
typedef struct step_call {
  m2gpu *m;
  int rows;
} step_call;
static int step_call_run(void *arg, mbd_error *err) {
  const step_call *c = (const step_call *)arg;
  return step_body(c->m, c->rows, err);
}

static int m2_step(void *model, int n, const int32_t *tokens, const int32_t *slots,
                   int32_t *next, float *logits, mbd_error *err) {
  m2gpu *m = (m2gpu *)model;
  if (n < 1 || n > m->max_batch)
    return mbd_error_set(err, MBD_E_INVALID, "step: batch %d outside 1..%d", n, m->max_batch);
  int rc = check_slots(m, n, slots, err);
  if (rc) return rc;
  if ((rc = check_tokens(m, n, tokens, err))) return rc;
  int bucket = 1, bi = 0;
  while (bucket < n) bucket <<= 1, bi++;
  const int rows = m->use_graphs ? bucket : n;
  /* The staging may still feed a copy only if the previous step failed
   * midway; the stream is idle otherwise. */
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  for (int i = 0; i < rows; i++) {
    m->h_step[i] = i < n ? tokens[i] : 0;
    m->h_step[rows + i] = i < n ? slots[i] : (int32_t)m->nslots; /* padding: scratch slot */
  }
  char what[48] = ""; /* named only for a capture: the replay path formats nothing */
  if (m->use_graphs && !m->graphs[bi])
    snprintf(what, sizeof what, "the batch-%d decode graph", rows);
  step_call call = {m, rows};
  if ((rc = mbd_gpu_graph_run(m->ctx, m->use_graphs, &m->graphs[bi], step_call_run, &call, what,
                              err)))
    return rc;
  if (logits) /* host or device memory (CUDA IPC outputs) */
    MBD_GPU_CHECK(cudaMemcpyAsync(logits, m->logits, (size_t)n * (size_t)m->V * 4,
                                  cudaMemcpyDefault, m->stream),
                  err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  if (next) memcpy(next, m->h_next, (size_t)n * 4);
  return 0;
}

/* ---- slots: payload = u32 heads, head_dim, groups, 0, then conv, ssm ---- */

#define SUB_HEADER 16

static size_t m2_state_payload(const void *model) {
  const m2gpu *m = (const m2gpu *)model;
  return SUB_HEADER + (size_t)(m->conv_slot + m->ssm_slot) * 4;
}

static int check_slot(const m2gpu *m, int64_t slot, mbd_error *err) {
  if (slot < 0 || slot >= m->nslots)
    return mbd_error_set(err, MBD_E_INVALID, "slot %lld outside 0..%lld", (long long)slot,
                         (long long)m->nslots - 1);
  return 0;
}

/* Slot `slot`'s SSM state on the device, and its bytes there. */
static void *ssm_at(const m2gpu *m, int64_t slot) {
  return (char *)m->ssm_st + (size_t)slot * (size_t)m->ssm_slot * (size_t)m->ssm_es;
}
static size_t ssm_bytes(const m2gpu *m) { return (size_t)m->ssm_slot * (size_t)m->ssm_es; }

static int m2_slot_reset(void *model, int64_t slot, mbd_error *err) {
  m2gpu *m = (m2gpu *)model;
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  MBD_GPU_CHECK(cudaMemsetAsync(m->conv_st + slot * m->conv_slot, 0, (size_t)m->conv_slot * 4,
                                m->stream),
                err);
  MBD_GPU_CHECK(cudaMemsetAsync(ssm_at(m, slot), 0, ssm_bytes(m), m->stream), err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int m2_slot_read(void *model, int64_t slot, void *buf, size_t cap, mbd_error *err) {
  m2gpu *m = (m2gpu *)model;
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = m2_state_payload(m), cb = (size_t)m->conv_slot * 4;
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "slot read: buffer of %zu bytes, need %zu", cap,
                         need);
  unsigned char *p = (unsigned char *)buf;
  put_u32(p, (uint32_t)m->cfg.n_heads);
  put_u32(p + 4, (uint32_t)m->cfg.head_dim);
  put_u32(p + 8, (uint32_t)m->cfg.n_groups);
  put_u32(p + 12, 0);
  MBD_GPU_CHECK(cudaMemcpyAsync(p + SUB_HEADER, m->conv_st + slot * m->conv_slot, cb,
                                cudaMemcpyDeviceToHost, m->stream),
                err);
  if (m->ssm_es == 4) {
    MBD_GPU_CHECK(cudaMemcpyAsync(p + SUB_HEADER + cb, ssm_at(m, slot), need - SUB_HEADER - cb,
                                  cudaMemcpyDeviceToHost, m->stream),
                  err);
    MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
    return 0;
  }
  /* bf16 state: through pinned staging, widened exactly into the f32 image */
  MBD_GPU_CHECK(cudaMemcpyAsync(m->h_ssm, ssm_at(m, slot), ssm_bytes(m), cudaMemcpyDeviceToHost,
                                m->stream),
                err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  unsigned char *q = p + SUB_HEADER + cb;
  for (int64_t i = 0; i < m->ssm_slot; i++) {
    const float f = mbd_bf16_to_f32(m->h_ssm[i]);
    memcpy(q + 4 * i, &f, 4);
  }
  return 0;
}

static int m2_slot_write(void *model, int64_t slot, const void *buf, size_t len,
                         mbd_error *err) {
  m2gpu *m = (m2gpu *)model;
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = m2_state_payload(m), cb = (size_t)m->conv_slot * 4;
  if (len != need)
    return mbd_error_set(err, MBD_E_SHAPE, "slot write: %zu bytes, this model's state is %zu",
                         len, need);
  const unsigned char *p = (const unsigned char *)buf;
  if (get_u32(p) != (uint32_t)m->cfg.n_heads || get_u32(p + 4) != (uint32_t)m->cfg.head_dim ||
      get_u32(p + 8) != (uint32_t)m->cfg.n_groups || get_u32(p + 12) != 0)
    return mbd_error_set(err, MBD_E_SHAPE, "slot write: state of %u heads x %u, %u groups",
                         get_u32(p), get_u32(p + 4), get_u32(p + 8));
  MBD_GPU_CHECK(cudaMemcpyAsync(m->conv_st + slot * m->conv_slot, p + SUB_HEADER, cb,
                                cudaMemcpyHostToDevice, m->stream),
                err);
  if (m->ssm_es == 4) {
    MBD_GPU_CHECK(cudaMemcpyAsync(ssm_at(m, slot), p + SUB_HEADER + cb, need - SUB_HEADER - cb,
                                  cudaMemcpyHostToDevice, m->stream),
                  err);
  } else {
    /* bf16 state: the f32 image rounded to nearest even (the kernels'
     * rounding), so an image this route wrote comes back exactly; the
     * staging is free once the stream is idle (slot_read syncs too) */
    MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
    const unsigned char *q = p + SUB_HEADER + cb;
    for (int64_t i = 0; i < m->ssm_slot; i++) {
      float f;
      memcpy(&f, q + 4 * i, 4);
      m->h_ssm[i] = mbd_f32_to_bf16(f);
    }
    MBD_GPU_CHECK(cudaMemcpyAsync(ssm_at(m, slot), m->h_ssm, ssm_bytes(m),
                                  cudaMemcpyHostToDevice, m->stream),
                  err);
  }
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

/* The regions are the payload after its sub-header, which depends on the
 * model only. */
static int m2_slot_regions(void *model, int64_t slot, mbd_gpu_region *out, mbd_error *err) {
  m2gpu *m = (m2gpu *)model;
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  out[0].ptr = m->conv_st + slot * m->conv_slot;
  out[0].bytes = (size_t)m->conv_slot * 4;
  out[1].ptr = ssm_at(m, slot);
  out[1].bytes = ssm_bytes(m);
  return 2;
}

static int64_t m2_vocab(const void *model) { return ((const m2gpu *)model)->V; }
static int64_t m2_slots(const void *model) { return ((const m2gpu *)model)->nslots; }
static mbd_state_shape m2_state_shape(const void *model) {
  return mbd_mamba2_state_shape(&((const m2gpu *)model)->cfg);
}

extern "C" const mbd_gpu_model_ops mbd_mamba2_gpu_ops = {
    /* .name = */ "mamba2",
    /* .load = */ m2_load,
    /* .destroy = */ m2_destroy,
    /* .vocab = */ m2_vocab,
    /* .slots = */ m2_slots,
    /* .state_shape = */ m2_state_shape,
    /* .state_payload = */ m2_state_payload,
    /* .slot_reset = */ m2_slot_reset,
    /* .slot_read = */ m2_slot_read,
    /* .slot_write = */ m2_slot_write,
    /* .prefill = */ m2_prefill,
    /* .step = */ m2_step,
    /* .slot_regions = */ m2_slot_regions,
    /* .step_launch = */ NULL, /* steps run whole (step) */
    /* .step_wait = */ NULL,
    /* .state_dtypes = */ (1u << MBD_STATE_F32) | (1u << MBD_STATE_BF16),
};
