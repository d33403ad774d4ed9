/* Mamba-2 model on the CPU backend (see mamba2.h).
 *
 * A call's tokens are flattened into rows, sequence-major, and processed in
 * chunks of at most max_rows rows (a time window of every sequence). Row-wise
 * work (norms, projections through the batch-invariant GEMM) depends only on
 * the row; the conv and the recurrence walk each sequence's rows in time
 * order with the per-token ops (kernels/cpu/mamba_ops.h conv step,
 * kernels/cpu/ssd_step.h), parallel over channels and heads. So neither the
 * batch, the slot, the chunking nor prefill-vs-step can change a sequence's
 * bits. */
#include "kernels/model/mamba2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/safetensors.h"
#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/family_ops.h"
#include "kernels/model/rows.h"
#include "kernels/model/trunk.h"
#include "kernels/model/weights.h"
#include "kernels/cpu/ssd_step.h"
#include "kernels/portable_math.h"

#define DEFAULT_MAX_ROWS 256
#define CHANNEL_BLOCK 64 /* conv channels, and scan channels (whole heads), per task */

typedef struct layer_w {
  float *norm;             /* [d] */
  mbd_cpu_wpack *in_proj;  /* [Pin, d]: z | xBC | dt */
  float *in_bias;          /* [Pin] or NULL */
  float *conv_w;           /* [dc][conv_dim], tap-major */
  float *conv_b;           /* [conv_dim] or NULL */
  float *dt_bias;          /* [H] */
  float *A;                /* [H], = -exp(A_log) */
  float *D;                /* [H] */
  float *gnorm;            /* [di] gated norm weight */
  mbd_cpu_wpack *out_proj; /* [d, di] */
  float *out_bias;         /* [d] or NULL */
} layer_w;

struct mbd_mamba2_model {
  mbd_mamba2_config cfg;
  mbd_trunk t;             /* embedding (its rows: V), head, final norm, rows, batch buffers */
  int64_t pin, conv_dim;   /* in_proj width, conv channels */
  mbd_ssd_dims dims;
  layer_w *layers;         /* [n_layer] */
  /* workspace for max_rows rows */
  float *zx;               /* [rows, Pin] in_proj output */
  float *xbc;              /* [rows, conv_dim] conv + silu output (x | B | C) */
  float *y;                /* [rows, di] recurrence output, then gated-normed */
};

struct mbd_mamba2_state {
  int n_layer, di, dc, ds, heads, head_dim, groups, conv_dim;
  int64_t pos;
  float *conv; /* [L][dc-1][conv_dim] */
  float *ssm;  /* [L][H][P][N] */
};

void mbd_mamba2_options_default(mbd_mamba2_options *o) {
  memset(o, 0, sizeof(*o));
  o->dtype = MBD_DTYPE_F32;
  o->isa = MBD_CPU_ISA_AUTO;
  o->max_rows = DEFAULT_MAX_ROWS;
}

/* ---- loading ---- */

