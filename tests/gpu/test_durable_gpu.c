/* Durable sessions on the GPU: two mambad-worker --device cuda:0 processes
 * (one route: same GPU, same options) behind the real broker, serving a
 * synthetic bf16 Mamba-1 of the 130m shape written into the test's temp dir,
 * deterministic GEMMs, a checkpoint every 16 tokens.
 *
 * 64 sessions generate at once (even: greedy; odd: seeded sampling) and 4
 * idle ones have STEPped; kill -9 of the worker that holds them all once a
 * quarter of the tokens streamed. The broker re-homes every session on the
 * other worker from its last checkpoint plus the tokens since, and each
 * GENERATE continues there. Asserted:
 * - both workers report the same route id (the precondition of re-homing);
 * - every stream completes, the streamed tokens are the FINAL's prefix;
 * - the tokens, the logits of a STEP afterwards and the exported state equal
 *   (memcmp) those of the same requests on an undisturbed run, and so do an
 *   idle session's next STEP logits;
 * - STATUS: every session re-homed, none lost, GENERATEs resumed, tokens
 *   replayed; the counts are printed.
 * And the rolling restart: SIGTERM of the worker under 8 generating sessions
 * hands them over, the streams and a STEP's logits afterwards equal an
 * undisturbed run, and the worker exits 0.
 * Exits 77 with a reason when no CUDA device is visible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>

#include <cmocka.h>

#include "kernels/model/synth.h"
#include "support/service_gpu.h"
#include "support/wh_sessions.h"

#define NGEN 64    /* generating sessions */
#define NIDLE 4    /* idle sessions that only STEP */
#define NSTEP 5    /* STEPs of an idle session before the kill */
#define GEN_LEN 64 /* tokens per GENERATE */
#define NS (NGEN + NIDLE)
#define PMAX 40 /* longest prompt */

static wh g_h;
static char g_model[64];       /* the synthetic checkpoint's directory, "" until written */
static int64_t g_vocab;        /* the model's vocabulary (token ids in [0, g_vocab)) */
static int64_t g_prompts[NS][PMAX];

/* Every worker of the test: cuda:0, bf16, deterministic, checkpoints every
 * 16 tokens, room for 2 x NS sessions. */
static pid_t start_worker(const char *name) {
  return wh_start_worker(&g_h, name, "--device", "cuda:0", "--dtype", "bf16", "--gemm-mode",
                         "deterministic", "--checkpoint-tokens", "16", "--capacity", "256",
                         "--sessions", "256", "--client-sessions", "256", "--max-message-mb",
                         "1024", NULL);
}

static int64_t prompt_len(int i) { return 8 + i % (PMAX - 8); }
static int64_t step_token(int i, int k) { return (i * 37 + k * 11 + 5) % g_vocab; }

static const int64_t *prompt_of(int i, int64_t *len) {
  *len = prompt_len(i);
  return g_prompts[i];
}

static void open_prefill(char sids[][64], int n) {
  wh_open_prefill(&g_h, sids, n, prompt_of, 120000);
}

static void generate_all(char sids[][64], int n, pid_t victim, int sig, int64_t out[][GEN_LEN]) {
  wh_generate_all(&g_h, sids, n, GEN_LEN, victim, sig, 300000, &out[0][0]);
}

/* STEP of session i with step_token(i, k): its logits (malloc'ed), *n bytes. */
static uint8_t *step(const char *sid, int i, int k, size_t *n) {
  mbd_msg *m = wh_wait(&g_h, wh_send_step(&g_h, sid, step_token(i, k)), 120000);
  assert_int_equal(wh_code(m), 0);
  uint8_t *p = sg_payload(m, n);
  assert_true(*n >= (size_t)g_vocab * 4);
  mbd_msg_destroy(&m);
  return p;
}

static uint64_t counter(const char *name) { return wh_counter(&g_h, name); }

/* What a run leaves to compare: per generating session its tokens, the
 * logits of one STEP after the GENERATE and the exported state; per idle
 * session the logits of its STEP after the kill. */
typedef struct {
  int64_t tok[NGEN][GEN_LEN];
  uint8_t *logits[NS];
  size_t nlogits[NS];
  uint8_t *blob[NGEN];
  size_t nblob[NGEN];
} run_out;

