/* The Mamba-1 family on the CUDA backend with a bf16 recurrent state (route
 * state=bf16, docs/route.md "Mamba-1 with a bf16 state"), through the
 * backend interface, with f32 and bf16 weights. The bit-exact properties
 * run on synthetic checkpoints written at setup (d_state 16 with the prefill
 * kernel's dt rank, d_state 8 with a dt rank it does not take and a d_inner
 * that is no multiple of the decode kernel's channel block, d_state 4 whose
 * bf16 state rows are 8 bytes, d_state 32), so they need no fixtures; the
 * tolerance and greedy checks read ../shared/fixtures/mamba1
 * (MBD_FIXTURES_DIR) and skip without them. The route says state=bf16;
 * prefill in chunks of several lengths (non-multiples of the kernels' chunks
 * included) then decoding == decoding token by token (memcmp of logits and
 * state images); long prefills (several model chunks, many sequences) ==
 * decoding; a sequence alone == any slot of batched steps of 2..256; run to
 * run and backend to backend; the state image is f32 holding bf16 values, and
 * export -> import (another backend too) -> continue is bit-exact, the device
 * stash likewise and smaller than on the f32-state route; small batches never
 * take the persistent decode; the f32-state route still gives the CPU
 * backend's bits on f32 weights; logits within the stated bound of the
 * float64 fixtures, greedy tokens wherever the margin exceeds twice that
 * bound. The CPU backend and Mamba-3 refuse the bf16 state. Exits 77 without
 * a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "common/half.h"
#include "common/route.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/mamba1_gpu.h"
#include "kernels/cuda/mamba_ops.h"
#include "kernels/model/mamba3_synth.h"
#include "kernels/portable_math.h"
#include "kernels/model/synth.h"
#include "support/backend_calls.h"
#include "support/gpu_util.h"

#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off") /* the host reference's roundings as written */
#endif

static const char *cases[] = {"tiny-d64", "small-d256"};
#define NCASES 2

/* The bounds of docs/route.md ("Mamba-1 with a bf16 state"): the largest
 * absolute logit error against the float64 fixture, as a multiple of
 * the error of PyTorch's own bf16 run of it (weights and activations in
 * bf16). f32 weights with a bf16 state: a quarter of it; bf16 weights with a
 * bf16 state: twice it (the bf16 route's bound). */
#define BOUND_F32_WEIGHTS 0.25
#define BOUND_BF16_WEIGHTS 2.0

typedef struct fixture {
  char dir[1024];
  int64_t B, T, V, G;
  int64_t *ids;    /* [B*T] */
  int64_t *greedy; /* [B, T+G] */
  float *hf, *lbf16; /* [B,T,V] */
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
  snprintf(f->dir, sizeof f->dir, "%s/mamba1/%s", root, name);
  char p[1200];
  snprintf(p, sizeof p, "%s/expected.safetensors", f->dir);
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  if (mbd_safetensors_open(p, &st, &err)) return -1;
  const mbd_st_entry *ids = mbd_safetensors_find(st, "input_ids");
  const mbd_st_entry *lg = mbd_safetensors_find(st, "logits");
  const mbd_st_entry *gr = mbd_safetensors_find(st, "greedy");
  assert_non_null(ids);
  assert_non_null(lg);
  assert_non_null(gr);
  f->B = ids->desc.shape[0];
  f->T = ids->desc.shape[1];
  f->V = lg->desc.shape[2];
  f->G = gr->desc.shape[1] - f->T;
  f->ids = copy_entry(st, "input_ids");
  f->greedy = copy_entry(st, "greedy");
  f->hf = copy_entry(st, "logits");
  f->lbf16 = copy_entry(st, "logits_bf16");
  assert_non_null(f->lbf16);
  mbd_safetensors_destroy(&st);
  return 0;
}

static void free_fixture(fixture *f) {
  free(f->ids);
  free(f->greedy);
  free(f->hf);
  free(f->lbf16);
}

