/* Mamba-1 model on a GPU context (see mamba1_gpu.h): options, device
 * allocations, the weights (loaded, or filled by the bench-only synthetic
 * model through mamba1_gpu_impl.h), the workspace and the persistent decode's
 * tables, accessors and state slots. Running the model (prefill, decode
 * steps, graphs) is mamba1_gpu_run.cu.
 *
 * Device memory is allocated at load (weights, state slots, the workspace for
 * max(max_rows, max_batch) rows, pinned staging); nothing is allocated per
 * token.
 *
 * The SSM state is stored in the route's state dtype (f32, or bf16 on a
 * state=bf16 route, which the persistent decode does not run; the conv
 * windows stay f32 either way); the state image is f32 on both: slot_read
 * widens bf16 exactly, slot_write rounds to nearest even (exact for an image
 * a bf16-state route wrote). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/dev_arena.h"
#include "kernels/cuda/gpu_check.h"
#include "kernels/cuda/mamba1_gpu_impl.h"
extern "C" {
#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cuda/mamba_ops.h"
}
#include "kernels/portable_math.h"

/* ------------------------------------------------------------ small helpers */

void mbd_mamba1_gpu_options_default(mbd_mamba1_gpu_options *o) {
  memset(o, 0, sizeof *o);
  o->dtype = MBD_DTYPE_F32;
  o->max_rows = 2048;
  o->max_batch = 256;
  o->use_graphs = 1;
}

static int dalloc(mbd_mamba1_gpu *m, size_t bytes, void **out, mbd_error *err) {
  return mbd_dev_arena_alloc(&m->arena, bytes, out, err);
}

/* Host values (f32) -> device, either in the storage dtype (matrices, GEMM
 * biases) or as f32 rounded through it (small parameters). */
static int upload(mbd_mamba1_gpu *m, const float *v, size_t n, int as_dtype, void **out,
                  mbd_error *err) {
  return mbd_dev_arena_upload(&m->arena, m->dtype, v, n, as_dtype, out, err);
}

/* ------------------------------------------------------------ structure */

static int model_alloc(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg,
                       const mbd_mamba1_gpu_options *opts, mbd_mamba1_gpu **out,
                       mbd_error *err) {
  *out = NULL;
  mbd_mamba1_gpu_options def;
  if (!opts) {
    mbd_mamba1_gpu_options_default(&def);
    opts = &def;
  }
  if (opts->dtype != MBD_DTYPE_F32 && opts->dtype != MBD_DTYPE_BF16 &&
      opts->dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_INVALID, "model: storage dtype must be f32, bf16 or f16");
  mbd_route_identity rid;
  int rc = mbd_gpu_ctx_route(ctx, &rid, err);
  if (rc) return rc;
  mbd_dtype want = rid.policy == MBD_POLICY_BF16 ? MBD_DTYPE_BF16
                   : rid.policy == MBD_POLICY_F16 ? MBD_DTYPE_F16
                                                  : MBD_DTYPE_F32;
  if (want != opts->dtype)
    return mbd_error_set(err, MBD_E_INVALID,
                         "model: storage dtype %s does not fit the context's dtype policy %s "
                         "(use %s)",
                         mbd_dtype_name(opts->dtype), mbd_dtype_policy_name(rid.policy),
                         mbd_dtype_name(want));
  if (rid.state_capacity < 1)
    return mbd_error_set(err, MBD_E_INVALID, "model: context state capacity %lld < 1",
                         (long long)rid.state_capacity);
  if (cfg->d_conv < 2 || cfg->d_conv > 8 ||
      (cfg->d_state != 4 && cfg->d_state != 8 && cfg->d_state != 16 && cfg->d_state != 32))
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model: d_conv %d (2..8) or d_state %d (4, 8, 16, 32) not supported",
                         cfg->d_conv, cfg->d_state);
  int nev = 0;
  for (int i = 0; i < MBD_MAMBA1_GPU_STEP_EVENTS; i++) nev += opts->step_events[i] != NULL;
  if (nev != 0 && nev != MBD_MAMBA1_GPU_STEP_EVENTS)
    return mbd_error_set(err, MBD_E_INVALID, "model: %d of the %d step events given (all or none)",
                         nev, MBD_MAMBA1_GPU_STEP_EVENTS);
  mbd_mamba1_gpu *m = (mbd_mamba1_gpu *)calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  m->ctx = ctx;
  m->stream = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  m->cfg = *cfg;
  m->dtype = opts->dtype;
  m->max_rows = opts->max_rows > 0 ? opts->max_rows : 2048;
  int mb = opts->max_batch > 0 ? opts->max_batch : 256;
  m->max_batch = 1;
  while (m->max_batch < mb && m->max_batch < (1 << (MBD_M1G_MAX_BUCKETS - 1))) m->max_batch <<= 1;
  m->use_graphs = opts->use_graphs;
  m->decode = rid.decode;
  m->dp_epoch_wrap = opts->dp_epoch_wrap;
  for (int i = 0; i < MBD_MAMBA1_GPU_STEP_EVENTS; i++)
    m->step_ev[i] = (cudaEvent_t)opts->step_events[i];
  m->dp_trace = opts->dp_trace;
  m->nslots = rid.state_capacity;
  m->ssm_es = rid.state == MBD_STATE_BF16 ? 2 : 4;
  m->layers = (layer_d *)calloc((size_t)cfg->n_layer, sizeof(layer_d));
  m->stamp = (uint32_t *)calloc((size_t)m->nslots, sizeof(uint32_t));
  if (!m->layers || !m->stamp) {
    mbd_mamba1_gpu_destroy(&m);
    return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  }
  *out = m;
  return 0;
}