/* The idle sessions' STEPs before the GENERATEs. */
static void step_idle(char sids[][64]) {
  for (int i = NGEN; i < NS; i++)
    for (int k = 0; k < NSTEP; k++) {
      size_t n = 0;
      free(step(sids[i], i, k, &n));
    }
}

/* The STEPs and EXPORTs after the GENERATEs. */
static void collect(char sids[][64], run_out *o) {
  for (int i = 0; i < NGEN; i++) {
    o->logits[i] = step(sids[i], i, 0, &o->nlogits[i]);
    o->blob[i] = wh_export(&g_h, sids[i], 120000, &o->nblob[i]);
  }
  for (int i = NGEN; i < NS; i++) o->logits[i] = step(sids[i], i, NSTEP, &o->nlogits[i]);
}

static void run_out_free(run_out *o) {
  for (int i = 0; i < NS; i++) free(o->logits[i]);
  for (int i = 0; i < NGEN; i++) free(o->blob[i]);
}

/* The harness with the broker, serving the synthetic 130m checkpoint as
 * model "tiny" (the harness's name); the checkpoint is written once into its
 * own temp dir for all tests. Skips (77) without a device. */
static void start(void) {
  sg_init_or_skip(&g_h, 1);
  g_h.client_inflight = "100000"; /* this one client sends the traffic of many */
  if (!g_model[0]) {
    double t_synth = wh_now();
    snprintf(g_model, sizeof g_model, "/tmp/mbd-durable-gpu-XXXXXX");
    assert_non_null(mkdtemp(g_model));
    mbd_mamba_config cfg;
    mbd_error err = {0};
    assert_int_equal(mbd_synth_shape("130m", &cfg, &err), 0);
    if (mbd_synth_write(&cfg, MBD_DTYPE_BF16, 11, g_model, &err)) fail_msg("synth: %s", err.msg);
    fprintf(stderr, "synthetic 130m bf16 written in %.1f s\n", wh_now() - t_synth);
    g_vocab = cfg.vocab_size;
    uint64_t seed = 5;
    for (int i = 0; i < NS; i++)
      for (int t = 0; t < PMAX; t++)
        g_prompts[i][t] = (int64_t)(sg_rng(&seed) % (uint64_t)g_vocab);
  }
  snprintf(g_h.model_dir, sizeof g_h.model_dir, "%s", g_model);
  wh_start_broker(&g_h);
}

static int remove_model(void **state) {
  (void)state;
  if (g_model[0] && procs_sh("rm -rf '%s'", g_model))
    fprintf(stderr, "could not remove %s\n", g_model);
  return 0;
}

