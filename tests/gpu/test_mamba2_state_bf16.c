/* The Mamba-2 family on the CUDA backend with a bf16 recurrent state (route
 * state=bf16, docs/route.md "Mamba-2 with a bf16 state"), through the backend
 * interface, with f32 and bf16 weights. The bit-exact properties run on
 * synthetic checkpoints written at setup (the fixtures' head shapes, one
 * with a d_state that no lane split divides, and the published models'
 * head_dim 64 / d_state 128), so they need no fixtures; the tolerance and
 * greedy checks read ../shared/fixtures/mamba2 (MBD_FIXTURES_DIR) and skip
 * without them. The route says state=bf16; prefill in
 * chunks of several lengths (non-multiples of the kernel's chunks included)
 * then decoding == decoding token by token (memcmp of logits and state
 * images), long prefills (many rows; several kernel chunks and time windows;
 * the published models' head shape on a synthetic checkpoint) == batched
 * decoding; a sequence alone == any slot of batched steps of
 * 2..256; run to run and backend to backend; the state image is f32 holding
 * bf16 values, and export -> import (another backend too) -> continue is
 * bit-exact, the device stash likewise and smaller than on the f32-state
 * route; logits within the stated bound of the float64 fixtures, greedy
 * tokens where the reference's margin exceeds twice that bound. The CPU
 * backend and Mamba-3 refuse the bf16 state (Mamba-1 keeps it too:
 * test_mamba1_state_bf16.c). Exits 77 without a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/route.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/model/mamba2.h"
#include "kernels/model/mamba3_synth.h"
#include "kernels/model/synth.h"
#include "support/backend_calls.h"
#include "support/gpu_util.h"

#include <unistd.h>

static const char *cases[] = {"tiny-d64-s16-c8", "small-d256-g2-s32-c16"};
#define NCASES 2

/* The bounds of docs/route.md ("Mamba-2 with a bf16 state"): the largest
 * absolute logit error against the float64 fixture, as a multiple of the
 * error of PyTorch's own bf16 run of it (weights, activations and state in
 * bf16). f32 weights with a bf16 state: a quarter of it (the CPU model
 * with the same roundings measured 0.05 and 0.11 of it); bf16 weights with
 * a bf16 state: twice it (the bf16 route's bound). */
#define BOUND_F32_WEIGHTS 0.25
#define BOUND_BF16_WEIGHTS 2.0

typedef struct fixture {
  char dir[1024];
  int64_t B, T, V, G;
  int64_t *ids;    /* [B*T] */
  int64_t *greedy; /* [B, T+G] */
  float *target;   /* [B,T,V] (per-group norm for n_groups > 1) */
  float *hf, *lbf16;
  float *glogits;  /* [B, G, V] */
  int n_groups1;   /* the greedy keys are a target (n_groups = 1) */
} fixture;

static void *copy_entry(const mbd_safetensors *st, const char *name) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  if (!e) return NULL;
  void *v = malloc(e->nbytes);
  memcpy(v, e->data, e->nbytes);
  return v;
}