static int load_layer(mbd_mamba2_model *m, const mbd_st_dir *s, int i, mbd_error *err) {
  const mbd_mamba2_config *c = &m->cfg;
  layer_w *L = &m->layers[i];
  mbd_trunk *T = &m->t;
  int64_t d = c->d_model, di = c->d_inner, H = c->n_heads, dc = c->d_conv;
  int64_t cd = m->conv_dim, pin = m->pin;
  char nm[256];
  int rc;
#define NAME(suffix) (snprintf(nm, sizeof(nm), "backbone.layers.%d.%s", i, suffix), nm)
  int64_t sh_d[1] = {d}, sh_di[1] = {di}, sh_H[1] = {H}, sh_pin[1] = {pin}, sh_cd[1] = {cd};
  if ((rc = mbd_trunk_vec(T, s, NAME("norm.weight"), 1, sh_d, &L->norm, err))) return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.in_proj.weight"), pin, d, &L->in_proj, err))) return rc;
  if (c->proj_bias &&
      (rc = mbd_trunk_vec(T, s, NAME("mixer.in_proj.bias"), 1, sh_pin, &L->in_bias, err)))
    return rc;
  if ((rc = mbd_weights_conv(s, NAME("mixer.conv1d.weight"), cd, dc, m->t.dtype, &L->conv_w,
                              &m->t.weight_bytes, err)))
    return rc;
  if (c->conv_bias && (rc = mbd_trunk_vec(T, s, NAME("mixer.conv1d.bias"), 1, sh_cd, &L->conv_b,
                                          err)))
    return rc;
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.dt_bias"), 1, sh_H, &L->dt_bias, err))) return rc;
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.A_log"), 1, sh_H, &L->A, err))) return rc;
  /* portable exp: a GPU model computes A with the same function (same bits) */
  for (int64_t k = 0; k < H; k++) L->A[k] = -mbd_pm_expf(L->A[k]);
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.D"), 1, sh_H, &L->D, err))) return rc;
  if ((rc = mbd_trunk_vec(T, s, NAME("mixer.norm.weight"), 1, sh_di, &L->gnorm, err))) return rc;
  if ((rc = mbd_trunk_mat(T, s, NAME("mixer.out_proj.weight"), d, di, &L->out_proj, err)))
    return rc;
  if (c->proj_bias &&
      (rc = mbd_trunk_vec(T, s, NAME("mixer.out_proj.bias"), 1, sh_d, &L->out_bias, err)))
    return rc;
#undef NAME
  return MBD_OK;
}

static int alloc_workspace(mbd_mamba2_model *m, mbd_error *err) {
  const mbd_mamba2_config *c = &m->cfg;
  float **bufs[] = {&m->zx, &m->xbc, &m->y};
  size_t widths[] = {(size_t)m->pin, (size_t)m->conv_dim, (size_t)c->d_inner};
  int64_t ks[2] = {c->d_model, c->d_inner};
  int rc = mbd_trunk_alloc_rows(&m->t, bufs, widths, 3, err);
  return rc ? rc : mbd_trunk_reserve(&m->t, ks, 2, err);
}

/* The model's part of prefill and step (defined with the forward, below). */
static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err);
static int state_fits(const void *model, const void *state);
static void advance(void *state, int64_t n);

int mbd_mamba2_load(const char *dir, const mbd_mamba2_options *opts, mbd_mamba2_model **out,
                    mbd_error *err) {
  *out = NULL;
  mbd_mamba2_options def;
  if (!opts) {
    mbd_mamba2_options_default(&def);
    opts = &def;
  }
  mbd_st_dir *sh = NULL;
  mbd_mamba2_model *m = calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  int rc = mbd_mamba2_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba2_config *c = &m->cfg;
  m->conv_dim = (int64_t)c->d_inner + 2 * (int64_t)c->n_groups * c->d_state;
  m->pin = (int64_t)c->d_inner + m->conv_dim + c->n_heads;
  m->dims = (mbd_ssd_dims){.heads = c->n_heads, .head_dim = c->head_dim, .d_state = c->d_state,
                           .n_groups = c->n_groups};
  if ((rc = mbd_trunk_init(&m->t, opts->dtype, opts->threads, opts->isa, opts->max_rows,
                           c->d_model, err)))
    goto fail;
  if ((rc = mbd_st_dir_open(dir, &sh, err))) goto fail;
  m->layers = calloc((size_t)c->n_layer, sizeof(layer_w));
  if (!m->layers) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
    goto fail;
  }
  const mbd_st_entry *emb = mbd_st_dir_find(sh, "backbone.embeddings.weight");
  int64_t V = emb && emb->desc.ndim == 2 ? emb->desc.shape[0] : c->vocab_size;
  if (V < 1 || V > INT32_MAX) {
    rc = mbd_error_set(err, MBD_E_SHAPE, "model %s: embedding has no rows", dir);
    goto fail;
  }
  if ((rc = mbd_trunk_load_embed(&m->t, sh, "backbone.embeddings.weight", V, err))) goto fail;
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
  mbd_mamba2_destroy(&m);
  return rc;
}

