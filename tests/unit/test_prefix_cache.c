/* The prefix state cache (worker/prefix_cache.h) and the prefix hashes it
 * shares with libmambad (common/prefix_hash.h): boundaries, the longest held
 * prefix wins, stored tokens are compared, LRU eviction within the budget, an
 * entry over the budget is not kept, keys differ across routes, digests and
 * model names, and the routing hashes a client computes are the worker's.
 * The device tier over a stand-in for the backend's stashes (host buffers):
 * entries go there first, hit entries leaving it are demoted to the host
 * tier with the same bytes, unhit ones are dropped without a copy, stashes
 * are reused, and a device without room shrinks the tier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/prefix_hash.h"
#include "worker/prefix_cache.h"

#define V 8
#define SB 100 /* state image bytes in these tests */

typedef struct fill_arg {
  uint8_t tag; /* every state byte */
  int calls;
} fill_arg;

/* Writes the tag into the host image, or into the fake device stash. */
static int fill(void *ctx, void *state, void *stash, size_t n, float *logits, mbd_error *err) {
  (void)err;
  fill_arg *a = ctx;
  memset(state ? state : stash, a->tag, n);
  for (int i = 0; i < V; i++) logits[i] = (float)a->tag + (float)i;
  a->calls++;
  return MBD_OK;
}

static int fill_fail(void *ctx, void *state, void *stash, size_t n, float *logits,
                     mbd_error *err) {
  (void)ctx, (void)state, (void)stash, (void)n, (void)logits;
  return mbd_error_set(err, MBD_E_IO, "device said no");
}

static void test_boundaries(void **state) {
  (void)state;
  int64_t out[16];
  const int64_t pts[] = {8, 3, 0, 11, 8, -2};
  assert_int_equal(mbd_prefix_boundaries(10, 4, pts, 6, out, 16), 3);
  assert_int_equal(out[0], 3);
  assert_int_equal(out[1], 4);
  assert_int_equal(out[2], 8);
  assert_int_equal(mbd_prefix_boundaries(12, 4, NULL, 0, out, 16), 3); /* 4 8 12 */
  assert_int_equal(out[2], 12);
  assert_int_equal(mbd_prefix_boundaries(3, 4, NULL, 0, out, 16), 0);
  assert_int_equal(mbd_prefix_boundaries(10, 0, pts, 6, out, 16), 2); /* points only */
  assert_int_equal(mbd_prefix_boundaries(100, 1, NULL, 0, out, 4), 100); /* counts past cap */
  assert_int_equal(out[3], 4);
}

static void test_route_hashes(void **state) {
  (void)state;
  int64_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = i * 7 % 13;
  mbd_pcache *c = NULL;
  assert_int_equal(mbd_pcache_new(1 << 20, "m", "d1", "r1", V, &c, NULL), 0);
  mbd_pcache_plan *p = NULL;
  const int64_t pts[] = {10};
  assert_int_equal(mbd_pcache_plan_new(c, ids, 40, 16, pts, 1, &p, NULL), 0);
  assert_non_null(p);
  assert_int_equal(p->n, 3); /* 10 16 32 */
  uint64_t h[8];
  assert_int_equal(mbd_prefix_route_hashes("m", ids, 40, 16, pts, 1, h, 8), 3);
  for (size_t i = 0; i < 3; i++) assert_true(h[i] == p->route[i]);
  /* Capped: the longest ones. */
  uint64_t h2[2];
  assert_int_equal(mbd_prefix_route_hashes("m", ids, 40, 16, pts, 1, h2, 2), 2);
  assert_true(h2[0] == p->route[1] && h2[1] == p->route[2]);
  /* Another model name hashes differently. */
  assert_int_equal(mbd_prefix_route_hashes("m2", ids, 40, 16, pts, 1, h, 8), 3);
  assert_true(h[0] != p->route[0]);
  mbd_pcache_plan_free(&p);
  assert_null(p);
  mbd_pcache_destroy(&c);
  assert_null(c);
}