/* Synthetic checkpoints, written once at setup: Mamba-1 shapes (d_model,
 * d_state, dt_rank) 64 / 16 / 4 (the published models' d_state; the prefill
 * kernel), 96 / 8 / 6 (a dt rank the prefill kernel does not take: the
 * chunked k_scan; d_inner 192, a partial channel block), 64 / 4 / 4 (bf16
 * rows of 8 bytes), 128 / 32 / 8; 1024 / 16 / 64 (SYN_WIDE: d_inner 2048,
 * wide enough that batches of 64 and more take the decode kernel's
 * streaming ranges); then a Mamba-3 model for the refusal. */
enum { NSYN = 4, SYN_WIDE = NSYN, SYN_M3 = NSYN + 1, NDIRS = NSYN + 2 };
static char g_dirs[NDIRS][64];
static mbd_mamba_config g_cfg[NSYN + 1];

static void synth_cfg(int k, mbd_mamba_config *c) {
  static const int dm[NSYN + 1] = {64, 96, 64, 128, 1024}, N[NSYN + 1] = {16, 8, 4, 32, 16},
                   R[NSYN + 1] = {4, 6, 4, 8, 64};
  mbd_synth_custom(dm[k], 2, 256, c);
  c->d_state = N[k];
  c->dt_rank = R[k];
}