/* x_w regrouped by 8-channel group, [di / 8][R + 2N][8] (layer_d.x_wg): one
 * contiguous slice per group for the persistent decode's producer. */
static int dp_regroup_xw(mbd_mamba1_gpu *m, layer_d *L, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  const size_t es = mbd_dtype_size(m->dtype), no = (size_t)(c->dt_rank + 2 * c->d_state);
  const size_t di = (size_t)c->d_inner, bytes = no * di * es;
  unsigned char *h = (unsigned char *)malloc(2 * bytes), *g = h + bytes;
  if (!h) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  int rc = 0;
  MBD_GPU_TRY(cudaMemcpy(h, L->x_w, bytes, cudaMemcpyDeviceToHost), err);
  for (size_t o = 0; o < no; o++)
    for (size_t k = 0; k < di; k++)
      memcpy(g + (((k / 8) * no + o) * 8 + k % 8) * es, h + (o * di + k) * es, es);
  if ((rc = dalloc(m, bytes, &L->x_wg, err))) goto fail;
  MBD_GPU_TRY(cudaMemcpy(L->x_wg, g, bytes, cudaMemcpyHostToDevice), err);
fail:
  free(h);
  return rc;
}

/* The persistent decode's view (decode_persistent.h): a device copy of the
 * layer table (layer_d is its mbd_dp_layer, with x_wg filled in), its x_proj
 * exchange words and its launch counter. Runs after the weights and the
 * workspace exist; only where the route allows the persistent decode and it
 * can run. */
