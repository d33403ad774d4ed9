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

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gated_rmsnorm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/conv_rows.h"
#include "kernels/model/family_ops.h"
#include "kernels/model/seq_state.h"
#include "kernels/model/trunk.h"
#include "kernels/model/weights.h"
#include "kernels/cpu/ssd_step.h"

#define DEFAULT_MAX_ROWS 256
#define CHANNEL_BLOCK 64 /* scan channels (whole heads) per task */

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
  mbd_trunk t;             /* embedding (its rows: V), layers, head, final norm, rows, states */
  int64_t pin, conv_dim;   /* in_proj width, conv channels */
  mbd_ssd_dims dims;
  layer_w *layers;         /* [n_layer], t's */
  size_t ssm_off;          /* where a state's ssm part starts in its buffer */
  /* workspace for max_rows rows (t's) */
  float *zx;               /* [rows, Pin] in_proj output */
  float *xbc;              /* [rows, conv_dim] conv + silu output (x | B | C) */
  float *y;                /* [rows, di] recurrence output, then gated-normed */
};

/* A state (kernels/model/seq_state.h) is the image payload after the words
 * (heads, head_dim, groups, 0): f32 conv[L][dc-1][conv_dim], then
 * ssm[L][H][P][N] from ssm_off. */

void mbd_mamba2_options_default(mbd_mamba2_options *o) {
  memset(o, 0, sizeof(*o));
  o->dtype = MBD_DTYPE_F32;
  o->isa = MBD_CPU_ISA_AUTO;
  o->max_rows = DEFAULT_MAX_ROWS;
}

/* ---- loading (through the trunk, kernels/model/trunk.h) ---- */

/* The checkpoint tensors of a layer, "backbone.layers.<i>." + suffix. */
static size_t layer_tensors(const mbd_mamba2_model *m, mbd_weight_spec *w) {
  const mbd_mamba2_config *c = &m->cfg;
  int64_t d = c->d_model, di = c->d_inner, H = c->n_heads, cd = m->conv_dim, pin = m->pin;
  size_t n = 0;
  w[n++] = MBD_WEIGHT_VEC(layer_w, norm, "norm.weight", d);
  w[n++] = MBD_WEIGHT_MAT(layer_w, in_proj, "mixer.in_proj.weight", pin, d);
  if (c->proj_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, in_bias, "mixer.in_proj.bias", pin);
  w[n++] = MBD_WEIGHT_CONV(layer_w, conv_w, "mixer.conv1d.weight", cd, c->d_conv);
  if (c->conv_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, conv_b, "mixer.conv1d.bias", cd);
  w[n++] = MBD_WEIGHT_VEC(layer_w, dt_bias, "mixer.dt_bias", H);
  w[n++] = MBD_WEIGHT_NEG_EXP(layer_w, A, "mixer.A_log", H);
  w[n++] = MBD_WEIGHT_VEC(layer_w, D, "mixer.D", H);
  w[n++] = MBD_WEIGHT_VEC(layer_w, gnorm, "mixer.norm.weight", di);
  w[n++] = MBD_WEIGHT_MAT(layer_w, out_proj, "mixer.out_proj.weight", d, di);
  if (c->proj_bias) w[n++] = MBD_WEIGHT_VEC(layer_w, out_bias, "mixer.out_proj.bias", d);
  return n;
}

static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err);