static void test_longest_hit_and_tokens(void **state) {
  (void)state;
  int64_t ids[64];
  for (int i = 0; i < 64; i++) ids[i] = i;
  mbd_pcache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_pcache_new(1 << 20, "m", "d", "r", V, &c, &err), 0);
  mbd_pcache_plan *p = NULL;
  assert_int_equal(mbd_pcache_plan_new(c, ids, 64, 16, NULL, 0, &p, &err), 0);
  assert_int_equal(p->n, 4);
  mbd_pcache_hit hit;
  assert_false(mbd_pcache_lookup(c, p, ids, &hit));
  fill_arg a = {.tag = 1};
  assert_int_equal(mbd_pcache_insert(c, p, 0, ids, SB, fill, &a, &err), 0);
  a.tag = 2;
  assert_int_equal(mbd_pcache_insert(c, p, 2, ids, SB, fill, &a, &err), 0);
  assert_int_equal(mbd_pcache_insert(c, p, 2, ids, SB, fill, &a, &err), 0); /* held: no fill */
  assert_int_equal(a.calls, 2);
  assert_int_equal(mbd_pcache_insert(c, p, 3, ids, SB, fill_fail, NULL, &err), MBD_E_IO);
  assert_true(mbd_pcache_contains(c, p, 0, ids));
  assert_false(mbd_pcache_contains(c, p, 1, ids));
  assert_false(mbd_pcache_contains(c, p, 3, ids));
  p->next = 0;
  assert_true(mbd_pcache_lookup(c, p, ids, &hit));
  assert_int_equal(hit.pos, 48);
  assert_int_equal(p->next, 3);
  assert_int_equal(hit.state_bytes, SB);
  assert_int_equal(((const uint8_t *)hit.state)[SB - 1], 2);
  assert_true(hit.logits[3] == 5.0f);
  /* A prompt that differs at token 20 (after the first block) hits only 16. */
  int64_t other[64];
  memcpy(other, ids, sizeof ids);
  other[20] = 999;
  mbd_pcache_plan *q = NULL;
  assert_int_equal(mbd_pcache_plan_new(c, other, 64, 16, NULL, 0, &q, &err), 0);
  assert_true(mbd_pcache_lookup(c, q, other, &hit));
  assert_int_equal(hit.pos, 16);
  assert_int_equal(((const uint8_t *)hit.state)[0], 1);
  /* The key matches but the tokens given do not: never a hit (what a
   * collision would look like). */
  q->next = 0;
  int64_t wrong[64];
  memcpy(wrong, ids, sizeof ids);
  wrong[0] = 5;
  assert_false(mbd_pcache_lookup(c, p, wrong, &hit));
  mbd_pcache_stats s;
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.lookups, 4);
  assert_int_equal(s.hits, 2);
  assert_int_equal(s.hit_tokens, 64);
  assert_int_equal(s.inserts, 2);
  assert_int_equal(s.entries, 2);
  assert_int_equal(s.evictions, 0);
  assert_true(s.bytes >= 2 * (SB + V * 4));
  /* Adverts: most recently used first (16 was hit last). */
  uint64_t adv[4];
  assert_int_equal(mbd_pcache_adverts(c, adv, 4), 2);
  assert_true(adv[0] == p->route[0] && adv[1] == p->route[2]);
  mbd_pcache_plan_free(&q);
  mbd_pcache_plan_free(&p);
  mbd_pcache_destroy(&c);
}

static void test_eviction_lru(void **state) {
  (void)state;
  int64_t ids[8][32];
  for (int k = 0; k < 8; k++)
    for (int i = 0; i < 32; i++) ids[k][i] = k * 100 + i;
  /* Find one entry's bytes, then allow three. */
  mbd_pcache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_pcache_new(1 << 20, "m", "d", "r", V, &c, &err), 0);
  mbd_pcache_plan *p[8] = {0};
  fill_arg a = {.tag = 7};
  assert_int_equal(mbd_pcache_plan_new(c, ids[0], 32, 32, NULL, 0, &p[0], &err), 0);
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  mbd_pcache_stats s;
  mbd_pcache_stats_get(c, &s);
  size_t one = (size_t)s.bytes;
  mbd_pcache_plan_free(&p[0]);
  mbd_pcache_destroy(&c);
  assert_int_equal(mbd_pcache_new(3 * one, "m", "d", "r", V, &c, &err), 0);
  for (int k = 0; k < 8; k++) assert_int_equal(mbd_pcache_plan_new(c, ids[k], 32, 32, NULL, 0, &p[k], &err), 0);
  for (int k = 0; k < 3; k++) assert_int_equal(mbd_pcache_insert(c, p[k], 0, ids[k], SB, fill, &a, &err), 0);
  mbd_pcache_hit hit;
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit)); /* 0 becomes most recent: 1 is oldest */
  assert_int_equal(mbd_pcache_insert(c, p[3], 0, ids[3], SB, fill, &a, &err), 0);
  assert_true(mbd_pcache_contains(c, p[0], 0, ids[0]));
  assert_false(mbd_pcache_contains(c, p[1], 0, ids[1]));
  assert_true(mbd_pcache_contains(c, p[2], 0, ids[2]));
  assert_true(mbd_pcache_contains(c, p[3], 0, ids[3]));
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.entries, 3);
  assert_int_equal(s.evictions, 1);
  assert_true(s.bytes <= 3 * one);
  /* Many more: the table grows and the budget holds. */
  for (int k = 4; k < 8; k++) assert_int_equal(mbd_pcache_insert(c, p[k], 0, ids[k], SB, fill, &a, &err), 0);
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.entries, 3);
  assert_int_equal(s.evictions, 5);
  /* An entry larger than the whole budget is not kept, and evicts nothing. */
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], 4 * one, fill, &a, &err), 0);
  assert_false(mbd_pcache_contains(c, p[0], 0, ids[0]));
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.entries, 3);
  for (int k = 0; k < 8; k++) mbd_pcache_plan_free(&p[k]);
  mbd_pcache_destroy(&c);
}

