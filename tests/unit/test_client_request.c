/* libmambad's request loop against a scripted fake broker (a ROUTER in a
 * thread): replies for other request ids and malformed messages are skipped,
 * a late reply to a timed-out request never answers the next one, ERROR
 * replies surface code, message, route id and worker, PARTIALs stream to the
 * callback, reply tensors are checked against their frames, and requests carry
 * the documented body (model, route, deadline, tensors, shm refs). */
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/mambad.h"
#include "common/protocol.h"
#include "common/wire.h"

typedef enum scenario {
  SC_STRAY_THEN_STATUS,
  SC_ERROR,
  SC_SILENT,         /* no reply at all */
  SC_LATE_THEN_OK,   /* first the reply to the previous (timed-out) id, then ours */
  SC_STREAM,
  SC_TENSOR,
  SC_BAD_TENSOR,     /* reply names a frame that is not there */
  SC_OPEN,           /* FINAL {session: "uid7/3"} */
} scenario;

typedef struct fake {
  void *ctx, *router;
  char ep[128];
  scenario sc;
  /* what the fake saw in the last request */
  uint8_t cmd;
  uint64_t tag;
  char model[64], route_dtype[16], shm_name[64];
  int64_t deadline_ms;
  size_t npayloads, payload0_len;
  unsigned char payload0[64];
  unsigned char shm_bytes[64];
  uint64_t prev_tag;
} fake;

static void send_reply(fake *f, const mbd_msg *req, uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb,
                       const void *payload, size_t plen) {
  mbd_msg *m = NULL;
  size_t idl = 0;
  const void *id = mbd_msg_peer(req, &idl);
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  mbd_msg_set_peer(m, id, idl, NULL);
  if (sb) mbd_msg_take_body(m, sb, NULL);
  if (payload) mbd_msg_add_payload_copy(m, payload, plen, NULL);
  assert_int_equal(mbd_msg_send(&m, f->router, 0, NULL), 0);
}

/* Starts a body map of n entries. */
static msgpack_packer begin(msgpack_sbuffer *sb, size_t n) {
  msgpack_sbuffer_init(sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, n);
  return pk;
}

static void record(fake *f, const mbd_msg *req) {
  f->cmd = mbd_msg_cmd(req);
  f->tag = mbd_msg_tag(req);
  size_t len = 0;
  const void *b = mbd_msg_body(req, &len);
  mbd_body *body = NULL;
  assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
  const msgpack_object *root = mbd_body_root(body);
  f->model[0] = f->route_dtype[0] = f->shm_name[0] = '\0';
  f->deadline_ms = 0;
  mbd_obj_str(root, "model", false, f->model, sizeof f->model, NULL);
  mbd_obj_i64(root, "deadline_ms", false, &f->deadline_ms, NULL);
  mbd_route_want w;
  if (mbd_obj_route_want(root, "route", &w, NULL) == 0) snprintf(f->route_dtype, sizeof f->route_dtype, "%s", w.dtype);
  mbd_tensor_ref refs[4];
  size_t n = 0;
  if (mbd_obj_tensor_refs(root, "tensors", false, refs, 4, &n, NULL) == 0 && n > 0 &&
      refs[0].kind == MBD_TREF_SHM) {
    snprintf(f->shm_name, sizeof f->shm_name, "%s", refs[0].shm_name);
    int fd = shm_open(refs[0].shm_name, O_RDONLY, 0);
    if (fd >= 0) {
      if (pread(fd, f->shm_bytes, sizeof f->shm_bytes, (off_t)refs[0].offset) < 0) f->shm_bytes[0] = 0xee;
      close(fd);
    }
  }
  mbd_body_destroy(&body);
  f->npayloads = mbd_msg_npayloads(req);
  f->payload0_len = 0;
  if (f->npayloads) {
    const void *p = mbd_msg_payload(req, 0, &f->payload0_len);
    memcpy(f->payload0, p, f->payload0_len < 64 ? f->payload0_len : 64);
  }
}

