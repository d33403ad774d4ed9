/* Durable sessions through the real processes: kill -9 of the worker that
 * holds 64 generating sessions (greedy and seeded sampling). The broker
 * re-homes every session on the other worker of the route from its last
 * checkpoint plus the tokens since, and each GENERATE continues there: every
 * stream completes, the streamed tokens equal the FINAL's, and the tokens,
 * a STEP's logits afterwards and the exported state equal an undisturbed
 * run by memcmp. Idle sessions continue with STEP bit for bit (against the
 * in-process model). A session whose route has no other live worker gets
 * WORKER_LOST saying so. The time cadence (--checkpoint-ms) alone keeps a
 * session as well. The re-home counts come from STATUS and are printed. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <time.h>

#include <cmocka.h>

#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/wh_sessions.h"
#include "support/worker_harness.h"

#define NGEN 64   /* generating sessions */
#define NIDLE 4   /* idle sessions that only STEP */
#define NSTEP 5   /* STEPs of an idle session before the kill */
#define GEN_LEN 48
#define NS (NGEN + NIDLE)

static wh g_h;
static wh_fixture g_f;

/* Every worker of the test: checkpoints every 16 tokens, room for 2 x NS sessions. */
static pid_t start_worker(const char *name) {
  return wh_start_worker(&g_h, name, "--checkpoint-tokens", "16", "--capacity", "256",
                         "--sessions", "256", "--client-sessions", "256", NULL);
}

static int64_t prompt_len(int i) { return 4 + i % 16; }
static const int64_t *prompt(int i) { return g_f.ids + (i % g_f.B) * g_f.T; }
static int64_t step_token(int i, int k) { return (i * 37 + k * 11 + 5) % g_f.V; }

static const int64_t *prompt_of(int i, int64_t *len) {
  *len = prompt_len(i);
  return prompt(i);
}

static void open_prefill(char sids[][64], int n) {
  wh_open_prefill(&g_h, sids, n, prompt_of, 60000);
}

static void generate_all(char sids[][64], int n, pid_t victim, int sig, int64_t out[][GEN_LEN]) {
  wh_generate_all(&g_h, sids, n, GEN_LEN, victim, sig, 120000, &out[0][0]);
}

/* STEP of session i with step_token(i, k): its logits into out[V]. */
static void step(const char *sid, int i, int k, float *out) {
  mbd_msg *m = wh_wait(&g_h, wh_send_step(&g_h, sid, step_token(i, k)), 60000);
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const void *p = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)g_f.V * 4);
  memcpy(out, p, len);
  mbd_msg_destroy(&m);
}

static uint64_t counter(const char *name) { return wh_counter(&g_h, name); }

