/* Durable sessions in the broker core, without sockets: a checkpoint and
 * the tokens after it (STEP, GENERATE PARTIAL) become, when the worker is
 * lost, an IMPORT on the other worker of the route with exactly those tokens
 * as `replay`, bound to the owner; the session's GENERATE waits for it and is
 * re-sent under the new worker's session id with `resume`; another caller's
 * request with that id is not mapped; a checkpoint over the byte budget is
 * refused, and then the session is lost with WORKER_LOST. */
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
#include "common/protocol.h"
#include "support/fake_peers.h"

typedef struct body {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} body;

static void body_init(body *b, size_t n) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
  msgpack_pack_map(&b->pk, n);
}

static mbd_msg *msg_of(uint8_t cmd, uint64_t tag, body *b, const char *peer) {
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  assert_int_equal(mbd_msg_take_body(m, &b->sb, NULL), 0);
  msgpack_sbuffer_destroy(&b->sb);
  assert_int_equal(mbd_msg_set_peer(m, peer, strlen(peer), NULL), 0);
  return m;
}

static void ready(mbd_bcore *c, const char *ident, const char *uid) {
  const fp_ready o = {.uid = uid, .capacity = 8, .digest = "d0d0d0d0"};
  mbd_msg *m = fp_ready_msg(ident, &o);
  mbd_bcore_on_worker(c, &m, 0, NULL, 0);
}

static const uint8_t g_blob[16] = "MBDSESS1-state!";

static void checkpoint(mbd_bcore *c, const char *ident, const char *sid, int64_t now) {
  body b;
  body_init(&b, 4);
  mbd_pack_kv_str(&b.pk, "session", sid);
  mbd_pack_kv_str(&b.pk, "owner", "uid:1");
  mbd_pack_kv_str(&b.pk, "model", "m");
  mbd_pack_kv_str(&b.pk, "model_digest", "d0d0d0d0");
  mbd_msg *m = msg_of(MBD_CMD_CHECKPOINT, 0, &b, ident);
  assert_int_equal(mbd_msg_add_payload_copy(m, g_blob, sizeof g_blob, NULL), 0);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
}

/* A client request on session sid from caller `who` (STEP: token). */
static void request(mbd_bcore *c, uint8_t cmd, uint64_t tag, const char *sid, const char *who,
                    int64_t token, int64_t now) {
  body b;
  body_init(&b, cmd == MBD_CMD_STEP ? 2 : 1);
  mbd_pack_kv_str(&b.pk, "session", sid);
  if (cmd == MBD_CMD_STEP) mbd_pack_kv_i64(&b.pk, "token", token);
  mbd_msg *m = msg_of(cmd, tag, &b, "cli");
  mbd_bcaller who_c;
  memset(&who_c, 0, sizeof who_c);
  snprintf(who_c.id, sizeof who_c.id, "%s", who);
  assert_int_equal(mbd_bcaller_stamp(m, &who_c, NULL), 0);
  mbd_bcore_on_client(c, &m, 0, NULL, now);
}

/* A worker reply to ticket with tokens (GENERATE) or a session id (IMPORT). */
static void reply(mbd_bcore *c, const char *ident, uint8_t cmd, uint64_t ticket,
                  const int64_t *tokens, size_t n, const char *session, int64_t now) {
  body b;
  body_init(&b, session ? 1 : tokens ? 1 : 0);
  if (session) mbd_pack_kv_str(&b.pk, "session", session);
  if (tokens) {
    mbd_pack_str(&b.pk, "tokens");
    msgpack_pack_array(&b.pk, n);
    for (size_t i = 0; i < n; i++) msgpack_pack_int64(&b.pk, tokens[i]);
  }
  mbd_msg *m = msg_of(cmd, ticket, &b, ident);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
}

/* Decoded body of m (the caller destroys it). */
static mbd_body *parse(const mbd_msg *m) {
  size_t len;
  const void *p = mbd_msg_body(m, &len);
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(p, len, &b, NULL), 0);
  return b;
}

static void assert_tokens(const msgpack_object *root, const char *key, const int64_t *want,
                          size_t n) {
  int64_t got[16];
  size_t k = 0;
  assert_int_equal(mbd_obj_i64_array(root, key, true, got, 16, &k, NULL), 0);
  assert_int_equal(k, n);
  assert_memory_equal(got, want, n * sizeof *want);
}

static mbd_bcore *core_new(fp_sent *s, int64_t durable_mb) {
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  strcpy(cfg.clients_ep, "inproc://c");
  strcpy(cfg.workers_ep, "inproc://w");
  cfg.durable_mb = durable_mb;
  mbd_bcore *c = NULL;
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, s, &c, NULL), 0);
  ready(c, "w1", "u1");
  ready(c, "w2", "u2");
  fp_clear(s);
  return c;
}

