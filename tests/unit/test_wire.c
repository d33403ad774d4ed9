/* Wire messages over inproc:// DEALER/ROUTER pairs: round trips with payloads,
 * zero-copy free callbacks, cloning, and every kind of malformed frame giving
 * the documented error with the peer identity (and tag when readable). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "common/wire.h"
#include "support/events.h"

typedef struct {
  void *ctx, *router, *dealer;
} pair;

static int setup(void **state) {
  static int n;
  pair *p = calloc(1, sizeof *p);
  p->ctx = zmq_ctx_new();
  p->router = zmq_socket(p->ctx, ZMQ_ROUTER);
  p->dealer = zmq_socket(p->ctx, ZMQ_DEALER);
  int one = 1, zero = 0, tmo = 2000;
  zmq_setsockopt(p->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(p->router, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(p->dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(p->router, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(p->dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(p->dealer, ZMQ_ROUTING_ID, "dealer-1", 8);
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://wire-%d-%d", (int)getpid(), n++);
  assert_int_equal(zmq_bind(p->router, ep), 0);
  assert_int_equal(zmq_connect(p->dealer, ep), 0);
  *state = p;
  return 0;
}

static int teardown(void **state) {
  pair *p = *state;
  zmq_close(p->dealer);
  zmq_close(p->router);
  zmq_ctx_term(p->ctx);
  free(p);
  return 0;
}

static mbd_msg *make_msg(uint8_t cmd, uint64_t tag) {
  mbd_msg *m = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_msg_new(cmd, tag, &m, &err), 0);
  return m;
}

static void test_roundtrip_payloads(void **state) {
  pair *p = *state;
  mbd_error err = {0};
  mbd_msg *m = make_msg(MBD_CMD_FORWARD, 0x0102030405060708ull);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "model", "mamba-130m");
  assert_int_equal(mbd_msg_take_body(m, &sb, &err), 0);
  assert_null(sb.data);
  msgpack_sbuffer_destroy(&sb);
  uint8_t big[100000];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 31 + 7);
  assert_int_equal(mbd_msg_add_payload_copy(m, big, sizeof big, &err), 0);
  assert_int_equal(mbd_msg_add_payload_copy(m, NULL, 0, &err), 0); /* empty payload */
  assert_int_equal(mbd_msg_add_payload_copy(m, "xyz", 3, &err), 0);
  assert_int_equal(mbd_msg_npayloads(m), 3);
  assert_int_equal(mbd_msg_send(&m, p->dealer, 0, &err), 0);
  assert_null(m);

  mbd_msg *r = NULL;
  assert_int_equal(mbd_msg_recv(p->router, true, 0, &r, &err), 0);
  assert_int_equal(mbd_msg_cmd(r), MBD_CMD_FORWARD);
  assert_true(mbd_msg_tag(r) == 0x0102030405060708ull);
  size_t len = 0;
  const void *peer = mbd_msg_peer(r, &len);
  assert_int_equal(len, 8);
  assert_memory_equal(peer, "dealer-1", 8);
  const void *body = mbd_msg_body(r, &len);
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(body, len, &b, &err), 0);
  char model[32];
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "model", true, model, sizeof model, &err), 0);
  assert_string_equal(model, "mamba-130m");
  mbd_body_destroy(&b);
  assert_int_equal(mbd_msg_npayloads(r), 3);
  const void *d = mbd_msg_payload(r, 0, &len);
  assert_int_equal(len, sizeof big);
  assert_memory_equal(d, big, sizeof big);
  mbd_msg_payload(r, 1, &len);
  assert_int_equal(len, 0);
  d = mbd_msg_payload(r, 2, &len);
  assert_int_equal(len, 3);
  assert_memory_equal(d, "xyz", 3);
  assert_null(mbd_msg_payload(r, 3, &len));

  /* Reply back through the ROUTER using the peer identity, payloads moved. */
  mbd_msg *fw = make_msg(MBD_CMD_FINAL, 77);
  const void *pid = mbd_msg_peer(r, &len);
  assert_int_equal(mbd_msg_set_peer(fw, pid, len, &err), 0);
  zmq_msg_t z;
  assert_int_equal(mbd_msg_take_payload(r, 0, &z, &err), 0);
  const void *zdata = zmq_msg_data(&z);
  assert_int_equal(mbd_msg_add_payload_move(fw, &z, &err), 0);
  assert_int_equal(zmq_msg_size(&z), 0); /* src re-initialised */
  zmq_msg_close(&z);
  const void *moved = mbd_msg_payload(fw, 0, &len);
  assert_ptr_equal(moved, zdata); /* moved, not copied */
  assert_int_equal(mbd_msg_take_payload(r, 9, &z, &err), MBD_E_INVALID);
  assert_int_equal(mbd_msg_send(&fw, p->router, 0, &err), 0);
  mbd_msg_destroy(&r);
  assert_int_equal(mbd_msg_recv(p->dealer, false, 0, &r, &err), 0);
  assert_int_equal(mbd_msg_cmd(r), MBD_CMD_FINAL);
  assert_int_equal(mbd_msg_tag(r), 77);
  d = mbd_msg_payload(r, 0, &len);
  assert_int_equal(len, sizeof big);
  assert_memory_equal(d, big, sizeof big);
  body = mbd_msg_body(r, &len);
  assert_int_equal(len, 0); /* empty body reads as an empty map */
  mbd_msg_destroy(&r);
  assert_null(r);
  mbd_msg_destroy(&r); /* NULL-safe */
}

