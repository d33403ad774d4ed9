/* Broker routing logic without sockets: the registry (READY validation,
 * matching, least-loaded pick, NO_ROUTE text) and the core state machine
 * driven with a fake clock and a send callback that records every message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker/caller.h"
#include "broker/core.h"
#include "broker/reclaim.h"
#include "broker/registry.h"
#include "support/fake_peers.h"
#include "common/protocol.h"

/* ---- fixtures ------------------------------------------------------------- */

/* A READY message from worker `ident`. */
static mbd_msg *ready_msg(const char *ident, const char *uid, mbd_dtype_policy p, int cap,
                          const char *model, bool bad_id) {
  const fp_ready o = {.uid = uid, .policy = p, .capacity = cap, .model = model,
                      .tokenizer_digest = "t", .bad_route_id = bad_id};
  return fp_ready_msg(ident, &o);
}

static mbd_msg *client_req(uint8_t cmd, uint64_t tag, const char *dtype, const char *model,
                           uint64_t deadline, const char *session) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, (size_t)((dtype != NULL) + (model != NULL) + (deadline != 0) + (session != NULL)));
  if (dtype) {
    mbd_route_want w;
    memset(&w, 0, sizeof w);
    strcpy(w.dtype, dtype);
    mbd_pack_str(&pk, "route");
    mbd_pack_route_want(&pk, &w);
  }
  if (model) mbd_pack_kv_str(&pk, "model", model);
  if (deadline) mbd_pack_kv_u64(&pk, "deadline_ms", deadline);
  if (session) mbd_pack_kv_str(&pk, "session", session);
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "cli", 3, NULL), 0);
  return m;
}

static void from_worker(mbd_bcore *c, const char *ident, uint8_t cmd, uint64_t tag, int64_t now) {
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  assert_int_equal(mbd_msg_set_peer(m, ident, strlen(ident), NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
  assert_null(m);
}

static int64_t err_code(mbd_msg *m) {
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  int64_t code = 0;
  assert_int_equal(mbd_obj_i64(mbd_body_root(body), "code", true, &code, NULL), 0);
  mbd_body_destroy(&body);
  return code;
}

static void err_text(mbd_msg *m, char *out, size_t cap) {
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  assert_int_equal(mbd_obj_str(mbd_body_root(body), "message", true, out, cap, NULL), 0);
  mbd_body_destroy(&body);
}

static mbd_bcore *core_new(fp_sent *s, int queue_limit) {
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  strcpy(cfg.clients_ep, "inproc://c");
  strcpy(cfg.workers_ep, "inproc://w");
  cfg.heartbeat_ms = 100;
  cfg.liveness = 3;
  cfg.queue_limit = queue_limit;
  mbd_bcore *c = NULL;
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, s, &c, NULL), 0);
  return c;
}

/* ---- registry ----------------------------------------------------------------- */

/* One name, two digests: unpinned is refused naming both, a pin (or the
 * deployment's default) picks exactly one, and select honours the digest. */
static void test_registry_digest_identity(void **state) {
  (void)state;
  static const char d1[] = "1111111111111111111111111111111111111111111111111111111111111111";
  static const char d2[] = "2222222222222222222222222222222222222222222222222222222222222222";
  mbd_registry *r = NULL;
  assert_int_equal(mbd_registry_new(&r, NULL), 0);
  mbd_bworker w;
  bool rep = false;
  fp_worker(&w, "a", d1);
  assert_int_equal(mbd_registry_add(r, &w, NULL, &rep, NULL), 0);
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  char out[MBD_BW_DIGEST_MAX], tok[MBD_BW_DIGEST_MAX];
  mbd_error err = {0};
  /* one digest: unpinned resolves to it */
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "", out, tok, &err), 0);
  assert_string_equal(out, d1);
  fp_worker(&w, "b", d2);
  assert_int_equal(mbd_registry_add(r, &w, NULL, &rep, NULL), 0);
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "", out, tok, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, d1));
  assert_non_null(strstr(err.msg, d2));
  /* pinned by prefix */
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "22222222", out, tok, &err), 0);
  assert_string_equal(out, d2);
  size_t nm = 0;
  for (int i = 0; i < 8; i++)
    assert_string_equal(mbd_registry_select(r, &want, "m", out, NULL, NULL, &nm)->name, "b");
  assert_int_equal(nm, 1);
  /* a pin nobody serves: the prefix comes back, select finds nothing (NO_ROUTE) */
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "33333333", out, tok, &err), 0);
  assert_string_equal(out, "33333333");
  assert_null(mbd_registry_select(r, &want, "m", out, NULL, NULL, &nm));
  assert_int_equal(nm, 0);
  /* the deployment's default decides for unpinned requests */
  assert_int_equal(mbd_registry_set_default(r, "m", "BAD", &err), MBD_E_INVALID);
  assert_int_equal(mbd_registry_set_default(r, "m", "11111111", &err), 0);
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "", out, tok, &err), 0);
  assert_string_equal(out, d1);
  /* ... but a pin still wins */
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "2222222222", out, tok, &err), 0);
  assert_string_equal(out, d2);
  /* same weights, another tokenizer under the name: refused, pinned or not */
  fp_worker(&w, "c", d2);
  strcpy(w.models[0].tokenizer_digest, "7777777777777777777777777777777777777777777777777777777777777777");
  assert_int_equal(mbd_registry_add(r, &w, NULL, &rep, NULL), 0);
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "22222222", out, tok, &err),
                   MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "tokenizers"));
  /* the default's weights have one tokenizer: served, and only by its workers */
  assert_int_equal(mbd_registry_resolve_digest(r, &want, "m", "", out, tok, &err), 0);
  assert_string_equal(out, d1);
  assert_string_equal(tok, "");
  assert_string_equal(mbd_registry_select(r, &want, "m", out, tok, NULL, &nm)->name, "a");
  mbd_registry_destroy(&r);
}