static int load_fixture(const char *name, fixture *f) {
  memset(f, 0, sizeof *f);
  const char *root = getenv("MBD_FIXTURES_DIR");
  if (!root) return -1;
  snprintf(f->dir, sizeof f->dir, "%s/mamba2/%s", root, name);
  char p[1200];
  snprintf(p, sizeof p, "%s/expected.safetensors", f->dir);
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  if (mbd_safetensors_open(p, &st, &err)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(st, "logits");
  const mbd_st_entry *gl = mbd_safetensors_find(st, "greedy_logits");
  assert_non_null(ids);
  assert_non_null(lg);
  assert_non_null(gl);
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->V = lg->desc.shape[2];
  f->G = gl->desc.shape[1];
  f->ids = copy_entry(st, "input_ids");
  f->greedy = copy_entry(st, "greedy");
  f->hf = copy_entry(st, "logits");
  f->lbf16 = copy_entry(st, "logits_bf16");
  f->glogits = copy_entry(st, "greedy_logits");
  f->target = copy_entry(st, "logits_norm_per_group");
  f->n_groups1 = f->target == NULL;
  if (!f->target) f->target = copy_entry(st, "logits");
  mbd_safetensors_destroy(&st);
  return 0;
}

static void free_fixture(fixture *f) {
  free(f->ids);
  free(f->greedy);
  free(f->target);
  free(f->hf);
  free(f->lbf16);
  free(f->glogits);
}

/* Synthetic checkpoints, written once at setup: Mamba-2 shapes (heads x
 * head_dim, d_state, groups) 8 x 16 / 16 / 1 and 8 x 32 / 32 / 2 (the
 * fixtures'), 8 x 24 / 24 / 2 (no lane split divides 24: partial lanes, no
 * vector access), 4 x 64 / 128 / 1 (the published models'); then a Mamba-1
 * model (which loads on this route) and a Mamba-3 model (which refuses it). */
enum { NSYN = 4, SYN_M1 = NSYN, SYN_M3 = NSYN + 1, NDIRS = NSYN + 2 };
static char g_dirs[NDIRS][64];
static mbd_mamba2_config g_cfg[NSYN];

static void synth_cfg(int k, mbd_mamba2_config *c) {
  static const int dm[NSYN] = {64, 128, 96, 128}, P[NSYN] = {16, 32, 24, 64},
                   N[NSYN] = {16, 32, 24, 128}, G[NSYN] = {1, 2, 2, 1};
  mbd_mamba2_synth_custom(dm[k], 2, 512, c);
  c->head_dim = P[k];
  c->n_heads = c->d_inner / P[k];
  c->d_state = N[k];
  c->n_groups = G[k];
}

static int write_synth(void) {
  mbd_error err = {0};
  for (int k = 0; k < NDIRS; k++) {
    snprintf(g_dirs[k], sizeof g_dirs[k], "/tmp/mbd_m2bf16_XXXXXX");
    if (!mkdtemp(g_dirs[k])) return -1;
  }
  for (int k = 0; k < NSYN; k++) {
    synth_cfg(k, &g_cfg[k]);
    if (mbd_mamba2_synth_write(&g_cfg[k], MBD_DTYPE_F32, 100 + (uint64_t)k, g_dirs[k], &err))
      goto fail;
  }
  mbd_mamba_config c1;
  mbd_synth_custom(64, 2, 256, &c1);
  if (mbd_synth_write(&c1, MBD_DTYPE_F32, 5, g_dirs[SYN_M1], &err)) goto fail;
  mbd_mamba3_config c3;
  if (mbd_mamba3_synth_shape("custom", 64, 2, 256, &c3, &err) ||
      mbd_mamba3_synth_write(&c3, MBD_DTYPE_F32, 6, g_dirs[SYN_M3], &err))
    goto fail;
  return 0;
fail:
  fprintf(stderr, "synthetic checkpoints: %s\n", err.msg);
  return -1;
}

static void remove_synth(void) {
  for (int k = 0; k < NDIRS; k++) {
    if (!g_dirs[k][0]) continue;
    char p[160];
    snprintf(p, sizeof p, "%.63s/config.json", g_dirs[k]);
    unlink(p);
    snprintf(p, sizeof p, "%.63s/model.safetensors", g_dirs[k]);
    unlink(p);
    rmdir(g_dirs[k]);
  }
}

/* SSM entries of synthetic model k: n_layer x heads x head_dim x d_state. */
static int64_t ssm_floats_of(int k) {
  return (int64_t)g_cfg[k].n_layer * g_cfg[k].d_inner * g_cfg[k].d_state;
}

static mbd_backend *backend_state(mbd_dtype_policy policy, mbd_state_dtype sd) {
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = policy, .state = sd,
                        .threads = 2, .state_capacity = 300, .max_batch = 256};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  if (mbd_backend_new(MBD_BACKEND_CUDA, &o, &b, &err)) fail_msg("backend: %s", err.msg);
  return b;
}
static mbd_backend *backend(mbd_dtype_policy policy) {
  return backend_state(policy, MBD_STATE_BF16);
}

static double max_err(const float *a, const float *b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > e) e = d;
  }
  return e;
}

/* The image's SSM section (after its image header, the 16-byte family
 * sub-header and the f32 conv windows) holds bf16 values widened: the low
 * 16 bits of every f32 are zero, and some entry is not zero. */
