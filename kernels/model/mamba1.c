/* Mamba-1 model on the CPU backend (see mamba1.h).
 *
 * A call's tokens are flattened into rows, sequence-major, and processed in
 * chunks of at most max_rows rows (a time window of every sequence). Row-wise
 * work (norms, projections via the batch-invariant GEMM) depends only on the
 * row; the conv and scan walk each sequence's rows in time order with the
 * per-token functions of kernels/cpu/mamba_ops.h, parallel over channels. So
 * neither the batch, the slot, the chunking nor prefill-vs-step can change a
 * sequence's bits. */
#include "kernels/model/mamba1.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/family_ops.h"
#include "kernels/model/rows.h"
#include "kernels/model/trunk.h"
#include "kernels/model/weights.h"
#include "kernels/portable_math.h"

#define DEFAULT_MAX_ROWS 256
#define CHANNEL_BLOCK 64 /* channels per conv/scan task */

typedef struct layer_w {
  float *norm;             /* [d] */
  mbd_cpu_wpack *in_proj;  /* [2 di, d] */
  float *in_bias;          /* [2 di] or NULL */
  float *conv_w;           /* [dc][di], tap-major */
  float *conv_b;           /* [di] or NULL */
  mbd_cpu_wpack *x_proj;   /* [R + 2 S, di] */
  mbd_cpu_wpack *dt_proj;  /* [di, R] */
  float *dt_bias;          /* [di] */
  float *A;                /* [di][S], = -exp(A_log) */
  float *D;                /* [di] */
  mbd_cpu_wpack *out_proj; /* [d, di] */
  float *out_bias;         /* [d] or NULL */
} layer_w;

struct mbd_mamba1_model {
  mbd_mamba_config cfg;
  mbd_trunk t;             /* embedding, head, final norm, rows, batch buffers */
  layer_w *layers;         /* [n_layer] */
  /* workspace for max_rows rows */
  float *xz;               /* [rows, 2 di] in_proj output (x | z) */
  float *xc;               /* [rows, di] conv + silu output */
  float *dbc;              /* [rows, R + 2 S] x_proj output (dt | B | C) */
  float *dt;               /* [rows, di] dt_proj output (before softplus) */
  float *y;                /* [rows, di] gated scan output */
};

struct mbd_mamba1_state {
  int n_layer, di, dc, ds;
  int64_t pos;
  float *conv; /* [L][dc-1][di] */
  float *ssm;  /* [L][di][ds] */
};

void mbd_mamba1_options_default(mbd_mamba1_options *o) {
  memset(o, 0, sizeof(*o));
  o->backend = MBD_BACKEND_CPU;
  o->dtype = MBD_DTYPE_F32;
  o->threads = 0;
  o->isa = MBD_CPU_ISA_AUTO;
  o->max_rows = DEFAULT_MAX_ROWS;
}

/* ---- loading (through the one checkpoint reader, common/safetensors.h) ---- */

