/* The service on one GPU (real mambad-broker + mambad-worker --device cuda:0,
 * deterministic f32 route, tiny fixture):
 *  - 256 sessions run concurrently (prefill, greedy or seeded GENERATE batched
 *    into graph-replayed decodes, one STEP, EXPORT) give exactly the tokens,
 *    logits and state bytes that each gives when run alone;
 *  - 1000 identical FORWARDs sent at once among random other traffic (other
 *    forwards, generating sessions) give exactly one distinct output, equal to
 *    the same request sent alone;
 *  - GENERATE's greedy loop (next tokens picked on the device) equals a loop of
 *    STEPs with host argmax, and the fixture's greedy tokens; the exported
 *    states (state + last logits) of both sessions are byte-identical;
 *  - GPU worker basics: registration says backend cuda, a CPU-route state blob
 *    is refused, the worker keeps serving.
 * Exits 77 with a reason when no CUDA device is present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/service_gpu.h"
#include "support/wh_fixture.h"

#define NS 256    /* concurrent sessions */
#define GEN 12    /* tokens generated per session */
#define NSAME 1000 /* identical forwards */

static wh g_h;
static int64_t g_V = 512;

typedef struct run_out {
  int64_t toks[GEN];
  int ntoks;
  uint8_t *step_logits; /* [V] f32 bytes */
  size_t nstep;
  uint8_t *blob;        /* export */
  size_t nblob;
} run_out;

static void prompt_of(int i, int64_t *ids, int64_t *T) {
  uint64_t s = 1000 + (uint64_t)i;
  *T = 3 + i % 17;
  for (int64_t t = 0; t < *T; t++) ids[t] = (int64_t)(sg_rng(&s) % (uint64_t)g_V);
}

static uint64_t send_gen(int i, const char *sid) {
  /* even: greedy; odd: seeded sampling with a per-session seed */
  return wh_send_generate(&g_h, sid, GEN, i % 2 ? 0.9 : 0.0, 77 + (uint64_t)i);
}

static void check_final(mbd_msg *m, const char *what, int i) {
  if (!m || mbd_msg_cmd(m) != MBD_CMD_FINAL) {
    fprintf(stderr, "%s of session %d: %s\n", what, i, m ? "ERROR" : "no reply");
    if (m) wh_code(m);
    fail();
  }
}

/* Session i alone: every request waits for its reply. */
static void run_alone(int i, run_out *o) {
  int64_t ids[32], T;
  prompt_of(i, ids, &T);
  char sid[64] = "";
  mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
  check_final(m, "open", i);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, ids, T, true), 30000);
  check_final(m, "prefill", i);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, send_gen(i, sid), 30000);
  check_final(m, "generate", i);
  o->ntoks = wh_tokens(m, o->toks, GEN);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_step(&g_h, sid, (i * 7) % g_V), 30000);
  check_final(m, "step", i);
  o->step_logits = sg_payload(m, &o->nstep);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_export(&g_h, sid), 30000);
  check_final(m, "export", i);
  o->blob = sg_payload(m, &o->nblob);
  mbd_msg_destroy(&m);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 1);
  mbd_pack_kv_str(&k.pk, "session", sid);
  m = wh_call(&g_h, MBD_CMD_CLOSE, &k.sb, 0, NULL, NULL);
  mbd_msg_destroy(&m);
}

static int setup(void **st) {
  (void)st;
  sg_init_or_skip(&g_h, 1);
  g_h.client_inflight = "100000"; /* this one client sends the traffic of many */
  wh_start_broker(&g_h);
  sg_start_gpu_worker(&g_h, "gpu0", 0, "1100", "256");
  if (wh_wait_workers(&g_h, 1, 60000)) {
    fprintf(stderr, "GPU worker did not register\n");
    return -1;
  }
  return 0;
}

static int teardown(void **st) {
  (void)st;
  wh_fini(&g_h);
  return 0;
}