static void test_registry_ready_and_select(void **state) {
  (void)state;
  mbd_registry *r = NULL;
  assert_int_equal(mbd_registry_new(&r, NULL), 0);
  mbd_bworker w[3];
  const char *names[3] = {"a", "b", "c"};
  mbd_dtype_policy pol[3] = {MBD_POLICY_F32, MBD_POLICY_F32, MBD_POLICY_BF16};
  int caps[3] = {2, 4, 1};
  for (int i = 0; i < 3; i++) {
    mbd_msg *m = ready_msg(names[i], names[i], pol[i], caps[i], "m", false);
    size_t len;
    const void *b = mbd_msg_body(m, &len);
    mbd_body *body = NULL;
    assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
    memset(&w[i], 0, sizeof w[i]);
    mbd_error err = {0};
    assert_int_equal(mbd_registry_parse_ready(mbd_body_root(body), &w[i], &err), 0);
    assert_string_equal(w[i].models[0].tokenizer_digest, "t");
    mbd_body_destroy(&body);
    mbd_msg_destroy(&m);
    memcpy(w[i].ident, names[i], 1);
    w[i].ident_len = 1;
    w[i].gen = (uint64_t)i + 1;
    bool rep = true;
    assert_int_equal(mbd_registry_add(r, &w[i], NULL, &rep, NULL), 0);
    assert_false(rep);
  }
  assert_int_equal(mbd_registry_count(r), 3);
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  strcpy(want.dtype, "f32");
  size_t nm = 0;
  /* least loaded by inflight/capacity: a 1/2 vs b 1/4 -> b */
  mbd_registry_find_ident(r, "a", 1)->inflight = 1;
  mbd_registry_find_ident(r, "b", 1)->inflight = 1;
  mbd_bworker *p = mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm);
  assert_non_null(p);
  assert_string_equal(p->name, "b");
  assert_int_equal(nm, 2);
  /* b 3/4 vs a 1/2 -> a */
  mbd_registry_find_ident(r, "b", 1)->inflight = 3;
  assert_string_equal(mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm)->name, "a");
  /* all full -> NULL but 2 match (queue, not NO_ROUTE) */
  mbd_registry_find_ident(r, "a", 1)->inflight = 2;
  mbd_registry_find_ident(r, "b", 1)->inflight = 4;
  assert_null(mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm));
  assert_int_equal(nm, 2);
  /* ties go round-robin */
  mbd_registry_find_ident(r, "a", 1)->inflight = 0;
  mbd_registry_find_ident(r, "b", 1)->inflight = 0;
  mbd_registry_find_ident(r, "b", 1)->capacity = 2;
  const char *first = mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm)->name;
  const char *second = mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm)->name;
  assert_string_not_equal(first, second);
  /* model and dead workers */
  assert_null(mbd_registry_select(r, &want, "nope", NULL, NULL, NULL, &nm));
  assert_int_equal(nm, 0);
  mbd_registry_find_ident(r, "a", 1)->dead = true;
  assert_string_equal(mbd_registry_select(r, &want, "m", NULL, NULL, NULL, &nm)->name, "b");
  assert_int_equal(nm, 1);
  char msg[1024];
  strcpy(want.dtype, "f16");
  mbd_registry_no_route_message(r, &want, "m", NULL, msg, sizeof msg);
  assert_non_null(strstr(msg, "dtype=f16"));
  assert_non_null(strstr(msg, "model=m"));
  char shortid[9];
  snprintf(shortid, sizeof shortid, "%.8s", w[2].route_id);
  assert_non_null(strstr(msg, shortid));
  assert_non_null(strstr(msg, "cpu/bf16/deterministic models=[m@d]"));
  char tiny[40];
  mbd_registry_no_route_message(r, &want, "m", NULL, tiny, sizeof tiny);
  assert_int_equal(strlen(tiny), sizeof tiny - 1);
  assert_string_equal(tiny + sizeof tiny - 4, "...");
  /* uid / gen lookups, re-registration replaces */
  assert_non_null(mbd_registry_find_uid(r, "c"));
  assert_non_null(mbd_registry_find_gen(r, 3));
  mbd_bworker again = w[0], old;
  again.gen = 9;
  bool rep = false;
  assert_int_equal(mbd_registry_add(r, &again, &old, &rep, NULL), 0);
  assert_true(rep);
  assert_int_equal(old.gen, 1);
  assert_int_equal(mbd_registry_count(r), 3);
  assert_int_equal(mbd_registry_remove(r, "c", 1), 0);
  assert_int_equal(mbd_registry_remove(r, "c", 1), MBD_E_NOT_FOUND);
  mbd_registry_destroy(&r);
  assert_null(r);
}

