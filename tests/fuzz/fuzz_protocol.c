/* Fuzz target: the wire decoder (frames -> mbd_msg), then the body parser,
 * the typed getters, route constraints and tensor refs on what it accepts.
 *
 * Input layout: byte 0 = flags (bit 0: ROUTER framing, bit 1: 4 KiB size cap),
 * then frames as [u16 little-endian length][bytes]; a length running past the
 * end takes the rest. Invariants: a rejected message carries an error code and
 * message; an accepted one has a known command and a tag equal to its header frame, a
 * body that parses, and refs whose fields respect the documented rules. */
#include <stdlib.h>
#include <string.h>

#include "common/protocol.h"
#include "common/wire.h"
#include "mbd_fuzz.h"

#define MAX_FRAMES 64

static void check_body(const void *buf, size_t len, size_t npayloads) {
  mbd_body *b = NULL;
  mbd_error err = {0};
  int rc = mbd_body_parse(buf, len, &b, &err);
  MBD_FUZZ_CHECK(rc == 0); /* decode already validated the body */
  const msgpack_object *r = mbd_body_root(b);
  MBD_FUZZ_CHECK(r->type == MSGPACK_OBJECT_MAP);
  mbd_route_want w;
  if (mbd_obj_route_want(r, "route", &w, &err) == 0) {
    size_t n = strlen(w.route_id);
    MBD_FUZZ_CHECK(n == 0 || n >= 8);
    char txt[512];
    mbd_route_want_format(&w, txt, sizeof txt);
    MBD_FUZZ_CHECK(txt[0] != '\0');
  } else {
    MBD_FUZZ_CHECK(err.code < 0 && err.msg[0]);
  }
  mbd_tensor_ref refs[8];
  size_t n = 0;
  rc = mbd_obj_tensor_refs(r, "tensors", false, refs, 8, &n, &err);
  if (rc == 0) {
    for (size_t i = 0; i < n; i++) {
      size_t nb = 0;
      MBD_FUZZ_CHECK(refs[i].desc.ndim >= 0 && refs[i].desc.ndim <= MBD_MAX_DIMS);
      MBD_FUZZ_CHECK(mbd_tensor_desc_nbytes(&refs[i].desc, &nb, NULL) == 0);
      if (refs[i].kind != MBD_TREF_INLINE) {
        MBD_FUZZ_CHECK(refs[i].size >= nb);
        MBD_FUZZ_CHECK(refs[i].offset <= UINT64_MAX - refs[i].size);
      }
      if (refs[i].kind == MBD_TREF_SHM) MBD_FUZZ_CHECK(refs[i].shm_name[0] == '/');
      (void)npayloads;
    }
  } else {
    MBD_FUZZ_CHECK(n == 0 && err.code == rc && err.msg[0]);
  }
  char s[64];
  uint64_t u;
  int64_t i64, arr[16];
  double f;
  bool bo;
  (void)mbd_obj_str(r, "session", false, s, sizeof s, &err);
  (void)mbd_obj_u64(r, "deadline_ms", false, &u, &err);
  (void)mbd_obj_i64(r, "token", false, &i64, &err);
  (void)mbd_obj_f64(r, "temperature", false, &f, &err);
  (void)mbd_obj_bool(r, "last_only", false, &bo, &err);
  rc = mbd_obj_i64_array(r, "stop", false, arr, 16, &n, &err);
  MBD_FUZZ_CHECK(n <= 16);
  mbd_body_destroy(&b);
  MBD_FUZZ_CHECK(b == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  bool router = data[0] & 1;
  size_t cap = (data[0] & 2) ? 4096 : 0;
  zmq_msg_t fr[MAX_FRAMES];
  size_t n = 0, off = 1;
  while (off < size && n < MAX_FRAMES) {
    size_t len = data[off];
    if (off + 1 < size) len |= (size_t)data[off + 1] << 8;
    off += 2;
    if (off > size) off = size;
    if (len > size - off) len = size - off;
    zmq_msg_init_size(&fr[n], len);
    if (len) memcpy(zmq_msg_data(&fr[n]), data + off, len);
    off += len;
    n++;
  }
  size_t b = router ? 1 : 0;
  uint8_t hdr[MBD_PROTO_HEADER_BYTES] = {0}; /* decode consumes the frames */
  size_t hl = n > b ? zmq_msg_size(&fr[b]) : 0;
  if (hl == sizeof hdr) memcpy(hdr, zmq_msg_data(&fr[b]), sizeof hdr);
  mbd_msg *m = NULL;
  mbd_error err = {0};
  int rc = mbd_msg_decode(fr, n, router, cap, &m, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc == MBD_E_PROTOCOL || rc == MBD_E_FORMAT || rc == MBD_E_TOO_LARGE);
    MBD_FUZZ_CHECK(err.code == rc && err.msg[0]);
    MBD_FUZZ_CHECK(m != NULL && mbd_msg_npayloads(m) == 0);
  } else {
    MBD_FUZZ_CHECK(m != NULL);
    MBD_FUZZ_CHECK(strcmp(mbd_cmd_name(mbd_msg_cmd(m)), "unknown") != 0);
    MBD_FUZZ_CHECK(n >= b + 2 && mbd_msg_npayloads(m) == n - b - 2);
    MBD_FUZZ_CHECK(hl == sizeof hdr && mbd_msg_cmd(m) == hdr[4]);
    uint64_t tag = 0;
    for (int i = 7; i >= 0; i--) tag = (tag << 8) | hdr[5 + i];
    MBD_FUZZ_CHECK(mbd_msg_tag(m) == tag);
    size_t len = 0;
    const void *body = mbd_msg_body(m, &len);
    check_body(body, len, mbd_msg_npayloads(m));
    /* A clone must be indistinguishable. */
    mbd_msg *c = NULL;
    MBD_FUZZ_CHECK(mbd_msg_clone(m, &c, &err) == 0);
    MBD_FUZZ_CHECK(mbd_msg_tag(c) == mbd_msg_tag(m) && mbd_msg_npayloads(c) == mbd_msg_npayloads(m));
    mbd_msg_destroy(&c);
  }
  mbd_msg_destroy(&m);
  return 0;
}

