/* Broker routing of requests that carry CUDA IPC tensors (no sockets): they
 * go only to GPU workers on the client's host, preferring the worker on the
 * device holding the memory; without the client's host_id they are refused;
 * session requests with IPC refs to a worker on another host are refused;
 * ordinary requests are unaffected. */
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

/* READY of a worker on host `host`, device `dev` (-1: a CPU worker, no field). */
static mbd_msg *ready(const char *ident, const char *host, int dev, int cap) {
  const fp_ready o = {.capacity = cap, .host_id = host, .gpu = dev >= 0, .device = dev};
  return fp_ready_msg(ident, &o);
}

/* A FORWARD whose input is an IPC ref on device `dev` (dev < 0: inline), with
 * the client's host (NULL: omitted), or a session command when sid is set. */
static mbd_msg *request(uint8_t cmd, uint64_t tag, int dev, const char *host, const char *sid) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2 + (host != NULL) + (sid != NULL));
  mbd_pack_kv_str(&pk, "model", "m");
  if (host) mbd_pack_kv_str(&pk, "host_id", host);
  if (sid) mbd_pack_kv_str(&pk, "session", sid);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_tensor_ref r;
  memset(&r, 0, sizeof r);
  strcpy(r.name, "input_ids");
  int64_t sh[2] = {1, 4};
  mbd_tensor_desc_make(&r.desc, MBD_DTYPE_I64, 2, sh, NULL);
  if (dev >= 0) {
    r.kind = MBD_TREF_CUDA_IPC;
    r.device = dev;
    r.size = 32;
    memset(r.ipc_handle, 7, sizeof r.ipc_handle);
  }
  mbd_pack_tensor_ref(&pk, &r);
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(cmd, tag, &m, NULL), 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, "cli", 3, NULL), 0);
  return m;
}

typedef struct fx {
  mbd_bcore *c;
  fp_sent s;
} fx;

static void start(fx *f) {
  memset(f, 0, sizeof *f);
  mbd_broker_config cfg;
  mbd_broker_config_defaults(&cfg);
  assert_int_equal(mbd_bcore_new(&cfg, fp_send, &f->s, &f->c, NULL), 0);
}

static void add(fx *f, const char *ident, const char *host, int dev, int cap) {
  mbd_msg *m = ready(ident, host, dev, cap);
  mbd_bcore_on_worker(f->c, &m, 0, NULL, 0);
  fp_clear(&f->s);
}

/* Sends a request; returns the peer it went to ("" when answered with ERROR,
 * *code set then). */
static void route_req(fx *f, mbd_msg *m, char *peer, int64_t *code) {
  peer[0] = '\0';
  *code = 0;
  mbd_bcore_on_client(f->c, &m, 0, NULL, 1);
  assert_int_equal(f->s.n, 1);
  if (f->s.dest[0] == MBD_BDEST_WORKER) {
    size_t pl;
    const void *p = mbd_msg_peer(f->s.m[0], &pl);
    memcpy(peer, p, pl);
    peer[pl] = '\0';
  } else {
    assert_int_equal(mbd_msg_cmd(f->s.m[0]), MBD_CMD_ERROR);
    size_t len;
    const void *b = mbd_msg_body(f->s.m[0], &len);
    mbd_body *body = NULL;
    assert_int_equal(mbd_body_parse(b, len, &body, NULL), 0);
    assert_int_equal(mbd_obj_i64(mbd_body_root(body), "code", true, code, NULL), 0);
    mbd_body_destroy(&body);
  }
  fp_clear(&f->s);
}