static void test_registry_rejects_bad_ready(void **state) {
  (void)state;
  mbd_msg *m = ready_msg("x", "x", MBD_POLICY_F32, 1, "m", true);
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  mbd_bworker w;
  mbd_error err = {0};
  assert_int_equal(mbd_registry_parse_ready(mbd_body_root(body), &w, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "does not match"));
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
  m = ready_msg("x", "bad/uid", MBD_POLICY_F32, 1, "m", false);
  b = mbd_msg_body(m, &len);
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  assert_int_equal(mbd_registry_parse_ready(mbd_body_root(body), &w, &err), MBD_E_INVALID);
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
  m = ready_msg("x", "x", MBD_POLICY_F32, 0, "m", false); /* capacity 0 */
  b = mbd_msg_body(m, &len);
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  assert_int_equal(mbd_registry_parse_ready(mbd_body_root(body), &w, &err), MBD_E_INVALID);
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
}

/* ---- core ------------------------------------------------------------------------ */

static void test_core_forward_and_reply(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 8);
  mbd_msg *m = ready_msg("w1", "u1", MBD_POLICY_F32, 1, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  assert_int_equal(mbd_registry_count(mbd_bcore_registry(c)), 1);
  /* request with a payload: forwarded under a fresh ticket, payload bytes shared */
  m = client_req(MBD_CMD_FORWARD, 77, "f32", "m", 0, NULL);
  static uint8_t data[4096];
  assert_int_equal(mbd_msg_add_payload_ref(m, data, sizeof data, NULL, NULL, NULL), 0);
  mbd_bcore_on_client(c, &m, 0, NULL, 10);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.dest[0], MBD_BDEST_WORKER);
  uint64_t ticket = mbd_msg_tag(s.m[0]);
  assert_true(ticket != 77 && ticket != 0);
  size_t len;
  assert_ptr_equal(mbd_msg_payload(s.m[0], 0, &len), data); /* no copy */
  fp_clear(&s);
  /* second request queues (capacity 1) */
  m = client_req(MBD_CMD_FORWARD, 78, "f32", "m", 0, NULL);
  mbd_bcore_on_client(c, &m, 0, NULL, 11);
  assert_int_equal(s.n, 0);
  assert_int_equal(mbd_bcore_queue_len(c), 1);
  /* a PARTIAL then FINAL go to the client with its tag; FINAL frees the slot */
  from_worker(c, "w1", MBD_CMD_PARTIAL, ticket, 12);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.dest[0], MBD_BDEST_CLIENT);
  assert_int_equal(mbd_msg_tag(s.m[0]), 77);
  fp_clear(&s);
  from_worker(c, "w1", MBD_CMD_FINAL, ticket, 13);
  assert_int_equal(s.n, 2); /* FINAL to client + queued request to worker */
  int fi = fp_find(&s, MBD_CMD_FINAL, "cli");
  assert_true(fi >= 0);
  assert_int_equal(mbd_msg_tag(s.m[fi]), 77);
  int wi = fp_find(&s, MBD_CMD_FORWARD, "w1");
  assert_true(wi >= 0);
  uint64_t t2 = mbd_msg_tag(s.m[wi]);
  fp_clear(&s);
  assert_int_equal(mbd_bcore_queue_len(c), 0);
  /* a duplicate FINAL for the finished ticket is dropped */
  from_worker(c, "w1", MBD_CMD_FINAL, ticket, 14);
  assert_int_equal(s.n, 0);
  assert_int_equal(mbd_bcore_get_stats(c)->late_dropped, 1);
  from_worker(c, "w1", MBD_CMD_ERROR, t2, 15);
  assert_int_equal(s.n, 1);
  assert_int_equal(mbd_msg_tag(s.m[0]), 78);
  fp_clear(&s);
  assert_int_equal(mbd_bcore_pending(c), 0);
  mbd_bcore_destroy(&c);
  assert_null(c);
}