static int load_layer(mbd_mamba1_model *m, const mbd_st_dir *s, int i, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  layer_w *L = &m->layers[i];
  mbd_trunk *T = &m->t;
  int64_t d = c->d_model, di = c->d_inner, S = c->d_state, R = c->dt_rank, dc = c->d_conv;
  char nm[256];
  int rc;
#define NAME(suffix) (snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", i, suffix), nm)
  int64_t sh_d[1] = {d}, sh_di[1] = {di}, sh_2di[1] = {2 * di}, sh_A[2] = {di, S};
  if ((rc = mbd_trunk_vec(T, s, NAME("norm.weight"), 1, sh_d, &L->norm, err))) return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.in_proj.weight"), 2 * di, d, &L->in_proj, err)))
    return rc;
  if (c->proj_bias &&
      (rc = mbd_trunk_vec(T, s, NAME("mixer.in_proj.bias"), 1, sh_2di, &L->in_bias, err)))
    return rc;
  if ((rc = mbd_weights_conv(s, NAME("mixer.conv1d.weight"), di, dc, m->t.dtype, &L->conv_w,
                              &m->t.weight_bytes, err)))
    return rc;
  if (c->conv_bias && (rc = mbd_trunk_vec(T, s, NAME("mixer.conv1d.bias"), 1, sh_di, &L->conv_b,
                                          err)))
    return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.x_proj.weight"), R + 2 * S, di, &L->x_proj, err)))
    return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.dt_proj.weight"), di, R, &L->dt_proj, err))) return rc;
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.dt_proj.bias"), 1, sh_di, &L->dt_bias, err))) return rc;
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.A_log"), 2, sh_A, &L->A, err))) return rc;
  /* portable exp: the GPU model computes A with the same function (same bits) */
  for (int64_t k = 0; k < di * S; k++) L->A[k] = -mbd_pm_expf(L->A[k]);
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.D"), 1, sh_di, &L->D, err))) return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.out_proj.weight"), d, di, &L->out_proj, err)))
    return rc;
  if (c->proj_bias &&
      (rc = mbd_trunk_vec(T, s, NAME("mixer.out_proj.bias"), 1, sh_d, &L->out_bias, err)))
    return rc;
#undef NAME
  return MBD_OK;
}

static int alloc_workspace(mbd_mamba1_model *m, mbd_error *err) {
  const mbd_mamba_config *c = &m->cfg;
  size_t di = (size_t)c->d_inner, dbc = (size_t)(c->dt_rank + 2 * c->d_state);
  float **bufs[] = {&m->xz, &m->xc, &m->dbc, &m->dt, &m->y};
  size_t widths[] = {2 * di, di, dbc, di, di};
  int64_t ks[3] = {c->d_model, c->d_inner, c->dt_rank};
  int rc = mbd_trunk_alloc_rows(&m->t, bufs, widths, 5, err);
  return rc ? rc : mbd_trunk_reserve(&m->t, ks, 3, err);
}

/* The model's part of prefill and step (defined with the forward, below). */
static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err);
static int state_fits(const void *model, const void *state);
static void advance(void *state, int64_t n);

int mbd_mamba1_load(const char *dir, const mbd_mamba1_options *opts, mbd_mamba1_model **out,
                    mbd_error *err) {
  *out = NULL;
  mbd_mamba1_options def;
  if (!opts) {
    mbd_mamba1_options_default(&def);
    opts = &def;
  }
  if (opts->backend != MBD_BACKEND_CPU)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "model %s: the %s backend is not built for model runs yet; use cpu", dir,
                         mbd_backend_name(opts->backend));
  mbd_st_dir *sh = NULL;
  mbd_mamba1_model *m = calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  int rc = mbd_mamba_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba_config *c = &m->cfg;
  if (c->d_conv < 1 || c->d_state < 1 || c->dt_rank < 1 || c->d_inner < 1) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "model %s: config has non-positive sizes", dir);
    goto fail;
  }
  if ((rc = mbd_trunk_init(&m->t, opts->dtype, opts->threads, opts->isa, opts->max_rows,
                           c->d_model, err)))
    goto fail;
  if ((rc = mbd_st_dir_open(dir, &sh, err)) || (rc = mbd_st_dir_set_progress(sh, opts->progress, err)))
    goto fail;
  m->layers = calloc((size_t)c->n_layer, sizeof(layer_w));
  if (!m->layers) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
    goto fail;
  }
  if ((rc = mbd_trunk_load_embed(&m->t, sh, "backbone.embeddings.weight", c->vocab_size, err)))
    goto fail;
  for (int i = 0; i < c->n_layer; i++)
    if ((rc = load_layer(m, sh, i, err))) goto fail;
  if ((rc = mbd_trunk_load_tail(&m->t, sh, c->tie_embeddings, true, err))) goto fail;
  if ((rc = alloc_workspace(m, err))) goto fail;
  mbd_trunk_bind(&m->t, m, state_fits, advance, forward_rows);
  mbd_st_dir_destroy(&sh);
  *out = m;
  return MBD_OK;
