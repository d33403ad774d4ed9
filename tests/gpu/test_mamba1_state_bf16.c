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
#include "kernels/backend.h"
#include "kernels/cuda/gpu_ctx.h"
#include "kernels/cuda/mamba1_gpu.h"
#include "kernels/cuda/mamba_ops.h"
#include "kernels/model/mamba3_synth.h"
#include "kernels/portable_math.h"
#include "kernels/model/synth.h"
#include "support/backend_calls.h"
#include "support/gpu_util.h"
#include "tests/gpu/gpu_model_test.h"

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

/* SSM entries of synthetic model k: n_layer x d_inner x d_state. */
static int64_t ssm_floats_of(int k) {
  return (int64_t)g_cfg[k].n_layer * g_cfg[k].d_inner * g_cfg[k].d_state;
}

static mbd_backend *backend_state(mbd_dtype_policy policy, mbd_state_dtype sd) {
  return gmt_backend(MBD_BACKEND_CUDA, policy, sd);
}
static mbd_backend *backend(mbd_dtype_policy policy) {
  return backend_state(policy, MBD_STATE_BF16);
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
 * memcmp. pick: NULL, or "MBD_SCAN_PREFILL=old" / "MBD_SCAN_STEP=old|v1", set
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
 * ranges of 4 and 8 a block, also with MBD_SCAN_STEP=old and v1, the two
 * forms at d_state 16 and bf16), the prefill kernel (d_state 8 / 16,
 * dt rank 4) and the
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
  /* d_inner 4096, where the width picks the plainer form: the other by name */
  scan_case(16, 8, 4096, 1, 300, MBD_DTYPE_BF16, NULL);
  scan_case(16, 8, 4096, 1, 300, MBD_DTYPE_BF16, "MBD_SCAN_STEP=v1");
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
  gmt_check_route_bf16();
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
      /* the prefill kernels stage 16 (k_scan) or 32 (k_scan_prefill) steps */
      const int64_t chunks[] = {1, 2, 3, 5, 8, 13, 16, 17, 31, 33, 64};
      char what[32];
      snprintf(what, sizeof what, "model %d", c);
      gmt_check_forward_decode_prefill(gb, gm, 3, 70, c, ssm_floats_of(c), chunks,
                                       sizeof chunks / sizeof chunks[0], 11, what);
      print_message("%s weights, model %d (d_model %d, d_state %d, dt_rank %d), state bf16: "
                    "prefill chunks == decode == forward\n",
                    mbd_dtype_policy_name(pols[pi]), c, g_cfg[c].d_model, g_cfg[c].d_state,
                    g_cfg[c].dt_rank);
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
    char what[32];
    snprintf(what, sizeof what, "model %d", c);
    {
      enum { NS = 24, TL = 100 };
      int64_t *ids = malloc((size_t)NS * TL * 8);
      for (int64_t i = 0; i < NS * TL; i++) ids[i] = (i * 7919 + 13) % V;
      float *fw = malloc((size_t)NS * TL * V * 4);
      assert_int_equal(gb->ops->forward(gb, gm, ids, NS, TL, false, fw, &err), 0);
      gmt_check_batched_decode(gb, gm, ids, NS, TL, V, fw, what);
      free(fw);
      free(ids);
    }
    {
      enum { TL = 2500, PIECE = 777 };
      int64_t *ids = malloc((size_t)TL * 8);
      for (int64_t i = 0; i < TL; i++) ids[i] = (i * 104729 + 3) % V;
      gmt_check_long_prefill(gb, gm, ids, TL, V, PIECE, ssm_floats_of(c));
      free(ids);
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
 * conv fused at 64, and again with MBD_SCAN_STEP=old: the plainer form); bf16
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
    char what[64];
    snprintf(what, sizeof what, "model %d%s", m, how);
    gmt_check_batch_invariance(gb, gm, 5, what);
    print_message("model %d (d_state %d)%s, state bf16: batched steps 2..256 == solo\n", m,
                  g_cfg[m].d_state, how);
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
  gmt_check_export_import(g_dirs[0], ssm_floats_of(0));
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
  mbd_backend *cb = gmt_backend(MBD_BACKEND_CPU, MBD_POLICY_F32, MBD_STATE_F32);
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
      gmt_fixture f;
      if (gmt_fixture_load("mamba1", cases[c], &f)) continue;
      ran++;
      assert_non_null(f.greedy);
      mbd_bmodel *gm = bc_load(gb, f.dir);
      const int64_t B = f.B, T = f.T, V = f.V, G = f.G;
      mbd_error err = {0};
      char what[96];
      snprintf(what, sizeof what, "%s weights %s, state bf16", mbd_dtype_policy_name(pols[pi]),
               cases[c]);
      const double bound = gmt_check_logits_bound(gb, gm, &f, f.hf, factor[pi], what);
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
      gb->ops->model_destroy(gb, gm);
      gmt_fixture_free(&f);
    }
    mbd_backend_destroy(&gb);
  }
  if (!ran) skip();
}

/* The CPU backend and Mamba-3 refuse a bf16 state, saying where it runs. */
static void test_refusals(void **state) {
  (void)state;
  gmt_check_bf16_refusals(g_dirs[SYN_M3]);
}

static int setup(void **state) {
  (void)state;
  gpu_test_require_device();
  return write_synth();
}

static int teardown(void **state) {
  (void)state;
  gmt_remove_checkpoints(g_dirs, NDIRS);
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