static int dp_setup(mbd_mamba1_gpu *m, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  if (m->decode != MBD_DECODE_PERSISTENT) return 0;
  if (m->ssm_es != 4) return 0; /* it keeps an f32 state only */
  if (m->dtype != MBD_DTYPE_BF16 && m->dtype != MBD_DTYPE_F16) return 0; /* dp stays zeroed: */
  if (c->d_inner > MBD_DP_MAX_INNER) return 0;                           /* never runs */
  const size_t tb = (size_t)c->n_layer * sizeof(mbd_dp_layer);
  /* the exchange words (decode_persistent.h), 4 rows each, zeroed: tag 0 */
  const size_t xq = 4 * (size_t)(c->dt_rank + 2 * c->d_state) * (MBD_DP_MAX_INNER / 16) * 8,
               xs = 4 * (size_t)(c->dt_rank + 2 * c->d_state) * 8,
               xy = 4 * (size_t)c->d_inner / 2 * 8, xo = 4 * (size_t)c->d_model * 8;
  void *dl = NULL, *ep = NULL, *q = NULL, *xsd = NULL, *y = NULL, *o = NULL;
  int rc = 0;
  for (int l = 0; l < c->n_layer && !rc; l++) rc = dp_regroup_xw(m, &m->layers[l], err);
  if (rc || (rc = dalloc(m, tb, &dl, err)) || (rc = dalloc(m, sizeof(unsigned), &ep, err)) ||
      (rc = dalloc(m, xq, &q, err)) || (rc = dalloc(m, xs, &xsd, err)) ||
      (rc = dalloc(m, xy, &y, err)) || (rc = dalloc(m, xo, &o, err)))
    goto fail;
  MBD_GPU_TRY(cudaMemcpy(dl, m->layers, tb, cudaMemcpyHostToDevice), err);
  /* on the model's stream, done before the first launch: a memset left on
   * the legacy stream could land after a launch's words and hang it */
  MBD_GPU_TRY(cudaMemsetAsync(ep, 0, sizeof(unsigned), m->stream), err);
  MBD_GPU_TRY(cudaMemsetAsync(q, 0, xq, m->stream), err);
  MBD_GPU_TRY(cudaMemsetAsync(xsd, 0, xs, m->stream), err);
  MBD_GPU_TRY(cudaMemsetAsync(y, 0, xy, m->stream), err);
  MBD_GPU_TRY(cudaMemsetAsync(o, 0, xo, m->stream), err);
  MBD_GPU_TRY(cudaStreamSynchronize(m->stream), err);
  {
    mbd_dp_model *dp = &m->dp;
    dp->d_model = c->d_model;
    dp->d_inner = c->d_inner;
    dp->dt_rank = c->dt_rank;
    dp->d_state = c->d_state;
    dp->d_conv = c->d_conv;
    dp->n_layer = c->n_layer;
    dp->norm_eps = c->norm_eps;
    dp->dtype = m->dtype;
    dp->emb = m->emb;
    dp->layers = (const mbd_dp_layer *)dl;
    dp->conv_state = m->conv_st;
    dp->conv_slot = m->conv_slot;
    dp->ssm_state = (float *)m->ssm_st;
    dp->ssm_slot = m->ssm_slot;
    dp->xq = (uint64_t *)q;
    dp->xs = (uint64_t *)xsd;
    dp->xy = (uint64_t *)y;
    dp->xo = (uint64_t *)o;
    dp->epoch = (unsigned *)ep;
    /* tags (launch * n_layer + layer + 1) stay below 2^32; the tests' wrap
     * comes sooner, never later */
    const uint32_t wrap = 0xfffffffeu / (uint32_t)c->n_layer - 1u;
    const uint32_t ew = m->dp_epoch_wrap;
    dp->epoch_wrap = ew > 0 && ew < wrap ? ew : wrap;
    dp->resid = m->resid;
    dp->out = m->out;
    dp->norm_f = m->norm_f;
    dp->hn = m->hn;
  }
fail:
  return rc;
}