fail:
  mbd_st_dir_destroy(&sh);
  mbd_mamba1_destroy(&m);
  return rc;
}

void mbd_mamba1_destroy(mbd_mamba1_model **pm) {
  if (!pm || !*pm) return;
  mbd_mamba1_model *m = *pm;
  if (m->layers) {
    for (int i = 0; i < m->cfg.n_layer; i++) {
      layer_w *L = &m->layers[i];
      free(L->norm);
      mbd_cpu_wpack_destroy(&L->in_proj);
      free(L->in_bias);
      free(L->conv_w);
      free(L->conv_b);
      mbd_cpu_wpack_destroy(&L->x_proj);
      mbd_cpu_wpack_destroy(&L->dt_proj);
      free(L->dt_bias);
      free(L->A);
      free(L->D);
      mbd_cpu_wpack_destroy(&L->out_proj);
      free(L->out_bias);
    }
  }
  free(m->layers);
  free(m->xz);
  free(m->xc);
  free(m->dbc);
  free(m->dt);
  free(m->y);
  mbd_trunk_free(&m->t);
  free(m);
  *pm = NULL;
}

const mbd_mamba_config *mbd_mamba1_config(const mbd_mamba1_model *m) { return &m->cfg; }
int mbd_mamba1_vocab(const mbd_mamba1_model *m) { return m->cfg.vocab_size; }
mbd_dtype mbd_mamba1_dtype(const mbd_mamba1_model *m) { return m->t.dtype; }
const char *mbd_mamba1_isa(const mbd_mamba1_model *m) {
  return mbd_cpu_isa_name(mbd_cpu_ctx_isa(m->t.ctx));
}
size_t mbd_mamba1_weight_bytes(const mbd_mamba1_model *m) { return m->t.weight_bytes; }

/* ---- state ---- */

int mbd_mamba1_state_new(const mbd_mamba1_model *m, mbd_mamba1_state **out, mbd_error *err) {
  *out = NULL;
  mbd_mamba1_state *s = calloc(1, sizeof(*s));
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  s->n_layer = m->cfg.n_layer;
  s->di = m->cfg.d_inner;
  s->dc = m->cfg.d_conv;
  s->ds = m->cfg.d_state;
  size_t nc = (size_t)s->n_layer * (size_t)(s->dc - 1) * (size_t)s->di;
  size_t ns = (size_t)s->n_layer * (size_t)s->di * (size_t)s->ds;
  s->conv = calloc(nc + 1, sizeof(float));
  s->ssm = calloc(ns + 1, sizeof(float));
  if (!s->conv || !s->ssm) {
    mbd_mamba1_state_destroy(&s);
    return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  }
  *out = s;
  return MBD_OK;
}

void mbd_mamba1_state_destroy(mbd_mamba1_state **ps) {
  if (!ps || !*ps) return;
  free((*ps)->conv);
  free((*ps)->ssm);
  free(*ps);
  *ps = NULL;
}

static size_t conv_count(const mbd_mamba1_state *s) {
  return (size_t)s->n_layer * (size_t)(s->dc - 1) * (size_t)s->di;
}
static size_t ssm_count(const mbd_mamba1_state *s) {
  return (size_t)s->n_layer * (size_t)s->di * (size_t)s->ds;
}

void mbd_mamba1_state_reset(mbd_mamba1_state *s) {
  memset(s->conv, 0, conv_count(s) * sizeof(float));
  memset(s->ssm, 0, ssm_count(s) * sizeof(float));
  s->pos = 0;
}

int64_t mbd_mamba1_state_position(const mbd_mamba1_state *s) { return s->pos; }

/* The image payload: conv then ssm. */
static size_t parts_of(const mbd_mamba1_state *s, mbd_state_part p[2]) {
  p[0] = (mbd_state_part){s->conv, conv_count(s)};
  p[1] = (mbd_state_part){s->ssm, ssm_count(s)};
  return 2;
}

size_t mbd_mamba1_state_export_size(const mbd_mamba1_state *s) {
  mbd_state_part p[2];
  return mbd_state_image_size(0, p, parts_of(s, p));
}