static void *fake_main(void *arg) {
  fake *f = arg;
  mbd_msg *req = NULL;
  if (mbd_msg_recv(f->router, true, 0, &req, NULL) != 0) return NULL;
  record(f, req);
  uint64_t tag = mbd_msg_tag(req);
  msgpack_sbuffer sb;
  msgpack_packer pk;
  switch (f->sc) {
  case SC_STRAY_THEN_STATUS: {
    pk = begin(&sb, 1);
    mbd_pack_kv_u64(&pk, "queue", 99);
    send_reply(f, req, MBD_CMD_FINAL, tag + 100, &sb, NULL, 0); /* someone else's */
    msgpack_sbuffer_destroy(&sb);
    zmq_msg_t junk; /* not even our framing */
    size_t idl = 0;
    const void *id = mbd_msg_peer(req, &idl);
    zmq_send(f->router, id, idl, ZMQ_SNDMORE);
    zmq_msg_init_size(&junk, 3);
    memcpy(zmq_msg_data(&junk), "XYZ", 3);
    zmq_msg_send(&junk, f->router, 0);
    pk = begin(&sb, 2);
    mbd_pack_kv_u64(&pk, "queue", 3);
    mbd_pack_str(&pk, "workers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 5);
    mbd_pack_kv_str(&pk, "name", "w1");
    mbd_pack_kv_str(&pk, "route_id", "ab12");
    mbd_pack_kv_i64(&pk, "inflight", 2);
    mbd_pack_kv_i64(&pk, "capacity", 8);
    mbd_pack_str(&pk, "models");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 3);
    mbd_pack_kv_str(&pk, "name", "tiny");
    mbd_pack_kv_str(&pk, "digest", "d1");
    mbd_pack_kv_str(&pk, "tokenizer_digest", "t1");
    send_reply(f, req, MBD_CMD_FINAL, tag, &sb, NULL, 0);
    break;
  }
  case SC_ERROR:
    pk = begin(&sb, 5);
    mbd_pack_kv_i64(&pk, "code", MBD_E_NO_ROUTE);
    mbd_pack_kv_str(&pk, "error", "NO_ROUTE");
    mbd_pack_kv_str(&pk, "message", "no worker for dtype=f16");
    mbd_pack_kv_str(&pk, "route_id", "cafe");
    mbd_pack_kv_str(&pk, "worker", "w9");
    send_reply(f, req, MBD_CMD_ERROR, tag, &sb, NULL, 0);
    break;
  case SC_SILENT:
    f->prev_tag = tag;
    mbd_msg_destroy(&req);
    return NULL;
  case SC_LATE_THEN_OK:
    pk = begin(&sb, 1);
    mbd_pack_kv_u64(&pk, "queue", 1234);
    send_reply(f, req, MBD_CMD_FINAL, f->prev_tag, &sb, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
    pk = begin(&sb, 1);
    mbd_pack_kv_u64(&pk, "queue", 7);
    send_reply(f, req, MBD_CMD_FINAL, tag, &sb, NULL, 0);
    break;
  case SC_STREAM: {
    int64_t parts[2][2] = {{11, 12}, {13, 0}};
    for (int i = 0; i < 2; i++) {
      pk = begin(&sb, 1);
      mbd_pack_str(&pk, "tokens");
      msgpack_pack_array(&pk, i == 0 ? 2 : 1);
      for (int k = 0; k < (i == 0 ? 2 : 1); k++) msgpack_pack_int64(&pk, parts[i][k]);
      send_reply(f, req, MBD_CMD_PARTIAL, tag, &sb, NULL, 0);
      msgpack_sbuffer_destroy(&sb);
    }
    pk = begin(&sb, 4);
    mbd_pack_str(&pk, "tokens");
    msgpack_pack_array(&pk, 4);
    for (int k = 11; k <= 14; k++) msgpack_pack_int64(&pk, k);
    mbd_pack_kv_str(&pk, "reason", "stop");
    mbd_pack_kv_str(&pk, "route_id", "beef");
    mbd_pack_kv_str(&pk, "worker", "w2");
    send_reply(f, req, MBD_CMD_FINAL, tag, &sb, NULL, 0);
    break;
  }
  case SC_OPEN:
    pk = begin(&sb, 1);
    mbd_pack_kv_str(&pk, "session", "uid7/3");
    send_reply(f, req, MBD_CMD_FINAL, tag, &sb, NULL, 0);
    break;
  case SC_TENSOR:
  case SC_BAD_TENSOR: {
    float v[6] = {1, 2, 3, 4, 5, 6.5f};
    mbd_tensor_ref r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "logits");
    int64_t shape[2] = {2, 3};
    mbd_tensor_desc_make(&r.desc, MBD_DTYPE_F32, 2, shape, NULL);
    r.kind = MBD_TREF_INLINE;
    r.frame = f->sc == SC_TENSOR ? 0 : 1;
    pk = begin(&sb, 3);
    mbd_pack_str(&pk, "tensors");
    msgpack_pack_array(&pk, 1);
    mbd_pack_tensor_ref(&pk, &r);
    mbd_pack_kv_str(&pk, "route_id", "f00d");
    mbd_pack_kv_str(&pk, "worker", "w3");
    send_reply(f, req, MBD_CMD_FINAL, tag, &sb, v, sizeof v);
    break;
  }
  }
  msgpack_sbuffer_destroy(&sb);
  mbd_msg_destroy(&req);
  return NULL;
}

