/* The prefix state cache through the real processes: a broker and two CPU
 * workers, 1000 sessions whose prompts share a 512-token prefix (OPEN with the
 * prompt's routing hashes, PREFILL last_only with a cache point, GENERATE 2
 * greedy tokens, CLOSE). The logits and tokens equal by memcmp those of the
 * same requests on workers with the cache off, hits are counted in STATUS,
 * a second model never hits the first's entries, the broker opens sessions
 * on the worker that advertises the prompt's prefix, `mambad status` shows
 * the counters, and under a 1 MiB budget with 8-token blocks (evicting all
 * the time) the results are still identical. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/mambad.h"
#include "kernels/model/synth.h"
#include "support/events.h"
#include "support/wh_prefix.h"
#include "support/worker_harness.h"

#define NREQ 1000
#define NREQ2 50   /* requests for the second model */
#define NEVICT 200 /* requests under the tiny budget */
#define PFX 512
#define SUFFIX_MAX 8
#define GEN 2

static wh g_h;
static mbd_client *g_c;
static int64_t g_V;

/* Prompt i of family f: the shared prefix of f, then i % 9 tokens of its own. */
static int64_t prompt(int f, int i, int64_t *ids) {
  for (int j = 0; j < PFX; j++) ids[j] = (j * (13 + 4 * f) + 5 + f) % 512;
  int64_t n = PFX + i % (SUFFIX_MAX + 1);
  for (int64_t j = PFX; j < n; j++) ids[j] = (i * 31 + j * 7) % 512;
  return n;
}

/* One request: logits [V] after the prompt and GEN greedy tokens. */
static void run_one(const char *model, int f, int i, float *logits, int64_t *toks) {
  int64_t ids[PFX + SUFFIX_MAX];
  int64_t n = prompt(f, i, ids);
  wh_prefix_request(g_c, model, ids, n, PFX, g_V, GEN, i, logits, toks);
}

static bool stats_of(const char *name, mbd_prefix_cache_info *x) {
  return wh_prefix_stats(g_c, name, x);
}

static void wait_count(size_t n) { wh_wait_listed(g_c, n, 30000); }

/* Waits until the two workers' reported lookups add up to n (either may
 * have served none: once one advertises the prefix, the broker prefers it). */
static void wait_sum(const char *a, const char *b, int64_t n, mbd_prefix_cache_info *x,
                     mbd_prefix_cache_info *y) {
  for (int k = 0; k < 300; k++) {
    stats_of(a, x);
    stats_of(b, y);
    if (x->lookups + y->lookups >= n) return;
    ev_nap_ms(50);
  }
  fail_msg("workers %s and %s never reported %lld lookups", a, b, (long long)n);
}

/* Waits until `name`'s reported counters satisfy inserts >= ins and lookups >= lk. */
static void wait_stats(const char *name, int64_t lk, int64_t ins, mbd_prefix_cache_info *x) {
  for (int k = 0; k < 300; k++) {
    if (stats_of(name, x) && x->lookups >= lk && x->inserts >= ins) return;
    ev_nap_ms(50);
  }
  fail_msg("worker %s never reported %lld lookups and %lld inserts", name, (long long)lk,
           (long long)ins);
}

static void start_pair(const char *a, const char *b, const char *model2, const char *const *extra) {
  for (int k = 0; k < 2; k++)
    wh_start_worker(&g_h, k ? b : a, "--model", model2, extra[0], extra[1], extra[2], extra[3],
                    NULL);
  wait_count(2);
}

static void stop_all(void) {
  for (int i = 0; i < g_h.nprocs; i++)
    if (g_h.procs[i]) {
      assert_int_equal(wh_stop(g_h.procs[i], SIGTERM), 0);
      g_h.procs[i] = 0;
    }
  wait_count(0);
}