static int alloc_runtime(mbd_mamba1_gpu *m, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  int rc = 0;
  const size_t L = (size_t)c->n_layer, di = (size_t)c->d_inner, d = (size_t)c->d_model;
  const size_t N = (size_t)c->d_state, R = (size_t)c->dt_rank, K = (size_t)c->d_conv;
  const size_t V = (size_t)c->vocab_size, es = mbd_dtype_size(m->dtype);
  m->conv_slot = (int64_t)(L * (K - 1) * di);
  m->ssm_slot = (int64_t)(L * di * N);
  const size_t ns = (size_t)m->nslots + 1;
  size_t rows = (size_t)(m->max_rows > m->max_batch ? m->max_rows : m->max_batch);
  void *p;
#define DA(ptr, bytes)                                     \
  do {                                                     \
    if ((rc = dalloc(m, (bytes), &p, err))) return rc;     \
    *(void **)&(ptr) = p;                                  \
  } while (0)
  DA(m->conv_st, ns * (size_t)m->conv_slot * 4);
  DA(m->ssm_st, ns * (size_t)m->ssm_slot * (size_t)m->ssm_es);
  MBD_GPU_CHECK(cudaMemset(m->conv_st, 0, ns * (size_t)m->conv_slot * 4), err);
  MBD_GPU_CHECK(cudaMemset(m->ssm_st, 0, ns * (size_t)m->ssm_slot * (size_t)m->ssm_es), err);
  if (m->ssm_es == 2)
    MBD_GPU_CHECK(cudaMallocHost((void **)&m->h_ssm, (size_t)m->ssm_slot * 2), err);
  const size_t B = (size_t)m->max_batch;
  const size_t o_temp = 2 * rows * 4, o_seed = (o_temp + B * 4 + 7) & ~(size_t)7;
  const size_t o_step = o_seed + B * 8;
  m->in_bytes = o_step + B * 8;
  DA(m->d_in, m->in_bytes);
  MBD_GPU_CHECK(cudaMallocHost(&m->h_in, m->in_bytes), err);
  memset(m->h_in, 0, m->in_bytes);
  m->d_tok = (int32_t *)m->d_in;
  m->d_slots = (int32_t *)((char *)m->d_in + rows * 4);
  m->d_temp = (float *)((char *)m->d_in + o_temp);
  m->d_seed = (uint64_t *)((char *)m->d_in + o_seed);
  m->d_step = (uint64_t *)((char *)m->d_in + o_step);
  m->h_tok = (int32_t *)m->h_in;
  m->h_slots = (int32_t *)((char *)m->h_in + rows * 4);
  m->h_temp = (float *)((char *)m->h_in + o_temp);
  m->h_seed = (uint64_t *)((char *)m->h_in + o_seed);
  m->h_step = (uint64_t *)((char *)m->h_in + o_step);
  DA(m->resid, rows * d * 4);
  DA(m->hn, rows * d * es);
  DA(m->xz, rows * 2 * di * 4);
  DA(m->xc, rows * di * 4);
  if (m->dtype == MBD_DTYPE_F32)
    m->xc_act = m->xc;
  else
    DA(m->xc_act, rows * di * es);
  DA(m->dbl, rows * (R + 2 * N) * 4);
  DA(m->y, rows * di * es);
  DA(m->out, rows * d * 4);
  DA(m->logits, rows * V * 4);
  DA(m->sample_work, mbd_mops_sample_work_bytes((int)B));
  /* the sampler's row counters start at zero; each launch leaves them zero */
  MBD_GPU_CHECK(cudaMemset(m->sample_work, 0, mbd_mops_sample_work_bytes((int)B)), err);
#undef DA
  MBD_GPU_CHECK(cudaMallocHost((void **)&m->h_next, B * 4), err);
  return dp_setup(m, err);
}

void mbd_mamba1_gpu_destroy(mbd_mamba1_gpu **pm) {
  if (!pm || !*pm) return;
  mbd_mamba1_gpu *m = *pm;
  if (m->stream) cudaStreamSynchronize(m->stream);
  for (int i = 0; i < MBD_M1G_MAX_BUCKETS; i++) mbd_gpu_graph_destroy(&m->graphs[i]);
  mbd_dev_arena_free(&m->arena);
  cudaFreeHost(m->h_in);
  cudaFreeHost(m->h_next);
  cudaFreeHost(m->h_ssm);
  free(m->layers);
  free(m->stamp);
  free(m);
  *pm = NULL;
}