static fake F;
static mbd_client *C;

static int setup(void **state) {
  (void)state;
  snprintf(F.ep, sizeof F.ep, "ipc:///tmp/mbd-client-test-%d.sock", (int)getpid());
  F.ctx = zmq_ctx_new();
  F.router = zmq_socket(F.ctx, ZMQ_ROUTER);
  int zero = 0;
  zmq_setsockopt(F.router, ZMQ_LINGER, &zero, sizeof zero);
  if (zmq_bind(F.router, F.ep) != 0) return -1;
  mbd_client_options o;
  mbd_client_options_init(&o);
  o.deadline_ms = 5000;
  return mbd_client_new(F.ep, &o, &C, NULL);
}

static int teardown(void **state) {
  (void)state;
  mbd_client_destroy(&C);
  zmq_close(F.router);
  zmq_ctx_term(F.ctx);
  unlink(F.ep + 6);
  return 0;
}

static pthread_t run_fake(scenario sc) {
  pthread_t t;
  F.sc = sc;
  assert_int_equal(pthread_create(&t, NULL, fake_main, &F), 0);
  return t;
}

static void test_stray_and_malformed_replies_skipped(void **state) {
  (void)state;
  pthread_t t = run_fake(SC_STRAY_THEN_STATUS);
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  int rc = mbd_client_status(C, &r, &err);
  pthread_join(t, NULL);
  if (rc) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(F.cmd, MBD_CMD_STATUS);
  assert_int_equal(F.deadline_ms, 5000);
  assert_true(F.tag != 0);
  assert_int_equal(mbd_client_last_reply(C)->request_id, F.tag);
  assert_int_equal(r->queue, 3);
  assert_int_equal(r->n_workers, 1);
  assert_string_equal(r->workers[0].name, "w1");
  assert_int_equal(r->workers[0].load, 2); /* "inflight" */
  assert_int_equal(r->workers[0].capacity, 8);
  assert_true(r->workers[0].alive);
  assert_string_equal(r->workers[0].route, "");
  assert_int_equal(r->workers[0].n_models, 1);
  assert_string_equal(r->workers[0].models[0].digest, "d1");
  assert_string_equal(r->workers[0].models[0].tokenizer_digest, "t1");
  mbd_status_report_free(&r);
}