static int write_synth(void) {
  mbd_error err = {0};
  for (int k = 0; k < NDIRS; k++) {
    snprintf(g_dirs[k], sizeof g_dirs[k], "/tmp/mbd_m1bf16_XXXXXX");
    if (!mkdtemp(g_dirs[k])) return -1;
  }
  for (int k = 0; k <= SYN_WIDE; k++) {
    synth_cfg(k, &g_cfg[k]);
    if (mbd_synth_write(&g_cfg[k], MBD_DTYPE_F32, 200 + (uint64_t)k, g_dirs[k], &err)) goto fail;
  }
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

/* SSM entries of synthetic model k: n_layer x d_inner x d_state. */
static int64_t ssm_floats_of(int k) {
  return (int64_t)g_cfg[k].n_layer * g_cfg[k].d_inner * g_cfg[k].d_state;
}

static mbd_backend *backend_kind(mbd_backend_kind kind, mbd_dtype_policy policy,
                                 mbd_state_dtype sd) {
  mbd_backend_opts o = {.mode = MBD_GEMM_DETERMINISTIC, .policy = policy, .state = sd,
                        .threads = 2, .state_capacity = 300, .max_batch = 256};
  mbd_backend *b = NULL;
  mbd_error err = {0};
  if (mbd_backend_new(kind, &o, &b, &err)) fail_msg("backend: %s", err.msg);
  return b;
}
static mbd_backend *backend_state(mbd_dtype_policy policy, mbd_state_dtype sd) {
  return backend_kind(MBD_BACKEND_CUDA, policy, sd);
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

/* The image's SSM section (the last ssm_floats f32 of the image, after its
 * header and the f32 conv windows) holds bf16 values widened: the low 16 bits
 * of every f32 are zero, and some entry is not zero. */
static void check_bf16_image(const uint8_t *img, size_t n, int64_t ssm_floats) {
  assert_true(n >= (size_t)ssm_floats * 4);
  const uint8_t *ssm = img + n - (size_t)ssm_floats * 4;
  int nonzero = 0;
  for (int64_t i = 0; i < ssm_floats; i++) {
    uint32_t u;
    memcpy(&u, ssm + 4 * i, 4);
    if (u & 0xffffu)
      fail_msg("state image entry %lld is not a bf16 value (0x%08x)", (long long)i, u);
    nonzero |= u != 0;
  }
  assert_true(nonzero);
}

/* ---- the op: mbd_mops_scan_bf16state against a host reference ---- */

static uint64_t g_rs = 12345;
static float urand(float lo, float hi) {
  g_rs = g_rs * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)((g_rs >> 40) & 0xffffff) / 16777216.0f;
}
static float bf16_rn(float v) { return mbd_bf16_to_f32(mbd_f32_to_bf16(v)); }
static float round_act(mbd_dtype act, float v) { return act == MBD_DTYPE_BF16 ? bf16_rn(v) : v; }

/* One scan launch of nseq sequences of T steps over d_inner di, d_state N,
 * dt rank R, activations act (f32 or bf16), the state in bf16 in slots
 * nseq - 1 - s of a state of nseq + 1 slots: y and the state against the
 * host's f32 arithmetic in the f32 route's order (mbd_cpu_scan_step's) with
 * each updated entry rounded to bf16 and the rounded value carried on, by
 * memcmp. pick: NULL, or "MBD_SCAN_PREFILL=old|v0" / "MBD_SCAN_STEP=old", set
 * for the launch (the kernel it names instead of the default). */
static void scan_case(int N, int R, int di, int T, int nseq, mbd_dtype act, const char *pick) {
  const int64_t nd = R + 2 * N, M = (int64_t)nseq * T, ldxz = 2 * di + 3, zoff = di;
  const int64_t sstride = (int64_t)di * N + 8, nslot = nseq + 1;
  const size_t es = act == MBD_DTYPE_BF16 ? 2 : 4;
  float *A = malloc((size_t)di * N * 4), *D = malloc((size_t)di * 4);
  float *xc = malloc((size_t)M * di * 4), *dbl = malloc((size_t)M * nd * 4);
  float *xz = malloc((size_t)M * ldxz * 4), *w = malloc((size_t)di * R * 4);
  float *b = malloc((size_t)di * 4), *h = malloc((size_t)nslot * sstride * 4);
  uint16_t *h16 = malloc((size_t)nslot * sstride * 2), *g16 = malloc((size_t)nslot * sstride * 2);
  void *wa = malloc((size_t)di * R * es), *ba = malloc((size_t)di * es);
  void *ry = malloc((size_t)M * di * es), *gy = malloc((size_t)M * di * es);
  int32_t *slots = malloc((size_t)nseq * 4);
  for (int64_t i = 0; i < (int64_t)di * N; i++) A[i] = -mbd_pm_expf(urand(0.0f, 2.0f));
  for (int64_t i = 0; i < di; i++) D[i] = urand(-1.0f, 1.0f);
  for (int64_t i = 0; i < M * di; i++) xc[i] = urand(-2.0f, 2.0f);
  for (int64_t i = 0; i < M * nd; i++) dbl[i] = urand(-1.0f, 1.0f);
  for (int64_t i = 0; i < M * ldxz; i++) xz[i] = urand(-4.0f, 4.0f);
  for (int64_t i = 0; i < (int64_t)di * R; i++) w[i] = round_act(act, urand(-1.0f, 1.0f));
  for (int64_t i = 0; i < di; i++) b[i] = round_act(act, urand(-3.0f, 0.0f));
  for (int64_t i = 0; i < nslot * sstride; i++) {
    h16[i] = mbd_f32_to_bf16(urand(-1.0f, 1.0f));
    h[i] = mbd_bf16_to_f32(h16[i]);
  }
  for (int64_t i = 0; i < (int64_t)di * R; i++) {
    if (act == MBD_DTYPE_BF16)
      ((uint16_t *)wa)[i] = mbd_f32_to_bf16(w[i]);
    else
      ((float *)wa)[i] = w[i];
  }
  for (int64_t i = 0; i < di; i++) {
    if (act == MBD_DTYPE_BF16)
      ((uint16_t *)ba)[i] = mbd_f32_to_bf16(b[i]);
    else
      ((float *)ba)[i] = b[i];
  }
  for (int s = 0; s < nseq; s++) slots[s] = nseq - 1 - s;
  /* the device's copies (the bf16 state as stored) */
  void *d[9] = {NULL};
  const void *hs[9] = {A, D, xc, dbl, xz, wa, ba, h16, slots};
  const size_t nb[9] = {(size_t)di * N * 4, (size_t)di * 4, (size_t)M * di * 4,
                        (size_t)M * nd * 4, (size_t)M * ldxz * 4, (size_t)di * R * es,
                        (size_t)di * es, (size_t)nslot * sstride * 2, (size_t)nseq * 4};
  for (int i = 0; i < 9; i++) {
    assert_int_equal(cudaMalloc(&d[i], nb[i]), cudaSuccess);
    assert_int_equal(cudaMemcpy(d[i], hs[i], nb[i], cudaMemcpyHostToDevice), cudaSuccess);
  }
  void *dy = NULL;
  assert_int_equal(cudaMalloc(&dy, (size_t)M * di * es), cudaSuccess);
  cudaStream_t st;
  assert_int_equal(cudaStreamCreate(&st), cudaSuccess);
  mbd_error err = {0};
  char var[32] = "";
  if (pick) {
    const char *eq = strchr(pick, '=');
    assert_non_null(eq);
    snprintf(var, sizeof var, "%.*s", (int)(eq - pick), pick);
    setenv(var, eq + 1, 1);
  }
  int rc = mbd_mops_scan_bf16state(st, nseq, T, di, N, R, d[2], d[3], act, d[5], d[6], d[0],
                                   d[1], d[4], ldxz, zoff, d[7], sstride, d[8], NULL, act, dy,
                                   &err);
  if (pick) unsetenv(var);
  if (rc) fail_msg("scan: %s", err.msg);
  assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
  assert_int_equal(cudaMemcpy(gy, dy, (size_t)M * di * es, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(cudaMemcpy(g16, d[7], nb[7], cudaMemcpyDeviceToHost), cudaSuccess);
  /* the reference */
  for (int s = 0; s < nseq; s++)
    for (int t = 0; t < T; t++) {
      const int64_t r = (int64_t)s * T + t;
      const float *row = dbl + r * nd, *B = row + R, *C = row + R + N;
      for (int ch = 0; ch < di; ch++) {
        float v = 0.0f;
        for (int k = 0; k < R; k++) v = fmaf(round_act(act, row[k]), w[ch * R + k], v);
        const float dt = mbd_pm_softplus(v + b[ch]), x = xc[r * di + ch];
        float *hc = h + (int64_t)slots[s] * sstride + (int64_t)ch * N;
        float y = 0.0f;
        for (int n = 0; n < N; n++) {
          const float dA = mbd_pm_expf(dt * A[ch * N + n]);
          hc[n] = bf16_rn(fmaf(dA, hc[n], (dt * B[n]) * x));
          y = fmaf(hc[n], C[n], y);
        }
        y = fmaf(D[ch], x, y);
        const float out = y * mbd_pm_silu(xz[r * ldxz + zoff + ch]);
        if (act == MBD_DTYPE_BF16)
          ((uint16_t *)ry)[r * di + ch] = mbd_f32_to_bf16(out);
        else
          ((float *)ry)[r * di + ch] = out;
      }
    }
  for (int64_t i = 0; i < nslot * sstride; i++) h16[i] = mbd_f32_to_bf16(h[i]);
  /* slots' padding entries are never touched: compare rows only */
  for (int64_t sl = 0; sl < nslot; sl++)
    if (memcmp(g16 + sl * sstride, h16 + sl * sstride, (size_t)di * N * 2))
      fail_msg("scan N=%d R=%d di=%d T=%d nseq=%d %s %s: slot %lld's state differs", N, R, di,
               T, nseq, mbd_dtype_name(act), pick ? pick : "", (long long)sl);
  if (memcmp(gy, ry, (size_t)M * di * es))
    fail_msg("scan N=%d R=%d di=%d T=%d nseq=%d %s %s: y differs", N, R, di, T, nseq,
             mbd_dtype_name(act), pick ? pick : "");
  for (int i = 0; i < 9; i++) cudaFree(d[i]);
  cudaFree(dy);
  cudaStreamDestroy(st);
  free(A), free(D), free(xc), free(dbl), free(xz), free(w), free(b), free(h), free(h16);
  free(g16), free(wa), free(ba), free(ry), free(gy), free(slots);
}

/* The decode step (one sequence a block; 500..2000 sequences: streaming
 * ranges of 4 and 8 a block, also with MBD_SCAN_STEP=old, the previous
 * form at d_state 16 and bf16), the prefill kernel (d_state 8 / 16,
 * dt rank 4; also with MBD_SCAN_PREFILL=v0, its previous form) and the
 * chunked k_scan (the other shapes, and MBD_SCAN_PREFILL=old), over d_state 4..32, a
 * d_inner that fills no channel block, f32 and bf16. */
static void test_scan_op(void **state) {
  (void)state;
  const int Ns[] = {4, 8, 16, 32}, Rs[] = {4, 5};
  const mbd_dtype acts[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16};
  for (int ni = 0; ni < 4; ni++)
    for (int ri = 0; ri < 2; ri++)
      for (int a = 0; a < 2; a++) {
        scan_case(Ns[ni], Rs[ri], 200, 1, 3, acts[a], NULL);
        scan_case(Ns[ni], Rs[ri], 200, 37, 3, acts[a], NULL);
        scan_case(Ns[ni], Rs[ri], 200, 37, 2, acts[a], "MBD_SCAN_PREFILL=old");
        scan_case(Ns[ni], Rs[ri], 200, 37, 2, acts[a], "MBD_SCAN_PREFILL=v0");
      }
  for (int ni = 0; ni < 4; ni++) {
    scan_case(Ns[ni], 4, 200, 1, 600, MBD_DTYPE_BF16, NULL);
    scan_case(Ns[ni], 5, 200, 1, 1100, MBD_DTYPE_F32, NULL);
  }
  const int nseqs[] = {500, 600, 777, 1100, 2000};
  for (int k = 0; k < 5; k++)
    for (int a = 0; a < 2; a++)
      for (int ri = 0; ri < 2; ri++) {
        scan_case(16, 4 * ri + 4 + a, 200 + 37 * k, 1, nseqs[k], acts[a], NULL);
        scan_case(16, 4 * ri + 4 + a, 200 + 37 * k, 1, nseqs[k], acts[a],
                  "MBD_SCAN_STEP=old");
      }
  for (int k = 0; k < 2; k++) { /* 16-byte weight pieces */
    const char *pick = k ? "MBD_SCAN_STEP=old" : NULL;
    scan_case(16, 64, 256, 1, 1100, MBD_DTYPE_BF16, pick);
    scan_case(16, 48, 384, 1, 900, MBD_DTYPE_F32, pick);
  }
  /* the bf16 state's alignment is checked */
  mbd_error err = {0};
  int32_t *sl = NULL;
  assert_int_equal(cudaMalloc((void **)&sl, 64), cudaSuccess);
  char *p = NULL;
  assert_int_equal(cudaMalloc((void **)&p, 1 << 16), cudaSuccess);
  assert_int_equal(mbd_mops_scan_bf16state(NULL, 1, 1, 64, 16, 4, (float *)p, (float *)p,
                                           MBD_DTYPE_F32, p, p, (float *)p, (float *)p,
                                           (float *)p, 128, 64, p + 2, 64 * 16, sl, NULL,
                                           MBD_DTYPE_F32, p, &err),
                   MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "aligned"));
  cudaFree(p);
  cudaFree(sl);
  print_message("mbd_mops_scan_bf16state == the host's f32 arithmetic with bf16 rounding "
                "(decode, prefill, chunked; d_state 4..32; f32, bf16)\n");
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
 * images), forward == decode, run to run; f32 and bf16 weights (bf16: the
 * decode conv fused into x_proj and the scan at small batches). */
static void test_prefill_eq_decode(void **state) {
  (void)state;
  const mbd_dtype_policy pols[2] = {MBD_POLICY_F32, MBD_POLICY_BF16};
  for (int pi = 0; pi < 2; pi++) {
    mbd_backend *gb = backend(pols[pi]);
    for (int c = 0; c < NSYN; c++) {
      mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
      enum { B = 3, T = 70 };
      const int64_t V = gb->ops->model_vocab(gm);
      int64_t ids[B * T];
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
      /* the prefill kernels stage 16 (k_scan) or 32 (k_scan_prefill) steps */
      const int64_t chunks[] = {1, 2, 3, 5, 8, 13, 16, 17, 31, 33, 64};
      for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        for (int64_t pre = 1; pre <= T; pre += 11) {
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
      print_message("%s weights, model %d (d_model %d, d_state %d, dt_rank %d), state bf16: "
                    "prefill chunks == decode == forward\n",
                    mbd_dtype_policy_name(pols[pi]), c, g_cfg[c].d_model, g_cfg[c].d_state,
                    g_cfg[c].dt_rank);
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

/* Long prefills: 24 sequences of 100 tokens in one forward against batched
 * decoding, and one sequence of 2500 tokens (more than one model chunk of
 * 2048 rows) in one call and in pieces of 777 against decoding; the
 * published models' d_state (16) and the chunked k_scan's shape (d_state 8). */
static void test_long_prefill(void **state) {
  (void)state;
  mbd_backend *gb = backend(MBD_POLICY_BF16);
  for (int c = 0; c < 2; c++) {
    mbd_bmodel *gm = bc_load(gb, g_dirs[c]);
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
            fail_msg("model %d sequence %d step %lld: batched decode != forward of %d x %d", c,
                     i, (long long)t, NS, TL);
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
      check_bf16_image(ia, na, ssm_floats_of(c));
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
        assert_int_equal(gb->ops->prefill(gb, gm, s, ids + t0, len, false, b + t0 * V, &err),
                         0);
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
    print_message("model %d: long prefills == decoding (24 x 100 batched, 2500 alone and in "
                  "pieces)\n", c);
    gb->ops->model_destroy(gb, gm);
  }
  mbd_backend_destroy(&gb);
}

/* Batched steps of n = 2..256 sequences: every slot equals its solo run
 * (one sequence a block; on the wide model, batches of 64 and more in the
 * decode kernel's streaming ranges of 2, 4 and 8 sequences a block, with the
 * conv fused at 64, and again with MBD_SCAN_STEP=old: the previous form); bf16
 * weights (the fused conv at small batches). */
static void test_batch_invariance(void **state) {
  (void)state;
  for (int c = 0; c <= SYN_WIDE + 1; c++) {
    /* the decode graphs are captured with the kernel the variable picks */
    if (c == SYN_WIDE + 1) setenv("MBD_SCAN_STEP", "old", 1);
    mbd_backend *gb = backend(MBD_POLICY_BF16);
    const int m = c > SYN_WIDE ? SYN_WIDE : c;
    const char *how = c > SYN_WIDE ? ", MBD_SCAN_STEP=old" : "";
    mbd_bmodel *gm = bc_load(gb, g_dirs[m]);
    const int64_t V = gb->ops->model_vocab(gm);
    enum { NMAX = 256, STEPS = 5 };
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
          if (memcmp(rows + (size_t)i * V,
                     solo + ((size_t)((i * 7 + (int)k) % NMAX) * STEPS + t) * V, (size_t)V * 4))
            fail_msg("model %d%s: row %d of a batch of %d, step %d != its solo run", m, how, i,
                     n, t);
      }
      for (int i = 0; i < n; i++) gb->ops->state_free(gb, st[i]);
    }
    print_message("model %d (d_state %d)%s, state bf16: batched steps 2..256 == solo\n", m,
                  g_cfg[m].d_state, how);
    free(rows);
    free(solo);
    gb->ops->model_destroy(gb, gm);
    mbd_backend_destroy(&gb);
  }
  unsetenv("MBD_SCAN_STEP");
}

/* Export after half the prompt, import into a fresh state (same backend and
 * a second one), continue: the bits of decoding from the start; the device
 * stash the same, and smaller than the f32-state route's; an f32-state
 * route's image imports (rounded). */
static void test_export_import(void **state) {
  (void)state;
  const char *dir = g_dirs[0];
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
  check_bf16_image(img, in, ssm_floats_of(0));
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
    const size_t ssm = (size_t)ssm_floats_of(0);
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
    check_bf16_image(back, bn, ssm_floats_of(0));
    assert_int_equal(gb->ops->step(gb, gm, &t, ids + H, 1, got, &err), 0);
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

/* On a context whose route allows the persistent decode, a bf16-state model
 * never takes it (it keeps an f32 state): small batches run per op. */
static void test_no_persistent(void **state) {
  (void)state;
  mbd_error err = {0};
  for (int sd = 0; sd < 2; sd++) {
    mbd_gpu_ctx_config cfg;
    mbd_gpu_ctx_config_default(&cfg);
    cfg.policy = MBD_POLICY_BF16;
    cfg.state_capacity = 8;
    cfg.state = sd ? MBD_STATE_BF16 : MBD_STATE_F32;
    assert_int_equal(cfg.decode, MBD_DECODE_PERSISTENT);
    mbd_gpu_ctx *ctx = NULL;
    if (mbd_gpu_ctx_new(&cfg, &ctx, &err)) fail_msg("context: %s", err.msg);
    mbd_mamba1_gpu_options o;
    mbd_mamba1_gpu_options_default(&o);
    o.dtype = MBD_DTYPE_BF16;
    o.max_batch = 8;
    mbd_mamba1_gpu *m = NULL;
    if (mbd_mamba1_gpu_load(ctx, g_dirs[0], &o, &m, &err)) fail_msg("load: %s", err.msg);
    print_message("state %s: persistent decode at batch 1/4: %d/%d\n",
                  mbd_state_dtype_name(cfg.state), mbd_mamba1_gpu_persistent(m, 1),
                  mbd_mamba1_gpu_persistent(m, 4));
    if (sd) {
      assert_false(mbd_mamba1_gpu_persistent(m, 1));
      assert_false(mbd_mamba1_gpu_persistent(m, 4));
    }
    mbd_mamba1_gpu_destroy(&m);
    mbd_gpu_ctx_destroy(&ctx);
  }
}

/* The f32-state route is unchanged: on f32 weights its logits and states are
 * the CPU backend's bit for bit (docs/route.md "Contract between the
 * backends"), by prefill and by decode; the bf16-state route's differ. */
static void test_f32_route_unchanged(void **state) {
  (void)state;
  mbd_backend *cb = backend_kind(MBD_BACKEND_CPU, MBD_POLICY_F32, MBD_STATE_F32);
  mbd_backend *fb = backend_state(MBD_POLICY_F32, MBD_STATE_F32);
  mbd_backend *gb = backend(MBD_POLICY_F32);
  for (int c = 0; c < NSYN; c++) {
    mbd_bmodel *cm = bc_load(cb, g_dirs[c]), *fm = bc_load(fb, g_dirs[c]),
               *gm = bc_load(gb, g_dirs[c]);
    enum { B = 2, T = 40 };
    const int64_t V = cb->ops->model_vocab(cm);
    int64_t ids[B * T];
    for (int64_t i = 0; i < B * T; i++) ids[i] = (i * 97 + 3 * c + 2) % V;
    const size_t n = (size_t)(B * T * V);
    float *a = malloc(n * 4), *b = malloc(n * 4), *g = malloc(n * 4);
    mbd_error err = {0};
    assert_int_equal(cb->ops->forward(cb, cm, ids, B, T, false, a, &err), 0);
    assert_int_equal(fb->ops->forward(fb, fm, ids, B, T, false, b, &err), 0);
    assert_int_equal(gb->ops->forward(gb, gm, ids, B, T, false, g, &err), 0);
    if (memcmp(a, b, n * 4)) fail_msg("model %d: f32-state GPU forward != CPU", c);
    assert_true(memcmp(b, g, n * 4) != 0); /* the state route matters */
    float *da = malloc((size_t)(T * V) * 4), *db = malloc((size_t)(T * V) * 4);
    uint8_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    bc_decode_all(cb, cm, ids, T, V, da, &ia, &na);
    bc_decode_all(fb, fm, ids, T, V, db, &ib, &nb);
    if (memcmp(da, db, (size_t)(T * V) * 4)) fail_msg("model %d: f32-state GPU decode != CPU", c);
    assert_int_equal(na, nb);
    assert_memory_equal(ia, ib, na);
    print_message("model %d: f32-state route == CPU (forward, decode, state)\n", c);
    free(ia);
    free(ib);
    free(da);
    free(db);
    free(a);
    free(b);
    free(g);
    cb->ops->model_destroy(cb, cm);
    fb->ops->model_destroy(fb, fm);
    gb->ops->model_destroy(gb, gm);
  }
  mbd_backend_destroy(&cb);
  mbd_backend_destroy(&fb);
  mbd_backend_destroy(&gb);
}

/* Logits against the float64 fixtures within the bound over every prompt
 * position; greedy: the reference's continuation fed token by token, our
 * pick equal to the reference's token wherever our top-2 margin exceeds twice
 * the bound (with every logit within the bound, a smaller margin is the only
 * place a pick can flip). */
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
      const double ours = max_err(g, f.hf, n);
      print_message("%s weights %s, state bf16: max abs err %.4g (bound %.4g = %.2f x PyTorch "
                    "bf16 %.4g)\n",
                    mbd_dtype_policy_name(pols[pi]), cases[c], ours, bound, factor[pi], theirs);
      if (ours > bound) fail_msg("%s: err %.4g > bound %.4g", cases[c], ours, bound);
      float *l = malloc((size_t)V * 4);
      int checked = 0, steps = 0;
      for (int64_t s = 0; s < B; s++) {
        const int64_t *gs = f.greedy + s * (T + G);
        mbd_bstate *st = bc_new_state(gb, gm);
        assert_int_equal(gb->ops->prefill(gb, gm, st, gs, T, true, l, &err), 0);
        for (int64_t i = 0; i < G; i++) {
          if (i) assert_int_equal(gb->ops->step(gb, gm, &st, gs + T - 1 + i, 1, l, &err), 0);
          steps++;
          int64_t am = 0;
          for (int64_t v = 1; v < V; v++)
            if (l[v] > l[am]) am = v;
          double second = -INFINITY;
          for (int64_t v = 0; v < V; v++)
            if (v != am && l[v] > second) second = l[v];
          if (l[am] - second > 2 * bound) {
            checked++;
            if (am != gs[T + i])
              fail_msg("%s sequence %lld greedy step %lld: picked %lld, reference %lld "
                       "(margin %.4g)", cases[c], (long long)s, (long long)i, (long long)am,
                       (long long)gs[T + i], l[am] - second);
          }
        }
        gb->ops->state_free(gb, st);
      }
      print_message("   greedy: %d of %d picks checked (margin > 2 x bound), all the "
                    "reference's\n", checked, steps);
      free(l);
      free(g);
      gb->ops->model_destroy(gb, gm);
      free_fixture(&f);
    }
    mbd_backend_destroy(&gb);
  }
  if (!ran) skip();
}

/* The CPU backend and Mamba-3 refuse a bf16 state, saying where it runs. */
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
      cmocka_unit_test(test_scan_op),
      cmocka_unit_test(test_route_says_bf16),  cmocka_unit_test(test_prefill_eq_decode),
      cmocka_unit_test(test_long_prefill),     cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_export_import),    cmocka_unit_test(test_no_persistent),
      cmocka_unit_test(test_f32_route_unchanged), cmocka_unit_test(test_fixture_bound),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
