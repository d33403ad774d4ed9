/* 32 sessions generating at once through the real broker and worker: the
 * worker batches their steps (one model step per tick), and each session's
 * tokens and following logits equal the same session run alone, bit for bit;
 * the greedy ones equal the fixture's greedy tokens. Half the sessions sample
 * (temperature, top_k, seed), so batch-invariance of sampling is covered too.
 * Batching is checked through the FINAL's `peak_batch` (rows of the largest
 * step a loop ran in), not through reply order, which depends on scheduling. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define NS 32
#define PROBE_TOKEN 7

static wh g_h;
static wh_fixture g_f;

typedef struct run {
  int64_t tokens[64];
  int ntok;
  float *logits; /* [V] after PROBE_TOKEN */
} run;

static bool sampled(int i) { return i % 2 == 1; }

static uint64_t send_gen(const char *sid, int i) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, sampled(i) ? 6 : 3);
  mbd_pack_kv_str(&k.pk, "session", sid);
  mbd_pack_kv_i64(&k.pk, "max_tokens", g_f.G);
  mbd_pack_kv_i64(&k.pk, "partial_every", 2);
  if (sampled(i)) {
    mbd_pack_kv_f64(&k.pk, "temperature", 0.9);
    mbd_pack_kv_i64(&k.pk, "top_k", 50);
    mbd_pack_kv_u64(&k.pk, "seed", 1000 + (uint64_t)i);
  }
  return wh_send(&g_h, MBD_CMD_GENERATE, &k.sb, 0, NULL, NULL);
}

static void open_session(char *sid) {
  mbd_msg *m = wh_open(&g_h, sid, 64);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

static void test_concurrent(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  assert_int_equal(wh_fixture_load(&g_h, &g_f), 0);
  const int64_t T = g_f.T, V = g_f.V, G = g_f.G;
  wh_start_broker(&g_h);
  wh_start_worker(&g_h, "wA", "--capacity", "64", "--client-sessions", "64", "--max-batch", "64",
                  NULL);
  assert_int_equal(wh_wait_workers(&g_h, 1, 30000), 0);
  static run alone[NS], conc[NS];
  /* Alone: one session at a time. */
  double t_alone = wh_now();
  for (int i = 0; i < NS; i++) {
    char sid[64];
    open_session(sid);
    mbd_msg *m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, g_f.ids + (i % 3) * T, T, true), 30000);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, send_gen(sid, i), 60000);
    assert_int_equal(wh_code(m), 0);
    alone[i].ntok = wh_tokens(m, alone[i].tokens, 64);
    assert_int_equal(alone[i].ntok, G);
    assert_int_equal(wh_i64(m, "peak_batch"), 1); /* nothing else ran: the field is honest */
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, wh_send_step(&g_h, sid, PROBE_TOKEN), 30000);
    assert_int_equal(wh_code(m), 0);
    size_t len;
    const void *p = wh_tensor(m, &len);
    assert_int_equal(len, (size_t)V * 4);
    alone[i].logits = malloc(len);
    memcpy(alone[i].logits, p, len);
    mbd_msg_destroy(&m);
    if (!sampled(i))
      assert_memory_equal(alone[i].tokens, g_f.greedy + (i % 3) * (T + G) + T, (size_t)G * 8);
  }
  t_alone = wh_now() - t_alone;
  /* Concurrent: open + prefill all, then 32 GENERATEs in flight at once. */
  char sids[NS][64];
  for (int i = 0; i < NS; i++) open_session(sids[i]);
  uint64_t tags[NS];
  for (int i = 0; i < NS; i++)
    tags[i] = wh_send_prefill(&g_h, sids[i], g_f.ids + (i % 3) * T, T, true);
  for (int i = 0; i < NS; i++) {
    mbd_msg *m = wh_wait(&g_h, tags[i], 30000);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
  }
  double t_gen = wh_now();
  for (int i = 0; i < NS; i++) tags[i] = send_gen(sids[i], i);
  int done = 0;
  int64_t peak = 0;
  double end = wh_now() + 120;
  while (done < NS && wh_now() < end) {
    mbd_msg *m = wh_recv(&g_h, 200);
    if (!m) continue;
    int i = -1;
    for (int k = 0; k < NS; k++)
      if (tags[k] == mbd_msg_tag(m)) i = k;
    assert_true(i >= 0);
    if (mbd_msg_cmd(m) != MBD_CMD_PARTIAL) {
      assert_int_equal(wh_code(m), 0);
      assert_int_equal(conc[i].ntok, 0); /* exactly one FINAL per request */
      conc[i].ntok = wh_tokens(m, conc[i].tokens, 64);
      int64_t p = wh_i64(m, "peak_batch");
      assert_in_range(p, 1, NS);
      if (p > peak) peak = p;
      done++;
    }
    mbd_msg_destroy(&m);
  }
  assert_int_equal(done, NS);
  t_gen = wh_now() - t_gen;
  fprintf(stderr,
          "solo phase (open+prefill+generate %lld+step, x%d, sequential): %.2f s; "
          "%d concurrent GENERATEs of %lld tokens: %.3f s = %.0f tokens/s\n",
          (long long)G, NS, t_alone, NS, (long long)G, t_gen, (double)(NS * G) / t_gen);
  /* Batched: all 32 GENERATEs were sent before any reply was read, so unless
   * the worker runs loops one at a time some step held several of them. */
  fprintf(stderr, "largest batched step of the concurrent GENERATEs: %lld rows\n",
          (long long)peak);
  assert_true(peak > 1);
  /* Probe STEPs all at once: batched, yet each equals its alone run. */
  for (int i = 0; i < NS; i++) tags[i] = wh_send_step(&g_h, sids[i], PROBE_TOKEN);
  for (int i = 0; i < NS; i++) {
    mbd_msg *m = wh_wait(&g_h, tags[i], 30000);
    assert_int_equal(wh_code(m), 0);
    size_t len;
    const void *p = wh_tensor(m, &len);
    assert_int_equal(len, (size_t)V * 4);
    assert_int_equal(conc[i].ntok, alone[i].ntok);
    assert_memory_equal(conc[i].tokens, alone[i].tokens, (size_t)G * 8);
    assert_memory_equal(p, alone[i].logits, (size_t)V * 4);
    mbd_msg_destroy(&m);
    free(alone[i].logits);
  }
  /* Sampling really sampled: some sampled run differs from greedy. */
  int differ = 0;
  for (int i = 1; i < NS; i += 2)
    differ += memcmp(alone[i].tokens, g_f.greedy + (i % 3) * (T + G) + T, (size_t)G * 8) != 0;
  assert_true(differ > 0);
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