static void test_ipc_goes_to_same_host_gpu_on_its_device(void **st) {
  (void)st;
  fx f;
  start(&f);
  add(&f, "cpu-a", "hostA", -1, 100);
  add(&f, "gpu-b0", "hostB", 0, 100);
  add(&f, "gpu-a0", "hostA", 0, 100);
  add(&f, "gpu-a1", "hostA", 1, 100);
  char peer[300];
  int64_t code;
  for (int i = 0; i < 5; i++) { /* always the device holding the memory */
    route_req(&f, request(MBD_CMD_FORWARD, 10 + (uint64_t)i, 1, "hostA", NULL), peer, &code);
    assert_string_equal(peer, "gpu-a1");
    route_req(&f, request(MBD_CMD_FORWARD, 20 + (uint64_t)i, 0, "hostA", NULL), peer, &code);
    assert_string_equal(peer, "gpu-a0");
    route_req(&f, request(MBD_CMD_FORWARD, 30 + (uint64_t)i, 0, "hostB", NULL), peer, &code);
    assert_string_equal(peer, "gpu-b0");
  }
  /* Device 3 has no worker on hostA: another GPU worker of hostA, never hostB or the CPU. */
  route_req(&f, request(MBD_CMD_FORWARD, 40, 3, "hostA", NULL), peer, &code);
  assert_true(!strcmp(peer, "gpu-a0") || !strcmp(peer, "gpu-a1"));
  /* Inline requests still spread over every worker, the CPU included. */
  int seen_cpu = 0;
  for (int i = 0; i < 8; i++) {
    route_req(&f, request(MBD_CMD_FORWARD, 50 + (uint64_t)i, -1, NULL, NULL), peer, &code);
    assert_int_equal(code, 0);
    seen_cpu |= !strcmp(peer, "cpu-a");
  }
  assert_true(seen_cpu);
  mbd_bcore_destroy(&f.c);
}

static void test_ipc_prefers_affine_then_spills_when_full(void **st) {
  (void)st;
  fx f;
  start(&f);
  add(&f, "gpu-a0", "hostA", 0, 1);
  add(&f, "gpu-a1", "hostA", 1, 1);
  char peer[300];
  int64_t code;
  route_req(&f, request(MBD_CMD_FORWARD, 1, 1, "hostA", NULL), peer, &code);
  assert_string_equal(peer, "gpu-a1");
  /* gpu-a1 is at capacity: the other same-host GPU takes it. */
  route_req(&f, request(MBD_CMD_FORWARD, 2, 1, "hostA", NULL), peer, &code);
  assert_string_equal(peer, "gpu-a0");
  mbd_bcore_destroy(&f.c);
}

static void test_ipc_refusals(void **st) {
  (void)st;
  fx f;
  start(&f);
  add(&f, "cpu-a", "hostA", -1, 100);
  add(&f, "gpu-b0", "hostB", 0, 100);
  char peer[300];
  int64_t code;
  /* No host_id with an IPC tensor: INVALID. */
  route_req(&f, request(MBD_CMD_FORWARD, 1, 0, NULL, NULL), peer, &code);
  assert_string_equal(peer, "");
  assert_int_equal(code, MBD_E_INVALID);
  /* Only a CPU worker on the client's host: NO_ROUTE (the GPU of hostB cannot open it). */
  route_req(&f, request(MBD_CMD_FORWARD, 2, 0, "hostA", NULL), peer, &code);
  assert_string_equal(peer, "");
  assert_int_equal(code, MBD_E_NO_ROUTE);
  /* A session on hostB's GPU worker with an IPC tensor from hostA: INVALID. */
  route_req(&f, request(MBD_CMD_PREFILL, 3, 0, "hostA", "gpu-b0/1"), peer, &code);
  assert_int_equal(code, MBD_E_INVALID);
  /* The same from hostB goes through. */
  route_req(&f, request(MBD_CMD_PREFILL, 4, 0, "hostB", "gpu-b0/1"), peer, &code);
  assert_string_equal(peer, "gpu-b0");
  mbd_bcore_destroy(&f.c);
}

static void test_registry_select_ipc_plain(void **st) {
  (void)st;
  mbd_registry *r = NULL;
  assert_int_equal(mbd_registry_new(&r, NULL), 0);
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  size_t n = 99;
  assert_null(mbd_registry_select_ipc(r, &want, "", NULL, NULL, "h", 0, NULL, &n));
  assert_int_equal(n, 0);
  mbd_registry_destroy(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ipc_goes_to_same_host_gpu_on_its_device),
      cmocka_unit_test(test_ipc_prefers_affine_then_spills_when_full),
      cmocka_unit_test(test_ipc_refusals),
      cmocka_unit_test(test_registry_select_ipc_plain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
