/* Request builders for the worker harness (see wh_requests.h). */
#include "support/wh_requests.h"

#include "common/protocol.h"

void wh_pack_init(wh_pack *p) {
  msgpack_sbuffer_init(&p->sb);
  msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

/* Opens a tensor reference map: name, dtype and shape, the location to follow. */
static void ref_head(msgpack_packer *pk, const char *name, const char *dt, int ndim,
                     const int64_t *shape) {
  msgpack_pack_map(pk, 4);
  mbd_pack_kv_str(pk, "name", name);
  mbd_pack_kv_str(pk, "dtype", dt);
  mbd_pack_str(pk, "shape");
  msgpack_pack_array(pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_int64(pk, shape[i]);
}

void wh_ref(msgpack_packer *pk, const char *name, const char *dt, int ndim, const int64_t *shape,
            int frame) {
  ref_head(pk, name, dt, ndim, shape);
  mbd_pack_kv_u64(pk, "frame", (uint64_t)frame);
}

void wh_ref_shm(msgpack_packer *pk, const char *name, const char *dt, int ndim,
                const int64_t *shape, const char *obj, uint64_t off, uint64_t size) {
  ref_head(pk, name, dt, ndim, shape);
  mbd_pack_str(pk, "shm");
  msgpack_pack_map(pk, 3);
  mbd_pack_kv_str(pk, "name", obj);
  mbd_pack_kv_u64(pk, "offset", off);
  mbd_pack_kv_u64(pk, "size", size);
}

uint64_t wh_send_open(wh *h) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  return wh_send(h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
}

mbd_msg *wh_open(wh *h, char *sid, size_t cap) {
  mbd_msg *m = wh_wait(h, wh_send_open(h), 60000);
  if (m && mbd_msg_cmd(m) == MBD_CMD_FINAL) wh_str(m, "session", sid, cap);
  return m;
}

uint64_t wh_send_prefill(wh *h, const char *sid, const int64_t *ids, int64_t T, bool last_only) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_bool(&p.pk, "last_only", last_only);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref(&p.pk, "input_ids", "i64", 1, &T, 0);
  const void *pl[1] = {ids};
  size_t lens[1] = {(size_t)T * 8};
  return wh_send(h, MBD_CMD_PREFILL, &p.sb, 1, pl, lens);
}

uint64_t wh_send_step(wh *h, const char *sid, int64_t token) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_i64(&p.pk, "token", token);
  return wh_send(h, MBD_CMD_STEP, &p.sb, 0, NULL, NULL);
}

uint64_t wh_send_generate(wh *h, const char *sid, int64_t max_tokens, double temperature,
                          uint64_t seed) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 4);
  mbd_pack_kv_str(&p.pk, "session", sid);
  mbd_pack_kv_i64(&p.pk, "max_tokens", max_tokens);
  mbd_pack_kv_f64(&p.pk, "temperature", temperature);
  mbd_pack_kv_u64(&p.pk, "seed", seed);
  return wh_send(h, MBD_CMD_GENERATE, &p.sb, 0, NULL, NULL);
}

/* A request whose body is {session: sid}. */
static uint64_t send_session_cmd(wh *h, uint8_t cmd, const char *sid) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "session", sid);
  return wh_send(h, cmd, &p.sb, 0, NULL, NULL);
}

uint64_t wh_send_export(wh *h, const char *sid) { return send_session_cmd(h, MBD_CMD_EXPORT, sid); }

uint64_t wh_send_close(wh *h, const char *sid) { return send_session_cmd(h, MBD_CMD_CLOSE, sid); }

uint64_t wh_send_import(wh *h, const void *blob, size_t n, const mbd_route_want *want) {
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_str(&k.pk, "route");
  mbd_pack_route_want(&k.pk, want);
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  int64_t s[1] = {(int64_t)(n / 8)};
  wh_ref(&k.pk, "state", "i64", 1, s, 0);
  const void *pl[1] = {blob};
  size_t lens[1] = {n};
  return wh_send(h, MBD_CMD_IMPORT, &k.sb, 1, pl, lens);
}

uint64_t wh_send_forward(wh *h, const int64_t *ids, int64_t B, int64_t T, bool last_only) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_kv_bool(&p.pk, "last_only", last_only);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  int64_t s[2] = {B, T};
  wh_ref(&p.pk, "input_ids", "i64", 2, s, 0);
  const void *pl[1] = {ids};
  size_t lens[1] = {(size_t)(B * T) * 8};
  return wh_send(h, MBD_CMD_FORWARD, &p.sb, 1, pl, lens);
}

void wh_fill_ids(int64_t *ids, size_t n, int64_t V) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids[i] = (int64_t)(x % (uint64_t)V);
  }
}