static void test_core_failover_exactly_once(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 8);
  mbd_msg *m = ready_msg("w1", "u1", MBD_POLICY_F32, 1, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  m = ready_msg("w2", "u2", MBD_POLICY_F32, 1, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  m = client_req(MBD_CMD_GEMM, 5, "f32", NULL, 100000, NULL);
  mbd_bcore_on_client(c, &m, 0, NULL, 0);
  assert_int_equal(s.n, 1);
  size_t pl;
  const char *first = mbd_msg_peer(s.m[0], &pl);
  char fw[3] = {first[0], first[1], 0}, other[3] = {'w', fw[1] == '1' ? '2' : '1', 0};
  uint64_t t1 = mbd_msg_tag(s.m[0]);
  fp_clear(&s);
  /* the other worker keeps heartbeating; the first goes silent */
  from_worker(c, other, MBD_CMD_HEARTBEAT, 0, 250);
  mbd_bcore_tick(c, 350);
  int wi = fp_find(&s, MBD_CMD_GEMM, other);
  assert_true(wi >= 0); /* re-sent to the other */
  uint64_t t2 = mbd_msg_tag(s.m[wi]);
  assert_true(t2 != t1);
  assert_int_equal(fp_find(&s, MBD_CMD_ERROR, NULL), -1);
  assert_int_equal(mbd_bcore_get_stats(c)->failovers, 1);
  fp_clear(&s);
  /* a late reply from the first (it re-registers under the same ident? no: unknown now) */
  from_worker(c, fw, MBD_CMD_FINAL, t1, 360);
  assert_int_equal(fp_find(&s, MBD_CMD_FINAL, "cli"), -1); /* never answered twice */
  assert_true(fp_find(&s, MBD_CMD_DISCONNECT, fw) >= 0);   /* told to re-register */
  fp_clear(&s);
  /* the second dies too: WORKER_LOST, no third send */
  mbd_bcore_tick(c, 700);
  int ei = fp_find(&s, MBD_CMD_ERROR, "cli");
  assert_true(ei >= 0);
  assert_int_equal(err_code(s.m[ei]), MBD_E_WORKER_LOST);
  assert_int_equal(fp_find(&s, MBD_CMD_GEMM, NULL), -1);
  fp_clear(&s);
  assert_int_equal(mbd_bcore_pending(c), 0);
  assert_int_equal(mbd_registry_count(mbd_bcore_registry(c)), 0);
  mbd_bcore_destroy(&c);
}

static void test_core_session_and_reregister(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 8);
  mbd_msg *m = ready_msg("w1", "u1", MBD_POLICY_F32, 2, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  m = ready_msg("w2", "u2", MBD_POLICY_F32, 2, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  /* STEP on u2's session goes to w2 whatever the load */
  m = client_req(MBD_CMD_STEP, 9, NULL, NULL, 0, "u2/4");
  mbd_bcore_on_client(c, &m, 0, NULL, 1);
  assert_true(fp_find(&s, MBD_CMD_STEP, "w2") >= 0);
  fp_clear(&s);
  /* w2 re-registers (new process, same ident): the session request fails */
  m = ready_msg("w2", "u2b", MBD_POLICY_F32, 2, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 2);
  int ei = fp_find(&s, MBD_CMD_ERROR, "cli");
  assert_true(ei >= 0);
  assert_int_equal(err_code(s.m[ei]), MBD_E_WORKER_LOST);
  char txt[512];
  err_text(s.m[ei], txt, sizeof txt);
  assert_non_null(strstr(txt, "EXPORT"));
  fp_clear(&s);
  /* sessions of the old uid are gone */
  m = client_req(MBD_CMD_STEP, 10, NULL, NULL, 0, "u2/4");
  mbd_bcore_on_client(c, &m, 0, NULL, 3);
  assert_int_equal(err_code(s.m[0]), MBD_E_NOT_FOUND);
  fp_clear(&s);
  /* a uid that never registered: NOT_FOUND, not a lost worker */
  m = client_req(MBD_CMD_STEP, 11, NULL, NULL, 0, "never/1");
  mbd_bcore_on_client(c, &m, 0, NULL, 4);
  assert_int_equal(err_code(s.m[0]), MBD_E_NOT_FOUND);
  err_text(s.m[0], txt, sizeof txt);
  assert_non_null(strstr(txt, "never"));
  fp_clear(&s);
  assert_int_equal(mbd_registry_count(mbd_bcore_registry(c)), 2);
  mbd_bcore_destroy(&c);
}

static void test_core_queue_deadline_busy_noroute(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 1);
  mbd_msg *m = ready_msg("w1", "u1", MBD_POLICY_F32, 1, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  m = client_req(MBD_CMD_FORWARD, 1, "f32", "m", 50, NULL); /* in flight */
  mbd_bcore_on_client(c, &m, 0, NULL, 0);
  m = client_req(MBD_CMD_FORWARD, 2, "f32", "m", 30, NULL); /* queued */
  mbd_bcore_on_client(c, &m, 0, NULL, 0);
  m = client_req(MBD_CMD_FORWARD, 3, "f32", "m", 0, NULL); /* queue full */
  mbd_bcore_on_client(c, &m, 0, NULL, 0);
  int ei = fp_find(&s, MBD_CMD_ERROR, "cli");
  assert_int_equal(mbd_msg_tag(s.m[ei]), 3);
  assert_int_equal(err_code(s.m[ei]), MBD_E_BUSY);
  m = client_req(MBD_CMD_FORWARD, 4, "bf16", "m", 0, NULL); /* no route */
  mbd_bcore_on_client(c, &m, 0, NULL, 0);
  assert_int_equal(err_code(s.m[s.n - 1]), MBD_E_NO_ROUTE);
  fp_clear(&s);
  mbd_bcore_tick(c, 0); /* first heartbeat round */
  fp_clear(&s);
  assert_int_equal(mbd_bcore_next_due(c, 0), 30);
  from_worker(c, "w1", MBD_CMD_HEARTBEAT, 0, 29);
  mbd_bcore_tick(c, 29);
  assert_int_equal(fp_find(&s, MBD_CMD_ERROR, NULL), -1);
  fp_clear(&s);
  mbd_bcore_tick(c, 30);
  assert_int_equal(mbd_msg_tag(s.m[0]), 2);
  assert_int_equal(err_code(s.m[0]), MBD_E_TIMEOUT);
  fp_clear(&s);
  mbd_bcore_tick(c, 50);
  assert_int_equal(mbd_msg_tag(s.m[0]), 1);
  assert_int_equal(err_code(s.m[0]), MBD_E_TIMEOUT);
  fp_clear(&s);
  assert_int_equal(mbd_bcore_pending(c), 0);
  /* slot still held until the worker's late reply arrives */
  m = client_req(MBD_CMD_FORWARD, 5, "f32", "m", 0, NULL);
  mbd_bcore_on_client(c, &m, 0, NULL, 60);
  assert_int_equal(s.n, 0);
  assert_int_equal(mbd_bcore_queue_len(c), 1);
  /* malformed input from the client: ERROR with the recv code */
  mbd_msg *bad = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_FORWARD, 6, &bad, NULL), 0);
  mbd_msg_set_peer(bad, "cli", 3, NULL);
  mbd_error rerr = {0};
  mbd_error_set(&rerr, MBD_E_FORMAT, "body is not a msgpack map");
  mbd_bcore_on_client(c, &bad, MBD_E_FORMAT, &rerr, 61);
  assert_int_equal(err_code(s.m[0]), MBD_E_FORMAT);
  assert_int_equal(mbd_msg_tag(s.m[0]), 6);
  fp_clear(&s);
  /* shutdown answers the queue with BUSY, abort tells workers DISCONNECT */
  mbd_bcore_shutdown(c, 70);
  assert_int_equal(mbd_msg_tag(s.m[0]), 5);
  assert_int_equal(err_code(s.m[0]), MBD_E_BUSY);
  fp_clear(&s);
  mbd_bcore_abort(c, 71);
  assert_true(fp_find(&s, MBD_CMD_DISCONNECT, "w1") >= 0);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static void test_config_parse(void **state) {
  (void)state;
  mbd_broker_config c;
  mbd_broker_config_defaults(&c);
  mbd_error err = {0};
  char *ok[] = {"b", "--clients", "tcp://*:1", "--workers", "ipc:///tmp/w", "--heartbeat-ms", "250",
                "--queue-limit", "7", "--max-message-mb", "3", "--default-deadline-ms", "900",
                "--hwm", "50", "--liveness", "5"};
  assert_int_equal(mbd_broker_config_parse(17, ok, &c, &err), 0);
  assert_int_equal(c.heartbeat_ms, 250);
  assert_int_equal(c.queue_limit, 7);
  assert_int_equal(c.max_message_mb, 3);
  assert_int_equal(c.default_deadline_ms, 900);
  assert_int_equal(c.hwm, 50);
  assert_int_equal(c.liveness, 5);
  mbd_broker_config_defaults(&c); /* workers endpoint missing */
  char *bad1[] = {"b", "--clients", "tcp://*:1"};
  assert_int_equal(mbd_broker_config_parse(3, bad1, &c, &err), MBD_E_INVALID);
  char *bad2[] = {"b", "--clients", "tcp://*:1", "--workers", "tcp://*:2", "--liveness", "x"};
  assert_int_equal(mbd_broker_config_parse(7, bad2, &c, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "--liveness"));
  char *bad3[] = {"b", "--bogus", "1"};
  assert_int_equal(mbd_broker_config_parse(3, bad3, &c, &err), MBD_E_INVALID);
  char *bad4[] = {"b", "--clients", "tcp://*:1", "--workers", "tcp://*:1"};
  assert_int_equal(mbd_broker_config_parse(5, bad4, &c, &err), MBD_E_INVALID);
}

/* Stamps caller `id` into m as the reactor does (any caller already there is dropped). */
static void stamp(mbd_msg *m, const char *id) {
  mbd_bcaller who;
  memset(&who, 0, sizeof who);
  snprintf(who.id, sizeof who.id, "%s", id);
  assert_int_equal(mbd_bcaller_stamp(m, &who, NULL), 0);
}

static void test_caller_stamp_and_inflight_limit(void **state) {
  (void)state;
  /* The stamp replaces a forged caller; peer credentials parse from the end. */
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_GEMM, 1, &m, NULL), 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "model", "m");
  mbd_pack_str(&pk, "caller");
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "id", "uid:0");
  mbd_pack_kv_u64(&pk, "uid", 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  mbd_bcaller who;
  assert_true(mbd_bcaller_parse_peer("/x:0:0:1:1000:100:4242", &who));
  assert_string_equal(who.id, "uid:1000");
  assert_int_equal(who.gid, 100);
  assert_int_equal(who.pid, 4242);
  assert_false(mbd_bcaller_parse_peer("127.0.0.1", &who));
  assert_false(mbd_bcaller_parse_peer("1:2:x", &who));
  assert_true(mbd_bcaller_parse_peer("1000:100:4242", &who) == false);
  assert_true(mbd_bcaller_parse_peer("localhost:1000:100:4242", &who));
  assert_int_equal(mbd_bcaller_stamp(m, &who, NULL), 0);
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  assert_int_equal(mbd_body_root(body)->via.map.size, 2);
  mbd_bcaller back;
  mbd_bcaller_read(mbd_body_root(body), &back);
  assert_string_equal(back.id, "uid:1000");
  assert_true(back.has_uid);
  assert_int_equal(back.uid, 1000);
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);

  /* At most client_inflight unanswered requests per caller: the next is BUSY;
   * another caller is unaffected. */
  fp_sent s = {0};
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  strcpy(cfg.clients_ep, "inproc://c");
  strcpy(cfg.workers_ep, "inproc://w");
  cfg.client_inflight = 2;
  mbd_bcore *c = NULL;
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, &s, &c, NULL), 0);
  m = ready_msg("w1", "u1", MBD_POLICY_F32, 8, "m", false);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  for (int i = 0; i < 2; i++) {
    m = client_req(MBD_CMD_FORWARD, 10 + (uint64_t)i, "f32", "m", 0, NULL);
    stamp(m, "uid:5");
    mbd_bcore_on_client(c, &m, 0, NULL, 1);
  }
  assert_int_equal(s.n, 2);
  fp_clear(&s);
  m = client_req(MBD_CMD_FORWARD, 12, "f32", "m", 0, NULL);
  stamp(m, "uid:5");
  mbd_bcore_on_client(c, &m, 0, NULL, 1);
  assert_int_equal(s.n, 1);
  assert_int_equal(err_code(s.m[0]), MBD_E_BUSY);
  char txt[512];
  err_text(s.m[0], txt, sizeof txt);
  assert_non_null(strstr(txt, "--client-inflight"));
  fp_clear(&s);
  m = client_req(MBD_CMD_FORWARD, 13, "f32", "m", 0, NULL);
  stamp(m, "uid:6");
  mbd_bcore_on_client(c, &m, 0, NULL, 1);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.dest[0], MBD_BDEST_WORKER);
  uint64_t ticket = mbd_msg_tag(s.m[0]);
  fp_clear(&s);
  /* A reply claiming another worker and route reaches the client as the
   * broker knows the sender. */
  assert_int_equal(mbd_msg_new(MBD_CMD_FINAL, ticket, &m, NULL), 0);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  mbd_pack_kv_str(&pk, "worker", "someone-else");
  mbd_pack_kv_str(&pk, "route_id", "0000000000000000");
  mbd_pack_kv_u64(&pk, "x", 7);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "w1", 2, NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, 2);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.dest[0], MBD_BDEST_CLIENT);
  b = mbd_msg_body(s.m[0], &len);
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  char wn[64] = "", rid[80] = "";
  assert_int_equal(mbd_obj_str(mbd_body_root(body), "worker", true, wn, sizeof wn, NULL), 0);
  assert_int_equal(mbd_obj_str(mbd_body_root(body), "route_id", true, rid, sizeof rid, NULL), 0);
  assert_string_equal(wn, "w1");
  mbd_route_identity ri;
  fp_route(&ri, MBD_POLICY_F32);
  char want_id[65];
  mbd_route_id_hex(&ri, want_id);
  assert_string_equal(rid, want_id);
  assert_non_null(mbd_obj_get(mbd_body_root(body), "x"));
  mbd_body_destroy(&body);
  fp_clear(&s);
  /* A reply that opens with the registered route_id and worker, as workers
   * write it, reaches the client byte for byte (not rewritten); a later
   * duplicate key cannot override them, since readers take the first. */
  m = client_req(MBD_CMD_FORWARD, 14, "f32", "m", 0, NULL);
  stamp(m, "uid:6");
  mbd_bcore_on_client(c, &m, 0, NULL, 3);
  assert_int_equal(s.n, 1);
  ticket = mbd_msg_tag(s.m[0]);
  fp_clear(&s);
  assert_int_equal(mbd_msg_new(MBD_CMD_FINAL, ticket, &m, NULL), 0);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  mbd_pack_kv_str(&pk, "route_id", want_id);
  mbd_pack_kv_str(&pk, "worker", "w1");
  mbd_pack_kv_str(&pk, "worker", "someone-else");
  uint8_t body_sent[256];
  size_t sent_len = sb.size;
  assert_true(sent_len <= sizeof body_sent);
  memcpy(body_sent, sb.data, sent_len);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "w1", 2, NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, 4);
  assert_int_equal(s.n, 1);
  b = mbd_msg_body(s.m[0], &len);
  assert_int_equal(len, sent_len);
  assert_memory_equal(b, body_sent, sent_len);
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  assert_int_equal(mbd_obj_str(mbd_body_root(body), "worker", true, wn, sizeof wn, NULL), 0);
  assert_string_equal(wn, "w1");
  mbd_body_destroy(&body);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