static void test_rehome_replay_resume(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 16);
  checkpoint(c, "w1", "u1/aa", 1);
  /* STEP 7, then a GENERATE that streamed 3, 4 before w1 is lost. */
  request(c, MBD_CMD_STEP, 10, "u1/aa", "uid:1", 7, 2);
  mbd_msg *fw = fp_find_msg(&s, MBD_CMD_STEP, "w1");
  assert_non_null(fw);
  reply(c, "w1", MBD_CMD_FINAL, mbd_msg_tag(fw), NULL, 0, NULL, 3);
  fp_clear(&s);
  request(c, MBD_CMD_GENERATE, 11, "u1/aa", "uid:1", 0, 4);
  assert_non_null(fw = fp_find_msg(&s, MBD_CMD_GENERATE, "w1"));
  const int64_t streamed[2] = {3, 4};
  reply(c, "w1", MBD_CMD_PARTIAL, mbd_msg_tag(fw), streamed, 2, NULL, 5);
  fp_clear(&s);
  body b;
  body_init(&b, 1);
  mbd_pack_kv_str(&b.pk, "reason", "test");
  mbd_msg *m = msg_of(MBD_CMD_DISCONNECT, 0, &b, "w1");
  mbd_bcore_on_worker(c, &m, 0, NULL, 6);
  /* The restore: the checkpoint's bytes, replay = every token since, the owner. */
  mbd_msg *imp = fp_find_msg(&s, MBD_CMD_IMPORT, "w2");
  assert_non_null(imp);
  assert_null(fp_find_msg(&s, MBD_CMD_ERROR, "cli")); /* the GENERATE waits */
  size_t pl = 0;
  const void *p = mbd_msg_payload(imp, 0, &pl);
  assert_int_equal(pl, sizeof g_blob);
  assert_memory_equal(p, g_blob, pl);
  mbd_body *ib = parse(imp);
  const int64_t replay[3] = {7, 3, 4};
  assert_tokens(mbd_body_root(ib), "replay", replay, 3);
  char owner[32] = "";
  assert_int_equal(mbd_obj_str(mbd_obj_get(mbd_body_root(ib), "caller"), "id", true, owner,
                               sizeof owner, NULL),
                   0);
  assert_string_equal(owner, "uid:1");
  mbd_body_destroy(&ib);
  uint64_t ticket = mbd_msg_tag(imp);
  fp_clear(&s);
  /* Another caller's request with that id is not mapped to the session. */
  request(c, MBD_CMD_STEP, 12, "u1/aa", "uid:2", 1, 7);
  assert_non_null(m = fp_find_msg(&s, MBD_CMD_ERROR, "cli"));
  assert_null(fp_find_msg(&s, MBD_CMD_STEP, "w2"));
  fp_clear(&s);
  /* The restore lands: the GENERATE goes on under w2's id with resume. */
  reply(c, "w2", MBD_CMD_FINAL, ticket, NULL, 0, "u2/bb", 8);
  assert_non_null(fw = fp_find_msg(&s, MBD_CMD_GENERATE, "w2"));
  mbd_body *gb = parse(fw);
  char sid[64] = "";
  assert_int_equal(mbd_obj_str(mbd_body_root(gb), "session", true, sid, sizeof sid, NULL), 0);
  assert_string_equal(sid, "u2/bb");
  assert_tokens(mbd_body_root(gb), "resume", streamed, 2);
  mbd_body_destroy(&gb);
  /* Its FINAL reaches the client under the client's own tag. */
  const int64_t all[4] = {3, 4, 5, 6};
  reply(c, "w2", MBD_CMD_FINAL, mbd_msg_tag(fw), all, 4, NULL, 9);
  assert_non_null(m = fp_find_msg(&s, MBD_CMD_FINAL, "cli"));
  assert_int_equal(mbd_msg_tag(m), 11);
  fp_clear(&s);
  const mbd_bdurable_stats *ds = mbd_bcore_durable_stats(c);
  assert_int_equal(ds->rehomed, 1);
  assert_int_equal(ds->replayed_tokens, 3);
  assert_int_equal(ds->resumed, 1);
  assert_int_equal(ds->lost, 0);
  /* CLOSE's FINAL forgets the session. */
  request(c, MBD_CMD_CLOSE, 13, "u1/aa", "uid:1", 0, 10);
  assert_non_null(fw = fp_find_msg(&s, MBD_CMD_CLOSE, "w2"));
  reply(c, "w2", MBD_CMD_FINAL, mbd_msg_tag(fw), NULL, 0, NULL, 11);
  assert_int_equal(ds->sessions, 0);
  assert_int_equal(ds->bytes, 0);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

