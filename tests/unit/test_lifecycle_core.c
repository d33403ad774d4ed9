/* Request lifecycle in the broker core, without sockets (fake clock, a send
 * callback that records, a probe that says which clients are gone): the
 * deadline each worker send carries, CANCEL of a queued and of an in-flight
 * request, a client that went away, poison detection, and a draining worker. Also the body
 * rewrite that carries the deadline (mbd_body_prepend_u64). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker/core.h"
#include "broker/registry.h"
#include "common/protocol.h"
#include "support/fake_peers.h"

static const char *g_gone; /* client routing id the probe reports gone */

static int probe(void *ctx, const void *id, size_t len) {
  (void)ctx;
  return g_gone && len == strlen(g_gone) && !memcmp(id, g_gone, len) ? MBD_E_NOT_FOUND : MBD_OK;
}

static mbd_msg *ready_msg(const char *ident, int cap) {
  const fp_ready o = {.capacity = cap};
  return fp_ready_msg(ident, &o);
}

/* A FORWARD {model: m, deadline_ms?} from client `peer`. */
static void client_send(mbd_bcore *c, const char *peer, uint8_t cmd, uint64_t tag,
                        uint64_t deadline, int64_t now) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, deadline ? 2 : 1);
  mbd_pack_kv_str(&pk, "model", "m");
  if (deadline) mbd_pack_kv_u64(&pk, "deadline_ms", deadline);
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  if (cmd != MBD_CMD_CANCEL) assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, peer, strlen(peer), NULL), 0);
  mbd_bcore_on_client(c, &m, 0, NULL, now);
}

static void from_worker(mbd_bcore *c, const char *ident, uint8_t cmd, uint64_t tag,
                        const char *reason, int64_t now) {
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  if (reason) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    mbd_pack_kv_str(&pk, "reason", reason);
    assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
    msgpack_sbuffer_destroy(&sb);
  }
  assert_int_equal(mbd_msg_set_peer(m, ident, strlen(ident), NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
}

static int64_t body_i64(const mbd_msg *m, const char *key) {
  size_t len;
  const void *b = mbd_msg_body(m, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  int64_t v = -1;
  assert_int_equal(mbd_obj_i64(mbd_body_root(body), key, true, &v, NULL), 0);
  mbd_body_destroy(&body);
  return v;
}

static mbd_bcore *core_new(fp_sent *s) {
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  cfg.default_deadline_ms = 5000;
  mbd_bcore *c = NULL;
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, s, &c, NULL), 0);
  mbd_bcore_set_probe(c, probe);
  return c;
}

static void add_worker(mbd_bcore *c, const char *ident, int cap, int64_t now) {
  mbd_msg *m = ready_msg(ident, cap);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
}

static void test_prepend(void **state) {
  (void)state;
  msgpack_sbuffer in, out;
  msgpack_sbuffer_init(&in);
  msgpack_sbuffer_init(&out);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_u64(&pk, "deadline_ms", 99);
  mbd_pack_kv_str(&pk, "model", "m");
  assert_int_equal(mbd_body_prepend_u64(in.data, in.size, "deadline_ms", 7, &out, NULL), 0);
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(out.data, out.size, &b, NULL), 0);
  uint64_t v = 0;
  char model[8] = "";
  assert_int_equal(mbd_obj_u64(mbd_body_root(b), "deadline_ms", true, &v, NULL), 0);
  assert_int_equal(v, 7); /* the new entry comes first */
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "model", true, model, sizeof model, NULL), 0);
  assert_string_equal(model, "m");
  assert_int_equal(mbd_body_root(b)->via.map.size, 3);
  mbd_body_destroy(&b);
  msgpack_sbuffer_clear(&out);
  assert_int_equal(mbd_body_prepend_u64(NULL, 0, "k", 1, &out, NULL), 0); /* empty = {} */
  assert_int_equal(mbd_body_parse(out.data, out.size, &b, NULL), 0);
  assert_int_equal(mbd_body_root(b)->via.map.size, 1);
  mbd_body_destroy(&b);
  const char bad = 0x01;
  assert_int_equal(mbd_body_prepend_u64(&bad, 1, "k", 1, &out, NULL), MBD_E_FORMAT);
  msgpack_sbuffer_destroy(&in);
  msgpack_sbuffer_destroy(&out);
}