int mbd_mamba2_load(const char *dir, const mbd_mamba2_options *opts, mbd_mamba2_model **out,
                    mbd_error *err) {
  *out = NULL;
  mbd_mamba2_options def;
  if (!opts) {
    mbd_mamba2_options_default(&def);
    opts = &def;
  }
  mbd_mamba2_model *m = calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  int rc = mbd_mamba2_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba2_config *c = &m->cfg;
  m->conv_dim = (int64_t)c->d_inner + 2 * (int64_t)c->n_groups * c->d_state;
  m->pin = (int64_t)c->d_inner + m->conv_dim + c->n_heads;
  m->dims = (mbd_ssd_dims){.heads = c->n_heads, .head_dim = c->head_dim, .d_state = c->d_state,
                           .n_groups = c->n_groups};
  size_t ssm_off = (size_t)c->n_layer * (size_t)(c->d_conv - 1) * (size_t)m->conv_dim;
  float **bufs[] = {&m->zx, &m->xbc, &m->y};
  size_t widths[] = {(size_t)m->pin, (size_t)m->conv_dim, (size_t)c->d_inner};
  int64_t ks[] = {c->d_model, c->d_inner};
  mbd_weight_spec w[MBD_TRUNK_MAX_LAYER_TENSORS];
  mbd_trunk_spec sp = {
      .dtype = opts->dtype, .threads = opts->threads, .isa = opts->isa,
      .max_rows = opts->max_rows, .progress = opts->progress, .d = c->d_model,
      .embed = "backbone.embeddings.weight", .V = c->vocab_size, .V_as_stored = true,
      .tied = c->tie_embeddings, .head_optional = true, .n_layer = c->n_layer,
      .layer_size = sizeof(layer_w), .layer = w, .nlayer = layer_tensors(m, w), .bufs = bufs,
      .widths = widths, .nbufs = 3, .ks = ks, .nks = 2,
      .state = {.shape = mbd_mamba2_state_shape(c),
                .words = {(uint32_t)c->n_heads, (uint32_t)c->head_dim, (uint32_t)c->n_groups, 0},
                .nwords = 4,
                .floats = ssm_off + (size_t)c->n_layer * (size_t)c->d_inner * (size_t)c->d_state},
      .model = m, .forward = forward_rows};
  if ((rc = mbd_trunk_load(&m->t, dir, &sp, err))) goto fail;
  m->layers = m->t.layers;
  m->ssm_off = ssm_off;
  *out = m;
  return MBD_OK;
fail:
  mbd_mamba2_destroy(&m);
  return rc;
}

const mbd_mamba2_config *mbd_mamba2_model_config(const mbd_mamba2_model *m) { return &m->cfg; }

mbd_state_shape mbd_mamba2_state_shape(const mbd_mamba2_config *c) {
  return (mbd_state_shape){MBD_STATE_FAMILY_MAMBA2, (uint32_t)c->n_layer, (uint32_t)c->d_inner,
                           (uint32_t)c->d_conv, (uint32_t)c->d_state};
}

/* ---- forward ---- */

typedef struct chunk {
  mbd_mamba2_model *m;
  mbd_seq_state *const *states;
  const int64_t *seg; /* nseg x {seq, row0, nrows, t0} */
  int64_t nblocks;    /* head blocks per segment */
  int hb;             /* heads per scan task */
  int layer;
} chunk;

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
  float *h = ch->states[sg[0]]->buf + m->ssm_off +
             (size_t)ch->layer * (size_t)di * (size_t)c->d_state;
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
  mbd_seq_state *const *states = (mbd_seq_state *const *)st;
  const mbd_mamba2_config *c = &m->cfg;
  int64_t d = c->d_model, di = c->d_inner, cd = m->conv_dim;
  int hb = CHANNEL_BLOCK / c->head_dim > 0 ? CHANNEL_BLOCK / c->head_dim : 1;
  chunk sc = {.m = m, .states = states, .seg = seg, .hb = hb,
              .nblocks = (c->n_heads + hb - 1) / hb};
  int rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_w *L = &m->layers[l];
    sc.layer = l;
    mbd_trunk_norm(&m->t, rows, L->norm, c->norm_eps);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->t.xn, d, L->in_proj, L->in_bias, m->zx, m->pin,
                                  err)))
      return rc;
    mbd_conv_rows conv = {.ctx = m->t.ctx, .states = states, .seg = seg, .nseg = nseg,
                          .channels = cd, .dc = c->d_conv, .w = L->conv_w, .b = L->conv_b,
                          .state_off = (size_t)l * (size_t)(c->d_conv - 1) * (size_t)cd,
                          .in = m->zx + di, .ld_in = m->pin, .out = m->xbc};
    mbd_conv_rows_run(&conv, rows);
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

/* ---- what every family has (kernels/model/family_ops.h) ---- */

MBD_CPU_FAMILY_API(mamba2, mbd_logits_sel)

/* ---- the family vtable (kernels/model/family.h) ---- */

MBD_CPU_FAMILY_LOAD(mamba2)
MBD_CPU_FAMILY_OPS(mamba2, fam_load);