void mbd_mamba2_destroy(mbd_mamba2_model **pm) {
  if (!pm || !*pm) return;
  mbd_mamba2_model *m = *pm;
  for (int i = 0; m->layers && i < m->cfg.n_layer; i++) {
    layer_w *L = &m->layers[i];
    free(L->norm);
    mbd_cpu_wpack_destroy(&L->in_proj);
    free(L->in_bias);
    free(L->conv_w);
    free(L->conv_b);
    free(L->dt_bias);
    free(L->A);
    free(L->D);
    free(L->gnorm);
    mbd_cpu_wpack_destroy(&L->out_proj);
    free(L->out_bias);
  }
  free(m->layers);
  free(m->zx);
  free(m->xbc);
  free(m->y);
  mbd_trunk_free(&m->t);
  free(m);
  *pm = NULL;
}

const mbd_mamba2_config *mbd_mamba2_config_of(const mbd_mamba2_model *m) { return &m->cfg; }
int mbd_mamba2_vocab(const mbd_mamba2_model *m) { return (int)m->t.V; }
const char *mbd_mamba2_isa(const mbd_mamba2_model *m) {
  return mbd_cpu_isa_name(mbd_cpu_ctx_isa(m->t.ctx));
}
size_t mbd_mamba2_weight_bytes(const mbd_mamba2_model *m) { return m->t.weight_bytes; }

/* ---- state ---- */

static size_t conv_count(const mbd_mamba2_state *s) {
  return (size_t)s->n_layer * (size_t)(s->dc - 1) * (size_t)s->conv_dim;
}
static size_t ssm_count(const mbd_mamba2_state *s) {
  return (size_t)s->n_layer * (size_t)s->di * (size_t)s->ds;
}

int mbd_mamba2_state_new(const mbd_mamba2_model *m, mbd_mamba2_state **out, mbd_error *err) {
  *out = NULL;
  mbd_mamba2_state *s = calloc(1, sizeof(*s));
  if (!s) return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  const mbd_mamba2_config *c = &m->cfg;
  s->n_layer = c->n_layer;
  s->di = c->d_inner;
  s->dc = c->d_conv;
  s->ds = c->d_state;
  s->heads = c->n_heads;
  s->head_dim = c->head_dim;
  s->groups = c->n_groups;
  s->conv_dim = (int)m->conv_dim;
  s->conv = calloc(conv_count(s) + 1, sizeof(float));
  s->ssm = calloc(ssm_count(s) + 1, sizeof(float));
  if (!s->conv || !s->ssm) {
    mbd_mamba2_state_destroy(&s);
    return mbd_error_set(err, MBD_E_NOMEM, "state: out of memory");
  }
  *out = s;
  return MBD_OK;
}

void mbd_mamba2_state_destroy(mbd_mamba2_state **ps) {
  if (!ps || !*ps) return;
  free((*ps)->conv);
  free((*ps)->ssm);
  free(*ps);
  *ps = NULL;
}

void mbd_mamba2_state_reset(mbd_mamba2_state *s) {
  memset(s->conv, 0, conv_count(s) * sizeof(float));
  memset(s->ssm, 0, ssm_count(s) * sizeof(float));
  s->pos = 0;
}

int64_t mbd_mamba2_state_position(const mbd_mamba2_state *s) { return s->pos; }

#define SUB_WORDS 4 /* u32 heads, head_dim, groups, 0 */

/* The image payload after the sub-header: conv then ssm. */
static size_t parts_of(const mbd_mamba2_state *s, mbd_state_part p[2]) {
  p[0] = (mbd_state_part){s->conv, conv_count(s)};
  p[1] = (mbd_state_part){s->ssm, ssm_count(s)};
  return 2;
}

size_t mbd_mamba2_state_export_size(const mbd_mamba2_state *s) {
  mbd_state_part p[2];
  return mbd_state_image_size(SUB_WORDS, p, parts_of(s, p));
}

