/* Mamba-1 model on a GPU context (see mamba1_gpu.h).
 *
 * One forward routine serves prefill chunks and decode steps: rows are
 * sequences x time steps, projections are mbd_gpu_gemm calls (row-invariant by
 * the GEMM contract), and the conv and scan kernels walk each sequence's time
 * steps in order from its slot's state, so a row's bits never depend on the
 * batch, the chunking or the bucket. in_proj, out_proj and the LM head are
 * mbd_gpu_gemm calls; x_proj (N = dt_rank + 2 d_state, tiny) is one
 * mbd_mops_xproj launch and dt_proj is folded into the scan kernel, each with
 * its own row-invariant contract (mamba_ops.h, docs/route.md "Model kernels").
 * Small-batch decode folds the conv into x_proj and the scan (mbd_mops_conv_fused).
 *
 * Device memory is allocated at load (weights, state slots, the workspace for
 * max(max_rows, max_batch) rows, pinned staging); graphs are captured on first
 * use of a bucket; nothing is allocated per token. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gpu_check.h"
extern "C" {
#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cuda/decode_persistent.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/mamba1_gpu.h"
#include "kernels/cuda/mamba_ops.h"
}
#include "kernels/portable_math.h"

#define MAX_BUCKETS 16

typedef mbd_dp_layer layer_d; /* one layer's device weights (decode_persistent.h) */

struct mbd_mamba1_gpu {
  mbd_gpu_ctx *ctx;
  cudaStream_t stream;
  mbd_mamba_config cfg;
  mbd_dtype dtype;       /* storage dtype = activation dtype of GEMM inputs */
  int max_rows, max_batch, use_graphs;
  int64_t nslots;        /* real slots; index nslots is the padding scratch slot */
  layer_d *layers;
  void *emb;             /* [V, d] dtype */
  void *head;            /* LM head weight: emb when tied */
  float *norm_f;         /* [d] */
  size_t weight_bytes;
  void **allocs;         /* every device allocation, freed at destroy */
  int nalloc, capalloc;
  float *conv_st;        /* [nslots + 1][L][K-1][di] */
  float *ssm_st;         /* [nslots + 1][L][di][N] */
  int64_t conv_slot, ssm_slot; /* floats per slot */
  /* workspace, `rows` = max(max_rows, max_batch) */
  int32_t *d_tok, *d_slots;
  float *resid, *xz, *xc, *dbl, *out, *logits; /* dbl: x_proj rows [dt_low | B | C] */
  void *hn, *xc_act, *y;
  void *sample_work;
  float *d_temp;
  uint64_t *d_seed, *d_step;
  /* pinned staging */
  int32_t *h_tok, *h_slots, *h_next;
  float *h_temp;
  uint64_t *h_seed, *h_step;
  void *h_in, *d_in;     /* one pinned block [tok|slots|temp|seed|step] and its device
                            mirror (same offsets): a step's inputs in one copy */
  size_t in_bytes;
  uint32_t *stamp;       /* host [nslots]: duplicate-slot check */
  uint32_t gen;
  mbd_gpu_graph *graphs[MAX_BUCKETS];
  mbd_dp_model dp;       /* the persistent decode's view of this model */
  int marking;           /* inside step_body with MBD_STEP_EVENTS=1 */
};

/* MBD_STEP_EVENTS=1 (a diagnostic): events at a decode step's stage
 * boundaries, recorded into the graphs captured while it is set; the last
 * step's intervals by mbd_mamba1_gpu_step_events_print. */
#define STEP_EV 6
static cudaEvent_t g_step_ev[STEP_EV];
static int step_events_on(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("MBD_STEP_EVENTS");
    on = e && e[0] == '1';
    for (int i = 0; on && i < STEP_EV; i++)
      if (cudaEventCreate(&g_step_ev[i]) != cudaSuccess) on = 0;
  }
  return on;
}
static void step_mark(const mbd_mamba1_gpu *m, int i) {
  /* External: an event record node of the graph, not a capture-internal join */
  if (m->marking) (void)cudaEventRecordWithFlags(g_step_ev[i], m->stream, cudaEventRecordExternal);
}
extern "C" void mbd_mamba1_gpu_step_events_print(void) {
  static const char *name[STEP_EV - 1] = {"inputs up (copy)", "layers", "final add + norm",
                                          "lm_head", "sampling"};
  if (!step_events_on() || cudaEventSynchronize(g_step_ev[STEP_EV - 1]) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  printf("decode step on the device (events in the graph), us:");
  for (int i = 0; i + 1 < STEP_EV; i++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, g_step_ev[i], g_step_ev[i + 1]);
    printf(" %s %.1f;", name[i], ms * 1e3);
  }
  float ms = 0;
  cudaEventElapsedTime(&ms, g_step_ev[0], g_step_ev[STEP_EV - 1]);
  printf(" total %.1f\n", ms * 1e3);
}