static int g_freed;
static void count_free(void *data, void *hint) {
  (void)data;
  __atomic_add_fetch((int *)hint, 1, __ATOMIC_SEQ_CST);
}

static void test_zero_copy_ref(void **state) {
  pair *p = *state;
  mbd_error err = {0};
  static uint8_t buf[65536];
  memset(buf, 0xab, sizeof buf);
  g_freed = 0;
  mbd_msg *m = make_msg(MBD_CMD_GEMM, 5);
  assert_int_equal(mbd_msg_add_payload_ref(m, buf, sizeof buf, count_free, &g_freed, &err), 0);
  /* A clone shares the bytes: the callback must run once, after both are gone. */
  mbd_msg *c = NULL;
  assert_int_equal(mbd_msg_clone(m, &c, &err), 0);
  size_t len;
  assert_ptr_equal(mbd_msg_payload(c, 0, &len), buf);
  assert_int_equal(mbd_msg_send(&m, p->dealer, 0, &err), 0);
  mbd_msg *r = NULL;
  assert_int_equal(mbd_msg_recv(p->router, true, 0, &r, &err), 0);
  assert_memory_equal(mbd_msg_payload(r, 0, &len), buf, sizeof buf);
  mbd_msg_destroy(&r);
  assert_int_equal(__atomic_load_n(&g_freed, __ATOMIC_SEQ_CST), 0); /* clone still holds it */
  assert_int_equal(mbd_msg_tag(c), 5);
  assert_int_equal(mbd_msg_send(&c, p->dealer, 0, &err), 0);
  assert_int_equal(mbd_msg_recv(p->router, true, 0, &r, &err), 0);
  assert_int_equal(mbd_msg_tag(r), 5);
  mbd_msg_destroy(&r);
  /* inproc hands the zmq_msg over; freeing may lag on the I/O thread. */
  for (int64_t end = ev_now_ms() + EV_HANG_MS;
       __atomic_load_n(&g_freed, __ATOMIC_SEQ_CST) == 0 && ev_now_ms() < end;)
    ev_nap_ms(5);
  assert_int_equal(__atomic_load_n(&g_freed, __ATOMIC_SEQ_CST), 1);
}