/* Seeds: a GEMM with inline/shm tensors and a route, a READY, an ERROR. */
static uint8_t g_seed[3][1024];

static size_t put_frame(uint8_t *dst, size_t off, const void *p, size_t len) {
  dst[off] = (uint8_t)len;
  dst[off + 1] = (uint8_t)(len >> 8);
  memcpy(dst + off + 2, p, len);
  return off + 2 + len;
}

static size_t build_seed(uint8_t *dst, bool router, uint8_t cmd, int kind) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  if (kind == 0) {
    msgpack_pack_map(&pk, 4);
    mbd_pack_str(&pk, "route");
    mbd_route_want w;
    memset(&w, 0, sizeof w);
    strcpy(w.dtype, "bf16");
    strcpy(w.route_id, "0123abcd");
    mbd_pack_route_want(&pk, &w);
    mbd_pack_kv_u64(&pk, "deadline_ms", 1000);
    mbd_pack_kv_str(&pk, "session", "w1/3");
    mbd_pack_str(&pk, "tensors");
    msgpack_pack_array(&pk, 2);
    mbd_tensor_ref r;
    memset(&r, 0, sizeof r);
    strcpy(r.name, "a");
    int64_t sh[2] = {2, 2};
    mbd_tensor_desc_make(&r.desc, MBD_DTYPE_F32, 2, sh, NULL);
    mbd_pack_tensor_ref(&pk, &r);
    r.kind = MBD_TREF_SHM;
    strcpy(r.shm_name, "/x");
    r.size = 16;
    mbd_pack_tensor_ref(&pk, &r);
  } else if (kind == 1) {
    msgpack_pack_map(&pk, 3);
    mbd_pack_kv_str(&pk, "name", "w0");
    mbd_pack_kv_u64(&pk, "capacity", 4);
    mbd_pack_str(&pk, "stop");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_int(&pk, -2);
  } else {
    msgpack_pack_map(&pk, 2);
    mbd_pack_kv_i64(&pk, "code", -6);
    mbd_pack_kv_f64(&pk, "temperature", 0.5);
  }
  size_t off = 0;
  dst[off++] = router ? 1 : 0;
  if (router) off = put_frame(dst, off, "peer", 4);
  uint8_t hdr[MBD_PROTO_HEADER_BYTES] = {'M', 'B', 'D', MBD_PROTO_VERSION, cmd, 7};
  off = put_frame(dst, off, hdr, sizeof hdr);
  off = put_frame(dst, off, sb.data, sb.size);
  if (kind == 0) off = put_frame(dst, off, "0123456789abcdef", 16);
  msgpack_sbuffer_destroy(&sb);
  return off;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static mbd_fuzz_seed seeds[3];
  seeds[0].len = build_seed(g_seed[0], true, MBD_CMD_GEMM, 0);
  seeds[1].len = build_seed(g_seed[1], false, MBD_CMD_READY, 1);
  seeds[2].len = build_seed(g_seed[2], true, MBD_CMD_ERROR, 2);
  for (int i = 0; i < 3; i++) seeds[i].data = g_seed[i];
  *out = seeds;
  return 3;
}