static void test_budget_and_lost(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 0); /* no checkpoint fits */
  checkpoint(c, "w1", "u1/aa", 1);
  const mbd_bdurable_stats *ds = mbd_bcore_durable_stats(c);
  assert_int_equal(ds->dropped, 1);
  assert_int_equal(ds->sessions, 0);
  request(c, MBD_CMD_STEP, 10, "u1/aa", "uid:1", 7, 2);
  assert_non_null(fp_find_msg(&s, MBD_CMD_STEP, "w1"));
  fp_clear(&s);
  body b;
  body_init(&b, 0);
  mbd_msg *m = msg_of(MBD_CMD_DISCONNECT, 0, &b, "w1");
  mbd_bcore_on_worker(c, &m, 0, NULL, 3);
  assert_null(fp_find_msg(&s, MBD_CMD_IMPORT, "w2"));
  assert_non_null(m = fp_find_msg(&s, MBD_CMD_ERROR, "cli"));
  mbd_body *eb = parse(m);
  int64_t code = 0;
  assert_int_equal(mbd_obj_i64(mbd_body_root(eb), "code", true, &code, NULL), 0);
  assert_int_equal(code, MBD_E_WORKER_LOST);
  mbd_body_destroy(&eb);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

/* Two STEPs of a session in flight when its worker is lost reach the new
 * worker in their order (each feeds the state the other left). */
static void test_steps_keep_order(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 16);
  checkpoint(c, "w1", "u1/aa", 1);
  request(c, MBD_CMD_STEP, 10, "u1/aa", "uid:1", 8, 2);
  request(c, MBD_CMD_STEP, 11, "u1/aa", "uid:1", 9, 2);
  fp_clear(&s);
  body b;
  body_init(&b, 0);
  mbd_msg *m = msg_of(MBD_CMD_DISCONNECT, 0, &b, "w1");
  mbd_bcore_on_worker(c, &m, 0, NULL, 3);
  mbd_msg *imp = fp_find_msg(&s, MBD_CMD_IMPORT, "w2");
  assert_non_null(imp);
  uint64_t ticket = mbd_msg_tag(imp);
  fp_clear(&s);
  reply(c, "w2", MBD_CMD_FINAL, ticket, NULL, 0, "u2/bb", 4);
  int64_t order[2];
  int n = 0;
  for (int i = 0; i < s.n; i++) {
    if (mbd_msg_cmd(s.m[i]) != MBD_CMD_STEP) continue;
    mbd_body *sb = parse(s.m[i]);
    assert_true(n < 2);
    assert_int_equal(mbd_obj_i64(mbd_body_root(sb), "token", true, &order[n++], NULL), 0);
    mbd_body_destroy(&sb);
  }
  assert_int_equal(n, 2);
  assert_int_equal(order[0], 8);
  assert_int_equal(order[1], 9);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

/* Loses worker ident (DISCONNECT) and answers the restore from whichever
 * worker got it (its name into `next`) with session id `wid`; returns the
 * GENERATE re-sent there, or NULL. */
static mbd_msg *lose_and_restore(mbd_bcore *c, fp_sent *s, const char *ident, char *next,
                                 const char *wid, int64_t now) {
  fp_clear(s);
  body b;
  body_init(&b, 0);
  mbd_msg *m = msg_of(MBD_CMD_DISCONNECT, 0, &b, ident);
  mbd_bcore_on_worker(c, &m, 0, NULL, now);
  mbd_msg *imp = NULL;
  for (int i = 0; i < s->n && !imp; i++)
    if (mbd_msg_cmd(s->m[i]) == MBD_CMD_IMPORT) imp = s->m[i];
  assert_non_null(imp);
  size_t pl = 0;
  const char *p = mbd_msg_peer(imp, &pl);
  snprintf(next, 8, "%.*s", (int)pl, p);
  uint64_t t = mbd_msg_tag(imp);
  reply(c, next, MBD_CMD_FINAL, t, NULL, 0, wid, now + 1);
  return fp_find_msg(s, MBD_CMD_GENERATE, next);
}

/* A GENERATE during which two workers died is not sent to a third (a
 * poison request), while its session still moves there. */
static void test_poison_generate(void **state) {
  (void)state;
  fp_sent s = {0};
  mbd_bcore *c = core_new(&s, 16);
  ready(c, "w3", "u3");
  checkpoint(c, "w1", "u1/aa", 1);
  request(c, MBD_CMD_GENERATE, 11, "u1/aa", "uid:1", 0, 2);
  assert_non_null(fp_find_msg(&s, MBD_CMD_GENERATE, "w1"));
  char w[8], w2[8];
  assert_non_null(lose_and_restore(c, &s, "w1", w, "ux/bb", 3));
  assert_null(lose_and_restore(c, &s, w, w2, "uy/cc", 5));
  mbd_msg *e = fp_find_msg(&s, MBD_CMD_ERROR, "cli");
  assert_non_null(e);
  assert_int_equal(mbd_msg_tag(e), 11);
  assert_int_equal(mbd_bcore_get_stats(c)->poisoned, 1);
  assert_int_equal(mbd_bcore_durable_stats(c)->rehomed, 2);
  fp_clear(&s);
  mbd_bcore_destroy(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_poison_generate),
      cmocka_unit_test(test_steps_keep_order),
      cmocka_unit_test(test_rehome_replay_resume),
      cmocka_unit_test(test_budget_and_lost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