/* Sends raw frames from the dealer; returns after the last. */
static void send_raw(pair *p, const void *const *frames, const size_t *lens, size_t n) {
  for (size_t i = 0; i < n; i++)
    assert_true(zmq_send(p->dealer, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void expect_bad(pair *p, int code, bool tag_readable, uint64_t tag, const char *needle) {
  mbd_msg *r = NULL;
  mbd_error err = {0};
  int rc = mbd_msg_recv(p->router, true, 4096, &r, &err);
  assert_int_equal(rc, code);
  assert_non_null(r);
  size_t len;
  const void *peer = mbd_msg_peer(r, &len);
  assert_int_equal(len, 8);
  assert_memory_equal(peer, "dealer-1", 8);
  if (tag_readable) assert_true(mbd_msg_tag(r) == tag);
  else assert_int_equal(mbd_msg_tag(r), 0);
  assert_int_equal(mbd_msg_npayloads(r), 0);
  if (needle && !strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
  mbd_msg_destroy(&r);
  /* The socket is still in sync: the next good message reads cleanly. */
  mbd_msg *g = make_msg(MBD_CMD_STATUS, 99);
  assert_int_equal(mbd_msg_send(&g, p->dealer, 0, &err), 0);
  assert_int_equal(mbd_msg_recv(p->router, true, 4096, &r, &err), 0);
  assert_int_equal(mbd_msg_tag(r), 99);
  mbd_msg_destroy(&r);
}

/* A 13-byte header frame: 4 bytes of magic + version, command, tag. */
static void hdr(uint8_t h[MBD_PROTO_HEADER_BYTES], const char *magic4, uint8_t cmd, uint64_t tag) {
  memcpy(h, magic4, 4);
  h[4] = cmd;
  for (int i = 0; i < 8; i++) h[5 + i] = (uint8_t)(tag >> (8 * i));
}

static void test_malformed(void **state) {
  pair *p = *state;
  const uint8_t tag[8] = {0x2a, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t cmd = MBD_CMD_GEMM;
  const uint8_t empty_map = 0x80;
  static uint8_t filler[3000];
  uint8_t good[13], bad_magic[13], v9[13], badcmd[13];
  hdr(good, "MBD\x02", cmd, 42);
  hdr(bad_magic, "XYZ\x02", cmd, 42);
  hdr(v9, "MBD\x09", cmd, 42);
  hdr(badcmd, "MBD\x02", 0x55, 42);
  {
    const void *f[] = {bad_magic, &empty_map};
    size_t l[] = {13, 1};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_PROTOCOL, true, 42, "magic");
  }
  {
    const void *f[] = {v9, &empty_map};
    size_t l[] = {13, 1};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_PROTOCOL, true, 42, "version 9");
  }
  {
    /* a version 1 peer: four frames, the tag in the third */
    const void *f[] = {"MBD\x01", &cmd, tag, &empty_map};
    size_t l[] = {4, 1, 8, 1};
    send_raw(p, f, l, 4);
    expect_bad(p, MBD_E_PROTOCOL, false, 0, "version 1 not supported");
  }
  {
    const void *f[] = {"MBD", &empty_map}; /* magic without version */
    size_t l[] = {3, 1};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_PROTOCOL, false, 0, "magic");
  }
  {
    const void *f[] = {badcmd, &empty_map};
    size_t l[] = {13, 1};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_PROTOCOL, true, 42, "unknown command");
  }
  {
    const void *f[] = {good, &empty_map};
    size_t l[] = {12, 1}; /* short tag */
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_PROTOCOL, false, 0, "header frame");
  }
  {
    const void *f[] = {good};
    size_t l[] = {13}; /* body missing */
    send_raw(p, f, l, 1);
    expect_bad(p, MBD_E_PROTOCOL, true, 42, "frame");
  }
  {
    const void *f[] = {good, "\x92\x01\x02"}; /* body is an array */
    size_t l[] = {13, 3};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_FORMAT, true, 42, "map");
  }
  {
    const void *f[] = {good, "\x82\xa1k"}; /* truncated map */
    size_t l[] = {13, 3};
    send_raw(p, f, l, 2);
    expect_bad(p, MBD_E_FORMAT, true, 42, "truncated");
  }
  {
    /* over the 4096-byte cap, split over payload frames: all drained */
    const void *f[] = {good, &empty_map, filler, filler, filler};
    size_t l[] = {13, 1, sizeof filler, sizeof filler, sizeof filler};
    send_raw(p, f, l, 5);
    expect_bad(p, MBD_E_TOO_LARGE, true, 42, "exceeds");
  }
}

static void test_too_many_frames_and_decode(void **state) {
  (void)state;
  /* Socket-free decode: header and body frames + MAX+1 payloads. */
  size_t n = 2 + MBD_MSG_MAX_FRAMES + 1;
  zmq_msg_t *fr = calloc(n, sizeof *fr);
  zmq_msg_init_size(&fr[0], MBD_PROTO_HEADER_BYTES);
  hdr(zmq_msg_data(&fr[0]), "MBD\x02", MBD_CMD_FINAL, 9);
  zmq_msg_init(&fr[1]);
  for (size_t i = 2; i < n; i++) zmq_msg_init_size(&fr[i], 1);
  mbd_msg *m = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_msg_decode(fr, n, false, 0, &m, &err), MBD_E_TOO_LARGE);
  assert_int_equal(mbd_msg_tag(m), 9);
  mbd_msg_destroy(&m);
  /* the same minus one payload is fine */
  zmq_msg_init_size(&fr[0], MBD_PROTO_HEADER_BYTES);
  hdr(zmq_msg_data(&fr[0]), "MBD\x02", MBD_CMD_FINAL, 9);
  zmq_msg_init(&fr[1]);
  for (size_t i = 2; i < n - 1; i++) zmq_msg_init_size(&fr[i], 1);
  assert_int_equal(mbd_msg_decode(fr, n - 1, false, 0, &m, &err), 0);
  assert_int_equal(mbd_msg_npayloads(m), MBD_MSG_MAX_FRAMES);
  assert_int_equal(mbd_msg_cmd(m), MBD_CMD_FINAL);
  mbd_msg_destroy(&m);
  free(fr);
}