static void test_kill9_rehome(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const int64_t V = g_f.V;
  g_h.client_inflight = "4096";
  wh_start_broker(&g_h);
  pid_t a = start_worker("wA");
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);

  /* The undisturbed run, on A alone. */
  static char ref_sids[NGEN][64], sids[NS][64];
  static int64_t ref_tok[NGEN][GEN_LEN], tok[NGEN][GEN_LEN];
  float *ref_logits = malloc((size_t)(NGEN * V) * 4), *logits = malloc((size_t)V * 4);
  uint8_t *ref_blob[NGEN];
  size_t ref_n[NGEN];
  open_prefill(ref_sids, NGEN);
  generate_all(ref_sids, NGEN, 0, 0, ref_tok);
  for (int i = 0; i < NGEN; i++) {
    step(ref_sids[i], i, 0, ref_logits + (size_t)i * V);
    ref_blob[i] = wh_export(&g_h, ref_sids[i], 60000, &ref_n[i]);
    wh_close(&g_h, ref_sids[i]);
  }

  /* The same sessions again on A, and idle ones that STEP a few times. */
  open_prefill(sids, NS);
  for (int i = NGEN; i < NS; i++)
    for (int k = 0; k < NSTEP; k++) step(sids[i], i, k, logits);
  /* B joins; A dies under the 64 streams. */
  start_worker("wB");
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  generate_all(sids, NGEN, a, SIGKILL, tok);
  g_h.procs[0] = 0;
  wh_stop(a, SIGKILL);

  for (int i = 0; i < NGEN; i++) {
    assert_memory_equal(tok[i], ref_tok[i], sizeof tok[i]);
    step(sids[i], i, 0, logits);
    assert_memory_equal(logits, ref_logits + (size_t)i * V, (size_t)V * 4);
    size_t n = 0;
    uint8_t *blob = wh_export(&g_h, sids[i], 60000, &n);
    assert_int_equal(n, ref_n[i]);
    assert_memory_equal(blob, ref_blob[i], n);
    free(blob);
    free(ref_blob[i]);
  }
  /* Idle sessions continue with STEP as the in-process model does. */
  mbd_mamba1_state *s = NULL;
  int64_t seq[64];
  float *ref = malloc((size_t)(64 * V) * 4);
  for (int i = NGEN; i < NS; i++) {
    int64_t L = prompt_len(i);
    memcpy(seq, prompt(i), (size_t)L * sizeof *seq);
    for (int k = 0; k <= NSTEP; k++) seq[L + k] = step_token(i, k);
    assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
    wh_ref_prefill(&g_f, s, seq, L + NSTEP + 1, ref);
    mbd_mamba1_state_destroy(&s);
    step(sids[i], i, NSTEP, logits);
    assert_memory_equal(logits, ref + (size_t)(L + NSTEP) * V, (size_t)V * 4);
  }
  uint64_t rehomed = counter("sessions_rehomed"), replayed = counter("replayed_tokens"),
           resumed = counter("generates_resumed"), lost = counter("sessions_lost");
  fprintf(stderr,
          "kill -9 under %d generating + %d idle sessions: %llu sessions re-homed, %llu tokens "
          "replayed, %llu generates resumed, %llu sessions lost\n",
          NGEN, NIDLE, (unsigned long long)rehomed, (unsigned long long)replayed,
          (unsigned long long)resumed, (unsigned long long)lost);
  assert_int_equal(rehomed, NS);
  assert_int_equal(lost, 0);
  assert_true(resumed > 0);
  assert_true(replayed > 0);
  free(ref);
  free(ref_logits);
  free(logits);
  wh_fixture_free(&g_f);
  wh_fini(&g_h);
}

/* Only one worker of the route: its loss ends the stream with WORKER_LOST
 * saying no other worker could take the session, and so do later requests. */
static void test_no_other_worker(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  wh_start_broker(&g_h);
  pid_t a = start_worker("wA");
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  char sid[1][64];
  open_prefill(sid, 1);
  uint64_t t = wh_send_generate(&g_h, sid[0], 100000, 0.0, 0);
  int partials = 0;
  mbd_msg *m = NULL;
  double end = wh_now() + 60;
  while (wh_now() < end) {
    m = wh_recv(&g_h, 200);
    if (!m) continue;
    assert_int_equal(mbd_msg_tag(m), t);
    if (mbd_msg_cmd(m) != MBD_CMD_PARTIAL) break;
    if (++partials == 40) kill(a, SIGKILL);
    mbd_msg_destroy(&m);
  }
  g_h.procs[0] = 0;
  wh_stop(a, SIGKILL);
  assert_non_null(m);
  char msg[512] = "";
  assert_int_equal(wh_code(m), MBD_E_WORKER_LOST);
  wh_str(m, "message", msg, sizeof msg);
  assert_non_null(strstr(msg, "no other live worker"));
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_step(&g_h, sid[0], 1), 30000);
  assert_int_equal(wh_code(m), MBD_E_WORKER_LOST);
  wh_str(m, "message", msg, sizeof msg);
  assert_non_null(strstr(msg, "no other live worker"));
  mbd_msg_destroy(&m);
  assert_int_equal(counter("sessions_lost"), 1);
  wh_fixture_free(&g_f);
  wh_fini(&g_h);
}