/* A worker uid stays with the peer (key or local uid) that registered it. */
static void test_uid_bound_to_peer(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 8);
  mbd_msg *m = ready_msg("w1", "u1", MBD_POLICY_F32, 1, "m", false);
  stamp(m, "key:A");
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
  assert_int_equal(mbd_registry_count(mbd_bcore_registry(c)), 1);
  m = ready_msg("evil", "u1", MBD_POLICY_F32, 1, "m", false);
  stamp(m, "key:B");
  mbd_bcore_on_worker(c, &m, 0, NULL, 1);
  assert_int_equal(s.n, 1);
  assert_int_equal(mbd_msg_cmd(s.m[0]), MBD_CMD_ERROR);
  char txt[512];
  err_text(s.m[0], txt, sizeof txt);
  assert_non_null(strstr(txt, "another peer"));
  fp_clear(&s);
  const mbd_bworker *w = mbd_registry_find_uid(mbd_bcore_registry(c), "u1");
  assert_non_null(w);
  assert_memory_equal(w->ident, "w1", 2);
  /* The same key re-registering (a reconnect) is fine. */
  m = ready_msg("w1b", "u1", MBD_POLICY_F32, 1, "m", false);
  stamp(m, "key:A");
  mbd_bcore_on_worker(c, &m, 0, NULL, 2);
  w = mbd_registry_find_uid(mbd_bcore_registry(c), "u1");
  assert_memory_equal(w->ident, "w1b", 3);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static bool g_dead_pid_alive(int64_t pid) { return pid != 42; }