static void test_error_reply(void **state) {
  (void)state;
  pthread_t t = run_fake(SC_ERROR);
  mbd_session *s = (mbd_session *)&F; /* must be overwritten with NULL */
  mbd_error err = {0};
  mbd_route_want w;
  memset(&w, 0, sizeof w);
  snprintf(w.dtype, sizeof w.dtype, "f16");
  mbd_call_opts o = {.route = &w, .deadline_ms = 1234};
  int rc = mbd_session_open(C, &o, "tiny", &s, &err);
  pthread_join(t, NULL);
  assert_int_equal(rc, MBD_E_NO_ROUTE);
  assert_null(s);
  assert_int_equal(err.code, MBD_E_NO_ROUTE);
  assert_string_equal(err.msg, "no worker for dtype=f16");
  assert_int_equal(F.cmd, MBD_CMD_OPEN);
  assert_string_equal(F.model, "tiny");
  assert_string_equal(F.route_dtype, "f16");
  assert_int_equal(F.deadline_ms, 1234);
  const mbd_reply_meta *m = mbd_client_last_reply(C);
  assert_int_equal(m->code, MBD_E_NO_ROUTE);
  assert_string_equal(m->error, "NO_ROUTE");
  assert_string_equal(m->route_id, "cafe");
  assert_string_equal(m->worker, "w9");
}

static void test_timeout_then_late_reply_ignored(void **state) {
  (void)state;
  pthread_t t = run_fake(SC_SILENT);
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  mbd_client_destroy(&C); /* a short deadline for this one */
  mbd_client_options o;
  mbd_client_options_init(&o);
  o.deadline_ms = 50;
  assert_int_equal(mbd_client_new(F.ep, &o, &C, NULL), 0);
  assert_int_equal(mbd_client_status(C, &r, &err), MBD_E_TIMEOUT);
  if (!strstr(err.msg, "no reply to status")) fprintf(stderr, "msg: %s\n", err.msg);
  assert_non_null(strstr(err.msg, "no reply to status"));
  assert_null(r);
  pthread_join(t, NULL);
  t = run_fake(SC_LATE_THEN_OK);
  assert_int_equal(mbd_client_status(C, &r, &err), 0);
  pthread_join(t, NULL);
  assert_true(F.tag != F.prev_tag);
  assert_int_equal(r->queue, 7); /* not the late 1234 */
  mbd_status_report_free(&r);
}

typedef struct seen {
  int calls;
  int64_t toks[8];
  size_t n;
} seen;

static void on_tokens(void *user, const int64_t *t, size_t n) {
  seen *s = user;
  s->calls++;
  for (size_t i = 0; i < n && s->n < 8; i++) s->toks[s->n++] = t[i];
}

static void test_generate_stream(void **state) {
  (void)state;
  pthread_t t = run_fake(SC_OPEN);
  mbd_session *s = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_session_open(C, NULL, "tiny", &s, &err), 0);
  pthread_join(t, NULL);
  assert_string_equal(mbd_session_id(s), "uid7/3");
  t = run_fake(SC_STREAM);
  mbd_generate_params p;
  mbd_generate_params_init(&p);
  int64_t stop[1] = {14};
  p.stop = stop;
  p.n_stop = 1;
  seen sn = {0};
  int64_t *toks = NULL;
  size_t n = 0;
  char reason[16];
  int rc = mbd_session_generate(s, NULL, &p, on_tokens, &sn, &toks, &n, reason, &err);
  pthread_join(t, NULL);
  if (rc) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(F.cmd, MBD_CMD_GENERATE);
  assert_int_equal(sn.calls, 2);
  assert_int_equal(sn.n, 3);
  assert_int_equal(sn.toks[2], 13);
  assert_int_equal(n, 4);
  assert_int_equal(toks[3], 14);
  assert_string_equal(reason, "stop");
  assert_string_equal(mbd_client_last_reply(C)->worker, "w2");
  free(toks);
  t = run_fake(SC_OPEN); /* CLOSE gets a FINAL too */
  assert_int_equal(mbd_session_close(&s, &err), 0);
  pthread_join(t, NULL);
  assert_int_equal(F.cmd, MBD_CMD_CLOSE);
  assert_null(s);
}