static void check_bf16_image(const uint8_t *img, size_t n, int64_t ssm_floats) {
  assert_true(n >= (size_t)ssm_floats * 4);
  const uint8_t *ssm = img + n - (size_t)ssm_floats * 4;
  int nonzero = 0;
  for (int64_t i = 0; i < ssm_floats; i++) {
    uint32_t u;
    memcpy(&u, ssm + 4 * i, 4);
    if (u & 0xffffu) fail_msg("state image entry %lld is not a bf16 value (0x%08x)",
                              (long long)i, u);
    nonzero |= u != 0;
  }
  assert_true(nonzero);
}

static void test_route_says_bf16(void **state) {
  (void)state;
  mbd_backend *b = backend(MBD_POLICY_F32);
  mbd_route_identity r;
  b->ops->route(b, &r);
  assert_int_equal(r.state, MBD_STATE_BF16);
  char enc[1024];
  size_t len = 0;
  mbd_error err = {0};
  assert_int_equal(mbd_route_encode(&r, enc, sizeof enc, &len, &err), 0);
  assert_non_null(strstr(enc, "\nstate=bf16\n"));
  mbd_backend *f = backend_state(MBD_POLICY_F32, MBD_STATE_F32);
  mbd_route_identity rf;
  f->ops->route(f, &rf);
  assert_int_equal(rf.state, MBD_STATE_F32);
  char a[65], c[65];
  mbd_route_id_hex(&r, a);
  mbd_route_id_hex(&rf, c);
  assert_string_not_equal(a, c);
  mbd_backend_destroy(&b);
  mbd_backend_destroy(&f);
}

/* Prefill in chunks then decode == decode from the start (logits, state
 * images), forward == decode, run to run; f32 and bf16 weights. */
static void test_prefill_eq_decode(void **state) {
  (void)state;
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  for (int pi = 0; pi < 2; pi++) {
    mbd_backend *gb = backend(pols[pi]);
    for (int c = 0; c < NSYN; c++) {
      mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
      const int64_t B = 3, T = 37, V = gb->ops->model_vocab(gm);
      int64_t ids[3 * 37];
      for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 131 + 7 * c + 1) % V;
      size_t n = (size_t)(B * T * V);
      float *g = malloc(n * 4), *g2 = malloc(n * 4);
      mbd_error err = {0};
      assert_int_equal(gb->ops->forward(gb, gm, ids, B, T, false, g, &err), 0);
      assert_int_equal(gb->ops->forward(gb, gm, ids, B, T, false, g2, &err), 0);
      assert_memory_equal(g, g2, n * 4); /* run to run */
      float *gd = malloc((size_t)(T * V) * 4), *got = malloc((size_t)(T * V) * 4);
      uint8_t *gi = NULL;
      size_t gn = 0;
      bc_decode_all(gb, gm, ids, T, V, gd, &gi, &gn);
      assert_memory_equal(gd, g, (size_t)(T * V) * 4); /* decode == forward */
      check_bf16_image(gi, gn, ssm_floats_of(c));
      const int64_t chunks[] = {1, 2, 3, 4, 5, 7, 8, 13, 17, 33, 64};
      for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        for (int64_t pre = 1; pre <= T; pre += 6) {
          mbd_bstate *s = bc_new_state(gb, gm);
          for (int64_t t0 = 0; t0 < pre; t0 += chunks[k]) {
            int64_t len = pre - t0 < chunks[k] ? pre - t0 : chunks[k];
            assert_int_equal(
                gb->ops->prefill(gb, gm, s, ids + t0, len, false, got + t0 * V, &err), 0);
          }
          for (int64_t t = pre; t < T; t++)
            assert_int_equal(gb->ops->step(gb, gm, &s, ids + t, 1, got + t * V, &err), 0);
          if (memcmp(got, gd, (size_t)(T * V) * 4))
            fail_msg("model %d: prefill of %lld in chunks of %lld then decode != decode", c,
                     (long long)pre, (long long)chunks[k]);
          size_t sn = 0;
          uint8_t *si = bc_save(gb, s, &sn);
          assert_int_equal(sn, gn);
          assert_memory_equal(si, gi, gn);
          free(si);
          gb->ops->state_free(gb, s);
        }
      }
      print_message("%s weights, model %d (%d x %d, d_state %d, %d groups), state bf16: "
                    "prefill chunks == decode == forward\n",
                    mbd_dtype_policy_name(pols[pi]), c, g_cfg[c].n_heads, g_cfg[c].head_dim,
                    g_cfg[c].d_state, g_cfg[c].n_groups);
      free(got);
      free(gd);
      free(gi);
      free(g);
      free(g2);
      gb->ops->model_destroy(gb, gm);
    }
    mbd_backend_destroy(&gb);
  }
}

