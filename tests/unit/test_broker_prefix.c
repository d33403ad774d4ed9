/* The broker's prefix routing over plain registry data: a HEARTBEAT `prefix`
 * value is read (a malformed one is ignored), the worker advertising the
 * longest of a request's hashes wins while its load is under the threshold,
 * and without a match or over the threshold the usual least-loaded choice
 * stands. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "broker/core.h"
#include "broker/registry.h"
#include "common/protocol.h"
#include "support/fake_peers.h"

#define DIGEST "1111111111111111111111111111111111111111111111111111111111111111"

/* Reads a `prefix` value advertising hashes h[0..n) into w (returns the reader's verdict). */
static bool advertise(mbd_bworker *w, const uint64_t *h, size_t n, bool bad) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  mbd_pack_kv_u64(&pk, "hits", 5);
  mbd_pack_kv_u64(&pk, "device_hits", 3);
  mbd_pack_kv_u64(&pk, "entries", n);
  mbd_pack_str(&pk, "hashes");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    if (bad && i == 0) mbd_pack_str(&pk, "x");
    else msgpack_pack_uint64(&pk, h[i]);
  }
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(sb.data, sb.size, &b, NULL), 0);
  bool ok = mbd_bworker_read_prefix(w, mbd_body_root(b));
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&sb);
  return ok;
}

static void test_read_prefix(void **state) {
  (void)state;
  mbd_bworker w;
  fp_worker(&w, "a", DIGEST);
  const uint64_t h[3] = {1, 2, UINT64_MAX};
  assert_true(advertise(&w, h, 3, false));
  assert_true(w.prefix.known);
  assert_int_equal(w.prefix.hits, 5);
  assert_int_equal(w.prefix.device_hits, 3);
  assert_int_equal(w.prefix.demotions, 0); /* absent: 0 */
  assert_int_equal(w.prefix.nhashes, 3);
  assert_true(w.prefix.hashes[2] == UINT64_MAX);
  assert_false(advertise(&w, h, 2, true)); /* kept as it was */
  assert_int_equal(w.prefix.nhashes, 3);
  const uint64_t req[4] = {9, 2, 7, 1};
  assert_int_equal(mbd_bworker_prefix_match(&w, req, 4), 4); /* the longest: req[3] */
  assert_int_equal(mbd_bworker_prefix_match(&w, req, 3), 2);
  assert_int_equal(mbd_bworker_prefix_match(&w, req, 1), 0);
}

static void test_select_prefix(void **state) {
  (void)state;
  mbd_registry *r = NULL;
  assert_int_equal(mbd_registry_new(&r, NULL), 0);
  mbd_bworker w[3];
  const char *names[3] = {"a", "b", "c"};
  bool rep;
  for (int i = 0; i < 3; i++) {
    fp_worker(&w[i], names[i], DIGEST);
    assert_int_equal(mbd_registry_add(r, &w[i], NULL, &rep, NULL), 0);
  }
  mbd_bworker *a = mbd_registry_find_ident(r, "a", 1), *b = mbd_registry_find_ident(r, "b", 1),
              *c = mbd_registry_find_ident(r, "c", 1);
  const uint64_t short_only[1] = {10}, both[2] = {10, 20};
  assert_true(advertise(a, short_only, 1, false)); /* a holds the 256-token prefix */
  assert_true(advertise(b, both, 2, false));       /* b holds it and the 512-token one */
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  const uint64_t prompt[3] = {10, 20, 30};
  size_t nm = 0;
  a->inflight = 0;
  b->inflight = 2; /* busier than a and c, still under 75% */
  c->inflight = 0;
  mbd_bworker *p = mbd_registry_select_prefix(r, &want, "m", NULL, NULL, prompt, 3, NULL, &nm);
  assert_string_equal(p->name, "b");
  assert_int_equal(nm, 3);
  b->inflight = 3; /* 75%: load does not allow; a has the shorter prefix */
  p = mbd_registry_select_prefix(r, &want, "m", NULL, NULL, prompt, 3, NULL, &nm);
  assert_string_equal(p->name, "a");
  a->inflight = 3;
  c->inflight = 1; /* nobody holding it has room: the least loaded */
  p = mbd_registry_select_prefix(r, &want, "m", NULL, NULL, prompt, 3, NULL, &nm);
  assert_string_equal(p->name, "c");
  const uint64_t unknown[1] = {99};
  a->inflight = b->inflight = 0;
  c->inflight = 2;
  p = mbd_registry_select_prefix(r, &want, "m", NULL, NULL, unknown, 1, NULL, &nm);
  assert_true(!strcmp(p->name, "a") || !strcmp(p->name, "b"));
  /* Another model: no match whatever the hashes. */
  p = mbd_registry_select_prefix(r, &want, "other", NULL, NULL, prompt, 3, NULL, &nm);
  assert_null(p);
  assert_int_equal(nm, 0);
  mbd_registry_destroy(&r);
}

/* An OPEN from client "cli" whose `prefix` is n hashes (the first a string when bad). */
static mbd_msg *open_msg(uint64_t tag, size_t n, bool bad) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "model", "m");
  mbd_pack_str(&pk, "prefix");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    if (bad && i == n - 1) mbd_pack_str(&pk, "x");
    else msgpack_pack_uint64(&pk, 1000 + i);
  }
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_OPEN, tag, &m, NULL), 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "cli", 3, NULL), 0);
  return m;
}

/* The broker's reading of OPEN `prefix`: a malformed or oversized one is
 * INVALID, a good one routes as usual (no workers: NO_ROUTE); under ASan
 * this also checks that the hashes are freed on every path. */
static void test_core_reads_prefix(void **state) {
  (void)state;
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  strcpy(cfg.clients_ep, "inproc://c");
  strcpy(cfg.workers_ep, "inproc://w");
  fp_sent s = {0};
  mbd_bcore *c = NULL;
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, &s, &c, NULL), 0);
  const struct { size_t n; bool bad; int code; } cases[] = {
      {3, true, MBD_E_INVALID},
      {MBD_PREFIX_HASHES_MAX + 1, false, MBD_E_INVALID},
      {3, false, MBD_E_NO_ROUTE},
      {0, false, MBD_E_NO_ROUTE},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mbd_msg *m = open_msg(k + 1, cases[k].n, cases[k].bad);
    mbd_bcore_on_client(c, &m, 0, NULL, 1000);
    assert_int_equal(s.n, 1);
    assert_int_equal(mbd_msg_cmd(s.m[0]), MBD_CMD_ERROR);
    size_t bl = 0;
    const void *b = mbd_msg_body(s.m[0], &bl);
    mbd_body *body = NULL;
    assert_int_equal(mbd_body_parse(b, bl, &body, NULL), 0);
    int64_t code = 0;
    assert_int_equal(mbd_obj_i64(mbd_body_root(body), "code", true, &code, NULL), 0);
    assert_int_equal(code, cases[k].code);
    mbd_body_destroy(&body);
    fp_clear(&s);
  }
  mbd_bcore_destroy(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_read_prefix),
                                     cmocka_unit_test(test_select_prefix),
                                     cmocka_unit_test(test_core_reads_prefix)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
