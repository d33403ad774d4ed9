/* The prefix state cache on a GPU worker (real mambad-broker and one
 * mambad-worker --device cuda:0 at a time): three families of prompts that
 * share a 512-token prefix (OPEN with the prompt's routing hashes, PREFILL
 * last_only with a cache point, GENERATE 2 greedy tokens, CLOSE), run
 *  - with the cache off: the reference bits;
 *  - with the defaults (device tier on): every hit served from device memory;
 *  - with a 1 MiB device tier and 8-token blocks: a family's boundaries do
 *    not fit, entries leave the device all the time and hit ones are demoted
 *    to host memory, then hit there;
 *  - with the device tier off (host memory only);
 * and every logit and token equals the reference by memcmp. Prompts that
 * share nothing, through the 1 MiB device tier, demote nothing.
 * Exits 77 with a reason when no CUDA device is present. */
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
#include "support/service_gpu.h"
#include "support/wh_prefix.h"

#define NFAM 3
#define ROUNDS 4
#define NREQ (NFAM * ROUNDS * 2)
#define PFX 512
#define SUFFIX_MAX 8
#define GEN 2
#define V 512

static wh g_h;
static mbd_client *g_c;

/* Request k: round r = k / 6, family f, then the family's 2r-th or
 * (2r+1)-th prompt, so each family gets two requests in a row per round. */
static void request_of(int k, int *f, int *i) {
  int r = k / (2 * NFAM), w = k % (2 * NFAM);
  *f = w / 2;
  *i = 2 * r + w % 2;
}

/* Prompt i of family f: the shared prefix of f, then i % 9 tokens of its own. */
static int64_t prompt(int f, int i, int64_t *ids) {
  for (int j = 0; j < PFX; j++) ids[j] = (j * (13 + 4 * f) + 5 + f) % V;
  int64_t n = PFX + i % (SUFFIX_MAX + 1);
  for (int64_t j = PFX; j < n; j++) ids[j] = (i * 31 + j * 7 + f) % V;
  return n;
}

/* Request (f, i): logits [V] after the prompt and GEN greedy tokens. */
static void run_one(int f, int i, float *logits, int64_t *toks) {
  int64_t ids[PFX + SUFFIX_MAX];
  int64_t n = prompt(f, i, ids);
  wh_prefix_request(g_c, "tiny", ids, n, PFX, V, GEN, f * 1000 + i, logits, toks);
}

static bool stats_of(const char *name, mbd_prefix_cache_info *x) {
  return wh_prefix_stats(g_c, name, x);
}

static void wait_count(size_t n) { wh_wait_listed(g_c, n, 60000); }

/* Starts GPU worker `name` with up to four extra flags (NULL-padded), runs
 * every request and checks it against the reference (fill: writes the
 * reference instead; unique > 0: runs that many prompts of families of
 * their own instead, unchecked), then waits for its counters (when it has
 * a cache) and stops it. */
static void phase(const char *name, const char *const *extra, bool fill, int unique, float *ref,
                  int64_t (*rtok)[GEN], mbd_prefix_cache_info *x) {
  pid_t p = wh_start_worker(&g_h, name, "--device", "cuda:0", "--capacity", "64", extra[0],
                            extra[1], extra[2], extra[3], NULL);
  wait_count(1);
  float got[V];
  int64_t gtok[GEN];
  int n = unique ? unique : NREQ;
  for (int k = 0; k < n; k++) {
    int f, i;
    request_of(k, &f, &i);
    if (unique) {
      run_one(NFAM + k, 0, got, gtok);
    } else if (fill) {
      run_one(f, i, ref + (size_t)k * V, rtok[k]);
    } else {
      run_one(f, i, got, gtok);
      assert_memory_equal(got, ref + (size_t)k * V, sizeof got);
      assert_memory_equal(gtok, rtok[k], sizeof gtok);
    }
  }
  /* The reference run has no cache; the others report every lookup. */
  for (int k = 0; k < 300; k++) {
    bool has = stats_of(name, x);
    if (has ? x->lookups >= n : fill) break;
    ev_nap_ms(50);
  }
  if (stats_of(name, x))
    printf("%s: %lld lookups, %lld hits (%lld device), %lld entries (%lld device, %lld bytes), "
           "%lld demotions, %lld evictions\n",
           name, (long long)x->lookups, (long long)x->hits, (long long)x->device_hits,
           (long long)x->entries, (long long)x->device_entries, (long long)x->device_bytes,
           (long long)x->demotions, (long long)x->evictions);
  assert_int_equal(wh_stop(p, SIGTERM), 0);
  for (int i = 0; i < g_h.nprocs; i++)
    if (g_h.procs[i] == p) g_h.procs[i] = 0;
  wait_count(0);
}

