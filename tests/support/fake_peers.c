/* The broker core's peers without sockets (see fake_peers.h). */
#include "support/fake_peers.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"

int fp_send(void *ctx, mbd_bdest d, mbd_msg **m, mbd_error *err) {
  fp_sent *s = ctx;
  if (d == MBD_BDEST_WORKER && s->fail_worker_rc) {
    mbd_msg_destroy(m);
    return mbd_error_set(err, s->fail_worker_rc, "test: send failed");
  }
  assert_true(s->n < FP_SENT_MAX);
  s->dest[s->n] = d;
  s->m[s->n++] = *m;
  *m = NULL;
  return 0;
}

void fp_clear(fp_sent *s) {
  for (int i = 0; i < s->n; i++) mbd_msg_destroy(&s->m[i]);
  s->n = 0;
}

int fp_find(const fp_sent *s, uint8_t cmd, const char *peer) {
  for (int i = 0; i < s->n; i++) {
    size_t pl;
    const void *p = mbd_msg_peer(s->m[i], &pl);
    if (mbd_msg_cmd(s->m[i]) == cmd && (!peer || (pl == strlen(peer) && !memcmp(p, peer, pl))))
      return i;
  }
  return -1;
}

mbd_msg *fp_find_msg(const fp_sent *s, uint8_t cmd, const char *peer) {
  int i = fp_find(s, cmd, peer);
  return i < 0 ? NULL : s->m[i];
}

void fp_route(mbd_route_identity *r, mbd_dtype_policy p) {
  memset(r, 0, sizeof *r);
  r->policy = p;
  strcpy(r->isa, "x86-64-v3");
  strcpy(r->kernel_digest, "abc");
  strcpy(r->compiler, "cc");
  strcpy(r->device_name, "cpu");
  r->state_capacity = 4;
}

void fp_worker(mbd_bworker *w, const char *ident, const char *digest) {
  memset(w, 0, sizeof *w);
  fp_route(&w->route, MBD_POLICY_F32);
  mbd_route_id_hex(&w->route, w->route_id);
  snprintf(w->name, sizeof w->name, "%s", ident);
  snprintf(w->uid, sizeof w->uid, "u%s", ident);
  memcpy(w->ident, ident, strlen(ident));
  w->ident_len = strlen(ident);
  w->capacity = 4;
  w->nmodels = 1;
  strcpy(w->models[0].name, "m");
  snprintf(w->models[0].digest, sizeof w->models[0].digest, "%s", digest);
}

mbd_msg *fp_ready_msg(const char *ident, const fp_ready *o) {
  mbd_route_identity r;
  fp_route(&r, o->policy);
  if (o->gpu) {
    r.backend = MBD_BACKEND_CUDA;
    strcpy(r.device_name, "NVIDIA H200");
  }
  char enc[1024], id[65];
  size_t len;
  assert_int_equal(mbd_route_encode(&r, enc, sizeof enc, &len, NULL), 0);
  mbd_route_id_hex(&r, id);
  if (o->bad_route_id) id[0] = id[0] == '0' ? '1' : '0';
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 6 + (o->host_id != NULL) + o->gpu);
  mbd_pack_kv_str(&pk, "name", ident);
  mbd_pack_kv_str(&pk, "uid", o->uid ? o->uid : ident);
  mbd_pack_kv_str(&pk, "route", enc);
  mbd_pack_kv_str(&pk, "route_id", id);
  if (o->host_id) mbd_pack_kv_str(&pk, "host_id", o->host_id);
  mbd_pack_kv_u64(&pk, "capacity", (uint64_t)o->capacity);
  if (o->gpu) mbd_pack_kv_i64(&pk, "device", o->device);
  mbd_pack_str(&pk, "models");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, o->tokenizer_digest ? 3 : 2);
  mbd_pack_kv_str(&pk, "name", o->model ? o->model : "m");
  mbd_pack_kv_str(&pk, "digest", o->digest ? o->digest : "d");
  if (o->tokenizer_digest) mbd_pack_kv_str(&pk, "tokenizer_digest", o->tokenizer_digest);
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_READY, 0, &m, NULL), 0);
  assert_int_equal(mbd_msg_take_body(m, &sb, NULL), 0);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(mbd_msg_set_peer(m, ident, strlen(ident), NULL), 0);
  return m;
}