/* ------------------------------------------------------------ loading */

/* One tensor through the shared checkpoint reader (common/safetensors.h),
 * uploaded as upload() says. */
static int load_one(mbd_mamba1_gpu *m, const mbd_st_dir *st, const char *name, int ndim,
                    const int64_t *shape, int as_dtype, void **out, mbd_error *err) {
  return mbd_dev_arena_load(&m->arena, m->dtype, st, name, ndim, shape, as_dtype, out, err);
}

static int load_layer(mbd_mamba1_gpu *m, const mbd_st_dir *st, int i, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  layer_d *L = &m->layers[i];
  const int64_t d = c->d_model, di = c->d_inner, N = c->d_state, R = c->dt_rank, K = c->d_conv;
  char nm[256];
  int rc;
  float *v = NULL;
  size_t n = 0;
#define NAME(suffix) (snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", i, suffix), nm)
  int64_t sh_d[1] = {d}, sh_di[1] = {di}, sh_2di[1] = {2 * di}, sh_A[2] = {di, N};
  int64_t sh_in[2] = {2 * di, d}, sh_x[2] = {R + 2 * N, di}, sh_dt[2] = {di, R};
  int64_t sh_out[2] = {d, di}, sh_conv[3] = {di, 1, K};
  if ((rc = load_one(m, st, NAME("norm.weight"), 1, sh_d, 0, (void **)&L->norm, err)))
    return rc;
  if ((rc = load_one(m, st, NAME("mixer.in_proj.weight"), 2, sh_in, 1, &L->in_w, err)))
    return rc;
  if (c->proj_bias &&
      (rc = load_one(m, st, NAME("mixer.in_proj.bias"), 1, sh_2di, 1, &L->in_b, err)))
    return rc;
  if ((rc = mbd_st_dir_read_f32(st, NAME("mixer.conv1d.weight"), 3, sh_conv, &v, &n, err)))
    return rc;
  {
    float *tm = (float *)malloc(n * sizeof(float) + 4);
    if (!tm) {
      free(v);
      return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
    }
    for (int64_t ch = 0; ch < di; ch++)
      for (int64_t j = 0; j < K; j++) tm[j * di + ch] = v[ch * K + j];
    rc = upload(m, tm, n, 0, (void **)&L->conv_w, err);
    free(tm);
    free(v);
    v = NULL;
    if (rc) return rc;
  }
  if (c->conv_bias &&
      (rc = load_one(m, st, NAME("mixer.conv1d.bias"), 1, sh_di, 0, (void **)&L->conv_b, err)))
    return rc;
  if ((rc = load_one(m, st, NAME("mixer.x_proj.weight"), 2, sh_x, 1, &L->x_w, err)))
    return rc;
  if ((rc = load_one(m, st, NAME("mixer.dt_proj.weight"), 2, sh_dt, 1, &L->dt_w, err)))
    return rc;
  if ((rc = load_one(m, st, NAME("mixer.dt_proj.bias"), 1, sh_di, 1, &L->dt_b, err)))
    return rc;
  if ((rc = mbd_st_dir_read_f32(st, NAME("mixer.A_log"), 2, sh_A, &v, &n, err))) return rc;
  /* As the CPU model: round A_log through the storage dtype, then A = -expf. */
  for (size_t k = 0; k < n; k++) v[k] = -mbd_pm_expf(mbd_dev_round_to(m->dtype, v[k]));
  {
    /* upload() rounds through the dtype again; A itself must stay exact f32. */
    mbd_dtype keep = m->dtype;
    m->dtype = MBD_DTYPE_F32;
    rc = upload(m, v, n, 0, (void **)&L->A, err);
    m->dtype = keep;
    free(v);
    if (rc) return rc;
  }
  if ((rc = load_one(m, st, NAME("mixer.D"), 1, sh_di, 0, (void **)&L->D, err))) return rc;
  if ((rc = load_one(m, st, NAME("mixer.out_proj.weight"), 2, sh_out, 1, &L->out_w, err)))
    return rc;
  if (c->proj_bias &&
      (rc = load_one(m, st, NAME("mixer.out_proj.bias"), 1, sh_d, 1, &L->out_b, err)))
    return rc;
#undef NAME
  return 0;
}