mbd_state_shape mbd_mamba1_state_shape(const mbd_mamba_config *cfg) {
  mbd_state_shape sh = {.family = MBD_STATE_FAMILY_MAMBA1,
                        .n_layer = (uint32_t)cfg->n_layer,
                        .d_inner = (uint32_t)cfg->d_inner,
                        .d_conv = (uint32_t)cfg->d_conv,
                        .d_state = (uint32_t)cfg->d_state};
  return sh;
}

/* The image shape of s (its four dims). */
static mbd_state_shape state_shape(const mbd_mamba1_state *s) {
  mbd_mamba_config c = {.n_layer = s->n_layer, .d_inner = s->di, .d_conv = s->dc, .d_state = s->ds};
  return mbd_mamba1_state_shape(&c);
}

int mbd_mamba1_state_export(const mbd_mamba1_state *s, void *buf, size_t cap, size_t *len,
                            mbd_error *err) {
  mbd_state_part p[2];
  size_t np = parts_of(s, p);
  mbd_state_shape shape = state_shape(s);
  return mbd_state_image_export(buf, cap, len, &shape, s->pos, NULL, 0, p, np, err);
}

int mbd_mamba1_state_import(mbd_mamba1_state *s, const void *buf, size_t len, mbd_error *err) {
  mbd_state_part p[2];
  size_t np = parts_of(s, p);
  mbd_state_shape shape = state_shape(s);
  int64_t pos;
  int rc = mbd_state_image_check(buf, len, &shape, 0, p, np, &pos, NULL, err);
  if (rc) return rc;
  mbd_state_image_read_parts(buf, 0, p, np);
  s->pos = pos;
  return MBD_OK;
}

/* ---- forward ---- */

typedef struct chunk {
  mbd_mamba1_model *m;
  mbd_mamba1_state *const *states;
  const int64_t *seg; /* nseg x {seq, row0, nrows, t0} */
  int64_t nseg;
  int64_t nblocks;    /* channel blocks */
  int layer;
} chunk;

static void conv_task(void *arg, int64_t task, int thread) {
  (void)thread;
  const chunk *ch = arg;
  const mbd_mamba1_model *m = ch->m;
  const layer_w *L = &m->layers[ch->layer];
  int64_t di = m->cfg.d_inner;
  int dc = m->cfg.d_conv;
  const int64_t *sg = ch->seg + 4 * (task / ch->nblocks);
  int64_t c0 = (task % ch->nblocks) * CHANNEL_BLOCK;
  int64_t c1 = c0 + CHANNEL_BLOCK < di ? c0 + CHANNEL_BLOCK : di;
  mbd_mamba1_state *s = ch->states[sg[0]];
  float *state = s->conv + (size_t)ch->layer * (size_t)(dc - 1) * (size_t)di;
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++)
    mbd_cpu_conv_step(mbd_cpu_ctx_isa(m->t.ctx), c0, c1, di, dc, L->conv_w, L->conv_b, state, m->xz + r * 2 * di,
                      m->xc + r * di);
}

static void scan_task(void *arg, int64_t task, int thread) {
  (void)thread;
  const chunk *ch = arg;
  const mbd_mamba1_model *m = ch->m;
  const layer_w *L = &m->layers[ch->layer];
  int64_t di = m->cfg.d_inner;
  int ds = m->cfg.d_state;
  int64_t R = m->cfg.dt_rank, ldb = R + 2 * ds;
  const int64_t *sg = ch->seg + 4 * (task / ch->nblocks);
  int64_t c0 = (task % ch->nblocks) * CHANNEL_BLOCK;
  int64_t c1 = c0 + CHANNEL_BLOCK < di ? c0 + CHANNEL_BLOCK : di;
  mbd_mamba1_state *s = ch->states[sg[0]];
  float *h = s->ssm + (size_t)ch->layer * (size_t)di * (size_t)ds;
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++) {
    const float *bc = m->dbc + r * ldb + R;
    mbd_cpu_scan_step(mbd_cpu_ctx_isa(m->t.ctx), c0, c1, ds, L->A, L->D, m->dt + r * di, bc, bc + ds, m->xc + r * di,
                      m->xz + r * 2 * di + di, h, m->y + r * di);
  }
}