/* The time cadence alone (--checkpoint-ms, no token cadence): an idle
 * session that stepped before and after a pause is re-homed and STEPs on as
 * the in-process model does. */
static void test_time_cadence(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const int64_t V = g_f.V;
  wh_start_broker(&g_h);
  pid_t a = wh_start_worker(&g_h, "wA", "--checkpoint-ms", "20", NULL);
  wh_start_worker(&g_h, "wB", "--checkpoint-ms", "20", NULL);
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  char sid[1][64];
  float *logits = malloc((size_t)V * 4), *ref = malloc((size_t)(64 * V) * 4);
  open_prefill(sid, 1);
  const int K = 6;
  for (int k = 0; k < K; k++) {
    step(sid[0], 0, k, logits);
    if (k == K / 2) {
      struct timespec ts = {0, 100 * 1000 * 1000}; /* lets a time checkpoint go out */
      nanosleep(&ts, NULL);
    }
  }
  /* Whichever worker holds it dies. */
  char w[32] = "";
  mbd_msg *m = wh_wait(&g_h, wh_send_step(&g_h, sid[0], step_token(0, K)), 60000);
  assert_int_equal(wh_code(m), 0);
  wh_str(m, "worker", w, sizeof w);
  mbd_msg_destroy(&m);
  pid_t victim = !strcmp(w, "wA") ? a : g_h.procs[1];
  kill(victim, SIGKILL);
  int64_t L = prompt_len(0), seq[64];
  memcpy(seq, prompt(0), (size_t)L * sizeof *seq);
  for (int k = 0; k <= K + 1; k++) seq[L + k] = step_token(0, k);
  mbd_mamba1_state *s = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
  wh_ref_prefill(&g_f, s, seq, L + K + 2, ref);
  mbd_mamba1_state_destroy(&s);
  step(sid[0], 0, K + 1, logits);
  assert_memory_equal(logits, ref + (size_t)(L + K + 1) * V, (size_t)V * 4);
  assert_int_equal(counter("sessions_rehomed"), 1);
  free(logits);
  free(ref);
  wh_fixture_free(&g_f);
  wh_fini(&g_h);
}

/* A checkpointing worker that gets SIGTERM hands its running GENERATEs over:
 * they continue on the other worker, bit for bit, instead of ending with
 * STATE. */
static void test_sigterm_hand_over(void **state) {
  (void)state;
  enum { N = 8 };
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  g_h.client_inflight = "4096";
  wh_start_broker(&g_h);
  pid_t a = start_worker("wA");
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  static char ref_sids[N][64], sids[N][64];
  static int64_t ref_tok[N][GEN_LEN], tok[N][GEN_LEN];
  open_prefill(ref_sids, N);
  generate_all(ref_sids, N, 0, 0, ref_tok);
  for (int i = 0; i < N; i++) wh_close(&g_h, ref_sids[i]);
  open_prefill(sids, N);
  start_worker("wB");
  assert_int_equal(wh_wait_workers(&g_h, 2, 30000), 0);
  uint64_t resumed0 = counter("generates_resumed");
  generate_all(sids, N, a, SIGTERM, tok);
  assert_int_equal(wh_stop(a, SIGTERM), 0); /* it exited cleanly */
  g_h.procs[0] = 0;
  for (int i = 0; i < N; i++) assert_memory_equal(tok[i], ref_tok[i], sizeof tok[i]);
  fprintf(stderr, "SIGTERM under %d generating sessions: %llu generates continued elsewhere\n", N,
          (unsigned long long)(counter("generates_resumed") - resumed0));
  assert_int_equal(counter("sessions_rehomed"), N);
  wh_fixture_free(&g_f);
  wh_fini(&g_h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_hand_over),
      cmocka_unit_test(test_kill9_rehome),
      cmocka_unit_test(test_no_other_worker),
      cmocka_unit_test(test_time_cadence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