extern "C" int mbd_mamba1_gpu_load(mbd_gpu_ctx *ctx, const char *dir,
                                   const mbd_mamba1_gpu_options *opts, mbd_mamba1_gpu **out,
                                   mbd_error *err) {
  *out = NULL;
  mbd_mamba_config cfg;
  mbd_st_dir *st = NULL;
  mbd_mamba1_gpu *m = NULL;
  int rc = mbd_mamba_config_load(dir, &cfg, err);
  if (rc) return rc;
  if ((rc = mbd_st_dir_open(dir, &st, err))) return rc;
  if ((rc = mbd_st_dir_set_progress(st, opts ? opts->progress : NULL, err))) goto fail;
  if ((rc = model_alloc(ctx, &cfg, opts, &m, err))) goto fail;
  {
    int64_t sh_e[2] = {cfg.vocab_size, cfg.d_model}, sh_d[1] = {cfg.d_model};
    if ((rc = load_one(m, st, "backbone.embeddings.weight", 2, sh_e, 1, &m->emb, err)))
      goto fail;
    for (int i = 0; i < cfg.n_layer; i++)
      if ((rc = load_layer(m, st, i, err))) goto fail;
    if ((rc = load_one(m, st, "backbone.norm_f.weight", 1, sh_d, 0, (void **)&m->norm_f,
                       err)))
      goto fail;
    m->head = m->emb;
    if (!cfg.tie_embeddings && mbd_st_dir_find(st, "lm_head.weight") &&
        (rc = load_one(m, st, "lm_head.weight", 2, sh_e, 1, &m->head, err)))
      goto fail;
  }
  if ((rc = alloc_runtime(m, err))) goto fail;
  mbd_st_dir_destroy(&st);
  *out = m;
  return 0;
fail:
  mbd_st_dir_destroy(&st);
  mbd_mamba1_gpu_destroy(&m);
  return mbd_error_prefix(err, "loading %s on the GPU", dir);
}

/* ------------------------------------------------------------ internal entries */

/* For the bench-only synthetic model (mamba1_gpu_impl.h). */
extern "C" int mbd_m1g_alloc(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg,
                             const mbd_mamba1_gpu_options *opts, mbd_mamba1_gpu **out,
                             mbd_error *err) {
  return model_alloc(ctx, cfg, opts, out, err);
}
extern "C" int mbd_m1g_dalloc(mbd_mamba1_gpu *m, size_t bytes, void **out, mbd_error *err) {
  return dalloc(m, bytes, out, err);
}
extern "C" int mbd_m1g_upload(mbd_mamba1_gpu *m, const float *v, size_t n, int as_dtype,
                              void **out, mbd_error *err) {
  return upload(m, v, n, as_dtype, out, err);
}
extern "C" int mbd_m1g_finish(mbd_mamba1_gpu *m, mbd_error *err) { return alloc_runtime(m, err); }

/* ------------------------------------------------------------ accessors */

const mbd_mamba_config *mbd_mamba1_gpu_config(const mbd_mamba1_gpu *m) { return &m->cfg; }
mbd_dtype mbd_mamba1_gpu_dtype(const mbd_mamba1_gpu *m) { return m->dtype; }
int64_t mbd_mamba1_gpu_slots(const mbd_mamba1_gpu *m) { return m->nslots; }
size_t mbd_mamba1_gpu_weight_bytes(const mbd_mamba1_gpu *m) { return m->arena.param_bytes; }
size_t mbd_mamba1_gpu_state_bytes(const mbd_mamba1_gpu *m) {
  return (size_t)(m->conv_slot + m->ssm_slot) * 4;
}

/* ------------------------------------------------------------ state slots */