static void test_registration_is_cuda(void **st) {
  (void)st;
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  mbd_msg *m = wh_call(&g_h, MBD_CMD_STATUS, &p.sb, 0, NULL, NULL);
  assert_non_null(m);
  size_t len;
  const char *b = mbd_msg_body(m, &len);
  /* The STATUS body names the worker's backend in its route summary. */
  int found = 0;
  for (size_t i = 0; i + 4 <= len; i++) found |= !memcmp(b + i, "cuda", 4);
  assert_true(found);
  mbd_msg_destroy(&m);
}

static void test_256_sessions_concurrent_equal_alone(void **st) {
  (void)st;
  run_out *alone = calloc(NS, sizeof *alone);
  double t0 = wh_now();
  for (int i = 0; i < NS; i++) run_alone(i, &alone[i]);
  double t_alone = wh_now() - t0;
  /* All at once, phase by phase (each phase's requests in flight together). */
  mbd_msg **r = calloc(NS, sizeof *r);
  char (*sid)[64] = calloc(NS, 64);
  t0 = wh_now();
  uint64_t tg = g_h.next_tag;
  for (int i = 0; i < NS; i++) wh_send_open(&g_h);
  assert_int_equal(wh_collect(&g_h, tg, NS, r, 60000), 0);
  for (int i = 0; i < NS; i++) {
    check_final(r[i], "open", i);
    assert_int_equal(wh_str(r[i], "session", sid[i], 64), 0);
  }
  wh_free_all(r, NS);
  tg = g_h.next_tag;
  for (int i = 0; i < NS; i++) {
    int64_t ids[32], T;
    prompt_of(i, ids, &T);
    wh_send_prefill(&g_h, sid[i], ids, T, true);
  }
  assert_int_equal(wh_collect(&g_h, tg, NS, r, 60000), 0);
  for (int i = 0; i < NS; i++) check_final(r[i], "prefill", i);
  wh_free_all(r, NS);
  tg = g_h.next_tag;
  for (int i = 0; i < NS; i++) send_gen(i, sid[i]);
  assert_int_equal(wh_collect(&g_h, tg, NS, r, 120000), 0);
  int mism = 0;
  for (int i = 0; i < NS; i++) {
    check_final(r[i], "generate", i);
    int64_t toks[GEN];
    int n = wh_tokens(r[i], toks, GEN);
    if (n != alone[i].ntoks || memcmp(toks, alone[i].toks, (size_t)n * 8)) mism++;
  }
  wh_free_all(r, NS);
  assert_int_equal(mism, 0);
  tg = g_h.next_tag;
  for (int i = 0; i < NS; i++) wh_send_step(&g_h, sid[i], (i * 7) % g_V);
  assert_int_equal(wh_collect(&g_h, tg, NS, r, 60000), 0);
  for (int i = 0; i < NS; i++) {
    check_final(r[i], "step", i);
    size_t n = 0;
    const void *p = wh_tensor(r[i], &n);
    if (n != alone[i].nstep || memcmp(p, alone[i].step_logits, n)) mism++;
  }
  wh_free_all(r, NS);
  assert_int_equal(mism, 0);
  tg = g_h.next_tag;
  for (int i = 0; i < NS; i++) sg_send_export(&g_h, sid[i]);
  assert_int_equal(wh_collect(&g_h, tg, NS, r, 60000), 0);
  for (int i = 0; i < NS; i++) {
    check_final(r[i], "export", i);
    size_t n = 0;
    const void *p = wh_tensor(r[i], &n);
    if (n != alone[i].nblob || memcmp(p, alone[i].blob, n)) mism++;
  }
  wh_free_all(r, NS);
  assert_int_equal(mism, 0);
  double t_conc = wh_now() - t0;
  printf("256 sessions: alone (one after another) %.2f s, concurrent %.2f s; tokens, step logits "
         "and exported state bytes identical for all %d\n",
         t_alone, t_conc, NS);
  /* Distinct sessions really diverged (the comparison is not vacuous). */
  int differ = 0;
  for (int i = 1; i < NS; i++) differ += memcmp(alone[i].toks, alone[0].toks, GEN * 8) != 0;
  assert_true(differ > NS / 2);
  for (int i = 0; i < NS; i++) {
    free(alone[i].step_logits);
    free(alone[i].blob);
  }
  free(alone);
  free(r);
  free(sid);
}