static void test_kill9_rehome_gpu(void **state) {
  (void)state;
  start();
  pid_t a = start_worker("gpuA");
  assert_int_equal(wh_wait_workers(&g_h, 1, 120000), 0);

  /* The undisturbed run, on A alone. */
  static char ref_sids[NS][64], sids[NS][64];
  static run_out ref, got;
  open_prefill(ref_sids, NS);
  step_idle(ref_sids);
  generate_all(ref_sids, NGEN, 0, 0, ref.tok);
  collect(ref_sids, &ref);
  for (int i = 0; i < NS; i++) wh_close(&g_h, ref_sids[i]);
  /* Different prompts and seeds gave different streams (the comparison
   * below can fail). */
  assert_memory_not_equal(ref.tok[0], ref.tok[2], sizeof ref.tok[0]);
  assert_memory_not_equal(ref.tok[1], ref.tok[3], sizeof ref.tok[1]);

  /* The same sessions again on A; B joins; A dies under the 64 streams. */
  open_prefill(sids, NS);
  step_idle(sids);
  start_worker("gpuB");
  assert_int_equal(wh_wait_workers(&g_h, 2, 120000), 0);
  wh_assert_one_route(&g_h, 2, "cuda");
  double t_kill = wh_now();
  generate_all(sids, NGEN, a, SIGKILL, got.tok);
  g_h.procs[0] = 0;
  wh_stop(a, SIGKILL);
  collect(sids, &got);
  fprintf(stderr, "after the kill: streams, STEPs and EXPORTs done in %.3f s\n",
          wh_now() - t_kill);

  int bad_tok = 0, bad_logits = 0, bad_state = 0;
  for (int i = 0; i < NGEN; i++) {
    bad_tok += memcmp(got.tok[i], ref.tok[i], sizeof got.tok[i]) != 0;
    bad_state += got.nblob[i] != ref.nblob[i] || memcmp(got.blob[i], ref.blob[i], got.nblob[i]);
  }
  for (int i = 0; i < NS; i++)
    bad_logits += got.nlogits[i] != ref.nlogits[i] ||
                  memcmp(got.logits[i], ref.logits[i], got.nlogits[i]);
  uint64_t rehomed = counter("sessions_rehomed"), replayed = counter("replayed_tokens"),
           resumed = counter("generates_resumed"), lost = counter("sessions_lost"),
           ckpts = counter("checkpoints"), dropped = counter("checkpoints_dropped");
  fprintf(stderr,
          "GPU kill -9 under %d generating + %d idle sessions: %llu sessions re-homed, %llu "
          "tokens replayed, %llu generates resumed, %llu sessions lost; %llu checkpoints "
          "(%llu dropped) of %zu-byte session blobs; differing from the undisturbed run: %d "
          "token streams, %d logits, %d states\n",
          NGEN, NIDLE, (unsigned long long)rehomed, (unsigned long long)replayed,
          (unsigned long long)resumed, (unsigned long long)lost, (unsigned long long)ckpts,
          (unsigned long long)dropped, ref.nblob[0], bad_tok, bad_logits, bad_state);
  for (int i = 0; i < NGEN; i++) {
    assert_memory_equal(got.tok[i], ref.tok[i], sizeof got.tok[i]);
    assert_int_equal(got.nblob[i], ref.nblob[i]);
    assert_memory_equal(got.blob[i], ref.blob[i], got.nblob[i]);
  }
  for (int i = 0; i < NS; i++) {
    assert_int_equal(got.nlogits[i], ref.nlogits[i]);
    assert_memory_equal(got.logits[i], ref.logits[i], got.nlogits[i]);
  }
  assert_int_equal(rehomed, NS);
  assert_int_equal(lost, 0);
  assert_true(resumed > 0);
  assert_true(replayed > 0);
  run_out_free(&ref);
  run_out_free(&got);
  wh_fini(&g_h);
}

/* A checkpointing GPU worker that gets SIGTERM hands its running GENERATEs
 * over: they continue on the other worker, bit for bit, and it exits 0. */
static void test_sigterm_hand_over_gpu(void **state) {
  (void)state;
  enum { N = 8 };
  start();
  pid_t a = start_worker("gpuA");
  assert_int_equal(wh_wait_workers(&g_h, 1, 120000), 0);
  static char ref_sids[N][64], sids[N][64];
  static int64_t ref_tok[N][GEN_LEN], tok[N][GEN_LEN];
  open_prefill(ref_sids, N);
  generate_all(ref_sids, N, 0, 0, ref_tok);
  uint8_t *ref_logits[N];
  size_t ref_n[N];
  for (int i = 0; i < N; i++) {
    ref_logits[i] = step(ref_sids[i], i, 0, &ref_n[i]);
    wh_close(&g_h, ref_sids[i]);
  }
  open_prefill(sids, N);
  start_worker("gpuB");
  assert_int_equal(wh_wait_workers(&g_h, 2, 120000), 0);
  generate_all(sids, N, a, SIGTERM, tok);
  assert_int_equal(wh_stop(a, SIGTERM), 0); /* it exited cleanly */
  g_h.procs[0] = 0;
  uint64_t resumed = counter("generates_resumed"), rehomed = counter("sessions_rehomed");
  fprintf(stderr, "GPU SIGTERM under %d generating sessions: %llu re-homed, %llu generates "
                  "continued elsewhere\n",
          N, (unsigned long long)rehomed, (unsigned long long)resumed);
  for (int i = 0; i < N; i++) {
    assert_memory_equal(tok[i], ref_tok[i], sizeof tok[i]);
    size_t n = 0;
    uint8_t *l = step(sids[i], i, 0, &n);
    assert_int_equal(n, ref_n[i]);
    assert_memory_equal(l, ref_logits[i], n);
    free(l);
    free(ref_logits[i]);
  }
  assert_int_equal(rehomed, N);
  wh_fini(&g_h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kill9_rehome_gpu),
      cmocka_unit_test(test_sigterm_hand_over_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, remove_model);
}