/* ------------------------------------------------------------ small helpers */

void mbd_mamba1_gpu_options_default(mbd_mamba1_gpu_options *o) {
  o->dtype = MBD_DTYPE_F32;
  o->max_rows = 2048;
  o->max_batch = 256;
  o->use_graphs = 1;
}

static int dalloc(mbd_mamba1_gpu *m, size_t bytes, void **out, mbd_error *err) {
  *out = NULL;
  if (m->nalloc == m->capalloc) {
    int nc = m->capalloc ? 2 * m->capalloc : 64;
    void **na = (void **)realloc(m->allocs, (size_t)nc * sizeof(void *));
    if (!na) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
    m->allocs = na;
    m->capalloc = nc;
  }
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 16);
  if (e != cudaSuccess)
    return mbd_error_set(err, MBD_E_NOMEM, "model: cudaMalloc of %zu bytes failed: %s", bytes,
                         cudaGetErrorName(e));
  m->allocs[m->nalloc++] = *out;
  return 0;
}

static float round_to(mbd_dtype dt, float v) {
  if (dt == MBD_DTYPE_BF16) return mbd_bf16_to_f32(mbd_f32_to_bf16(v));
  if (dt == MBD_DTYPE_F16) return mbd_f16_to_f32(mbd_f32_to_f16(v));
  return v;
}

/* Host values (f32) -> device, either in the storage dtype (matrices, GEMM
 * biases) or as f32 rounded through it (small parameters). */
static int upload(mbd_mamba1_gpu *m, const float *v, size_t n, int as_dtype, void **out,
                  mbd_error *err) {
  int rc = 0;
  size_t es = as_dtype ? mbd_dtype_size(m->dtype) : 4;
  void *host = malloc(n * es + 4);
  if (!host) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  for (size_t i = 0; i < n; i++) {
    if (!as_dtype || m->dtype == MBD_DTYPE_F32) {
      ((float *)host)[i] = as_dtype ? v[i] : round_to(m->dtype, v[i]);
    } else {
      ((uint16_t *)host)[i] =
          m->dtype == MBD_DTYPE_BF16 ? mbd_f32_to_bf16(v[i]) : mbd_f32_to_f16(v[i]);
    }
  }
  if ((rc = dalloc(m, n * es, out, err))) goto fail;
  MBD_GPU_TRY(cudaMemcpy(*out, host, n * es, cudaMemcpyHostToDevice), err);
  m->weight_bytes += n * mbd_dtype_size(m->dtype);
fail:
  free(host);
  return rc;
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
  mbd_mamba1_gpu *m = (mbd_mamba1_gpu *)calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of host memory");
  m->ctx = ctx;
  m->stream = (cudaStream_t)mbd_gpu_ctx_stream(ctx);
  m->cfg = *cfg;
  m->dtype = opts->dtype;
  m->max_rows = opts->max_rows > 0 ? opts->max_rows : 2048;
  int mb = opts->max_batch > 0 ? opts->max_batch : 256;
  m->max_batch = 1;
  while (m->max_batch < mb && m->max_batch < (1 << (MAX_BUCKETS - 1))) m->max_batch <<= 1;
  m->use_graphs = opts->use_graphs;
  m->nslots = rid.state_capacity;
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
 * workspace exist; only where the persistent decode can run. */
static int dp_setup(mbd_mamba1_gpu *m, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
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
    dp->ssm_state = m->ssm_st;
    dp->ssm_slot = m->ssm_slot;
    dp->xq = (uint64_t *)q;
    dp->xs = (uint64_t *)xsd;
    dp->xy = (uint64_t *)y;
    dp->xo = (uint64_t *)o;
    dp->epoch = (unsigned *)ep;
    /* tags (launch * n_layer + layer + 1) stay below 2^32; MBD_DP_EPOCH_WRAP
     * (tests) wraps sooner, never later */
    const uint32_t wrap = 0xfffffffeu / (uint32_t)c->n_layer - 1u;
    const char *ew = getenv("MBD_DP_EPOCH_WRAP");
    const long ewv = ew ? atol(ew) : 0;
    dp->epoch_wrap = ewv > 0 && (unsigned long)ewv < wrap ? (uint32_t)ewv : wrap;
    dp->resid = m->resid;
    dp->out = m->out;
    dp->norm_f = m->norm_f;
    dp->hn = m->hn;
  }
  mbd_dp_trace_prepare(c->n_layer);
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
  DA(m->ssm_st, ns * (size_t)m->ssm_slot * 4);
  MBD_GPU_CHECK(cudaMemset(m->conv_st, 0, ns * (size_t)m->conv_slot * 4), err);
  MBD_GPU_CHECK(cudaMemset(m->ssm_st, 0, ns * (size_t)m->ssm_slot * 4), err);
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
  for (int i = 0; i < MAX_BUCKETS; i++) mbd_gpu_graph_destroy(&m->graphs[i]);
  for (int i = 0; i < m->nalloc; i++) cudaFree(m->allocs[i]);
  cudaFreeHost(m->h_in);
  cudaFreeHost(m->h_next);
  free(m->allocs);
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
  float *v = NULL;
  size_t n = 0;
  int rc = mbd_st_dir_read_f32(st, name, ndim, shape, &v, &n, err);
  if (!rc) rc = upload(m, v, n, as_dtype, out, err);
  free(v);
  return rc;
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
  for (size_t k = 0; k < n; k++) v[k] = -mbd_pm_expf(round_to(m->dtype, v[k]));
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
  return mbd_error_prefix(err, "loading %s on the GPU: ", dir);
}

