/* Mamba-3 SISO model on the CPU backend (see mamba3.h).
 *
 * A call's tokens are flattened into rows, sequence-major, and processed in
 * chunks of at most max_rows rows (a time window of every sequence), as the
 * Mamba-1 model does. Row-wise work (norms, projections via the
 * batch-invariant GEMM, mbd_cpu_m3_preprocess) depends only on the row; the
 * recurrence walks each sequence's rows in time order with
 * mbd_cpu_m3_head_step, one task per (sequence, head). So neither the batch,
 * the slot, the chunking nor prefill-vs-step can change a sequence's bits. */
#include "kernels/model/mamba3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ctx.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mamba3_ops.h"
#include "kernels/cpu/mamba_ops.h"
#include "kernels/model/family_ops.h"
#include "kernels/model/seq_state.h"
#include "kernels/model/trunk.h"
#include "kernels/model/weights.h"
#include "kernels/portable_math.h"

#define DEFAULT_MAX_ROWS 256

/* ---- model ---- */

typedef struct layer_w {
  float *norm;            /* [d] */
  mbd_cpu_wpack *in_proj; /* [d_in_proj, d] */
  float *dt_bias;         /* [heads] */
  float *b_bias, *c_bias; /* [heads][d_state] */
  float *b_norm, *c_norm; /* [d_state] */
  float *D;               /* [heads] */
  float *onorm;           /* [d_inner] (outproj_norm) or NULL */
  mbd_cpu_wpack *out_proj;/* [d, d_inner] */
} layer_w;

struct mbd_mamba3_model {
  mbd_mamba3_config cfg;
  mbd_m3_dims dims;
  mbd_trunk t;            /* embedding [Vp, d], layers, head, final norm, rows, states */
  layer_w *layers;        /* [n_layer], t's */
  float *proj, *y;        /* workspace rows (t's): [rows, d_in_proj], [rows, d_inner] */
  float *scratch;         /* [threads][2 d_state] (t's) */
};

/* A state (kernels/model/seq_state.h) is the image payload: f32
 * angle[L][H][S], ssm[L][H][P][N], k[L][H][N], v[L][H][P]. Floats per layer
 * of each part, and where a layer's part lies in the state's buffer: */
static size_t n_ang(const mbd_mamba3_config *c) { return (size_t)c->heads * (size_t)c->angles; }
static size_t n_ssm(const mbd_mamba3_config *c) {
  return (size_t)c->heads * (size_t)c->headdim * (size_t)c->d_state;
}
static size_t n_k(const mbd_mamba3_config *c) { return (size_t)c->heads * (size_t)c->d_state; }
static size_t n_v(const mbd_mamba3_config *c) { return (size_t)c->heads * (size_t)c->headdim; }
static size_t layers_of(const mbd_mamba3_config *c) { return (size_t)c->n_layer; }
static float *part_ang(const mbd_mamba3_config *c, float *buf, int l) {
  return buf + (size_t)l * n_ang(c);
}
static float *part_ssm(const mbd_mamba3_config *c, float *buf, int l) {
  return buf + layers_of(c) * n_ang(c) + (size_t)l * n_ssm(c);
}
static float *part_k(const mbd_mamba3_config *c, float *buf, int l) {
  return buf + layers_of(c) * (n_ang(c) + n_ssm(c)) + (size_t)l * n_k(c);
}
static float *part_v(const mbd_mamba3_config *c, float *buf, int l) {
  return buf + layers_of(c) * (n_ang(c) + n_ssm(c) + n_k(c)) + (size_t)l * n_v(c);
}

void mbd_mamba3_options_default(mbd_mamba3_options *o) {
  memset(o, 0, sizeof(*o));
  o->dtype = MBD_DTYPE_F32;
  o->isa = MBD_CPU_ISA_AUTO;
  o->max_rows = DEFAULT_MAX_ROWS;
}

/* ---- loading (through the trunk, kernels/model/trunk.h) ---- */

/* The checkpoint tensors of a layer, "backbone.layers.<i>." + suffix; the
 * biases and D stay f32, as upstream keeps them. */