mbd_state_shape mbd_mamba2_state_shape(const mbd_mamba2_config *cfg) {
  mbd_state_shape sh = {.family = MBD_STATE_FAMILY_MAMBA2,
                        .n_layer = (uint32_t)cfg->n_layer,
                        .d_inner = (uint32_t)cfg->d_inner,
                        .d_conv = (uint32_t)cfg->d_conv,
                        .d_state = (uint32_t)cfg->d_state};
  return sh;
}

static mbd_state_shape state_shape(const mbd_mamba2_state *s) {
  mbd_mamba2_config c = {.n_layer = s->n_layer, .d_inner = s->di, .d_conv = s->dc,
                         .d_state = s->ds};
  return mbd_mamba2_state_shape(&c);
}

int mbd_mamba2_state_export(const mbd_mamba2_state *s, void *buf, size_t cap, size_t *len,
                            mbd_error *err) {
  mbd_state_part p[2];
  size_t np = parts_of(s, p);
  mbd_state_shape shape = state_shape(s);
  uint32_t w[SUB_WORDS] = {(uint32_t)s->heads, (uint32_t)s->head_dim, (uint32_t)s->groups, 0};
  return mbd_state_image_export(buf, cap, len, &shape, s->pos, w, SUB_WORDS, p, np, err);
}

int mbd_mamba2_state_import(mbd_mamba2_state *s, const void *buf, size_t len, mbd_error *err) {
  mbd_state_part p[2];
  size_t np = parts_of(s, p);
  mbd_state_shape shape = state_shape(s);
  int64_t pos;
  uint32_t w[SUB_WORDS];
  int rc = mbd_state_image_check(buf, len, &shape, SUB_WORDS, p, np, &pos, w, err);
  if (rc) return rc;
  if (w[0] != (uint32_t)s->heads || w[1] != (uint32_t)s->head_dim ||
      w[2] != (uint32_t)s->groups || w[3] != 0)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "state import: state has %u heads x %u, %u groups; this model %d x %d, "
                         "%d groups",
                         w[0], w[1], w[2], s->heads, s->head_dim, s->groups);
  mbd_state_image_read_parts(buf, SUB_WORDS, p, np);
  s->pos = pos;
  return MBD_OK;
}

/* ---- forward ---- */

typedef struct chunk {
  mbd_mamba2_model *m;
  mbd_mamba2_state *const *states;
  const int64_t *seg; /* nseg x {seq, row0, nrows, t0} */
  int64_t nblocks;    /* conv channel blocks or head blocks per segment */
  int hb;             /* heads per scan task */
  int layer;
} chunk;

static void conv_task(void *arg, int64_t task, int thread) {
  (void)thread;
  const chunk *ch = arg;
  const mbd_mamba2_model *m = ch->m;
  const layer_w *L = &m->layers[ch->layer];
  int64_t cd = m->conv_dim, di = m->cfg.d_inner;
  int dc = m->cfg.d_conv;
  const int64_t *sg = ch->seg + 4 * (task / ch->nblocks);
  int64_t c0 = (task % ch->nblocks) * CHANNEL_BLOCK;
  int64_t c1 = c0 + CHANNEL_BLOCK < cd ? c0 + CHANNEL_BLOCK : cd;
  mbd_mamba2_state *s = ch->states[sg[0]];
  float *state = s->conv + (size_t)ch->layer * (size_t)(dc - 1) * (size_t)cd;
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++)
    mbd_cpu_conv_step(mbd_cpu_ctx_isa(m->t.ctx), c0, c1, cd, dc, L->conv_w, L->conv_b, state,
                      m->zx + r * m->pin + di, m->xbc + r * cd);
}