/* Long prefills through the kernel's other shapes: 24 sequences of 100
 * tokens in one launch (four rows per lane, several chunks) against batched
 * decoding, and one sequence of 2500 tokens (more than one model chunk and
 * dt window) in one call and in pieces of 777 against decoding. */
static void test_long_prefill(void **state) {
  (void)state;
  mbd_backend *gb = backend(MBD_POLICY_F32);
  mbd_bmodel *gm = bc_load(gb, g_dirs[1]);
  const int64_t V = gb->ops->model_vocab(gm);
  mbd_error err = {0};
  {
    enum { NS = 24, TL = 100 };
    int64_t *ids = malloc((size_t)NS * TL * 8);
    for (int64_t i = 0; i < NS * TL; i++) ids[i] = (i * 7919 + 13) % V;
    float *fw = malloc((size_t)NS * TL * V * 4), *row = malloc((size_t)NS * V * 4);
    assert_int_equal(gb->ops->forward(gb, gm, ids, NS, TL, false, fw, &err), 0);
    mbd_bstate *st[NS];
    for (int i = 0; i < NS; i++) st[i] = bc_new_state(gb, gm);
    int64_t tk[NS];
    for (int64_t t = 0; t < TL; t++) {
      for (int i = 0; i < NS; i++) tk[i] = ids[i * TL + t];
      assert_int_equal(gb->ops->step(gb, gm, st, tk, NS, row, &err), 0);
      for (int i = 0; i < NS; i++)
        if (memcmp(row + (size_t)i * V, fw + ((size_t)i * TL + t) * V, (size_t)V * 4))
          fail_msg("sequence %d step %lld: batched decode != forward of %d x %d", i,
                   (long long)t, NS, TL);
    }
    for (int i = 0; i < NS; i++) gb->ops->state_free(gb, st[i]);
    free(fw);
    free(row);
    free(ids);
  }
  {
    enum { TL = 2500, PIECE = 777 };
    int64_t *ids = malloc((size_t)TL * 8);
    for (int64_t i = 0; i < TL; i++) ids[i] = (i * 104729 + 3) % V;
    float *a = malloc((size_t)TL * V * 4), *b = malloc((size_t)TL * V * 4);
    uint8_t *ia = NULL;
    size_t na = 0;
    bc_decode_all(gb, gm, ids, TL, V, a, &ia, &na);
    mbd_bstate *s = bc_new_state(gb, gm);
    assert_int_equal(gb->ops->prefill(gb, gm, s, ids, TL, false, b, &err), 0);
    assert_memory_equal(a, b, (size_t)TL * V * 4);
    size_t nb = 0;
    uint8_t *ib = bc_save(gb, s, &nb);
    assert_memory_equal(ia, ib, na);
    free(ib);
    gb->ops->state_free(gb, s);
    s = bc_new_state(gb, gm);
    for (int64_t t0 = 0; t0 < TL; t0 += PIECE) {
      const int64_t len = TL - t0 < PIECE ? TL - t0 : PIECE;
      assert_int_equal(gb->ops->prefill(gb, gm, s, ids + t0, len, false, b + t0 * V, &err), 0);
    }
    assert_memory_equal(a, b, (size_t)TL * V * 4);
    ib = bc_save(gb, s, &nb);
    assert_memory_equal(ia, ib, na);
    free(ib);
    gb->ops->state_free(gb, s);
    free(ia);
    free(a);
    free(b);
  }
  print_message("long prefills == decoding (24 x 100 batched, 2500 alone and in pieces)\n");
  gb->ops->model_destroy(gb, gm);
  mbd_backend_destroy(&gb);
}