static size_t layer_tensors(const mbd_mamba3_config *c, mbd_weight_spec *w) {
  size_t n = 0;
  w[n++] = MBD_WEIGHT_VEC(layer_w, norm, "norm.weight", c->d_model);
  w[n++] = MBD_WEIGHT_MAT(layer_w, in_proj, "mixer.in_proj.weight", c->d_in_proj, c->d_model);
  w[n++] = MBD_WEIGHT_VEC_F32(layer_w, dt_bias, "mixer.dt_bias", c->heads);
  w[n++] = MBD_WEIGHT_VEC_F32(layer_w, b_bias, "mixer.B_bias", c->heads, 1, c->d_state);
  w[n++] = MBD_WEIGHT_VEC_F32(layer_w, c_bias, "mixer.C_bias", c->heads, 1, c->d_state);
  w[n++] = MBD_WEIGHT_VEC(layer_w, b_norm, "mixer.B_norm.weight", c->d_state);
  w[n++] = MBD_WEIGHT_VEC(layer_w, c_norm, "mixer.C_norm.weight", c->d_state);
  w[n++] = MBD_WEIGHT_VEC_F32(layer_w, D, "mixer.D", c->heads);
  if (c->outproj_norm) w[n++] = MBD_WEIGHT_VEC(layer_w, onorm, "mixer.norm.weight", c->d_inner);
  w[n++] = MBD_WEIGHT_MAT(layer_w, out_proj, "mixer.out_proj.weight", c->d_model, c->d_inner);
  return n;
}

static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err);

int mbd_mamba3_load(const char *dir, const mbd_mamba3_options *opts, mbd_mamba3_model **out,
                    mbd_error *err) {
  *out = NULL;
  mbd_mamba3_options def;
  if (!opts) {
    mbd_mamba3_options_default(&def);
    opts = &def;
  }
  mbd_mamba3_model *m = calloc(1, sizeof(*m));
  if (!m) return mbd_error_set(err, MBD_E_NOMEM, "model: out of memory");
  int rc = mbd_mamba3_config_load(dir, &m->cfg, err);
  if (rc) goto fail;
  const mbd_mamba3_config *c = &m->cfg;
  m->dims = (mbd_m3_dims){.d_inner = c->d_inner, .heads = c->heads, .headdim = c->headdim,
                          .d_state = c->d_state, .ngroups = c->ngroups, .angles = c->angles,
                          .a_floor = c->a_floor, .eps = c->eps};
  float **bufs[] = {&m->proj, &m->y};
  size_t widths[] = {(size_t)c->d_in_proj, (size_t)c->d_inner};
  int64_t ks[] = {c->d_model, c->d_inner};
  mbd_weight_spec w[MBD_TRUNK_MAX_LAYER_TENSORS];
  mbd_trunk_spec sp = {
      .dtype = opts->dtype, .threads = opts->threads, .isa = opts->isa,
      .max_rows = opts->max_rows, .progress = opts->progress, .d = c->d_model,
      .embed = "backbone.embedding.weight", .V = c->vocab_padded, .tied = c->tie_embeddings,
      .n_layer = c->n_layer, .layer_size = sizeof(layer_w), .layer = w,
      .nlayer = layer_tensors(c, w), .bufs = bufs, .widths = widths, .nbufs = 2, .ks = ks,
      .nks = 2,
      .state = {.shape = mbd_mamba3_state_shape(c),
                .floats = layers_of(c) * (n_ang(c) + n_ssm(c) + n_k(c) + n_v(c))},
      .model = m, .forward = forward_rows};
  if ((rc = mbd_trunk_load(&m->t, dir, &sp, err))) goto fail;
  m->layers = m->t.layers;
  size_t scratch = (size_t)mbd_cpu_ctx_threads(m->t.ctx) * 2 * (size_t)c->d_state;
  if ((rc = mbd_trunk_alloc_floats(&m->t, scratch, &m->scratch, err))) goto fail;
  *out = m;
  return MBD_OK;
fail:
  mbd_mamba3_destroy(&m);
  return mbd_error_prefix(err, "mamba3 %s", dir);
}

const mbd_mamba3_config *mbd_mamba3_model_config(const mbd_mamba3_model *m) { return &m->cfg; }

mbd_state_shape mbd_mamba3_state_shape(const mbd_mamba3_config *c) {
  return (mbd_state_shape){MBD_STATE_FAMILY_MAMBA3, (uint32_t)c->n_layer, (uint32_t)c->d_inner,
                           (uint32_t)c->heads /* as d_conv */, (uint32_t)c->d_state};
}