static void test_tensor_reply_and_request_body(void **state) {
  (void)state;
  pthread_t t = run_fake(SC_TENSOR);
  int64_t ids[6] = {1, 2, 3, 4, 5, 6}, shape[2] = {2, 3};
  mbd_tensor_in in = {.data = ids};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  mbd_tensor_out out = {0};
  mbd_error err = {0};
  int rc = mbd_client_forward(C, NULL, "tiny", &in, false, NULL, &out, &err);
  pthread_join(t, NULL);
  if (rc) fprintf(stderr, "%s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(F.cmd, MBD_CMD_FORWARD);
  assert_string_equal(F.model, "tiny");
  assert_int_equal(F.npayloads, 1);
  assert_int_equal(F.payload0_len, sizeof ids);
  assert_memory_equal(F.payload0, ids, sizeof ids);
  assert_string_equal(out.name, "logits");
  assert_int_equal(out.nbytes, 24);
  assert_int_equal(out.desc.shape[1], 3);
  assert_true(((float *)out.data)[5] == 6.5f);
  assert_string_equal(mbd_client_last_reply(C)->worker, "w3");
  mbd_tensor_out_release(&out);
  assert_null(out.data);

  /* the same through shared memory: the fake reads the bytes from the object */
  mbd_shm *shm = NULL;
  assert_int_equal(mbd_shm_create(NULL, 4096, &shm, &err), 0);
  memcpy((char *)mbd_shm_data(shm) + 64, ids, sizeof ids);
  assert_int_equal(mbd_shm_tensor(shm, 64, &in.desc, &in, &err), 0);
  mbd_tensor_in bad;
  assert_int_equal(mbd_shm_tensor(shm, 4090, &in.desc, &bad, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "do not fit"));
  t = run_fake(SC_TENSOR);
  rc = mbd_client_forward(C, NULL, "tiny", &in, true, NULL, &out, &err);
  pthread_join(t, NULL);
  assert_int_equal(rc, 0);
  assert_int_equal(F.npayloads, 0);
  assert_string_equal(F.shm_name, mbd_shm_name(shm));
  assert_memory_equal(F.shm_bytes, ids, sizeof ids);
  mbd_tensor_out_release(&out);
  mbd_shm_destroy(&shm);
  assert_null(shm);

  /* a reply naming a frame that is not there is a PROTOCOL error */
  in = (mbd_tensor_in){.data = ids};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  t = run_fake(SC_BAD_TENSOR);
  rc = mbd_client_forward(C, NULL, "tiny", &in, false, NULL, &out, &err);
  pthread_join(t, NULL);
  assert_int_equal(rc, MBD_E_PROTOCOL);
  assert_null(out.data);
}

static void test_argument_errors(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_tensor_out out = {0};
  int64_t ids[2] = {1, 2}, shape1[1] = {2};
  mbd_tensor_in in = {.data = ids};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 1, shape1, NULL);
  assert_int_equal(mbd_client_forward(C, NULL, "tiny", &in, false, NULL, &out, &err), MBD_E_SHAPE);
  assert_int_equal(mbd_client_forward(C, NULL, "", &in, false, NULL, &out, &err), MBD_E_INVALID);
  in.data = NULL;
  assert_int_equal(mbd_client_forward(C, NULL, "tiny", &in, false, NULL, &out, &err), MBD_E_INVALID);
  mbd_client *c2 = NULL;
  assert_int_equal(mbd_client_new("nonsense", NULL, &c2, &err), MBD_E_INVALID);
  assert_null(c2);
  assert_int_equal(mbd_client_new(NULL, NULL, &c2, &err), MBD_E_INVALID);
  mbd_shm *shm = NULL;
  assert_int_equal(mbd_shm_create("no-slash", 16, &shm, &err), MBD_E_INVALID);
  assert_int_equal(mbd_shm_create(NULL, 0, &shm, &err), MBD_E_INVALID);
  mbd_shm_destroy(&shm);
  mbd_client_destroy(&c2);
  mbd_tensor_out_release(NULL);
  mbd_status_report_free(NULL);
  mbd_session_state_free(NULL);
  assert_int_equal(mbd_session_close(NULL, &err), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stray_and_malformed_replies_skipped),
      cmocka_unit_test(test_error_reply),
      cmocka_unit_test(test_timeout_then_late_reply_ignored),
      cmocka_unit_test(test_generate_stream),
      cmocka_unit_test(test_tensor_reply_and_request_body),
      cmocka_unit_test(test_argument_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