static char g_closed[128];
static void on_reclaim(void *ctx, const char *id, const char *worker_uid, const char *caller,
                       const char *why) {
  (void)ctx;
  (void)why;
  snprintf(g_closed, sizeof g_closed, "%s %s %s", id, worker_uid, caller);
}
static bool g_conn_c1_up = true;
static bool conn_reachable(void *ctx, const uint8_t *conn, size_t len) {
  (void)ctx;
  return !(len == 2 && !memcmp(conn, "c1", 2)) || g_conn_c1_up;
}

static void test_reclaim_departed(void **state) {
  (void)state;
  mbd_breclaim *r = mbd_breclaim_new();
  assert_non_null(r);
  mbd_breclaim_opened(r, "u1/aa", "u1", "uid:5", 42, (const uint8_t *)"c0", 2);
  mbd_breclaim_opened(r, "u1/bb", "u1", "uid:5", 42, (const uint8_t *)"c0", 2);
  mbd_breclaim_opened(r, "u1/cc", "u1", "uid:6", 43, (const uint8_t *)"c0", 2);
  mbd_breclaim_opened(r, "u1/dd", "u1", "key:x", 0, NULL, 0); /* neither pid nor conn */
  assert_int_equal(mbd_breclaim_count(r), 3);
  mbd_breclaim_closed(r, "u1/bb");
  assert_int_equal(mbd_breclaim_sweep(r, g_dead_pid_alive, on_reclaim, NULL, 0, 1000), 1);
  assert_string_equal(g_closed, "u1/aa u1 uid:5");
  assert_int_equal(mbd_breclaim_count(r), 1);
  mbd_breclaim_destroy(&r);
  assert_null(r);
}