/* Synthetic model: matrices filled on the device, small vectors on the host. */
extern "C" int mbd_mamba1_gpu_new_random(mbd_gpu_ctx *ctx, const mbd_mamba_config *cfg,
                                         uint64_t seed, const mbd_mamba1_gpu_options *opts,
                                         mbd_mamba1_gpu **out, mbd_error *err) {
  *out = NULL;
  mbd_mamba1_gpu *m = NULL;
  float *h = NULL;
  int rc = model_alloc(ctx, cfg, opts, &m, err);
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
    if ((rc = dalloc(m, (size_t)(rows) * (size_t)(cols) * es, &(ptr), err))) goto fail;   \
    if ((rc = mbd_mops_fill_uniform(m->stream, m->dtype, (ptr), (int64_t)(rows) * (cols), \
                                    seed++, 1.0f / sqrtf((float)(cols)), err)))            \
      goto fail;                                                                         \
    m->weight_bytes += (size_t)(rows) * (size_t)(cols) * es;                             \
  } while (0)
#define VEC(ptr, n, as_dtype, expr)                                                  \
  do {                                                                             \
    for (int64_t i_ = 0; i_ < (n); i_++) h[i_] = (expr);                           \
    if ((rc = upload(m, h, (size_t)(n), (as_dtype), (void **)&(ptr), err))) goto fail; \
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
  if ((rc = alloc_runtime(m, err))) goto fail;
  MBD_GPU_TRY(cudaStreamSynchronize(m->stream), err);
  free(h);
  *out = m;
  return 0;
fail:
  free(h);
  mbd_mamba1_gpu_destroy(&m);
  return rc;
}

/* ------------------------------------------------------------ accessors */

const mbd_mamba_config *mbd_mamba1_gpu_config(const mbd_mamba1_gpu *m) { return &m->cfg; }
mbd_dtype mbd_mamba1_gpu_dtype(const mbd_mamba1_gpu *m) { return m->dtype; }
int64_t mbd_mamba1_gpu_slots(const mbd_mamba1_gpu *m) { return m->nslots; }
size_t mbd_mamba1_gpu_weight_bytes(const mbd_mamba1_gpu *m) { return m->weight_bytes; }
size_t mbd_mamba1_gpu_state_bytes(const mbd_mamba1_gpu *m) {
  return (size_t)(m->conv_slot + m->ssm_slot) * 4;
}