static void scan_task(void *arg, int64_t task, int thread) {
  (void)thread;
  const chunk *ch = arg;
  const mbd_mamba2_model *m = ch->m;
  const mbd_mamba2_config *c = &m->cfg;
  const layer_w *L = &m->layers[ch->layer];
  int64_t cd = m->conv_dim, di = c->d_inner, GN = (int64_t)c->n_groups * c->d_state;
  const int64_t *sg = ch->seg + 4 * (task / ch->nblocks);
  int h0 = (int)(task % ch->nblocks) * ch->hb;
  int h1 = h0 + ch->hb < c->n_heads ? h0 + ch->hb : c->n_heads;
  mbd_mamba2_state *s = ch->states[sg[0]];
  float *h = s->ssm + (size_t)ch->layer * (size_t)di * (size_t)c->d_state;
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++) {
    const float *xbc = m->xbc + r * cd;
    mbd_cpu_ssd_step(mbd_cpu_ctx_isa(m->t.ctx), &m->dims, h0, h1, L->A, L->D, L->dt_bias,
                     c->dt_min, c->dt_max, m->zx + r * m->pin + di + cd, xbc + di,
                     xbc + di + GN, xbc, h, m->y + r * di);
  }
}

/* Runs all layers over the chunk's rows; leaves final-normed rows in m->t.xn. */
static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err) {
  mbd_mamba2_model *m = model;
  mbd_mamba2_state *const *states = (mbd_mamba2_state *const *)st;
  const mbd_mamba2_config *c = &m->cfg;
  int64_t d = c->d_model, di = c->d_inner, cd = m->conv_dim;
  int hb = CHANNEL_BLOCK / c->head_dim > 0 ? CHANNEL_BLOCK / c->head_dim : 1;
  chunk cc = {.m = m, .states = states, .seg = seg,
              .nblocks = (cd + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK};
  chunk sc = {.m = m, .states = states, .seg = seg, .hb = hb,
              .nblocks = (c->n_heads + hb - 1) / hb};
  int rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_w *L = &m->layers[l];
    cc.layer = sc.layer = l;
    mbd_trunk_norm(&m->t, rows, L->norm, c->norm_eps);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->t.xn, d, L->in_proj, L->in_bias, m->zx, m->pin,
                                  err)))
      return rc;
    mbd_cpu_ctx_run_sized(m->t.ctx, conv_task, &cc, nseg * cc.nblocks, rows * cd * c->d_conv);
    mbd_cpu_ctx_run_sized(m->t.ctx, scan_task, &sc, nseg * sc.nblocks,
                          rows * di * c->d_state * 3);
    for (int64_t r = 0; r < rows; r++)
      mbd_cpu_gated_rmsnorm(m->y + r * di, m->zx + r * m->pin, L->gnorm, di,
                            di / c->n_groups, c->norm_eps, c->norm_before_gate, m->y + r * di);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->y, di, L->out_proj, L->out_bias, m->t.out, d,
                                  err)))
      return rc;
    mbd_trunk_add_out(&m->t, rows);
  }
  mbd_trunk_norm(&m->t, rows, m->t.norm_f, c->norm_eps);
  return MBD_OK;
}

static int state_fits(const void *model, const void *state) {
  const mbd_mamba2_config *c = &((const mbd_mamba2_model *)model)->cfg;
  const mbd_mamba2_state *s = state;
  return s->n_layer == c->n_layer && s->di == c->d_inner && s->dc == c->d_conv &&
         s->ds == c->d_state && s->heads == c->n_heads && s->groups == c->n_groups;
}

static void advance(void *state, int64_t n) { ((mbd_mamba2_state *)state)->pos += n; }

int mbd_mamba2_prefill(mbd_mamba2_model *m, mbd_mamba2_state *const *states, int batch,
                       const int32_t *const *tokens, const int64_t *lens, mbd_logits_sel which,
                       float *logits, mbd_error *err) {
  return mbd_rows_prefill(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, lens,
                          (mbd_logits_sel)which, logits, err);
}

int mbd_mamba2_step(mbd_mamba2_model *m, mbd_mamba2_state *const *states, int batch,
                    const int32_t *tokens, float *logits, mbd_error *err) {
  return mbd_rows_step(m ? &m->t.rows : NULL, (void *const *)states, batch, tokens, logits, err);
}

/* ---- the family vtable (kernels/model/family.h) ---- */

MBD_CPU_FAMILY_LOAD(mamba2)
MBD_CPU_FAMILY_OPS(mamba2, fam_load);