/* The published models' head shape (head_dim 64, d_state 128) on a small
 * synthetic checkpoint, where the kernel takes its other paths: 40
 * sequences of 64 tokens in one forward (four rows per lane in the 51-step
 * launch, one in the 13-step rest) == 40 batched decode steps at a time;
 * one sequence of 600 tokens prefilled == decoded (software-pipelined
 * prefill, eight lanes a row); the f32-state route's bits differ. */
static void test_real_head_shape(void **state) {
  (void)state;
  const char *dir = g_dirs[3];
  const mbd_mamba2_config cfg = g_cfg[3];
  assert_int_equal(cfg.head_dim, 64);
  assert_int_equal(cfg.d_state, 128);
  mbd_error err = {0};
  mbd_backend *gb = backend(MBD_POLICY_F32), *fb = backend_state(MBD_POLICY_F32, MBD_STATE_F32);
  mbd_bmodel *gm = bc_load(gb, dir), *fm = bc_load(fb, dir);
  const int64_t V = gb->ops->model_vocab(gm);
  {
    enum { NS = 40, TL = 64 };
    int64_t *ids = malloc((size_t)NS * TL * 8);
    for (int64_t i = 0; i < NS * TL; i++) ids[i] = (i * 7919 + 13) % V;
    float *fw = malloc((size_t)NS * TL * V * 4), *fw32 = malloc((size_t)NS * TL * V * 4);
    float *row = malloc((size_t)NS * V * 4);
    assert_int_equal(gb->ops->forward(gb, gm, ids, NS, TL, false, fw, &err), 0);
    assert_int_equal(fb->ops->forward(fb, fm, ids, NS, TL, false, fw32, &err), 0);
    assert_true(memcmp(fw, fw32, (size_t)NS * TL * V * 4) != 0); /* the state route matters */
    mbd_bstate *st[NS];
    for (int i = 0; i < NS; i++) st[i] = bc_new_state(gb, gm);
    int64_t tk[NS];
    for (int64_t t = 0; t < TL; t++) {
      for (int i = 0; i < NS; i++) tk[i] = ids[i * TL + t];
      assert_int_equal(gb->ops->step(gb, gm, st, tk, NS, row, &err), 0);
      for (int i = 0; i < NS; i++)
        if (memcmp(row + (size_t)i * V, fw + ((size_t)i * TL + t) * V, (size_t)V * 4))
          fail_msg("head_dim 64 d_state 128: sequence %d step %lld: batched decode != forward",
                   i, (long long)t);
    }
    for (int i = 0; i < NS; i++) gb->ops->state_free(gb, st[i]);
    free(fw);
    free(fw32);
    free(row);
    free(ids);
  }
  {
    enum { TL = 600 };
    int64_t *ids = malloc((size_t)TL * 8);
    for (int64_t i = 0; i < TL; i++) ids[i] = (i * 104729 + 3) % V;
    float *a = malloc((size_t)TL * V * 4), *b = malloc((size_t)TL * V * 4);
    uint8_t *ia = NULL;
    size_t na = 0;
    bc_decode_all(gb, gm, ids, TL, V, a, &ia, &na);
    check_bf16_image(ia, na, (int64_t)cfg.n_layer * cfg.d_inner * cfg.d_state);
    mbd_bstate *s = bc_new_state(gb, gm);
    assert_int_equal(gb->ops->prefill(gb, gm, s, ids, TL, false, b, &err), 0);
    assert_memory_equal(a, b, (size_t)TL * V * 4);
    size_t nb = 0;
    uint8_t *ib = bc_save(gb, s, &nb);
    assert_memory_equal(ia, ib, na);
    free(ib);
    gb->ops->state_free(gb, s);
    free(ia);
    free(a);
    free(b);
  }
  print_message("head_dim 64, d_state 128: 40 x 64 forward == batched decode, 600 prefill == "
                "decode\n");
  gb->ops->model_destroy(gb, gm);
  fb->ops->model_destroy(fb, fm);
  mbd_backend_destroy(&gb);
  mbd_backend_destroy(&fb);
}