static void test_prefix_cache(void **state) {
  (void)state;
  wh_init_or_skip(&g_h);
  /* A second model: other weights, same vocabulary. */
  char dir2[600], model2[700], cmd[700];
  snprintf(dir2, sizeof dir2, "%s/tiny2", g_h.dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir2);
  assert_int_equal(system(cmd), 0);
  mbd_mamba_config cfg;
  mbd_synth_custom(32, 2, 512, &cfg);
  mbd_error err = {0};
  assert_int_equal(mbd_synth_write(&cfg, MBD_DTYPE_F32, 7, dir2, &err), 0);
  snprintf(model2, sizeof model2, "tiny2=%s", dir2);
  wh_start_broker(&g_h);
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 60000;
  assert_int_equal(mbd_client_new(g_h.clients, &co, &g_c, &err), 0);
  g_V = 512;
  size_t lb = (size_t)g_V * 4;
  float *ref = malloc(NREQ * lb), *got = malloc(lb), *ref2 = malloc(NREQ2 * lb);
  int64_t (*rtok)[GEN] = malloc(NREQ * sizeof *rtok), (*rtok2)[GEN] = malloc(NREQ2 * sizeof *rtok2);
  int64_t gtok[GEN];
  assert_non_null(ref && got && ref2 && rtok && rtok2);

  /* Cache off: the reference bits. */
  const char *off[4] = {"--prefix-cache-mb", "0", NULL, NULL};
  start_pair("offA", "offB", model2, off);
  mbd_prefix_cache_info x, y;
  assert_false(stats_of("offA", &x));
  for (int i = 0; i < NREQ; i++) run_one("tiny", 0, i, ref + (size_t)i * g_V, rtok[i]);
  for (int i = 0; i < NREQ2; i++) run_one("tiny2", 0, i, ref2 + (size_t)i * g_V, rtok2[i]);
  stop_all();

  /* Cache on (the defaults: 256 MiB per model, 256-token blocks). */
  const char *on[4] = {"--slice-tokens", "512", NULL, NULL};
  start_pair("onA", "onB", model2, on);
  for (int i = 0; i < NREQ; i++) {
    run_one("tiny", 0, i, got, gtok);
    assert_memory_equal(got, ref + (size_t)i * g_V, lb);
    assert_memory_equal(gtok, rtok[i], sizeof gtok);
  }
  wait_sum("onA", "onB", NREQ, &x, &y);
  printf("cache on: onA %lld lookups %lld hits %lld hit tokens %lld entries; onB %lld lookups "
         "%lld hits %lld hit tokens %lld entries\n",
         (long long)x.lookups, (long long)x.hits, (long long)x.hit_tokens, (long long)x.entries,
         (long long)y.lookups, (long long)y.hits, (long long)y.hit_tokens, (long long)y.entries);
  assert_int_equal(x.lookups + y.lookups, NREQ);
  /* Only the first request on each worker can miss. */
  assert_true(x.hits + y.hits >= NREQ - 2);
  assert_true(x.hit_tokens + y.hit_tokens >= (int64_t)(NREQ - 2) * PFX);
  assert_int_equal(x.evictions + y.evictions, 0);
  /* `mambad status` shows the counters. */
  char line[512], cli[1200];
  snprintf(cli, sizeof cli, "'%s/mambad' status --connect '%s'", g_h.bin, g_h.clients);
  FILE *f = popen(cli, "r");
  assert_non_null(f);
  int shown = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "prefix cache:") && strstr(line, " hits")) shown++;
  assert_int_equal(pclose(f), 0);
  assert_int_equal(shown, 2);

  /* The second model shares nothing with the first: its first request misses. */
  int64_t hits0 = x.hits + y.hits, look0 = x.lookups + y.lookups;
  run_one("tiny2", 0, 0, got, gtok);
  assert_memory_equal(got, ref2, lb);
  assert_memory_equal(gtok, rtok2[0], sizeof gtok);
  for (int k = 0; k < 100; k++) {
    stats_of("onA", &x);
    stats_of("onB", &y);
    if (x.lookups + y.lookups > look0) break;
    ev_nap_ms(50);
  }
  assert_int_equal(x.lookups + y.lookups, look0 + 1);
  assert_int_equal(x.hits + y.hits, hits0);
  for (int i = 1; i < NREQ2; i++) {
    run_one("tiny2", 0, i, got, gtok);
    assert_memory_equal(got, ref2 + (size_t)i * g_V, lb);
    assert_memory_equal(gtok, rtok2[i], sizeof gtok);
  }

  /* Broker preference: once a worker advertises a new prefix, sessions whose
   * prompts start with it are opened there. */
  mbd_prefix_cache_info a0, b0, a1, b1;
  for (int k = 0; k < 100; k++) { /* settle: every earlier lookup reported */
    stats_of("onA", &a0);
    stats_of("onB", &b0);
    if (a0.lookups + b0.lookups == NREQ + NREQ2) break;
    ev_nap_ms(50);
  }
  assert_int_equal(a0.lookups + b0.lookups, NREQ + NREQ2);
  float l1[512];
  int64_t t1[GEN];
  run_one("tiny", 1, 0, l1, t1); /* a new prefix: stored on one worker */
  for (int k = 0; k < 100; k++) {
    stats_of("onA", &a1);
    stats_of("onB", &b1);
    if (a1.inserts + b1.inserts > a0.inserts + b0.inserts) break;
    ev_nap_ms(50);
  }
  bool on_a = a1.inserts > a0.inserts;
  assert_true(on_a != (b1.inserts > b0.inserts));
  for (int i = 1; i <= 20; i++) run_one("tiny", 1, i, got, gtok);
  const char *holder = on_a ? "onA" : "onB", *other = on_a ? "onB" : "onA";
  mbd_prefix_cache_info h1 = on_a ? a1 : b1, o1 = on_a ? b1 : a1, h2, o2;
  wait_stats(holder, h1.lookups + 20, 0, &h2);
  stats_of(other, &o2);
  printf("preference: %s took %lld of 20 sessions (%lld hits), %s %lld\n", holder,
         (long long)(h2.lookups - h1.lookups), (long long)(h2.hits - h1.hits), other,
         (long long)(o2.lookups - o1.lookups));
  assert_int_equal(h2.lookups - h1.lookups, 20);
  assert_int_equal(h2.hits - h1.hits, 20);
  assert_int_equal(o2.lookups, o1.lookups);
  stop_all();

  /* A 1 MiB budget with 8-token blocks: ~65 entries per prompt, evicting
   * all the time; the bits do not change. */
  const char *tiny_budget[4] = {"--prefix-cache-mb", "1", "--prefix-block", "8"};
  start_pair("evA", "evB", model2, tiny_budget);
  for (int i = 0; i < NEVICT; i++) {
    run_one("tiny", 0, i, got, gtok);
    assert_memory_equal(got, ref + (size_t)i * g_V, lb);
    assert_memory_equal(gtok, rtok[i], sizeof gtok);
  }
  wait_sum("evA", "evB", NEVICT, &x, &y);
  assert_int_equal(x.lookups + y.lookups, NEVICT);
  printf("tiny budget: %lld lookups, %lld hits, %lld evictions, %lld + %lld bytes held\n",
         (long long)(x.lookups + y.lookups), (long long)(x.hits + y.hits),
         (long long)(x.evictions + y.evictions), (long long)x.bytes,
         (long long)y.bytes);
  assert_true(x.evictions + y.evictions > 0);
  assert_true(x.hits + y.hits >= NEVICT - 2);
  assert_true(x.bytes <= (1 << 20) && y.bytes <= (1 << 20));

  mbd_client_destroy(&g_c);
  free(ref);
  free(got);
  free(ref2);
  free(rtok);
  free(rtok2);
  wh_fini(&g_h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_prefix_cache)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