/* ---- forward ---- */

typedef struct chunk {
  mbd_mamba3_model *m;
  mbd_seq_state *const *states;
  const int64_t *seg; /* nseg x {seq, row0, nrows, t0} */
  int layer;
} chunk;

static void pre_task(void *arg, int64_t r, int thread) {
  (void)thread;
  const chunk *ch = arg;
  mbd_mamba3_model *m = ch->m;
  const layer_w *L = &m->layers[ch->layer];
  mbd_cpu_m3_preprocess(&m->dims, L->dt_bias, L->b_norm, L->c_norm,
                        m->proj + r * m->cfg.d_in_proj);
}

static void head_task(void *arg, int64_t task, int thread) {
  const chunk *ch = arg;
  mbd_mamba3_model *m = ch->m;
  const mbd_mamba3_config *c = &m->cfg;
  const layer_w *L = &m->layers[ch->layer];
  const int H = c->heads, P = c->headdim, N = c->d_state, S = c->angles;
  const int64_t *sg = ch->seg + 4 * (task / H);
  const int h = (int)(task % H);
  float *buf = ch->states[sg[0]]->buf;
  float *ang = part_ang(c, buf, ch->layer) + (size_t)h * (size_t)S;
  float *ssm = part_ssm(c, buf, ch->layer) + (size_t)h * (size_t)P * (size_t)N;
  float *kst = part_k(c, buf, ch->layer) + (size_t)h * (size_t)N;
  float *vst = part_v(c, buf, ch->layer) + (size_t)h * (size_t)P;
  float *scratch = m->scratch + (size_t)thread * 2 * (size_t)N;
  for (int64_t r = sg[1]; r < sg[1] + sg[2]; r++) {
    float *y = m->y + r * c->d_inner + (int64_t)h * P;
    mbd_cpu_m3_head_step(&m->dims, h, m->proj + r * c->d_in_proj, L->b_bias + (size_t)h * N,
                         L->c_bias + (size_t)h * N, L->D[h], !c->outproj_norm, ang, ssm, kst, vst,
                         y, scratch);
    if (c->outproj_norm) { /* norm before gate, per head: rmsnorm(y) w silu(z) */
      const float *z = m->proj + r * c->d_in_proj + (int64_t)h * P;
      mbd_cpu_rmsnorm(y, L->onorm + (size_t)h * P, P, c->eps, y);
      for (int p = 0; p < P; p++) y[p] = y[p] * mbd_pm_silu(z[p]);
    }
  }
}

/* Runs all layers over the chunk's rows; leaves final-normed rows in m->t.xn. */
static int forward_rows(void *model, void *const *st, const int64_t *seg, int64_t nseg,
                        int64_t rows, mbd_error *err) {
  mbd_mamba3_model *m = model;
  mbd_seq_state *const *states = (mbd_seq_state *const *)st;
  const mbd_mamba3_config *c = &m->cfg;
  int64_t d = c->d_model, di = c->d_inner, np = c->d_in_proj;
  chunk ch = {.m = m, .states = states, .seg = seg};
  int rc;
  for (int l = 0; l < c->n_layer; l++) {
    const layer_w *L = &m->layers[l];
    ch.layer = l;
    mbd_trunk_norm(&m->t, rows, L->norm, c->eps);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->t.xn, d, L->in_proj, NULL, m->proj, np, err)))
      return rc;
    mbd_cpu_ctx_run_sized(m->t.ctx, pre_task, &ch, rows, rows * (np - 2 * di) * 16);
    mbd_cpu_ctx_run_sized(m->t.ctx, head_task, &ch, nseg * c->heads,
                          rows * di * c->d_state * 6);
    if ((rc = mbd_cpu_gemm_packed(m->t.ctx, rows, m->y, di, L->out_proj, NULL, m->t.out, d, err)))
      return rc;
    mbd_trunk_add_out(&m->t, rows);
  }
  mbd_trunk_norm(&m->t, rows, m->t.norm_f, c->eps);
  return MBD_OK;
}

/* ---- what every family has (kernels/model/family_ops.h) ---- */

MBD_CPU_FAMILY_API(mamba3, mbd_logits_sel)

/* ---- the family vtable (kernels/model/family.h) ---- */

MBD_CPU_FAMILY_LOAD(mamba3)
MBD_CPU_FAMILY_OPS(mamba3, fam_load);