/* Batched steps of n = 2..256 sequences: every slot equals its solo run. */
static void test_batch_invariance(void **state) {
  (void)state;
  mbd_backend *gb = backend(MBD_POLICY_F32);
  for (int c = 1; c < NSYN; c += 2) { /* 8 x 32 / 32 / 2 groups, and 4 x 64 / 128 */
  mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
  const int64_t V = gb->ops->model_vocab(gm);
  enum { NMAX = 256, STEPS = 6 };
  int64_t tok[NMAX][STEPS];
  for (int i = 0; i < NMAX; i++)
    for (int t = 0; t < STEPS; t++) tok[i][t] = (i * 131 + t * 17 + 5) % V;
  float *solo = malloc((size_t)NMAX * STEPS * V * 4);
  uint8_t *img = NULL;
  size_t in = 0;
  for (int i = 0; i < NMAX; i++) {
    bc_decode_all(gb, gm, tok[i], STEPS, V, solo + (size_t)i * STEPS * V, &img, &in);
    free(img);
  }
  const int sizes[] = {2, 3, 7, 16, 33, 64, 129, 256};
  float *rows = malloc((size_t)NMAX * V * 4);
  mbd_error err = {0};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int n = sizes[k];
    mbd_bstate *st[NMAX];
    int64_t tk[NMAX];
    for (int i = 0; i < n; i++) st[i] = bc_new_state(gb, gm);
    for (int t = 0; t < STEPS; t++) {
      for (int i = 0; i < n; i++) tk[i] = tok[(i * 7 + (int)k) % NMAX][t];
      assert_int_equal(gb->ops->step(gb, gm, st, tk, n, rows, &err), 0);
      for (int i = 0; i < n; i++)
        assert_memory_equal(rows + (size_t)i * V,
                            solo + ((size_t)((i * 7 + (int)k) % NMAX) * STEPS + t) * V,
                            (size_t)V * 4);
    }
    for (int i = 0; i < n; i++) gb->ops->state_free(gb, st[i]);
  }
  print_message("model %d, state bf16: batched steps 2..256 == solo\n", c);
  free(rows);
  free(solo);
  gb->ops->model_destroy(gb, gm);
  }
  mbd_backend_destroy(&gb);
}

/* Export after half the prompt, import into a fresh state (same backend and
 * a second one), continue: the bits of decoding from the start; the device
 * stash the same, and smaller than the f32-state route's. */
