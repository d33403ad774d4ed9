/* Mamba-3 SISO model on the CUDA backend (see mamba3_gpu.h). A call's tokens
 * run in chunks of at most max_rows rows (a time window of a group of
 * sequences); row-wise work is per row, the recurrence walks each (sequence,
 * head) in time order, so chunking and batching do not change a sequence's
 * bits, as on the CPU. */
#include "kernels/cuda/mamba3_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/route.h"
#include "common/safetensors.h"
#include "kernels/cuda/gpu_gemm.h"
#include "kernels/cuda/ops/add_rmsnorm.h"
#include "kernels/cuda/ops/embed.h"
#include "kernels/cuda/ops/m3_mixer.h"

#define MIN_ROWS 256

typedef struct layer_g {
  float *norm, *in_proj, *dt_bias, *b_bias, *c_bias, *b_norm, *c_norm, *D, *out_proj;
} layer_g;

struct mbd_mamba3_gpu {
  mbd_gpu_ctx *ctx;
  void *stream;
  mbd_mamba3_config cfg;
  mbd_m3g_dims dims;
  int64_t nslots, slot_floats;
  int max_rows, max_batch;
  layer_g *layers;
  float *emb, *norm_f;
  float *state;                        /* [nslots][slot_floats] */
  int32_t *d_tok, *d_slots;            /* [max_rows] */
  float *resid, *xn, *proj, *y, *out;  /* [max_rows][...] */
  float *logits;                       /* [max_rows][V] */
  int32_t *h_tok, *h_slots;            /* [max_rows] */
  float *h_logits;                     /* [max_batch][V] step scratch */
  void **allocs;
  int nalloc, capalloc;
};

static int dalloc(mbd_mamba3_gpu *m, size_t bytes, void **out, mbd_error *err) {
  if (m->nalloc == m->capalloc) {
    int cap = m->capalloc ? 2 * m->capalloc : 64;
    void **a = realloc(m->allocs, (size_t)cap * sizeof *a);
    if (!a) return mbd_error_set(err, MBD_E_NOMEM, "mamba3 gpu: out of memory");
    m->allocs = a;
    m->capalloc = cap;
  }
  int rc = mbd_gpu_alloc(m->ctx, bytes < 16 ? 16 : bytes, out, err);
  if (!rc) m->allocs[m->nalloc++] = *out;
  return rc;
}

/* Reads tensor `name` of the given shape as f32 and uploads it. */
static int upload_tensor(mbd_mamba3_gpu *m, const mbd_st_dir *s, const char *name, int ndim,
                         const int64_t *shape, float **out, mbd_error *err) {
  float *h = NULL;
  size_t n = 0;
  int rc = mbd_st_dir_read_f32(s, name, ndim, shape, &h, &n, err);
  if (!rc) rc = dalloc(m, n * sizeof(float), (void **)out, err);
  if (!rc) rc = mbd_gpu_upload(m->ctx, *out, h, n * sizeof(float), err);
  free(h);
  return rc;
}

static int load_layer(mbd_mamba3_gpu *m, const mbd_st_dir *s, int i, mbd_error *err) {
  const mbd_mamba3_config *c = &m->cfg;
  layer_g *L = &m->layers[i];
  char nm[256];
  int64_t sh_d[1] = {c->d_model}, sh_h[1] = {c->heads}, sh_n[1] = {c->d_state};
  int64_t sh_bias[3] = {c->heads, 1, c->d_state}, sh_in[2] = {c->d_in_proj, c->d_model};
  int64_t sh_out[2] = {c->d_model, c->d_inner};
  struct {
    const char *suffix;
    int ndim;
    const int64_t *shape;
    float **dst;
  } t[] = {{"norm.weight", 1, sh_d, &L->norm},
           {"mixer.in_proj.weight", 2, sh_in, &L->in_proj},
           {"mixer.dt_bias", 1, sh_h, &L->dt_bias},
           {"mixer.B_bias", 3, sh_bias, &L->b_bias},
           {"mixer.C_bias", 3, sh_bias, &L->c_bias},
           {"mixer.B_norm.weight", 1, sh_n, &L->b_norm},
           {"mixer.C_norm.weight", 1, sh_n, &L->c_norm},
           {"mixer.D", 1, sh_h, &L->D},
           {"mixer.out_proj.weight", 2, sh_out, &L->out_proj}};
  for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
    snprintf(nm, sizeof nm, "backbone.layers.%d.%s", i, t[k].suffix);
    int rc = upload_tensor(m, s, nm, t[k].ndim, t[k].shape, t[k].dst, err);
    if (rc) return rc;
  }
  return MBD_OK;
}