/* ------------------------------------------------------------ state slots */

static int check_slot(const mbd_mamba1_gpu *m, int64_t slot, mbd_error *err) {
  if (slot < 0 || slot >= m->nslots)
    return mbd_error_set(err, MBD_E_INVALID, "state slot %lld outside 0..%lld", (long long)slot,
                         (long long)m->nslots - 1);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_reset(mbd_mamba1_gpu *m, int64_t slot, mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  MBD_GPU_CHECK(cudaMemsetAsync(m->conv_st + slot * m->conv_slot, 0, (size_t)m->conv_slot * 4,
                                m->stream),
                err);
  MBD_GPU_CHECK(
      cudaMemsetAsync(m->ssm_st + slot * m->ssm_slot, 0, (size_t)m->ssm_slot * 4, m->stream),
      err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_read(mbd_mamba1_gpu *m, int64_t slot, void *buf, size_t cap,
                                        mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = mbd_mamba1_gpu_state_bytes(m), cb = (size_t)m->conv_slot * 4;
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "slot read: buffer of %zu bytes, need %zu", cap,
                         need);
  MBD_GPU_CHECK(cudaMemcpyAsync(buf, m->conv_st + slot * m->conv_slot, cb,
                                cudaMemcpyDeviceToHost, m->stream),
                err);
  MBD_GPU_CHECK(cudaMemcpyAsync((char *)buf + cb, m->ssm_st + slot * m->ssm_slot, need - cb,
                                cudaMemcpyDeviceToHost, m->stream),
                err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

extern "C" int mbd_mamba1_gpu_slot_write(mbd_mamba1_gpu *m, int64_t slot, const void *buf,
                                         size_t len, mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t need = mbd_mamba1_gpu_state_bytes(m), cb = (size_t)m->conv_slot * 4;
  if (len != need)
    return mbd_error_set(err, MBD_E_SHAPE, "slot write: %zu bytes, this model's state is %zu",
                         len, need);
  MBD_GPU_CHECK(cudaMemcpyAsync(m->conv_st + slot * m->conv_slot, buf, cb,
                                cudaMemcpyHostToDevice, m->stream),
                err);
  MBD_GPU_CHECK(cudaMemcpyAsync(m->ssm_st + slot * m->ssm_slot, (const char *)buf + cb,
                                need - cb, cudaMemcpyHostToDevice, m->stream),
                err);
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

/* ------------------------------------------------------------ forward */

static int gemm(mbd_mamba1_gpu *m, int64_t M, int64_t N, int64_t K, const void *x,
                const void *w, const void *b, void *y, mbd_dtype out_dt, mbd_error *err) {
  mbd_gpu_gemm_args a;
  a.dtype = m->dtype;
  a.out_dtype = out_dt;
  a.m = M;
  a.n = N;
  a.k = K;
  a.x = x;
  a.w = w;
  a.bias = b;
  a.y = y;
  a.w_static = 1; /* weights and biases never change after load */
  return mbd_gpu_gemm(m->ctx, &a, err);
}

int mbd_mamba1_gpu_persistent(const mbd_mamba1_gpu *m, int rows) {
  return mbd_gpu_ctx_mode(m->ctx) == MBD_GEMM_DETERMINISTIC && mbd_dp_fits(&m->dp, rows);
}

/* Embedding and every layer of nseq x T rows through the per-op kernels;
 * leaves resid and out for the final add + norm. */
static int layers(mbd_mamba1_gpu *m, int nseq, int T, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, di = c->d_inner, N = c->d_state;
  const int64_t R = c->dt_rank;
  const mbd_dtype act = m->dtype;
  void *s = (void *)m->stream;
  int rc;
  if ((rc = mbd_mops_embed(s, M, (int)d, m->d_tok, m->dtype, m->emb, m->resid, err))) return rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_d *L = &m->layers[l];
    if ((rc = mbd_mops_add_rmsnorm(s, M, (int)d, 1, 0, m->resid, l ? m->out : NULL, L->norm,
                                   c->norm_eps, act, m->hn, err)))
      return rc;
    if ((rc = gemm(m, M, 2 * di, d, m->hn, L->in_w, L->in_b, m->xz, MBD_DTYPE_F32, err)))
      return rc;
    /* Decode at small batch: the conv runs inside x_proj and the scan (one
     * launch less, same bits); they advance the conv state, not xc. */
    const mbd_mops_conv conv = {c->d_conv, L->conv_w, L->conv_b,
                                m->conv_st + (int64_t)l * (c->d_conv - 1) * di, m->conv_slot};
    const int fused = mbd_mops_conv_fused(nseq, T, c->d_conv, (int)di, act);
    if (fused)
      rc = mbd_mops_conv_xproj(s, nseq, (int)di, &conv, m->xz, 2 * di, m->d_slots,
                               (int)(R + 2 * N), act, L->x_w, m->dbl, err);
    else if (!(rc = mbd_mops_conv_silu(s, nseq, T, (int)di, c->d_conv, m->xz, 2 * di, L->conv_w,
                                       L->conv_b, conv.state, m->conv_slot, m->d_slots, m->xc,
                                       act, act == MBD_DTYPE_F32 ? NULL : m->xc_act, err)))
      rc = mbd_mops_xproj(s, M, (int)di, (int)(R + 2 * N), act, m->xc_act, L->x_w, m->dbl, err);
    if (rc) return rc;
    if ((rc = mbd_mops_scan(s, nseq, T, (int)di, (int)N, (int)R, m->xc, m->dbl, m->dtype,
                            L->dt_w, L->dt_b, L->A, L->D, m->xz, 2 * di, di,
                            m->ssm_st + (int64_t)l * di * N, m->ssm_slot, m->d_slots,
                            fused ? &conv : NULL, act, m->y, err)))
      return rc;
    if ((rc = gemm(m, M, d, di, m->y, L->out_w, L->out_b, m->out, MBD_DTYPE_F32, err)))
      return rc;
  }
  return 0;
}

/* Runs nseq x T rows (tokens in d_tok, slots in d_slots; from_staging: a
 * persistent decode takes them from the pinned staging h_tok, h_slots and
 * moves the sampling's inputs up) through the model, advancing the slots'
 * states. Logits: 0 none; 1 each sequence's last row ([nseq, V]); 2 every row
 * ([nseq * T, V]); into m->logits. Enqueue only. */
static int forward(mbd_mamba1_gpu *m, int nseq, int T, int which, int from_staging,
                   mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  const int64_t M = (int64_t)nseq * T, d = c->d_model, V = c->vocab_size;
  const mbd_dtype act = m->dtype;
  void *s = (void *)m->stream;
  int rc;
  const int persistent = T == 1 && mbd_mamba1_gpu_persistent(m, nseq);
  if (persistent) {
    /* small decode batches: every layer and the final add + norm in one
     * persistent launch, same bits */
    mbd_error poisoned;
    if (mbd_gpu_ctx_unusable(m->ctx, &poisoned)) { /* as mbd_gpu_gemm would refuse */
      if (err) *err = poisoned;
      return poisoned.code;
    }
    const mbd_dp_side side = {{m->h_temp, m->h_seed, m->h_step},
                              {m->d_temp, m->d_seed, m->d_step},
                              {(size_t)nseq * 4, (size_t)nseq * 8, (size_t)nseq * 8}};
    if ((rc = from_staging
                  ? mbd_dp_decode(s, &m->dp, nseq, m->h_tok, m->h_slots, &side, err)
                  : mbd_dp_decode(s, &m->dp, nseq, m->d_tok, m->d_slots, NULL, err)))
      return rc;
  } else if ((rc = layers(m, nseq, T, err))) {
    return rc;
  }
  step_mark(m, 2);
  if (which == 0) return 0;
  const int64_t rows = which == 1 ? nseq : M;
  if (!persistent && /* the persistent launch ends with it */
      (rc = mbd_mops_add_rmsnorm(s, rows, (int)d, which == 1 ? T : 1, which == 1 ? T - 1 : 0,
                                 m->resid, m->out, m->norm_f, c->norm_eps, act, m->hn, err)))
    return rc;
  step_mark(m, 3);
  return gemm(m, rows, V, d, m->hn, m->head, NULL, m->logits, MBD_DTYPE_F32, err);
}

/* Host checks shared by prefill and step: token range, slot range, distinct. */
static int check_batch(mbd_mamba1_gpu *m, int nseq, const int32_t *slots, int64_t ntok,
                       const int32_t *tokens, mbd_error *err) {
  for (int64_t i = 0; i < ntok; i++)
    if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
      return mbd_error_set(err, MBD_E_INVALID, "token %lld is %d, outside 0..%d", (long long)i,
                           tokens[i], m->cfg.vocab_size - 1);
  if (++m->gen == 0) {
    memset(m->stamp, 0, (size_t)m->nslots * sizeof(uint32_t));
    m->gen = 1;
  }
  for (int b = 0; b < nseq; b++) {
    int rc = check_slot(m, slots[b], err);
    if (rc) return rc;
    if (m->stamp[slots[b]] == m->gen)
      return mbd_error_set(err, MBD_E_INVALID, "state slot %d appears twice in one batch",
                           slots[b]);
    m->stamp[slots[b]] = m->gen;
  }
  return 0;
}

extern "C" int mbd_mamba1_gpu_prefill(mbd_mamba1_gpu *m, int nseq, int T, const int32_t *tokens,
                                      const int32_t *slots, mbd_mamba1_gpu_logits which,
                                      float *logits, mbd_error *err) {
  if (nseq < 0 || T < 0 || (which != MBD_MAMBA1_GPU_LOGITS_NONE && !logits))
    return mbd_error_set(err, MBD_E_INVALID, "prefill: negative sizes or no logits buffer");
  if (nseq == 0 || T == 0) return 0;
  int rc = check_batch(m, nseq, slots, (int64_t)nseq * T, tokens, err);
  if (rc) return rc;
  const size_t V = (size_t)m->cfg.vocab_size;
  const int sg = nseq < m->max_rows ? nseq : m->max_rows;
  const int Tc = m->max_rows / sg > 0 ? m->max_rows / sg : 1;
  for (int s0 = 0; s0 < nseq; s0 += sg) {
    const int ns = nseq - s0 < sg ? nseq - s0 : sg;
    memcpy(m->h_slots, slots + s0, (size_t)ns * 4);
    MBD_GPU_CHECK(cudaMemcpyAsync(m->d_slots, m->h_slots, (size_t)ns * 4,
                                  cudaMemcpyHostToDevice, m->stream),
                  err);
    for (int t0 = 0; t0 < T; t0 += Tc) {
      const int tc = T - t0 < Tc ? T - t0 : Tc;
      const int last = t0 + tc == T;
      /* The staging buffer is reused: wait for the previous chunk's upload. */
      MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
      for (int b = 0; b < ns; b++)
        memcpy(m->h_tok + (size_t)b * tc, tokens + (size_t)(s0 + b) * T + t0, (size_t)tc * 4);
      MBD_GPU_CHECK(cudaMemcpyAsync(m->d_tok, m->h_tok, (size_t)ns * tc * 4,
                                    cudaMemcpyHostToDevice, m->stream),
                    err);
      int w = which == MBD_MAMBA1_GPU_LOGITS_ALL ? 2
              : (which == MBD_MAMBA1_GPU_LOGITS_LAST && last) ? 1
                                                               : 0;
      if ((rc = forward(m, ns, tc, w, 0, err))) return rc;
      if (w == 2)
        MBD_GPU_CHECK(cudaMemcpy2DAsync(logits + ((size_t)s0 * T + t0) * V, (size_t)T * V * 4,
                                        m->logits, (size_t)tc * V * 4, (size_t)tc * V * 4,
                                        (size_t)ns, cudaMemcpyDeviceToHost, m->stream),
                      err);
      else if (w == 1)
        MBD_GPU_CHECK(cudaMemcpyAsync(logits + (size_t)s0 * V, m->logits, (size_t)ns * V * 4,
                                      cudaMemcpyDeviceToHost, m->stream),
                      err);
    }
  }
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  return 0;
}

/* One decode step of `rows` rows: the staged inputs (up in one copy for the
 * per-op path), the model, the pick into pinned h_next; a graph replays all
 * of it. */
static int step_body_marked(mbd_mamba1_gpu *m, int rows, mbd_error *err) {
  /* The pinned staging is mapped (unified addressing): the persistent decode
   * reads its tokens and slots from it directly and copies the rest up for
   * the sampling while the layers run; the picks go straight into h_next. A
   * copy node costs ~7 us each way (reading the sampling's inputs over PCIe
   * ~3 us); the per-op layers read the tokens and slots many times and get
   * one upload. */
  const int direct = mbd_mamba1_gpu_persistent(m, rows);
  step_mark(m, 0);
  if (!direct)
    MBD_GPU_CHECK(cudaMemcpyAsync(m->d_in, m->h_in, m->in_bytes, cudaMemcpyHostToDevice,
                                  m->stream),
                  err);
  step_mark(m, 1);
  int rc = forward(m, rows, 1, 2, direct, err);
  if (rc) return rc;
  step_mark(m, 4);
  if ((rc = mbd_mops_sample((void *)m->stream, rows, m->cfg.vocab_size, m->logits,
                            m->cfg.vocab_size, m->d_temp, m->d_seed, m->d_step, m->sample_work,
                            m->h_next, err)))
    return rc;
  step_mark(m, 5);
  return 0;
}

static int step_body(mbd_mamba1_gpu *m, int rows, mbd_error *err) {
  /* (persistent rows only: the per-op path's PDL launches admit no event
   * nodes between them) */
  m->marking = step_events_on() && mbd_mamba1_gpu_persistent(m, rows);
  int rc = step_body_marked(m, rows, err);
  m->marking = 0;
  return rc;
}

extern "C" int mbd_mamba1_gpu_step(mbd_mamba1_gpu *m, int n, const int32_t *tokens,
                                   const int32_t *slots, const mbd_mamba1_gpu_pick *picks,
                                   int32_t *next, float *logits, mbd_error *err) {
  if (n < 1 || n > m->max_batch)
    return mbd_error_set(err, MBD_E_INVALID, "step: batch %d outside 1..%d", n, m->max_batch);
  int rc = check_batch(m, n, slots, n, tokens, err);
  if (rc) return rc;
  int bucket = 1, bi = 0;
  while (bucket < n) bucket <<= 1, bi++;
  const int rows = m->use_graphs ? bucket : n;
  /* Pinned staging may still feed the previous step's copies only if that
   * step failed midway; the stream is idle otherwise. */
  MBD_GPU_CHECK(cudaStreamSynchronize(m->stream), err);
  for (int i = 0; i < rows; i++) {
    const int real = i < n;
    m->h_tok[i] = real ? tokens[i] : 0;
    m->h_slots[i] = real ? slots[i] : (int32_t)m->nslots; /* padding: scratch slot */
    m->h_temp[i] = real && picks ? picks[i].temperature : 0.0f;
    m->h_seed[i] = real && picks ? picks[i].seed : 0;
    m->h_step[i] = real && picks ? picks[i].step : 0;
  }
  cudaStream_t s = m->stream;
  (void)step_events_on(); /* creates its events now, outside any capture */
  if (m->use_graphs) {
    if (!m->graphs[bi]) {
      if ((rc = mbd_gpu_graph_begin(m->ctx, err))) return rc;
      int brc = step_body(m, rows, err);
      mbd_error e2;
      int erc = mbd_gpu_graph_end(m->ctx, &m->graphs[bi], brc ? &e2 : err);
      if (brc) {
        mbd_gpu_graph_destroy(&m->graphs[bi]);
        return mbd_error_prefix(err, "capturing the batch-%d decode graph: ", rows);
      }
      if (erc) return erc;
    }
    if ((rc = mbd_gpu_graph_launch(m->ctx, m->graphs[bi], err))) return rc;
  } else if ((rc = step_body(m, rows, err))) {
    return rc;
  }
  if (logits)
    MBD_GPU_CHECK(cudaMemcpyAsync(logits, m->logits, (size_t)n * m->cfg.vocab_size * 4,
                                  cudaMemcpyDeviceToHost, s),
                  err);
  MBD_GPU_CHECK(cudaStreamSynchronize(s), err);
  if (next) memcpy(next, m->h_next, (size_t)n * 4);
  return 0;
}

void mbd_mamba1_gpu_set_graphs(mbd_mamba1_gpu *m, int on) {
  if (!on)
    for (int i = 0; i < MAX_BUCKETS; i++) mbd_gpu_graph_destroy(&m->graphs[i]);
  m->use_graphs = on;
}