static void test_export_import(void **state) {
  (void)state;
  const char *dir = g_dirs[1];
  mbd_backend *gb = backend(MBD_POLICY_BF16), *gb2 = backend(MBD_POLICY_BF16);
  mbd_bmodel *gm = bc_load(gb, dir), *gm2 = bc_load(gb2, dir);
  const int64_t T = 37, V = gb->ops->model_vocab(gm), H = T / 2;
  int64_t ids[37];
  for (int64_t i = 0; i < T; i++) ids[i] = (i * 211 + 5) % V;
  mbd_error err = {0};
  float *ref = malloc((size_t)(T * V) * 4), *got = malloc((size_t)(T * V) * 4);
  uint8_t *ri = NULL;
  size_t rn = 0;
  bc_decode_all(gb, gm, ids, T, V, ref, &ri, &rn);
  mbd_bstate *s = bc_new_state(gb, gm);
  assert_int_equal(gb->ops->prefill(gb, gm, s, ids, H, false, got, &err), 0);
  size_t in = 0;
  uint8_t *img = bc_save(gb, s, &in);
  check_bf16_image(img, in, ssm_floats_of(1));
  mbd_backend *bs[2] = {gb, gb2};
  mbd_bmodel *ms[2] = {gm, gm2};
  for (int k = 0; k < 2; k++) {
    mbd_bstate *t = bc_new_state(bs[k], ms[k]);
    assert_int_equal(bs[k]->ops->state_load(t, img, in, &err), 0);
    size_t bn = 0;
    uint8_t *back = bc_save(bs[k], t, &bn);
    assert_memory_equal(back, img, in); /* import then export: the same image */
    free(back);
    assert_int_equal(bs[k]->ops->prefill(bs[k], ms[k], t, ids + H, T - H, false, got, &err), 0);
    assert_memory_equal(got, ref + H * V, (size_t)((T - H) * V) * 4);
    back = bc_save(bs[k], t, &bn);
    assert_memory_equal(back, ri, rn);
    free(back);
    bs[k]->ops->state_free(bs[k], t);
  }
  /* the device stash: save, export == state_save, load into another state, continue */
  if (gb->ops->stash_bytes) {
    mbd_backend *fb = backend_state(MBD_POLICY_BF16, MBD_STATE_F32);
    mbd_bmodel *fm = bc_load(fb, dir);
    const size_t sb = gb->ops->stash_bytes(gb, gm), fsb = fb->ops->stash_bytes(fb, fm);
    const size_t ssm = (size_t)ssm_floats_of(1);
    assert_int_equal(fsb - sb, ssm * 2); /* the SSM state at 2 bytes an entry, not 4 */
    fb->ops->model_destroy(fb, fm);
    mbd_backend_destroy(&fb);
    mbd_bstash *st = NULL;
    assert_int_equal(gb->ops->stash_new(gb, gm, &st, &err), 0);
    assert_int_equal(gb->ops->stash_save(gb, st, s, &err), 0);
    uint8_t *ex = malloc(in);
    assert_int_equal(gb->ops->stash_export(gb, st, ex, in, &err), 0);
    assert_memory_equal(ex, img, in);
    mbd_bstate *t = bc_new_state(gb, gm);
    assert_int_equal(gb->ops->stash_load(gb, t, st, &err), 0);
    assert_int_equal(gb->ops->prefill(gb, gm, t, ids + H, T - H, false, got, &err), 0);
    assert_memory_equal(got, ref + H * V, (size_t)((T - H) * V) * 4);
    gb->ops->state_free(gb, t);
    gb->ops->stash_free(gb, st);
    free(ex);
  }
  /* an image of the f32-state route imports (rounded) and runs */
  {
    mbd_backend *fb = backend_state(MBD_POLICY_BF16, MBD_STATE_F32);
    mbd_bmodel *fm = bc_load(fb, dir);
    mbd_bstate *fs = bc_new_state(fb, fm), *t = bc_new_state(gb, gm);
    assert_int_equal(fb->ops->prefill(fb, fm, fs, ids, H, true, got, &err), 0);
    size_t fn = 0;
    uint8_t *fi = bc_save(fb, fs, &fn);
    assert_int_equal(fn, in); /* the image is f32 on both routes */
    assert_int_equal(gb->ops->state_load(t, fi, fn, &err), 0);
    size_t bn = 0;
    uint8_t *back = bc_save(gb, t, &bn);
    check_bf16_image(back, bn, ssm_floats_of(1));
    free(back);
    free(fi);
    gb->ops->state_free(gb, t);
    fb->ops->state_free(fb, fs);
    fb->ops->model_destroy(fb, fm);
    mbd_backend_destroy(&fb);
  }
  print_message("state bf16: export -> import -> continue == decode; stash likewise\n");
  gb->ops->state_free(gb, s);
  free(img);
  free(ri);
  free(ref);
  free(got);
  gb->ops->model_destroy(gb, gm);
  gb2->ops->model_destroy(gb2, gm2);
  mbd_backend_destroy(&gb);
  mbd_backend_destroy(&gb2);
}

/* Logits against the float64 fixtures within the bound; greedy tokens of
 * the n_groups = 1 fixture by teacher forcing (the reference's tokens fed,
 * each step's logits within the bound of the reference's, the pick equal to
 * the reference's wherever its top-2 margin exceeds twice the bound). */