static int alloc_work(mbd_mamba3_gpu *m, mbd_error *err) {
  const mbd_mamba3_config *c = &m->cfg;
  size_t r = (size_t)m->max_rows, V = (size_t)c->vocab_padded;
  int rc;
  if ((rc = dalloc(m, (size_t)m->nslots * (size_t)m->slot_floats * 4, (void **)&m->state, err)) ||
      (rc = mbd_gpu_memset(m->ctx, m->state, 0, (size_t)m->nslots * (size_t)m->slot_floats * 4,
                           err)) ||
      (rc = dalloc(m, r * 4, (void **)&m->d_tok, err)) ||
      (rc = dalloc(m, r * 4, (void **)&m->d_slots, err)) ||
      (rc = dalloc(m, r * (size_t)c->d_model * 4, (void **)&m->resid, err)) ||
      (rc = dalloc(m, r * (size_t)c->d_model * 4, (void **)&m->xn, err)) ||
      (rc = dalloc(m, r * (size_t)c->d_in_proj * 4, (void **)&m->proj, err)) ||
      (rc = dalloc(m, r * (size_t)c->d_inner * 4, (void **)&m->y, err)) ||
      (rc = dalloc(m, r * (size_t)c->d_model * 4, (void **)&m->out, err)) ||
      (rc = dalloc(m, r * V * 4, (void **)&m->logits, err)))
    return rc;
  m->h_tok = malloc(r * sizeof(int32_t));
  m->h_slots = malloc(r * sizeof(int32_t));
  m->h_logits = malloc((size_t)m->max_batch * V * sizeof(float));
  if (!m->h_tok || !m->h_slots || !m->h_logits)
    return mbd_error_set(err, MBD_E_NOMEM, "mamba3 gpu: out of memory");
  return MBD_OK;
}

int mbd_mamba3_gpu_load(mbd_gpu_ctx *ctx, const char *dir, mbd_dtype dtype, int max_batch,
                        mbd_mamba3_gpu **out, mbd_error *err) {
  *out = NULL;
  if (dtype != MBD_DTYPE_F32)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model %s: Mamba-3 on CUDA runs f32 storage only (asked %s)", dir,
                         mbd_dtype_name(dtype));
  mbd_mamba3_gpu *m = calloc(1, sizeof *m);
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "mamba3 gpu: out of memory");
  mbd_st_dir *sh = NULL;
  mbd_route_identity rid;
  int rc = mbd_mamba3_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba3_config *c = &m->cfg;
  if (c->outproj_norm) {
    rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "model %s: is_outproj_norm not on CUDA yet", dir);
    goto fail;
  }
  m->ctx = ctx;
  m->stream = mbd_gpu_ctx_stream(ctx);
  m->dims = (mbd_m3g_dims){.d_inner = c->d_inner, .d_in_proj = c->d_in_proj, .heads = c->heads,
                           .headdim = c->headdim, .d_state = c->d_state, .ngroups = c->ngroups,
                           .angles = c->angles, .a_floor = c->a_floor, .eps = c->eps};
  if ((rc = mbd_gpu_ctx_route(ctx, &rid, err))) goto fail;
  m->nslots = rid.state_capacity;
  m->slot_floats = (int64_t)c->n_layer * c->heads *
                   ((int64_t)c->angles + (int64_t)c->headdim * c->d_state + c->d_state +
                    c->headdim);
  m->max_batch = max_batch > 0 ? max_batch : 256;
  m->max_rows = m->max_batch > MIN_ROWS ? m->max_batch : MIN_ROWS;
  if ((rc = mbd_st_dir_open(dir, &sh, err))) goto fail;
  m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
  if (!m->layers) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "mamba3 gpu: out of memory");
    goto fail;
  }
  for (int i = 0; i < c->n_layer; i++)
    if ((rc = load_layer(m, sh, i, err))) goto fail;
  int64_t sh_emb[2] = {c->vocab_padded, c->d_model}, sh_d[1] = {c->d_model};
  if ((rc = upload_tensor(m, sh, "backbone.embedding.weight", 2, sh_emb, &m->emb, err)) ||
      (rc = upload_tensor(m, sh, "backbone.norm_f.weight", 1, sh_d, &m->norm_f, err)))
    goto fail;
  if (!c->tie_embeddings) {
    rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "model %s: untied LM head not on CUDA yet", dir);
    goto fail;
  }
  mbd_st_dir_destroy(&sh);
  if ((rc = alloc_work(m, err))) goto fail;
  *out = m;
  return MBD_OK;