/* Sessions of tcp clients: closed after the grace period once their
 * connection is unreachable, unless the same key comes back within it. */
static void test_reclaim_connection_gone(void **state) {
  (void)state;
  mbd_breclaim *r = mbd_breclaim_new();
  mbd_breclaim_opened(r, "u1/k1", "u1", "key:A", 0, (const uint8_t *)"c1", 2);
  mbd_breclaim_opened(r, "u1/n1", "u1", "", 0, (const uint8_t *)"c1", 2);
  mbd_breclaim_opened(r, "u1/k2", "u1", "key:B", 0, (const uint8_t *)"c2", 2);
  assert_int_equal(mbd_breclaim_count(r), 3);
  g_conn_c1_up = true;
  mbd_breclaim_probe(r, conn_reachable, NULL, 100);
  assert_int_equal(mbd_breclaim_sweep(r, g_dead_pid_alive, on_reclaim, NULL, 100000, 1000), 0);
  g_conn_c1_up = false;
  mbd_breclaim_probe(r, conn_reachable, NULL, 200);
  assert_int_equal(mbd_breclaim_sweep(r, g_dead_pid_alive, on_reclaim, NULL, 1199, 1000), 0);
  mbd_breclaim_seen(r, "", (const uint8_t *)"c9", 2);      /* anonymous: nothing moves */
  mbd_breclaim_seen(r, "key:A", (const uint8_t *)"c3", 2); /* A reconnected as c3 */
  assert_int_equal(mbd_breclaim_sweep(r, g_dead_pid_alive, on_reclaim, NULL, 1200, 1000), 1);
  assert_string_equal(g_closed, "u1/n1 u1 ");
  mbd_breclaim_probe(r, conn_reachable, NULL, 1300); /* c3 and c2 are up */
  assert_int_equal(mbd_breclaim_sweep(r, g_dead_pid_alive, on_reclaim, NULL, 99999, 1000), 0);
  assert_int_equal(mbd_breclaim_count(r), 2);
  mbd_breclaim_destroy(&r);
  g_conn_c1_up = true;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry_ready_and_select),
      cmocka_unit_test(test_registry_digest_identity),
      cmocka_unit_test(test_registry_rejects_bad_ready),
      cmocka_unit_test(test_core_forward_and_reply),
      cmocka_unit_test(test_core_failover_exactly_once),
      cmocka_unit_test(test_core_session_and_reregister),
      cmocka_unit_test(test_core_queue_deadline_busy_noroute),
      cmocka_unit_test(test_config_parse),
      cmocka_unit_test(test_caller_stamp_and_inflight_limit),
      cmocka_unit_test(test_reclaim_departed),
      cmocka_unit_test(test_reclaim_connection_gone),
      cmocka_unit_test(test_uid_bound_to_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