static void test_prefix_cache_gpu(void **state) {
  (void)state;
  sg_init_or_skip(&g_h, 1);
  wh_start_broker(&g_h);
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 120000;
  mbd_error err = {0};
  assert_int_equal(mbd_client_new(g_h.clients, &co, &g_c, &err), 0);
  float *ref = malloc((size_t)NREQ * V * sizeof *ref);
  int64_t(*rtok)[GEN] = malloc(NREQ * sizeof *rtok);
  assert_non_null(ref && rtok);
  mbd_prefix_cache_info x;

  /* Cache off: the reference bits. */
  const char *off[4] = {"--prefix-cache-mb", "0", NULL, NULL};
  phase("off", off, true, 0, ref, rtok, &x);
  assert_int_equal(x.lookups, 0);

  /* The defaults: the device tier holds everything; only each family's
   * first request misses. */
  const char *dflt[4] = {NULL, NULL, NULL, NULL};
  phase("default", dflt, false, 0, ref, rtok, &x);
  assert_int_equal(x.lookups, NREQ);
  assert_true(x.hits >= NREQ - NFAM);
  assert_int_equal(x.device_hits, x.hits);
  assert_int_equal(x.demotions, 0);
  assert_true(x.device_entries > 0 && x.device_bytes > 0);

  /* A 1 MiB device tier and 8-token blocks: each family's 64 boundaries
   * overflow it; the prefix hit in round r is demoted while the next
   * families store theirs, and hit in host memory in round r + 1. */
  const char *tiny[4] = {"--prefix-cache-device-mb", "1", "--prefix-block", "8"};
  phase("tiny", tiny, false, 0, ref, rtok, &x);
  assert_int_equal(x.lookups, NREQ);
  assert_true(x.device_hits > 0);
  assert_true(x.demotions > 0);
  assert_true(x.hits - x.device_hits > 0);
  assert_true(x.evictions > 0);
  assert_true(x.device_bytes <= (1 << 20));

  /* Prompts that share nothing, through the same 1 MiB device tier: entries
   * leave it unhit, so none is demoted (no state goes device to host). */
  phase("unique", tiny, false, 6, ref, rtok, &x);
  assert_int_equal(x.lookups, 6);
  assert_int_equal(x.hits, 0);
  assert_int_equal(x.demotions, 0);
  assert_true(x.evictions > 0);
  assert_true(x.device_entries > 0);

  /* The device tier off: host memory only, as on a CPU worker. */
  const char *host[4] = {"--prefix-cache-device-mb", "0", NULL, NULL};
  phase("host", host, false, 0, ref, rtok, &x);
  assert_int_equal(x.lookups, NREQ);
  assert_true(x.hits >= NREQ - NFAM);
  assert_int_equal(x.device_hits, 0);
  assert_int_equal(x.device_entries, 0);
  assert_int_equal(x.demotions, 0);

  mbd_client_destroy(&g_c);
  free(ref);
  free(rtok);
  wh_fini(&g_h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_prefix_cache_gpu)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