fail:
  mbd_st_dir_destroy(&sh);
  mbd_mamba3_gpu_destroy(&m);
  return rc;
}

void mbd_mamba3_gpu_destroy(mbd_mamba3_gpu **pm) {
  if (!pm || !*pm) return;
  mbd_mamba3_gpu *m = *pm;
  for (int i = 0; i < m->nalloc; i++) mbd_gpu_free(m->ctx, m->allocs[i]);
  free(m->allocs);
  free(m->layers);
  free(m->h_tok);
  free(m->h_slots);
  free(m->h_logits);
  free(m);
  *pm = NULL;
}

const mbd_mamba3_config *mbd_mamba3_gpu_config(const mbd_mamba3_gpu *m) { return &m->cfg; }
int64_t mbd_mamba3_gpu_slots(const mbd_mamba3_gpu *m) { return m->nslots; }
size_t mbd_mamba3_gpu_state_bytes(const mbd_mamba3_gpu *m) {
  return (size_t)m->slot_floats * sizeof(float);
}

static int check_slot(const mbd_mamba3_gpu *m, int64_t slot, mbd_error *err) {
  if (slot < 0 || slot >= m->nslots)
    return mbd_error_set(err, MBD_E_INVALID, "slot %lld outside 0..%lld", (long long)slot,
                         (long long)m->nslots - 1);
  return MBD_OK;
}

int mbd_mamba3_gpu_slot_reset(mbd_mamba3_gpu *m, int64_t slot, mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  return mbd_gpu_memset(m->ctx, m->state + slot * m->slot_floats, 0,
                        mbd_mamba3_gpu_state_bytes(m), err);
}

/* The payload is little-endian f32, the device's and the supported hosts'
 * own order: the bytes copy as they are. */
int mbd_mamba3_gpu_slot_read(mbd_mamba3_gpu *m, int64_t slot, void *buf, size_t cap,
                             mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t n = mbd_mamba3_gpu_state_bytes(m);
  if (cap < n) return mbd_error_set(err, MBD_E_TOO_LARGE, "slot read needs %zu bytes", n);
  return mbd_gpu_download(m->ctx, buf, m->state + slot * m->slot_floats, n, err);
}

int mbd_mamba3_gpu_slot_write(mbd_mamba3_gpu *m, int64_t slot, const void *buf, size_t len,
                              mbd_error *err) {
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  size_t n = mbd_mamba3_gpu_state_bytes(m);
  if (len != n) return mbd_error_set(err, MBD_E_FORMAT, "slot write: %zu bytes, expected %zu", len, n);
  return mbd_gpu_upload(m->ctx, m->state + slot * m->slot_floats, buf, n, err);
}

static int gemm(mbd_mamba3_gpu *m, int64_t rows, const float *x, const float *w, int64_t n,
                int64_t k, float *y, mbd_error *err) {
  mbd_gpu_gemm_args a = {.dtype = MBD_DTYPE_F32, .out_dtype = MBD_DTYPE_F32, .m = rows, .n = n,
                         .k = k, .x = x, .w = w, .y = y};
  return mbd_gpu_gemm(m->ctx, &a, err);
}

/* gn sequences x tc tokens (tokens and slots already on the device): all
 * layers; the final-normed rows in xn (every row with ALL, each sequence's
 * last with LAST: rows 0..gn-1) and their logits in m->logits. */
