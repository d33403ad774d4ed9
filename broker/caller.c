/* Caller identities: from ZeroMQ metadata into the request body. */
#include "broker/caller.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/protocol.h"

/* Decimal digits [s, e) into *v (<= max); false otherwise. */
static bool parse_dec(const char *s, const char *e, uint64_t max, uint64_t *v) {
  if (s >= e || e - s > 19) return false;
  uint64_t x = 0;
  for (const char *p = s; p < e; p++) {
    if (*p < '0' || *p > '9') return false;
    x = x * 10 + (uint64_t)(*p - '0');
  }
  if (x > max) return false;
  *v = x;
  return true;
}

bool mbd_bcaller_parse_peer(const char *pa, mbd_bcaller *out) {
  memset(out, 0, sizeof *out);
  if (!pa) return false;
  const char *end = pa + strlen(pa), *f[4] = {end, NULL, NULL, NULL};
  /* f[1..3]: the last three ':' from the end; libzmq appends ":uid:gid:pid" last,
   * so whatever precedes them (a socket path a client chose) cannot shift them. */
  const char *p = end;
  for (int k = 1; k <= 3; k++) {
    while (p > pa && p[-1] != ':') p--;
    if (p == pa) return false;
    f[k] = --p;
  }
  uint64_t uid, gid, pid;
  if (!parse_dec(f[3] + 1, f[2], UINT32_MAX, &uid) || !parse_dec(f[2] + 1, f[1], UINT32_MAX, &gid) ||
      !parse_dec(f[1] + 1, f[0], INT64_MAX, &pid))
    return false;
  out->has_uid = true;
  out->uid = (uint32_t)uid;
  out->gid = (uint32_t)gid;
  out->pid = (int64_t)pid;
  snprintf(out->id, sizeof out->id, "uid:%u", out->uid);
  return true;
}

void mbd_bcaller_of(const mbd_msg *m, bool ipc, mbd_bcaller *out) {
  memset(out, 0, sizeof *out);
  if (ipc && mbd_bcaller_parse_peer(mbd_msg_gets(m, "Peer-Address"), out)) return;
  memset(out, 0, sizeof *out);
  const char *uid = mbd_msg_gets(m, "User-Id");
  if (uid && (!strncmp(uid, "key:", 4) || !strncmp(uid, "op:", 3)) && strlen(uid) < sizeof out->id)
    snprintf(out->id, sizeof out->id, "%s", uid);
}

static bool is_key(const msgpack_object *k, const char *s) {
  size_t n = strlen(s);
  return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && !memcmp(k->via.str.ptr, s, n);
}

int mbd_bcaller_stamp(mbd_msg *m, const mbd_bcaller *c, mbd_error *err) {
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  msgpack_sbuffer val, sb;
  msgpack_sbuffer_init(&val);
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &val, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, c->has_uid ? 4 : 1);
  mbd_pack_kv_str(&pk, "id", c->id);
  if (c->has_uid) {
    mbd_pack_kv_u64(&pk, "uid", c->uid);
    mbd_pack_kv_u64(&pk, "gid", c->gid);
    mbd_pack_kv_i64(&pk, "pid", c->pid);
  }
  int rc = mbd_body_replace_raw(b, blen, "caller", val.data, val.size, &sb, err);
  if (!rc) rc = mbd_msg_take_body(m, &sb, err);
  msgpack_sbuffer_destroy(&sb);
  msgpack_sbuffer_destroy(&val);
  return rc;
}

/* A bounded in-memory msgpack writer: the expected opening of a reply body. */
typedef struct fixed_buf {
  uint8_t data[2 * MBD_BCALLER_ID_MAX + 256];
  size_t len;
  bool overflow;
} fixed_buf;

static int fixed_write(void *ctx, const char *p, size_t n) {
  fixed_buf *f = ctx;
  if (f->overflow || n > sizeof f->data - f->len) {
    f->overflow = true;
    return -1;
  }
  memcpy(f->data + f->len, p, n);
  f->len += n;
  return 0;
}

/* True when the body (a valid map: the receiver checked it) opens with
 * route_id and worker equal to the registered ones, packed as this code packs
 * them (worker/reply.c does). Readers take a key's first occurrence, so such
 * a body already says what the broker would write, whatever follows. */
static bool reply_opens_vouched(const uint8_t *b, size_t blen, const char *worker,
                                const char *route_id) {
  size_t skip;
  uint32_t n;
  if (blen >= 1 && (b[0] & 0xf0) == 0x80) skip = 1, n = b[0] & 0x0f;
  else if (blen >= 3 && b[0] == 0xde) skip = 3, n = (uint32_t)b[1] << 8 | b[2];
  else if (blen >= 5 && b[0] == 0xdf)
    skip = 5, n = (uint32_t)b[1] << 24 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 8 | b[4];
  else return false;
  if (n < 2) return false;
  fixed_buf want = {.len = 0};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &want, fixed_write);
  mbd_pack_kv_str(&pk, "route_id", route_id);
  mbd_pack_kv_str(&pk, "worker", worker);
  return !want.overflow && blen - skip >= want.len && !memcmp(b + skip, want.data, want.len);
}

int mbd_bcaller_vouch_reply(mbd_msg *m, const char *worker, const char *route_id, mbd_error *err) {
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  if (reply_opens_vouched(b, blen, worker, route_id)) return MBD_OK; /* forwarded untouched */
  mbd_body *body = NULL;
  int rc = mbd_body_parse(b, blen, &body, err);
  if (rc) return rc;
  const msgpack_object *root = mbd_body_root(body);
  uint32_t keep = 0;
  for (uint32_t i = 0; i < root->via.map.size; i++) {
    const msgpack_object *k = &root->via.map.ptr[i].key;
    keep += !is_key(k, "worker") && !is_key(k, "route_id");
  }
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, keep + 2);
  mbd_pack_kv_str(&pk, "route_id", route_id);
  mbd_pack_kv_str(&pk, "worker", worker);
  for (uint32_t i = 0; i < root->via.map.size; i++) {
    const msgpack_object_kv *kv = &root->via.map.ptr[i];
    if (is_key(&kv->key, "worker") || is_key(&kv->key, "route_id")) continue;
    msgpack_pack_object(&pk, kv->key);
    msgpack_pack_object(&pk, kv->val);
  }
  mbd_body_destroy(&body);
  rc = mbd_msg_take_body(m, &sb, err);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

void mbd_bcaller_read(const msgpack_object *root, mbd_bcaller *out) {
  memset(out, 0, sizeof *out);
  const msgpack_object *c = mbd_obj_get(root, "caller");
  if (!c || c->type != MSGPACK_OBJECT_MAP) return;
  mbd_obj_str(c, "id", false, out->id, sizeof out->id, NULL);
  uint64_t uid = 0, gid = 0;
  if (mbd_obj_get(c, "uid") && !mbd_obj_u64(c, "uid", true, &uid, NULL) && uid <= UINT32_MAX) {
    mbd_obj_u64(c, "gid", false, &gid, NULL);
    mbd_obj_i64(c, "pid", false, &out->pid, NULL);
    out->has_uid = true;
    out->uid = (uint32_t)uid;
    out->gid = gid <= UINT32_MAX ? (uint32_t)gid : 0;
  }
}