/* Runs all layers over the chunk's rows; leaves final-normed rows in m->t.xn. */
static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err) {
  mbd_mamba1_model *m = model;
  mbd_mamba1_state *const *states = (mbd_mamba1_state *const *)st;
  const mbd_mamba_config *c = &m->cfg;
  int64_t d = c->d_model, di = c->d_inner, R = c->dt_rank, S = c->d_state;
  chunk ch = {.m = m, .states = states, .seg = seg, .nseg = nseg,
              .nblocks = (di + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK};
  int rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_w *L = &m->layers[l];
    ch.layer = l;
    mbd_trunk_norm(&m->t, rows, L->norm, c->norm_eps);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->t.xn, d, L->in_proj, L->in_bias, m->xz, 2 * di,
                                  err)))
      return rc;
    mbd_cpu_ctx_run_sized(m->t.ctx, conv_task, &ch, nseg * ch.nblocks, rows * di * c->d_conv);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->xc, di, L->x_proj, NULL, m->dbc, R + 2 * S,
                                  err)))
      return rc;
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->dbc, R + 2 * S, L->dt_proj, L->dt_bias, m->dt,
                                  di, err)))
      return rc;
    /* the scan costs ~ an expf and two fmas per (channel, state) */
    mbd_cpu_ctx_run_sized(m->t.ctx, scan_task, &ch, nseg * ch.nblocks, rows * di * S * 8);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->y, di, L->out_proj, L->out_bias, m->t.out, d,
                                  err)))
      return rc;
    mbd_trunk_add_out(&m->t, rows);
  }
  mbd_trunk_norm(&m->t, rows, m->t.norm_f, c->norm_eps);
  return MBD_OK;
}

static int state_fits(const void *model, const void *state) {
  const mbd_mamba_config *c = &((const mbd_mamba1_model *)model)->cfg;
  const mbd_mamba1_state *s = state;
  return s->n_layer == c->n_layer && s->di == c->d_inner && s->dc == c->d_conv &&
         s->ds == c->d_state;
}

static void advance(void *state, int64_t n) { ((mbd_mamba1_state *)state)->pos += n; }

int mbd_mamba1_prefill(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                       const int32_t *const *tokens, const int64_t *lens, mbd_mamba1_logits which,
                       float *logits, mbd_error *err) {
  return mbd_rows_prefill(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, lens,
                          (mbd_logits_sel)which, logits, err);
}

int mbd_mamba1_step(mbd_mamba1_model *m, mbd_mamba1_state *const *states, int batch,
                    const int32_t *tokens, float *logits, mbd_error *err) {
  return mbd_rows_step(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, logits, err);
}

/* ---- the family vtable (kernels/model/family.h) ---- */

_Static_assert((int)MBD_MAMBA1_LOGITS_NONE == (int)MBD_LOGITS_NONE &&
                   (int)MBD_MAMBA1_LOGITS_LAST == (int)MBD_LOGITS_LAST &&
                   (int)MBD_MAMBA1_LOGITS_ALL == (int)MBD_LOGITS_ALL,
               "mbd_mamba1_logits mirrors mbd_logits_sel");

static int fam_load(const char *dir, const mbd_cpu_model_opts *o, void **model, mbd_error *err) {
  mbd_mamba1_options mo;
  mbd_mamba1_options_default(&mo);
  mo.dtype = o->dtype;
  mo.threads = o->threads;
  mo.isa = o->isa;
  mo.progress = o->progress;
  mbd_mamba1_model *m = NULL;
  int rc = mbd_mamba1_load(dir, &mo, &m, err);
  *model = m;
  return rc;
}

MBD_CPU_FAMILY_OPS(mamba1, fam_load);