static int run_chunk(mbd_mamba3_gpu *m, int gn, int tc, mbd_logits_sel sel, mbd_error *err) {
  const mbd_mamba3_config *c = &m->cfg;
  const int64_t rows = (int64_t)gn * tc, d = c->d_model;
  int rc;
  if ((rc = mbd_mops_embed(m->stream, rows, (int)d, m->d_tok, MBD_DTYPE_F32, m->emb, m->resid,
                           err)))
    return rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_g *L = &m->layers[l];
    if ((rc = mbd_mops_add_rmsnorm(m->stream, rows, (int)d, 1, 0, m->resid, l ? m->out : NULL,
                                   L->norm, c->eps, MBD_DTYPE_F32, m->xn, err)) ||
        (rc = gemm(m, rows, m->xn, L->in_proj, c->d_in_proj, d, m->proj, err)) ||
        (rc = mbd_mops_m3_preprocess(m->stream, &m->dims, rows, L->dt_bias, L->b_norm,
                                     L->c_norm, m->proj, err)) ||
        (rc = mbd_mops_m3_heads(m->stream, &m->dims, gn, tc, c->n_layer, l, m->d_slots,
                                m->slot_floats, m->state, m->proj, L->b_bias, L->c_bias, L->D,
                                m->y, err)) ||
        (rc = gemm(m, rows, m->y, L->out_proj, d, c->d_inner, m->out, err)))
      return rc;
  }
  if (sel == MBD_LOGITS_NONE) return MBD_OK;
  const int64_t nout = sel == MBD_LOGITS_ALL ? rows : gn;
  if ((rc = mbd_mops_add_rmsnorm(m->stream, nout, (int)d, sel == MBD_LOGITS_ALL ? 1 : tc,
                                 sel == MBD_LOGITS_ALL ? 0 : tc - 1, m->resid, m->out, m->norm_f,
                                 c->eps, MBD_DTYPE_F32, m->xn, err)))
    return rc;
  return gemm(m, nout, m->xn, m->emb, c->vocab_padded, d, m->logits, err);
}

int mbd_mamba3_gpu_prefill(mbd_mamba3_gpu *m, int nseq, int T, const int32_t *tokens,
                           const int32_t *slots, mbd_logits_sel sel, float *logits,
                           mbd_error *err) {
  if (nseq <= 0 || T <= 0) return MBD_OK;
  if (!tokens || !slots || (sel != MBD_LOGITS_NONE && !logits))
    return mbd_error_set(err, MBD_E_INVALID, "mamba3 gpu prefill: NULL tokens/slots/logits");
  const int64_t V = m->cfg.vocab_padded;
  for (int j = 0; j < nseq; j++) {
    int rc = check_slot(m, slots[j], err);
    if (rc) return rc;
    for (int t = 0; t < T; t++)
      if (tokens[(int64_t)j * T + t] < 0 || tokens[(int64_t)j * T + t] >= V)
        return mbd_error_set(err, MBD_E_INVALID, "mamba3 gpu prefill: token outside [0, %lld)",
                             (long long)V);
  }
  for (int g0 = 0; g0 < nseq; g0 += m->max_rows) {
    const int gn = nseq - g0 < m->max_rows ? nseq - g0 : m->max_rows;
    const int tw = m->max_rows / gn;
    for (int t0 = 0; t0 < T; t0 += tw) {
      const int tc = T - t0 < tw ? T - t0 : tw;
      for (int j = 0; j < gn; j++) {
        m->h_slots[j] = slots[g0 + j];
        memcpy(m->h_tok + (int64_t)j * tc, tokens + (int64_t)(g0 + j) * T + t0,
               (size_t)tc * sizeof(int32_t));
      }
      int rc;
      const int last = t0 + tc == T;
      const mbd_logits_sel cs = sel == MBD_LOGITS_ALL ? sel : (last ? sel : MBD_LOGITS_NONE);
      if ((rc = mbd_gpu_upload(m->ctx, m->d_tok, m->h_tok, (size_t)gn * tc * 4, err)) ||
          (rc = mbd_gpu_upload(m->ctx, m->d_slots, m->h_slots, (size_t)gn * 4, err)) ||
          (rc = run_chunk(m, gn, tc, cs, err)))
        return rc;
      for (int j = 0; cs != MBD_LOGITS_NONE && j < gn; j++) {
        float *dst = cs == MBD_LOGITS_ALL ? logits + ((int64_t)(g0 + j) * T + t0) * V
                                          : logits + (int64_t)(g0 + j) * V;
        const float *src = m->logits + (cs == MBD_LOGITS_ALL ? (int64_t)j * tc : j) * V;
        size_t n = (size_t)(cs == MBD_LOGITS_ALL ? tc : 1) * (size_t)V * sizeof(float);
        if ((rc = mbd_gpu_download(m->ctx, dst, src, n, err))) return rc;
      }
    }
  }
  return MBD_OK;
}