static void test_deadline_and_cancel(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s);
  add_worker(c, "w1", 1, 0);
  fp_clear(&s);
  /* Sent at once: the worker gets the whole 1000 ms; the default when absent. */
  client_send(c, "cli", MBD_CMD_FORWARD, 1, 1000, 100);
  int i = fp_find(&s, MBD_CMD_FORWARD, "w1");
  assert_true(i >= 0);
  assert_int_equal(body_i64(s.m[i], "deadline_ms"), 1000);
  uint64_t t1 = mbd_msg_tag(s.m[i]);
  fp_clear(&s);
  /* Queued (capacity 1) from 150 with 1000 ms, sent at 400: 750 ms left. */
  client_send(c, "cli", MBD_CMD_FORWARD, 2, 1000, 150);
  client_send(c, "cli", MBD_CMD_FORWARD, 3, 0, 160);
  assert_int_equal(s.n, 0);
  from_worker(c, "w1", MBD_CMD_FINAL, t1, NULL, 400);
  i = fp_find(&s, MBD_CMD_FORWARD, "w1");
  assert_true(i >= 0);
  assert_int_equal(body_i64(s.m[i], "deadline_ms"), 750);
  uint64_t t2 = mbd_msg_tag(s.m[i]);
  fp_clear(&s);
  /* CANCEL of the queued one: answered, never sent. */
  client_send(c, "cli", MBD_CMD_CANCEL, 3, 0, 410);
  assert_int_equal(s.n, 1);
  assert_int_equal(mbd_msg_cmd(s.m[0]), MBD_CMD_ERROR);
  assert_int_equal(mbd_msg_tag(s.m[0]), 3);
  assert_int_equal(body_i64(s.m[0], "code"), MBD_E_CANCELLED);
  fp_clear(&s);
  /* CANCEL in flight: the client hears first, then the worker gets the ticket. */
  client_send(c, "cli", MBD_CMD_CANCEL, 2, 0, 420);
  assert_int_equal(s.n, 2);
  assert_int_equal(s.dest[0], MBD_BDEST_CLIENT);
  assert_int_equal(body_i64(s.m[0], "code"), MBD_E_CANCELLED);
  assert_int_equal(mbd_msg_cmd(s.m[1]), MBD_CMD_CANCEL);
  assert_int_equal(mbd_msg_tag(s.m[1]), t2);
  fp_clear(&s);
  /* The slot stays taken until the worker answers the ticket. */
  client_send(c, "cli", MBD_CMD_FORWARD, 4, 0, 430);
  assert_int_equal(s.n, 0);
  from_worker(c, "w1", MBD_CMD_ERROR, t2, NULL, 440);
  assert_true(fp_find(&s, MBD_CMD_FORWARD, "w1") >= 0);
  assert_int_equal(fp_find(&s, MBD_CMD_ERROR, NULL), -1); /* the late ERROR is not relayed */
  /* Another client's CANCEL of the same id reaches nothing. */
  fp_clear(&s);
  client_send(c, "other", MBD_CMD_CANCEL, 4, 0, 450);
  assert_int_equal(s.n, 0);
  assert_int_equal(mbd_bcore_get_stats(c)->cancelled, 2);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static void test_client_gone(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s);
  add_worker(c, "w1", 1, 0);
  client_send(c, "cli", MBD_CMD_FORWARD, 1, 0, 10); /* in flight */
  client_send(c, "cli", MBD_CMD_FORWARD, 2, 0, 10); /* queued */
  client_send(c, "live", MBD_CMD_FORWARD, 1, 0, 10); /* queued, other client */
  int i = fp_find(&s, MBD_CMD_FORWARD, "w1");
  uint64_t t1 = mbd_msg_tag(s.m[i]);
  fp_clear(&s);
  g_gone = "cli";
  mbd_bcore_on_disconnect(c, MBD_BDEST_CLIENT, 20);
  assert_true(mbd_bcore_next_due(c, 20) == 0);
  mbd_bcore_tick(c, 20);
  /* CANCEL of cli's ticket; nothing to cli; live's request still waits for the slot. */
  i = fp_find(&s, MBD_CMD_CANCEL, "w1");
  assert_true(i >= 0);
  assert_int_equal(mbd_msg_tag(s.m[i]), t1);
  assert_int_equal(fp_find(&s, MBD_CMD_ERROR, NULL), -1);
  assert_int_equal(fp_find(&s, MBD_CMD_FORWARD, NULL), -1);
  assert_int_equal(mbd_bcore_get_stats(c)->clients_gone, 1);
  assert_int_equal(mbd_bcore_get_stats(c)->cancelled, 2);
  fp_clear(&s);
  from_worker(c, "w1", MBD_CMD_ERROR, t1, NULL, 30);
  /* The freed slot goes to the live client's request, not cli's queued one. */
  i = fp_find(&s, MBD_CMD_FORWARD, "w1");
  assert_true(i >= 0);
  assert_int_equal(mbd_bcore_pending(c), 1);
  g_gone = NULL;
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static void test_poison(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s);
  add_worker(c, "w1", 1, 0);
  add_worker(c, "w2", 1, 0);
  add_worker(c, "w3", 1, 0);
  fp_clear(&s);
  client_send(c, "cli", MBD_CMD_FORWARD, 1, 0, 10);
  for (int k = 0; k < 2; k++) {
    /* the request, and after a loss the lost worker's goodbye */
    assert_int_equal(s.n, 1 + k);
    int f = fp_find(&s, MBD_CMD_FORWARD, NULL);
    assert_true(f >= 0);
    size_t pl;
    char who[8] = "";
    const void *p = mbd_msg_peer(s.m[f], &pl);
    memcpy(who, p, pl);
    fp_clear(&s);
    from_worker(c, who, MBD_CMD_DISCONNECT, 0, "crashed", 20 + k);
    assert_true(fp_find(&s, MBD_CMD_DISCONNECT, who) >= 0);
  }
  /* Two workers died under it: not sent to the third. */
  assert_int_equal(fp_find(&s, MBD_CMD_FORWARD, NULL), -1);
  int i = fp_find(&s, MBD_CMD_ERROR, "cli");
  assert_true(i >= 0);
  assert_int_equal(body_i64(s.m[i], "code"), MBD_E_WORKER_LOST);
  assert_int_equal(mbd_bcore_get_stats(c)->poisoned, 1);
  assert_int_equal(mbd_bcore_get_stats(c)->failovers, 1);
  fp_clear(&s);
  /* A re-registration is not a death: re-sent as often as MAX_SENDS allows. */
  add_worker(c, "w4", 1, 30);
  fp_clear(&s);
  client_send(c, "cli", MBD_CMD_FORWARD, 2, 0, 40);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(s.n, 1);
    size_t pl;
    char who[8] = "";
    const void *p = mbd_msg_peer(s.m[0], &pl);
    memcpy(who, p, pl);
    fp_clear(&s);
    mbd_msg *m = ready_msg(who, 1); /* same routing id registers again */
    mbd_bcore_on_worker(c, &m, 0, NULL, 50 + k);
  }
  assert_true(fp_find(&s, MBD_CMD_FORWARD, NULL) >= 0); /* third send */
  assert_int_equal(mbd_bcore_get_stats(c)->poisoned, 1);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static void test_draining_worker(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s);
  add_worker(c, "w1", 2, 0);
  fp_clear(&s);
  client_send(c, "cli", MBD_CMD_FORWARD, 1, 0, 10);
  int i = fp_find(&s, MBD_CMD_FORWARD, "w1");
  assert_true(i >= 0);
  uint64_t t1 = mbd_msg_tag(s.m[i]);
  fp_clear(&s);
  /* HEARTBEAT {draining: true}: its running request goes on, new ones wait. */
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_HEARTBEAT, 0, &m, NULL), 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_bool(&pk, "draining", true);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "w1", 2, NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, 20);
  client_send(c, "cli", MBD_CMD_FORWARD, 2, 0, 30);
  assert_int_equal(s.n, 0); /* queued, not NO_ROUTE, not sent */
  assert_int_equal(mbd_bcore_queue_len(c), 1);
  from_worker(c, "w1", MBD_CMD_FINAL, t1, NULL, 40);
  assert_int_equal(fp_find(&s, MBD_CMD_FINAL, "cli"), 0);
  assert_int_equal(fp_find(&s, MBD_CMD_FORWARD, NULL), -1);
  fp_clear(&s);
  add_worker(c, "w2", 1, 50); /* a replacement takes the queued one */
  assert_true(fp_find(&s, MBD_CMD_FORWARD, "w2") >= 0);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_prepend),
                                     cmocka_unit_test(test_deadline_and_cancel),
                                     cmocka_unit_test(test_client_gone),
                                     cmocka_unit_test(test_poison),
                                     cmocka_unit_test(test_draining_worker)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