static void test_1000_identical_among_traffic(void **st) {
  (void)st;
  int64_t P[24];
  uint64_t s = 4242;
  for (int t = 0; t < 24; t++) P[t] = (int64_t)(sg_rng(&s) % (uint64_t)g_V);
  mbd_msg *ref = wh_wait(&g_h, wh_send_forward(&g_h, P, 1, 24, false), 30000);
  check_final(ref, "forward alone", 0);
  size_t nref = 0;
  uint8_t *want = sg_payload(ref, &nref);
  mbd_msg_destroy(&ref);
  assert_int_equal(nref, (size_t)(24 * g_V * 4));
  /* Background: 32 generating sessions. */
  char sid[32][64];
  for (int i = 0; i < 32; i++) {
    mbd_msg *m = wh_open(&g_h, sid[i], 64);
    check_final(m, "open", i);
    mbd_msg_destroy(&m);
    int64_t ids[32], T;
    prompt_of(500 + i, ids, &T);
    m = wh_wait(&g_h, wh_send_prefill(&g_h, sid[i], ids, T, true), 30000);
    check_final(m, "prefill", i);
    mbd_msg_destroy(&m);
  }
  const size_t NT = NSAME + 600;
  mbd_msg **r = calloc(NT + 32, sizeof *r);
  uint8_t *is_same = calloc(NT + 32, 1);
  uint64_t tg = g_h.next_tag;
  for (int i = 0; i < 32; i++) wh_send_generate(&g_h, sid[i], 40, 0.0, 0);
  size_t sent = 32, nsame = 0;
  int64_t buf[4 * 40];
  while (sent < NT + 32) {
    bool same = nsame < NSAME && (sg_rng(&s) % 8 < 5 || sent + (NSAME - nsame) >= NT + 32);
    if (same) {
      is_same[sent] = 1;
      wh_send_forward(&g_h, P, 1, 24, false);
      nsame++;
    } else { /* random other traffic: other shapes and prompts */
      int64_t B = 1 + (int64_t)(sg_rng(&s) % 4), T = 1 + (int64_t)(sg_rng(&s) % 40);
      for (int64_t k = 0; k < B * T; k++) buf[k] = (int64_t)(sg_rng(&s) % (uint64_t)g_V);
      wh_send_forward(&g_h, buf, B, T, sg_rng(&s) % 2);
    }
    sent++;
  }
  assert_int_equal(nsame, NSAME);
  assert_int_equal(wh_collect(&g_h, tg, NT + 32, r, 300000), 0);
  size_t distinct_bad = 0, finals = 0;
  for (size_t i = 0; i < NT + 32; i++) {
    check_final(r[i], "traffic", (int)i);
    finals++;
    if (!is_same[i]) continue;
    size_t n = 0;
    const void *p = wh_tensor(r[i], &n);
    if (n != nref || memcmp(p, want, n)) distinct_bad++;
  }
  printf("%d identical forwards among %zu other requests: %zu differ from the lone run (1 distinct "
         "output when 0)\n",
         NSAME, finals - NSAME, distinct_bad);
  assert_int_equal(distinct_bad, 0);
  wh_free_all(r, NT + 32);
  free(r);
  free(is_same);
  free(want);
}

/* A state blob claiming another route (the CPU worker's) is refused with
 * STATE, a truncated one with FORMAT, and the worker keeps serving. */