static void test_error_reply_and_unreachable(void **state) {
  pair *p = *state;
  mbd_error err = {0};
  mbd_msg *e = NULL;
  assert_int_equal(mbd_msg_new_error(1234, MBD_E_NO_ROUTE, "no worker serves dtype=bf16", &e, &err), 0);
  assert_int_equal(mbd_msg_cmd(e), MBD_CMD_ERROR);
  assert_int_equal(mbd_msg_set_peer(e, "dealer-1", 8, &err), 0);
  assert_int_equal(mbd_msg_send(&e, p->router, 0, &err), 0);
  mbd_msg *r = NULL;
  assert_int_equal(mbd_msg_recv(p->dealer, false, 0, &r, &err), 0);
  assert_int_equal(mbd_msg_tag(r), 1234);
  size_t len;
  const void *body = mbd_msg_body(r, &len);
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(body, len, &b, &err), 0);
  int64_t code = 0;
  char name[32], msg[128];
  assert_int_equal(mbd_obj_i64(mbd_body_root(b), "code", true, &code, &err), 0);
  assert_int_equal(code, MBD_E_NO_ROUTE);
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "error", true, name, sizeof name, &err), 0);
  assert_string_equal(name, "NO_ROUTE");
  assert_int_equal(mbd_obj_str(mbd_body_root(b), "message", true, msg, sizeof msg, &err), 0);
  assert_string_equal(msg, "no worker serves dtype=bf16");
  mbd_body_destroy(&b);
  mbd_msg_destroy(&r);

  /* ROUTER_MANDATORY: unknown peer -> NOT_FOUND, message destroyed anyway. */
  e = make_msg(MBD_CMD_FINAL, 1);
  assert_int_equal(mbd_msg_set_peer(e, "nobody", 6, &err), 0);
  assert_int_equal(mbd_msg_send(&e, p->router, ZMQ_DONTWAIT, &err), MBD_E_NOT_FOUND);
  assert_null(e);
  uint8_t longid[300] = {0};
  e = make_msg(MBD_CMD_FINAL, 1);
  assert_int_equal(mbd_msg_set_peer(e, longid, sizeof longid, &err), MBD_E_INVALID);
  mbd_msg_destroy(&e);

  /* Nothing to receive: MBD_E_IO and *out NULL. */
  int tmo = 10;
  zmq_setsockopt(p->dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  r = (mbd_msg *)1;
  assert_int_equal(mbd_msg_recv(p->dealer, false, 0, &r, &err), MBD_E_IO);
  assert_null(r);
}

static void test_set_body_and_many_payloads(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_msg *m = make_msg(MBD_CMD_PARTIAL, 3);
  assert_int_equal(mbd_msg_set_body(m, "\x80", 1, &err), 0);
  size_t len;
  const uint8_t *b = mbd_msg_body(m, &len);
  assert_int_equal(len, 1);
  assert_int_equal(b[0], 0x80);
  /* growth across several reallocations keeps earlier frames intact */
  for (uint32_t i = 0; i < 100; i++) assert_int_equal(mbd_msg_add_payload_copy(m, &i, 4, &err), 0);
  for (uint32_t i = 0; i < 100; i++) {
    const uint32_t *v = mbd_msg_payload(m, i, &len);
    assert_int_equal(len, 4);
    assert_int_equal(*v, i);
  }
  mbd_msg_set_cmd(m, MBD_CMD_FINAL);
  mbd_msg_set_tag(m, 8);
  assert_int_equal(mbd_msg_cmd(m), MBD_CMD_FINAL);
  assert_int_equal(mbd_msg_tag(m), 8);
  mbd_msg_destroy(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_roundtrip_payloads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_zero_copy_ref, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
      cmocka_unit_test(test_too_many_frames_and_decode),
      cmocka_unit_test_setup_teardown(test_error_reply_and_unreachable, setup, teardown),
      cmocka_unit_test(test_set_body_and_many_payloads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
