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

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/conv_rows.h"
#include "kernels/model/family_ops.h"
#include "kernels/model/seq_state.h"
#include "kernels/model/trunk.h"
#include "kernels/model/weights.h"

#define DEFAULT_MAX_ROWS 256
#define CHANNEL_BLOCK 64 /* channels per scan task */

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
  mbd_trunk t;             /* embedding, layers, head, final norm, rows, batch buffers, states */
  layer_w *layers;         /* [n_layer], t's */
  size_t ssm_off;          /* where a state's ssm part starts in its buffer */
  /* workspace for max_rows rows (t's) */
  float *xz;               /* [rows, 2 di] in_proj output (x | z) */
  float *xc;               /* [rows, di] conv + silu output */
  float *dbc;              /* [rows, R + 2 S] x_proj output (dt | B | C) */
  float *dt;               /* [rows, di] dt_proj output (before softplus) */
  float *y;                /* [rows, di] gated scan output */
};

/* A state (kernels/model/seq_state.h) is the image payload: f32
 * conv[L][dc-1][di], then ssm[L][di][ds] from ssm_off. */

void mbd_mamba1_options_default(mbd_mamba1_options *o) {
  memset(o, 0, sizeof(*o));
  o->backend = MBD_BACKEND_CPU;
  o->dtype = MBD_DTYPE_F32;
  o->threads = 0;
  o->isa = MBD_CPU_ISA_AUTO;
  o->max_rows = DEFAULT_MAX_ROWS;
}

/* ---- loading (through the trunk, kernels/model/trunk.h) ---- */

/* The checkpoint tensors of a layer, "backbone.layers.<i>." + suffix. */
static size_t layer_tensors(const mbd_mamba_config *c, mbd_weight_spec *w) {
  int64_t d = c->d_model, di = c->d_inner, S = c->d_state, R = c->dt_rank, dc = c->d_conv;
  size_t n = 0;
  w[n++] = MBD_WEIGHT_VEC(layer_w, norm, "norm.weight", d);
  w[n++] = MBD_WEIGHT_MAT(layer_w, in_proj, "mixer.in_proj.weight", 2 * di, d);
  if (c->proj_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, in_bias, "mixer.in_proj.bias", 2 * di);
  w[n++] = MBD_WEIGHT_CONV(layer_w, conv_w, "mixer.conv1d.weight", di, dc);
  if (c->conv_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, conv_b, "mixer.conv1d.bias", di);
  w[n++] = MBD_WEIGHT_MAT(layer_w, x_proj, "mixer.x_proj.weight", R + 2 * S, di);
  w[n++] = MBD_WEIGHT_MAT(layer_w, dt_proj, "mixer.dt_proj.weight", di, R);
  w[n++] = MBD_WEIGHT_VEC(layer_w, dt_bias, "mixer.dt_proj.bias", di);
  w[n++] = MBD_WEIGHT_NEG_EXP(layer_w, A, "mixer.A_log", di, S);
  w[n++] = MBD_WEIGHT_VEC(layer_w, D, "mixer.D", di);
  w[n++] = MBD_WEIGHT_MAT(layer_w, out_proj, "mixer.out_proj.weight", d, di);
  if (c->proj_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, out_bias, "mixer.out_proj.bias", d);
  return n;
}

static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err);

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
  mbd_mamba1_model *m = calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  int rc = mbd_mamba_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba_config *c = &m->cfg;
  if (c->d_conv < 1 || c->d_state < 1 || c->dt_rank < 1 || c->d_inner < 1) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "model %s: config has non-positive sizes", dir);
    goto fail;
  }
  size_t di = (size_t)c->d_inner, dbc = (size_t)(c->dt_rank + 2 * c->d_state);
  size_t ssm_off = (size_t)c->n_layer * (size_t)(c->d_conv - 1) * di;
  float **bufs[] = {&m->xz, &m->xc, &m->dbc, &m->dt, &m->y};
  size_t widths[] = {2 * di, di, dbc, di, di};
  int64_t ks[] = {c->d_model, c->d_inner, c->dt_rank};
  mbd_weight_spec w[MBD_TRUNK_MAX_LAYER_TENSORS];
  mbd_trunk_spec sp = {
      .dtype = opts->dtype, .threads = opts->threads, .isa = opts->isa,
      .max_rows = opts->max_rows, .progress = opts->progress, .d = c->d_model,
      .embed = "backbone.embeddings.weight", .V = c->vocab_size, .tied = c->tie_embeddings,
      .head_optional = true, .n_layer = c->n_layer, .layer_size = sizeof(layer_w), .layer = w,
      .nlayer = layer_tensors(c, w), .bufs = bufs, .widths = widths, .nbufs = 5, .ks = ks,
      .nks = 3,
      .state = {.shape = mbd_mamba1_state_shape(c),
                .floats = ssm_off + (size_t)c->n_layer * di * (size_t)c->d_state},
      .model = m, .forward = forward_rows};
  if ((rc = mbd_trunk_load(&m->t, dir, &sp, err))) goto fail;
  m->layers = m->t.layers;
  m->ssm_off = ssm_off;
  *out = m;
  return MBD_OK;
fail:
  mbd_mamba1_destroy(&m);
  return rc;
}

const mbd_mamba_config *mbd_mamba1_model_config(const mbd_mamba1_model *m) { return &m->cfg; }

mbd_state_shape mbd_mamba1_state_shape(const mbd_mamba_config *c) {
  return (mbd_state_shape){MBD_STATE_FAMILY_MAMBA1, (uint32_t)c->n_layer, (uint32_t)c->d_inner,
                           (uint32_t)c->d_conv, (uint32_t)c->d_state};
}

/* ---- forward ---- */

typedef struct chunk {
  mbd_mamba1_model *m;
  mbd_seq_state *const *states;
  const int64_t *seg; /* nseg x {seq, row0, nrows, t0} */
  int64_t nseg;
  int64_t nblocks;    /* channel blocks of the scan */
  int layer;
} chunk;

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
  float *h = ch->states[sg[0]]->buf + m->ssm_off + (size_t)ch->layer * (size_t)di * (size_t)ds;
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
  mbd_seq_state *const *states = (mbd_seq_state *const *)st;
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
    mbd_conv_rows conv = {.ctx = m->t.ctx, .states = states, .seg = seg, .nseg = nseg,
                          .channels = di, .dc = c->d_conv, .w = L->conv_w, .b = L->conv_b,
                          .state_off = (size_t)l * (size_t)(c->d_conv - 1) * (size_t)di,
                          .in = m->xz, .ld_in = 2 * di, .out = m->xc};
    mbd_conv_rows_run(&conv, rows);
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

/* ---- what every family has (kernels/model/family_ops.h) ---- */

MBD_CPU_FAMILY_API(mamba1, mbd_mamba1_logits)

/* ---- the family vtable (kernels/model/family.h) ---- */

_Static_assert((int)MBD_MAMBA1_LOGITS_NONE == (int)MBD_LOGITS_NONE &&
                   (int)MBD_MAMBA1_LOGITS_LAST == (int)MBD_LOGITS_LAST &&
                   (int)MBD_MAMBA1_LOGITS_ALL == (int)MBD_LOGITS_ALL,
               "mbd_mamba1_logits mirrors mbd_logits_sel");

MBD_CPU_FAMILY_LOAD(mamba1)
MBD_CPU_FAMILY_OPS(mamba1, fam_load);