static void test_foreign_blob_refused(void **st) {
  (void)st;
  char sid[64];
  mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
  check_final(m, "open", 0);
  mbd_msg_destroy(&m);
  int64_t ids[3] = {1, 2, 3};
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, ids, 3, true), 30000);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_export(&g_h, sid), 30000);
  check_final(m, "export", 0);
  char rid[80] = "";
  wh_str(m, "route_id", rid, sizeof rid);
  size_t n;
  uint8_t *blob = sg_payload(m, &n);
  mbd_msg_destroy(&m);
  /* GPU export uses the CPU model's state format. */
  assert_memory_equal(blob + 256, "MBDMSTA1", 8);
  uint8_t *other = malloc(n);
  memcpy(other, blob, n);
  memset(other + 168, 0, 72);
  memcpy(other + 168, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64);
  m = wh_wait(&g_h, sg_send_import(&g_h, other, n, rid), 30000);
  assert_int_equal(wh_code(m), MBD_E_STATE);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_import(&g_h, blob, n - 8, rid), 30000);
  assert_int_not_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, sg_send_import(&g_h, blob, n, rid), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  free(other);
  free(blob);
}

static int64_t argmax(const float *l, int64_t V) {
  int64_t b = 0;
  for (int64_t i = 1; i < V; i++)
    if (l[i] > l[b]) b = i;
  return b;
}

static void test_generate_equals_step_loop_and_fixture(void **st) {
  (void)st;
  wh_fixture f;
  assert_int_equal(wh_fixture_load(&g_h, &f), 0);
  for (int64_t b = 0; b < f.B; b++) {
    const int64_t *prompt = f.ids + b * f.T;
    char sa[64], sb[64];
    mbd_msg *m = wh_open(&g_h, sa, sizeof sa);
    check_final(m, "open", 0);
    mbd_msg_destroy(&m);
    m = wh_open(&g_h, sb, sizeof sb);
    check_final(m, "open", 1);
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, wh_send_prefill(&g_h, sa, prompt, f.T, true), 30000);
    check_final(m, "prefill", 0);
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, wh_send_prefill(&g_h, sb, prompt, f.T, true), 30000);
    check_final(m, "prefill", 1);
    size_t n = 0;
    float *lg = (float *)sg_payload(m, &n);
    mbd_msg_destroy(&m);
    /* sb: host argmax + STEP, G times (the last STEP consumes the last token) */
    int64_t G = f.G, tb[64], ta[64];
    assert_true(G <= 64);
    for (int64_t k = 0; k < G; k++) {
      tb[k] = argmax(lg, g_V);
      free(lg);
      m = wh_wait(&g_h, wh_send_step(&g_h, sb, tb[k]), 30000);
      check_final(m, "step", (int)k);
      lg = (float *)sg_payload(m, &n);
      mbd_msg_destroy(&m);
    }
    free(lg);
    m = wh_wait(&g_h, wh_send_generate(&g_h, sa, G, 0.0, 0), 30000);
    check_final(m, "generate", 0);
    assert_int_equal(wh_tokens(m, ta, 64), G);
    mbd_msg_destroy(&m);
    assert_memory_equal(ta, tb, (size_t)G * 8);
    assert_memory_equal(ta, f.greedy + b * (f.T + G) + f.T, (size_t)G * 8);
    m = wh_wait(&g_h, sg_send_export(&g_h, sa), 30000);
    size_t na = 0, nb = 0;
    uint8_t *ea = sg_payload(m, &na);
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, sg_send_export(&g_h, sb), 30000);
    uint8_t *eb = sg_payload(m, &nb);
    mbd_msg_destroy(&m);
    assert_int_equal(na, nb);
    assert_memory_equal(ea, eb, na);
    free(ea);
    free(eb);
  }
  printf("GENERATE greedy (device pick) == STEP loop (host argmax) == fixture for %lld prompts; "
         "exported states identical\n",
         (long long)f.B);
  wh_fixture_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registration_is_cuda),
      cmocka_unit_test(test_generate_equals_step_loop_and_fixture),
      cmocka_unit_test(test_256_sessions_concurrent_equal_alone),
      cmocka_unit_test(test_1000_identical_among_traffic),
      cmocka_unit_test(test_foreign_blob_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