static void test_fixture_bound(void **state) {
  (void)state;
  int ran = 0;
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  const double factor[2] = {BOUND_F32_WEIGHTS, BOUND_BF16_WEIGHTS};
  for (int pi = 0; pi < 2; pi++) {
    mbd_backend *gb = backend(pols[pi]);
    for (int c = 0; c < NCASES; c++) {
      fixture f;
      if (load_fixture(cases[c], &f)) continue;
      ran++;
      mbd_bmodel *gm = bc_load(gb, f.dir);
      const int64_t B = f.B, T = f.T, V = f.V, G = f.G;
      size_t n = (size_t)(B * T * V);
      float *g = malloc(n * 4);
      mbd_error err = {0};
      assert_int_equal(gb->ops->forward(gb, gm, f.ids, B, T, false, g, &err), 0);
      const double theirs = max_err(f.lbf16, f.hf, n), bound = factor[pi] * theirs;
      const double ours = max_err(g, f.target, n);
      print_message("%s weights %s, state bf16: max abs err %.4g (bound %.4g = %.1f x PyTorch "
                    "bf16 %.4g)\n",
                    mbd_dtype_policy_name(pols[pi]), cases[c], ours, bound, factor[pi], theirs);
      if (ours > bound) fail_msg("%s: err %.4g > bound %.4g", cases[c], ours, bound);
      if (f.n_groups1) {
        float *l = malloc((size_t)V * 4);
        double ge = 0;
        int checked = 0;
        for (int64_t s = 0; s < B; s++) {
          const int64_t *gs = f.greedy + s * (T + G);
          mbd_bstate *st = bc_new_state(gb, gm);
          assert_int_equal(gb->ops->prefill(gb, gm, st, gs, T, true, l, &err), 0);
          for (int64_t i = 0; i < G; i++) {
            if (i) assert_int_equal(gb->ops->step(gb, gm, &st, gs + T - 1 + i, 1, l, &err), 0);
            const float *r = f.glogits + (s * G + i) * V;
            const double e = max_err(l, r, (size_t)V);
            if (e > ge) ge = e;
            int64_t am = 0, ar = 0;
            for (int64_t v = 1; v < V; v++) {
              if (l[v] > l[am]) am = v;
              if (r[v] > r[ar]) ar = v;
            }
            double second = -INFINITY;
            for (int64_t v = 0; v < V; v++)
              if (v != ar && r[v] > second) second = r[v];
            if (r[ar] - second > 2 * bound) {
              checked++;
              if (am != gs[T + i])
                fail_msg("%s sequence %lld greedy step %lld: picked %lld, reference %lld "
                         "(margin %.4g)", cases[c], (long long)s, (long long)i, (long long)am,
                         (long long)gs[T + i], r[ar] - second);
            }
          }
          gb->ops->state_free(gb, st);
        }
        print_message("   greedy: max abs err %.4g over %lld steps, %d picks checked\n", ge,
                      (long long)(B * G), checked);
        if (ge > bound) fail_msg("%s greedy logits err %.4g > bound %.4g", cases[c], ge, bound);
        free(l);
      }
      free(g);
      gb->ops->model_destroy(gb, gm);
      free_fixture(&f);
    }
    mbd_backend_destroy(&gb);
  }
  if (!ran) skip();
}

/* The CPU backend and Mamba-3 refuse a bf16 state, saying where it runs;
 * Mamba-1 loads. */
static void test_refusals(void **state) {
  (void)state;
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = MBD_POLICY_F32,
                        .state = MBD_STATE_BF16, .threads = 1, .state_capacity = 4,
                        .max_batch = 4};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_backend_new(MBD_BACKEND_CPU, &o, &b, &err), MBD_E_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "Mamba-1 and Mamba-2 on CUDA only"));
  mbd_backend *gb = backend(MBD_POLICY_F32);
  mbd_bmodel *m = NULL;
  memset(&err, 0, sizeof err);
  assert_int_not_equal(gb->ops->model_load(gb, g_dirs[SYN_M3], &m, &err), 0);
  if (!strstr(err.msg, "Mamba-1 and Mamba-2 on CUDA only")) fail_msg("mamba3: '%s'", err.msg);
  m = bc_load(gb, g_dirs[SYN_M1]);
  gb->ops->model_destroy(gb, m);
  mbd_backend_destroy(&gb);
}

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  return write_synth();
}

static int teardown(void **state) {
  (void)state;
  remove_synth();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_route_says_bf16),   cmocka_unit_test(test_prefill_eq_decode),
      cmocka_unit_test(test_long_prefill),      cmocka_unit_test(test_real_head_shape),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_export_import),     cmocka_unit_test(test_fixture_bound),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