/* Slot `slot`'s SSM state on the device, and its bytes there. */
static void *ssm_at(const mbd_mamba1_gpu *m, int64_t slot) {
  return (char *)m->ssm_st + (size_t)slot * (size_t)m->ssm_slot * (size_t)m->ssm_es;
}
static size_t ssm_bytes(const mbd_mamba1_gpu *m) {
  return (size_t)m->ssm_slot * (size_t)m->ssm_es;
}

extern "C" int mbd_m1g_check_slot(const mbd_mamba1_gpu *m, int64_t slot, mbd_error *err) {
  if (slot < 0 || slot >= m->nslots)
    return mbd_error_set(err, MBD_E_INVALID, "state slot %lld outside 0..%lld", (long long)slot,
                         (long long)m->nslots - 1);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_reset(mbd_mamba1_gpu *m, int64_t slot, mbd_error *err) {
  int rc = mbd_m1g_check_slot(m, slot, err);
  if (rc) return rc;
  MBD_GPU_CHECK(cudaMemsetAsync(m->conv_st + slot * m->conv_slot, 0, (size_t)m->conv_slot * 4,
                                m->stream),
                err);
  MBD_GPU_CHECK(cudaMemsetAsync(ssm_at(m, slot), 0, ssm_bytes(m), m->stream), err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_read(mbd_mamba1_gpu *m, int64_t slot, void *buf, size_t cap,
                                        mbd_error *err) {
  int rc = mbd_m1g_check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = mbd_mamba1_gpu_state_bytes(m), cb = (size_t)m->conv_slot * 4;
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "slot read: buffer of %zu bytes, need %zu", cap,
                         need);
  MBD_GPU_CHECK(cudaMemcpyAsync(buf, m->conv_st + slot * m->conv_slot, cb,
                                cudaMemcpyDeviceToHost, m->stream),
                err);
  if (m->ssm_es == 4) {
    MBD_GPU_CHECK(cudaMemcpyAsync((char *)buf + cb, ssm_at(m, slot), need - cb,
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
  unsigned char *q = (unsigned char *)buf + cb;
  for (int64_t i = 0; i < m->ssm_slot; i++) {
    const float f = mbd_bf16_to_f32(m->h_ssm[i]);
    memcpy(q + 4 * i, &f, 4);
  }
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_regions(mbd_mamba1_gpu *m, int64_t slot, void **ptr,
                                           size_t *bytes, mbd_error *err) {
  int rc = mbd_m1g_check_slot(m, slot, err);
  if (rc) return rc;
  ptr[0] = m->conv_st + slot * m->conv_slot;
  bytes[0] = (size_t)m->conv_slot * 4;
  ptr[1] = ssm_at(m, slot);
  bytes[1] = ssm_bytes(m);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_write(mbd_mamba1_gpu *m, int64_t slot, const void *buf,
                                         size_t len, mbd_error *err) {
  int rc = mbd_m1g_check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = mbd_mamba1_gpu_state_bytes(m), cb = (size_t)m->conv_slot * 4;
  if (len != need)
    return mbd_error_set(err, MBD_E_SHAPE, "slot write: %zu bytes, this model's state is %zu",
                         len, need);
  MBD_GPU_CHECK(cudaMemcpyAsync(m->conv_st + slot * m->conv_slot, buf, cb,
                                cudaMemcpyHostToDevice, m->stream),
                err);
  if (m->ssm_es == 4) {
    MBD_GPU_CHECK(cudaMemcpyAsync(ssm_at(m, slot), (const char *)buf + cb, need - cb,
                                  cudaMemcpyHostToDevice, m->stream),
                  err);
  } else {
    /* bf16 state: the f32 image rounded to nearest even (the kernels'
     * rounding), so an image this route wrote comes back exactly; the
     * staging is free once the stream is idle (slot_read syncs too) */
    MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
    const unsigned char *q = (const unsigned char *)buf + cb;
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