/* The device tier's stand-in: stashes are host buffers of SB bytes. */
typedef struct fake_dev {
  int allocs, frees, exports;
  int room; /* allocations that succeed, then MBD_E_NOMEM */
} fake_dev;

static int fd_alloc(void *ctx, void **stash, mbd_error *err) {
  fake_dev *d = ctx;
  if (d->allocs == d->room) return mbd_error_set(err, MBD_E_NOMEM, "no room on the fake device");
  d->allocs++;
  *stash = malloc(SB);
  return *stash ? MBD_OK : mbd_error_set(err, MBD_E_NOMEM, "out of memory");
}
static void fd_free(void *ctx, void *stash) {
  ((fake_dev *)ctx)->frees++;
  free(stash);
}
static int fd_export(void *ctx, const void *stash, void *dst, size_t n, mbd_error *err) {
  (void)err;
  ((fake_dev *)ctx)->exports++;
  memcpy(dst, stash, n);
  return MBD_OK;
}

/* A cache of host budget hb with a device tier of nstash stashes. */
static mbd_pcache *tiered(size_t hb, size_t nstash, fake_dev *d) {
  mbd_pcache *c = NULL;
  assert_int_equal(mbd_pcache_new(hb, "m", "d", "r", V, &c, NULL), 0);
  mbd_pcache_dev dev = {.ctx = d, .stash_bytes = SB, .budget = nstash * SB,
                        .alloc = fd_alloc, .free = fd_free, .export = fd_export};
  mbd_pcache_set_device(c, &dev);
  return c;
}

static void test_device_tier(void **state) {
  (void)state;
  int64_t ids[6][32];
  mbd_pcache_plan *p[6] = {0};
  fake_dev d = {.room = 100};
  mbd_pcache *c = tiered(1 << 20, 2, &d);
  for (int k = 0; k < 6; k++) {
    for (int i = 0; i < 32; i++) ids[k][i] = k * 100 + i;
    assert_int_equal(mbd_pcache_plan_new(c, ids[k], 32, 32, NULL, 0, &p[k], NULL), 0);
  }
  mbd_error err = {0};
  fill_arg a = {.tag = 1};
  mbd_pcache_hit hit;
  /* A and B go to the device; a hit there is a stash, no host image. */
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  a.tag = 2;
  assert_int_equal(mbd_pcache_insert(c, p[1], 0, ids[1], SB, fill, &a, &err), 0);
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit));
  assert_null(hit.state);
  assert_non_null(hit.stash);
  assert_int_equal(((const uint8_t *)hit.stash)[SB - 1], 1);
  mbd_pcache_stats s;
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.device_entries, 2);
  assert_int_equal(s.device_bytes, 2 * SB);
  assert_int_equal(s.device_hits, 1);
  size_t meta = (size_t)s.bytes / 2; /* host part of a device entry: no state image */
  /* C pushes out B, the least recently used, never hit: dropped, no copy. */
  a.tag = 3;
  assert_int_equal(mbd_pcache_insert(c, p[2], 0, ids[2], SB, fill, &a, &err), 0);
  assert_false(mbd_pcache_contains(c, p[1], 0, ids[1]));
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.demotions, 0);
  assert_int_equal(d.exports, 0);
  /* D pushes out A, which was hit: demoted with its bytes. */
  a.tag = 4;
  assert_int_equal(mbd_pcache_insert(c, p[3], 0, ids[3], SB, fill, &a, &err), 0);
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.demotions, 1);
  assert_int_equal(d.exports, 1);
  assert_int_equal(s.entries, 3);
  assert_int_equal(s.device_entries, 2);
  assert_int_equal(s.bytes, 3 * meta + SB);
  p[0]->next = 0;
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit));
  assert_null(hit.stash);
  assert_non_null(hit.state);
  uint8_t want[SB];
  memset(want, 1, SB);
  assert_memory_equal(hit.state, want, SB);
  assert_true(hit.logits[2] == 3.0f);
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.hits, 2);
  assert_int_equal(s.device_hits, 1);
  /* Adverts merge the tiers by last use: A (hit now), D, C. */
  uint64_t adv[4];
  assert_int_equal(mbd_pcache_adverts(c, adv, 4), 3);
  assert_true(adv[0] == p[0]->route[0] && adv[1] == p[3]->route[0] && adv[2] == p[2]->route[0]);
  /* Two stashes were ever allocated: they are reused. */
  assert_int_equal(d.allocs, 2);
  for (int k = 0; k < 6; k++) mbd_pcache_plan_free(&p[k]);
  mbd_pcache_destroy(&c);
  assert_int_equal(d.frees, 2);
}