int mbd_mamba3_gpu_step(mbd_mamba3_gpu *m, int n, const int32_t *tokens, const int32_t *slots,
                        int32_t *next, float *logits, mbd_error *err) {
  if (n < 1 || n > m->max_batch)
    return mbd_error_set(err, MBD_E_INVALID, "mamba3 gpu step: batch %d outside 1..%d", n,
                         m->max_batch);
  const int64_t V = m->cfg.vocab_padded;
  float *lg = logits ? logits : m->h_logits;
  int rc = mbd_mamba3_gpu_prefill(m, n, 1, tokens, slots,
                                  logits || next ? MBD_LOGITS_LAST : MBD_LOGITS_NONE, lg, err);
  if (rc || !next) return rc;
  for (int j = 0; j < n; j++) {
    const float *r = lg + (int64_t)j * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (r[v] > r[best]) best = v;
    next[j] = (int32_t)best;
  }
  return MBD_OK;
}

/* ---- the family vtable (kernels/cuda/gpu_family.h) ---- */

static int f_load(mbd_gpu_ctx *ctx, const char *dir, const mbd_gpu_model_opts *o, void **model,
                  mbd_error *err) {
  mbd_mamba3_gpu *m = NULL;
  int rc = mbd_mamba3_gpu_load(ctx, dir, o->dtype, o->max_batch, &m, err);
  *model = m;
  return rc;
}

static void f_destroy(void *model) {
  mbd_mamba3_gpu *m = model;
  mbd_mamba3_gpu_destroy(&m);
}

static int64_t f_vocab(const void *model) { return mbd_mamba3_gpu_config(model)->vocab_padded; }
static int64_t f_slots(const void *model) { return mbd_mamba3_gpu_slots(model); }
static mbd_state_shape f_state_shape(const void *model) {
  return mbd_mamba3_state_shape(mbd_mamba3_gpu_config(model));
}
static size_t f_state_payload(const void *model) { return mbd_mamba3_gpu_state_bytes(model); }
static int f_slot_reset(void *model, int64_t slot, mbd_error *err) {
  return mbd_mamba3_gpu_slot_reset(model, slot, err);
}
static int f_slot_read(void *model, int64_t slot, void *buf, size_t cap, mbd_error *err) {
  return mbd_mamba3_gpu_slot_read(model, slot, buf, cap, err);
}
static int f_slot_write(void *model, int64_t slot, const void *buf, size_t len, mbd_error *err) {
  return mbd_mamba3_gpu_slot_write(model, slot, buf, len, err);
}
static int f_prefill(void *model, int nseq, int T, const int32_t *tokens, const int32_t *slots,
                     mbd_logits_sel sel, float *logits, mbd_error *err) {
  return mbd_mamba3_gpu_prefill(model, nseq, T, tokens, slots, sel, logits, err);
}
static int f_step(void *model, int n, const int32_t *tokens, const int32_t *slots, int32_t *next,
                  float *logits, mbd_error *err) {
  return mbd_mamba3_gpu_step(model, n, tokens, slots, next, logits, err);
}

static int f_slot_regions(void *model, int64_t slot, mbd_gpu_region *out, mbd_error *err) {
  mbd_mamba3_gpu *m = model;
  int rc = check_slot(m, slot, err);
  if (rc) return rc;
  out[0] = (mbd_gpu_region){.ptr = m->state + slot * m->slot_floats,
                            .bytes = mbd_mamba3_gpu_state_bytes(m)};
  return 1;
}

const mbd_gpu_model_ops mbd_mamba3_gpu_ops = {
    .name = "mamba3",
    .load = f_load,
    .destroy = f_destroy,
    .vocab = f_vocab,
    .slots = f_slots,
    .state_shape = f_state_shape,
    .state_payload = f_state_payload,
    .slot_reset = f_slot_reset,
    .slot_read = f_slot_read,
    .slot_write = f_slot_write,
    .prefill = f_prefill,
    .step = f_step,
    .slot_regions = f_slot_regions,
    .state_dtypes = 1u << MBD_STATE_F32,
};