static void test_device_tier_limits(void **state) {
  (void)state;
  int64_t ids[4][32];
  mbd_pcache_plan *p[4] = {0};
  mbd_error err = {0};
  fill_arg a = {.tag = 9};
  mbd_pcache_hit hit;
  mbd_pcache_stats s;
  /* The device has room for one stash of the four the budget allows. */
  fake_dev d = {.room = 1};
  mbd_pcache *c = tiered(1 << 20, 4, &d);
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < 32; i++) ids[k][i] = k * 100 + i;
    assert_int_equal(mbd_pcache_plan_new(c, ids[k], 32, 32, NULL, 0, &p[k], NULL), 0);
  }
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit));
  assert_int_equal(mbd_pcache_insert(c, p[1], 0, ids[1], SB, fill, &a, &err), 0);
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.device_entries, 1); /* the tier shrank to what the device held */
  assert_int_equal(s.demotions, 1);
  assert_int_equal(s.entries, 2);
  assert_int_equal(d.allocs, 1);
  mbd_pcache_destroy(&c);
  assert_int_equal(d.frees, 1);
  /* No room at all: entries are host images, as without a device tier. */
  fake_dev none = {.room = 0};
  c = tiered(1 << 20, 4, &none);
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  p[0]->next = 0;
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit));
  assert_non_null(hit.state);
  assert_null(hit.stash);
  mbd_pcache_destroy(&c);
  assert_int_equal(none.frees, 0);
  /* A host budget that holds a device entry's host part but not with its
   * state image: a hit entry leaving the device is dropped, not demoted. */
  fake_dev d2 = {.room = 100};
  c = tiered(1 << 20, 1, &d2);
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  mbd_pcache_stats_get(c, &s);
  size_t meta = (size_t)s.bytes;
  mbd_pcache_destroy(&c);
  c = tiered(meta + SB - 1, 1, &d2);
  assert_int_equal(mbd_pcache_insert(c, p[0], 0, ids[0], SB, fill, &a, &err), 0);
  p[0]->next = 0;
  assert_true(mbd_pcache_lookup(c, p[0], ids[0], &hit));
  assert_int_equal(mbd_pcache_insert(c, p[1], 0, ids[1], SB, fill, &a, &err), 0);
  mbd_pcache_stats_get(c, &s);
  assert_int_equal(s.demotions, 0);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.entries, 1);
  assert_true(s.bytes <= meta + SB - 1);
  for (int k = 0; k < 4; k++) mbd_pcache_plan_free(&p[k]);
  mbd_pcache_destroy(&c);
  assert_int_equal(d2.frees, 2);
}

static void test_keys_by_identity(void **state) {
  (void)state;
  int64_t ids[16];
  for (int i = 0; i < 16; i++) ids[i] = i;
  const char *ident[4][3] = {{"m", "d", "r"}, {"m", "d", "r2"}, {"m", "d2", "r"}, {"m2", "d", "r"}};
  uint8_t keys[4][32];
  for (int k = 0; k < 4; k++) {
    mbd_pcache *c = NULL;
    mbd_pcache_plan *p = NULL;
    assert_int_equal(mbd_pcache_new(1 << 20, ident[k][0], ident[k][1], ident[k][2], V, &c, NULL), 0);
    assert_int_equal(mbd_pcache_plan_new(c, ids, 16, 16, NULL, 0, &p, NULL), 0);
    memcpy(keys[k], p->key[0], 32);
    mbd_pcache_plan_free(&p);
    mbd_pcache_destroy(&c);
  }
  for (int a = 0; a < 4; a++)
    for (int b = a + 1; b < 4; b++) assert_memory_not_equal(keys[a], keys[b], 32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_boundaries),          cmocka_unit_test(test_route_hashes),
      cmocka_unit_test(test_longest_hit_and_tokens), cmocka_unit_test(test_eviction_lru),
      cmocka_unit_test(test_keys_by_identity),     cmocka_unit_test(test_device_tier),
      cmocka_unit_test(test_device_tier_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
