/* Protocol codec: command names, msgpack body parsing with typed getters,
 * tensor references and route constraints, and packing helpers.
 *
 * Bodies come from the network, so parsing first walks the bytes with a
 * bounded validator (mbd_body_check) before msgpack-c allocates anything:
 * msgpack-c reserves memory for a container's declared element count up front,
 * and a 5-byte "array of 2^32 elements" must not become a 96 GiB allocation. */
#include "common/protocol.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* msgpack-c's own nesting limit is 32; stay below it so its errors never surface. */
#define BODY_MAX_DEPTH 24

const char *mbd_cmd_name(int cmd) {
  switch (cmd) {
  case MBD_CMD_STATUS: return "status";
  case MBD_CMD_GEMM: return "gemm";
  case MBD_CMD_FORWARD: return "forward";
  case MBD_CMD_OPEN: return "open";
  case MBD_CMD_PREFILL: return "prefill";
  case MBD_CMD_STEP: return "step";
  case MBD_CMD_GENERATE: return "generate";
  case MBD_CMD_EXPORT: return "export";
  case MBD_CMD_IMPORT: return "import";
  case MBD_CMD_CLOSE: return "close";
  case MBD_CMD_CANCEL: return "cancel";
  case MBD_CMD_PARTIAL: return "PARTIAL";
  case MBD_CMD_FINAL: return "FINAL";
  case MBD_CMD_ERROR: return "ERROR";
  case MBD_CMD_READY: return "READY";
  case MBD_CMD_HEARTBEAT: return "HEARTBEAT";
  case MBD_CMD_DISCONNECT: return "DISCONNECT";
  case MBD_CMD_CHECKPOINT: return "CHECKPOINT";
  default: return "unknown";
  }
}

bool mbd_cmd_is_request(int cmd) { return cmd >= MBD_CMD_STATUS && cmd <= MBD_CMD_CLOSE; }

bool mbd_cmd_is_session(int cmd) {
  return cmd == MBD_CMD_PREFILL || cmd == MBD_CMD_STEP || cmd == MBD_CMD_GENERATE ||
         cmd == MBD_CMD_EXPORT || cmd == MBD_CMD_CLOSE;
}

int mbd_body_prepend_u64(const void *buf, size_t len, const char *key, uint64_t v,
                         msgpack_sbuffer *out, mbd_error *err) {
  const uint8_t *p = buf;
  size_t hdr, n;
  if (len == 0) {
    hdr = 0;
    n = 0;
  } else if ((p[0] & 0xf0) == 0x80) {
    hdr = 1;
    n = p[0] & 0x0f;
  } else if (p[0] == 0xde && len >= 3) {
    hdr = 3;
    n = (size_t)p[1] << 8 | p[2];
  } else if (p[0] == 0xdf && len >= 5) {
    hdr = 5;
    n = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
  } else {
    return mbd_error_set(err, MBD_E_FORMAT, "body is not a msgpack map");
  }
  if (n >= UINT32_MAX) return mbd_error_set(err, MBD_E_FORMAT, "body map is too large");
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, (uint32_t)(n + 1));
  mbd_pack_kv_u64(&pk, key, v);
  if (len > hdr && msgpack_sbuffer_write(out, (const char *)p + hdr, len - hdr))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory rewriting a %zu-byte body", len);
  return MBD_OK;
}

/* ---- validation without allocation ------------------------------------ */

static int need(size_t len, size_t off, size_t n) { return n <= len - off; }

static uint64_t be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/* Reads the header of the object at *off: sets *children (elements a container
 * still owes) and advances past the header and any scalar payload. */
static int skip_header(const uint8_t *p, size_t len, size_t *off, uint64_t *children,
                       mbd_error *err) {
  size_t o = *off;
  if (!need(len, o, 1)) return mbd_error_set(err, MBD_E_FORMAT, "msgpack truncated at byte %zu", o);
  uint8_t t = p[o++];
  uint64_t skip = 0;
  *children = 0;
  if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
    /* fixint, nil, bool */
  } else if (t >= 0x80 && t <= 0x8f) {
    *children = 2u * (t & 0x0f);
  } else if (t >= 0x90 && t <= 0x9f) {
    *children = t & 0x0f;
  } else if (t >= 0xa0 && t <= 0xbf) {
    skip = t & 0x1f;
  } else {
    int lenbytes = 0; /* size field width for str/bin/ext/array/map */
    switch (t) {
    case 0xcc: case 0xd0: skip = 1; break;
    case 0xcd: case 0xd1: skip = 2; break;
    case 0xca: case 0xce: case 0xd2: skip = 4; break;
    case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
    case 0xd4: skip = 2; break;
    case 0xd5: skip = 3; break;
    case 0xd6: skip = 5; break;
    case 0xd7: skip = 9; break;
    case 0xd8: skip = 17; break;
    case 0xc4: case 0xd9: lenbytes = 1; break;
    case 0xc5: case 0xda: lenbytes = 2; break;
    case 0xc6: case 0xdb: lenbytes = 4; break;
    case 0xc7: lenbytes = 1; break;
    case 0xc8: lenbytes = 2; break;
    case 0xc9: lenbytes = 4; break;
    case 0xdc: case 0xde: lenbytes = 2; break;
    case 0xdd: case 0xdf: lenbytes = 4; break;
    default: return mbd_error_set(err, MBD_E_FORMAT, "msgpack: invalid type byte 0x%02x at %zu", t, o - 1);
    }
    if (lenbytes) {
      if (!need(len, o, (size_t)lenbytes))
        return mbd_error_set(err, MBD_E_FORMAT, "msgpack truncated at byte %zu", o);
      uint64_t n = be(p + o, lenbytes);
      o += (size_t)lenbytes;
      if (t == 0xdc || t == 0xdd) *children = n;
      else if (t == 0xde || t == 0xdf) *children = 2 * n;
      else skip = n + ((t >= 0xc7 && t <= 0xc9) ? 1 : 0); /* ext carries a type byte */
    }
  }
  if (skip > len - o) return mbd_error_set(err, MBD_E_FORMAT, "msgpack truncated at byte %zu", o);
  o += (size_t)skip;
  /* Every element takes at least one byte, so a count beyond the bytes left is a lie. */
  if (*children > len - o)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "msgpack truncated: container at byte %zu claims %" PRIu64 " elements, %zu bytes left",
                         *off, *children, len - o);
  *off = o;
  return MBD_OK;
}

int mbd_body_check(const void *buf, size_t len, mbd_error *err) {
  const uint8_t *p = buf;
  if (len == 0) return MBD_OK;
  uint8_t t = p[0];
  if (!((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf))
    return mbd_error_set(err, MBD_E_FORMAT, "body is not a msgpack map (type byte 0x%02x)", t);
  uint64_t stack[BODY_MAX_DEPTH + 1]; /* elements still owed per open container */
  int depth = 0;
  size_t off = 0;
  uint64_t kids = 0;
  int rc = skip_header(p, len, &off, &kids, err);
  if (rc) return rc;
  stack[0] = kids;
  while (depth >= 0) {
    if (stack[depth] == 0) {
      depth--;
      continue;
    }
    stack[depth]--;
    rc = skip_header(p, len, &off, &kids, err);
    if (rc) return rc;
    if (kids) {
      if (depth + 1 > BODY_MAX_DEPTH)
        return mbd_error_set(err, MBD_E_FORMAT, "msgpack nested deeper than %d levels", BODY_MAX_DEPTH);
      stack[++depth] = kids;
    }
  }
  if (off != len)
    return mbd_error_set(err, MBD_E_FORMAT, "body has %zu trailing bytes after the map", len - off);
  /* Keys must be strings: checked by the getters (non-string keys never match). */
  return MBD_OK;
}

/* ---- bodies ------------------------------------------------------------- */

struct mbd_body {
  msgpack_unpacked up;  /* owns the zone the objects live in */
  msgpack_object empty; /* root for an empty buffer */
  bool have;            /* up holds a parsed object */
  char *bytes;          /* private copy: strings/bins point into it */
};

int mbd_body_parse(const void *buf, size_t len, mbd_body **out, mbd_error *err) {
  *out = NULL;
  int rc = mbd_body_check(buf, len, err);
  if (rc) return rc;
  mbd_body *b = calloc(1, sizeof *b);
  if (!b) return mbd_error_set(err, MBD_E_NOMEM, "out of memory parsing a message body");
  b->empty.type = MSGPACK_OBJECT_MAP;
  msgpack_unpacked_init(&b->up);
  if (len == 0) {
    *out = b;
    return MBD_OK;
  }
  b->bytes = malloc(len);
  if (!b->bytes) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory parsing a %zu-byte body", len);
    goto fail;
  }
  memcpy(b->bytes, buf, len);
  size_t off = 0;
  msgpack_unpack_return ur = msgpack_unpack_next(&b->up, b->bytes, len, &off);
  if (ur != MSGPACK_UNPACK_SUCCESS || off != len || b->up.data.type != MSGPACK_OBJECT_MAP) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "body is not exactly one msgpack map (unpack %d)", (int)ur);
    goto fail;
  }
  b->have = true;
  *out = b;
  return MBD_OK;
fail:
  mbd_body_destroy(&b);
  return rc;
}

/* Skips one whole object at *off: bounded, no allocation, no recursion. */
static int skip_object(const uint8_t *p, size_t len, size_t *off, mbd_error *err) {
  uint64_t owed = 1;
  while (owed) {
    owed--;
    uint64_t kids = 0;
    int rc = skip_header(p, len, off, &kids, err);
    if (rc) return rc;
    owed += kids; /* kids <= bytes left, so this never overflows */
  }
  return MBD_OK;
}

/* The string at p[off..) as (ptr, n) without moving off; false when not a str. */
static bool peek_str(const uint8_t *p, size_t len, size_t off, const char **s, size_t *n) {
  if (off >= len) return false;
  uint8_t t = p[off];
  size_t h = 0, l = 0;
  if (t >= 0xa0 && t <= 0xbf) h = 1, l = t & 0x1f;
  else if (t == 0xd9 && need(len, off, 2)) h = 2, l = p[off + 1];
  else if (t == 0xda && need(len, off, 3)) h = 3, l = (size_t)be(p + off + 1, 2);
  else if (t == 0xdb && need(len, off, 5)) h = 5, l = (size_t)be(p + off + 1, 4);
  else return false;
  if (l > len - off - h) return false;
  *s = (const char *)p + off + h;
  *n = l;
  return true;
}

int mbd_body_parse_keys(const void *buf, size_t len, const char *const *keys, size_t max_bytes,
                        mbd_body **out, mbd_error *err) {
  *out = NULL;
  const uint8_t *p = buf;
  if (len == 0) return mbd_body_parse(buf, 0, out, err);
  uint8_t t = p[0];
  if (!((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf))
    return mbd_error_set(err, MBD_E_FORMAT, "body is not a msgpack map (type byte 0x%02x)", t);
  size_t off = 0;
  uint64_t kids = 0;
  int rc = skip_header(p, len, &off, &kids, err);
  if (rc) return rc;
  msgpack_sbuffer sel;
  msgpack_sbuffer_init(&sel);
  uint32_t nsel = 0;
  for (uint64_t i = 0; i < kids / 2; i++) {
    size_t k0 = off;
    const char *ks = NULL;
    size_t kn = 0;
    bool is_str = peek_str(p, len, off, &ks, &kn);
    if ((rc = skip_object(p, len, &off, err)) || (rc = skip_object(p, len, &off, err))) goto done;
    if (!is_str) continue;
    bool wanted = false;
    for (const char *const *k = keys; *k && !wanted; k++)
      wanted = strlen(*k) == kn && !memcmp(*k, ks, kn);
    if (!wanted) continue;
    if (off - k0 > max_bytes - sel.size) {
      rc = mbd_error_set(err, MBD_E_TOO_LARGE,
                         "body field '%.*s' makes the routing fields larger than %zu bytes",
                         (int)(kn < 64 ? kn : 64), ks, max_bytes);
      goto done;
    }
    msgpack_sbuffer_write(&sel, (const char *)p + k0, off - k0);
    nsel++;
  }
  if (off != len) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "body has %zu trailing bytes after the map", len - off);
    goto done;
  }
  {
    msgpack_sbuffer head;
    msgpack_sbuffer_init(&head);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &head, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, nsel);
    if (sel.size) msgpack_sbuffer_write(&head, sel.data, sel.size);
    rc = mbd_body_parse(head.data, head.size, out, err);
    msgpack_sbuffer_destroy(&head);
  }
done:
  msgpack_sbuffer_destroy(&sel);
  return rc;
}

/* True when the key at p[off..) is the string `key`. */
static bool key_is(const uint8_t *p, size_t len, size_t off, const char *key) {
  const char *ks = NULL;
  size_t kn = 0;
  return peek_str(p, len, off, &ks, &kn) && kn == strlen(key) && !memcmp(ks, key, kn);
}

int mbd_body_replace_raw(const void *buf, size_t len, const char *key, const void *val, size_t vlen,
                         msgpack_sbuffer *out, mbd_error *err) {
  const uint8_t *p = buf;
  size_t off = 0;
  uint64_t kids = 0;
  int rc;
  if (len) {
    uint8_t t = p[0];
    if (!((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf))
      return mbd_error_set(err, MBD_E_FORMAT, "body is not a msgpack map (type byte 0x%02x)", t);
    if ((rc = skip_header(p, len, &off, &kids, err))) return rc;
  }
  size_t first = off;
  uint64_t keep = 0;
  for (uint64_t i = 0; i < kids / 2; i++) { /* count what stays */
    bool drop = key_is(p, len, off, key);
    if ((rc = skip_object(p, len, &off, err)) || (rc = skip_object(p, len, &off, err))) return rc;
    keep += !drop;
  }
  if (off != len)
    return mbd_error_set(err, MBD_E_FORMAT, "body has %zu trailing bytes after the map", len - off);
  if (keep >= UINT32_MAX) return mbd_error_set(err, MBD_E_FORMAT, "body map is too large");
  if (!out->data) { /* one allocation for a body that may be large */
    out->data = malloc(len + vlen + strlen(key) + 16);
    if (!out->data) return mbd_error_set(err, MBD_E_NOMEM, "out of memory rewriting a %zu-byte body", len);
    out->alloc = len + vlen + strlen(key) + 16;
  }
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, (uint32_t)(keep + 1));
  mbd_pack_str(&pk, key);
  if (msgpack_sbuffer_write(out, val, vlen))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory rewriting a %zu-byte body", len);
  off = first;
  for (uint64_t i = 0; i < kids / 2; i++) {
    size_t k0 = off;
    bool drop = key_is(p, len, off, key);
    skip_object(p, len, &off, NULL); /* checked by the first pass */
    skip_object(p, len, &off, NULL);
    if (!drop && msgpack_sbuffer_write(out, (const char *)p + k0, off - k0))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory rewriting a %zu-byte body", len);
  }
  return MBD_OK;
}

void mbd_body_destroy(mbd_body **pb) {
  if (!pb || !*pb) return;
  msgpack_unpacked_destroy(&(*pb)->up);
  free((*pb)->bytes);
  free(*pb);
  *pb = NULL;
}

const msgpack_object *mbd_body_root(const mbd_body *b) { return b->have ? &b->up.data : &b->empty; }

/* ---- typed getters ------------------------------------------------------ */

const msgpack_object *mbd_obj_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t kl = strlen(key);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && !memcmp(k->via.str.ptr, key, kl))
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

static const char *type_name(msgpack_object_type t) {
  switch (t) {
  case MSGPACK_OBJECT_NIL: return "nil";
  case MSGPACK_OBJECT_BOOLEAN: return "bool";
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: return "float";
  case MSGPACK_OBJECT_STR: return "string";
  case MSGPACK_OBJECT_ARRAY: return "array";
  case MSGPACK_OBJECT_MAP: return "map";
  case MSGPACK_OBJECT_BIN: return "binary";
  default: return "extension";
  }
}

/* Looks up key; nil counts as absent. Returns 1 found, 0 absent-optional, <0 error. */
static int lookup(const msgpack_object *map, const char *key, bool required,
                  const msgpack_object **v, mbd_error *err) {
  *v = mbd_obj_get(map, key);
  if (*v && (*v)->type == MSGPACK_OBJECT_NIL) *v = NULL;
  if (*v) return 1;
  if (required) return mbd_error_set(err, MBD_E_INVALID, "missing required field '%s'", key);
  return 0;
}

static int wrong_type(const char *key, const char *want, const msgpack_object *v, mbd_error *err) {
  return mbd_error_set(err, MBD_E_INVALID, "field '%s' must be %s, got %s", key, want,
                       type_name(v->type));
}

int mbd_obj_str(const msgpack_object *map, const char *key, bool required, char *dst, size_t cap,
                mbd_error *err) {
  const msgpack_object *v;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  if (v->type != MSGPACK_OBJECT_STR) return wrong_type(key, "a string", v, err);
  size_t n = v->via.str.size;
  if (n >= cap)
    return mbd_error_set(err, MBD_E_INVALID, "field '%s' is %zu bytes (at most %zu)", key, n,
                         cap ? cap - 1 : 0);
  if (n && memchr(v->via.str.ptr, '\0', n))
    return mbd_error_set(err, MBD_E_INVALID, "field '%s' contains a NUL byte", key);
  memcpy(dst, v->via.str.ptr, n);
  dst[n] = '\0';
  return MBD_OK;
}

int mbd_obj_u64(const msgpack_object *map, const char *key, bool required, uint64_t *out,
                mbd_error *err) {
  const msgpack_object *v;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
    return mbd_error_set(err, MBD_E_INVALID, "field '%s' must be >= 0, got %" PRId64, key, v->via.i64);
  if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return wrong_type(key, "an unsigned integer", v, err);
  *out = v->via.u64;
  return MBD_OK;
}

/* Integer object -> int64 with range check. */
static int as_i64(const msgpack_object *v, const char *key, int64_t *out, mbd_error *err) {
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *out = v->via.i64;
    return MBD_OK;
  }
  if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return wrong_type(key, "an integer", v, err);
  if (v->via.u64 > (uint64_t)INT64_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "field '%s' is out of range (%" PRIu64 ")", key, v->via.u64);
  *out = (int64_t)v->via.u64;
  return MBD_OK;
}

int mbd_obj_i64(const msgpack_object *map, const char *key, bool required, int64_t *out,
                mbd_error *err) {
  const msgpack_object *v;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  return as_i64(v, key, out, err);
}

int mbd_obj_f64(const msgpack_object *map, const char *key, bool required, double *out,
                mbd_error *err) {
  const msgpack_object *v;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  switch (v->type) {
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: *out = v->via.f64; return MBD_OK;
  case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)v->via.u64; return MBD_OK;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)v->via.i64; return MBD_OK;
  default: return wrong_type(key, "a number", v, err);
  }
}

int mbd_obj_bool(const msgpack_object *map, const char *key, bool required, bool *out,
                 mbd_error *err) {
  const msgpack_object *v;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  if (v->type != MSGPACK_OBJECT_BOOLEAN) return wrong_type(key, "a bool", v, err);
  *out = v->via.boolean;
  return MBD_OK;
}

int mbd_obj_i64_array(const msgpack_object *map, const char *key, bool required, int64_t *out,
                      size_t cap, size_t *n, mbd_error *err) {
  const msgpack_object *v;
  *n = 0;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  if (v->type != MSGPACK_OBJECT_ARRAY) return wrong_type(key, "an array of integers", v, err);
  if (v->via.array.size > cap)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "field '%s' has %u entries (at most %zu)", key,
                         v->via.array.size, cap);
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    rc = as_i64(&v->via.array.ptr[i], key, &out[i], err);
    if (rc) return mbd_error_prefix(err, "entry %u", i);
  }
  *n = v->via.array.size;
  return MBD_OK;
}

/* ---- tensor references ------------------------------------------------- */

static int read_tref(const msgpack_object *m, mbd_tensor_ref *r, mbd_error *err) {
  memset(r, 0, sizeof *r);
  if (m->type != MSGPACK_OBJECT_MAP) return wrong_type("tensors[]", "a map", m, err);
  int rc = mbd_obj_str(m, "name", true, r->name, sizeof r->name, err);
  if (rc) return rc;
  char dt[16];
  rc = mbd_obj_str(m, "dtype", true, dt, sizeof dt, err);
  if (rc) return rc;
  mbd_dtype dtype;
  rc = mbd_dtype_parse(dt, &dtype, err);
  if (rc) return rc;
  int64_t shape[MBD_MAX_DIMS];
  size_t ndim = 0;
  rc = mbd_obj_i64_array(m, "shape", true, shape, MBD_MAX_DIMS, &ndim, err);
  if (rc) {
    if (err) err->code = MBD_E_SHAPE; /* keep the getter's message, report it as a shape error */
    return MBD_E_SHAPE;
  }
  rc = mbd_tensor_desc_make(&r->desc, dtype, (int)ndim, shape, err);
  if (rc) return rc;
  size_t nbytes = 0;
  rc = mbd_tensor_desc_nbytes(&r->desc, &nbytes, err);
  if (rc) return rc;

  const msgpack_object *fr = mbd_obj_get(m, "frame"), *shm = mbd_obj_get(m, "shm"),
                       *ipc = mbd_obj_get(m, "ipc");
  int locs = (fr != NULL) + (shm != NULL) + (ipc != NULL);
  if (locs != 1)
    return mbd_error_set(err, MBD_E_INVALID,
                         "tensor needs exactly one location of frame | shm | ipc, got %d", locs);
  if (fr) {
    uint64_t f = 0;
    rc = mbd_obj_u64(m, "frame", true, &f, err);
    if (rc) return rc;
    if (f > UINT32_MAX) return mbd_error_set(err, MBD_E_INVALID, "frame index %" PRIu64 " too large", f);
    r->kind = MBD_TREF_INLINE;
    r->frame = (uint32_t)f;
    return MBD_OK;
  }
  const msgpack_object *loc = shm ? shm : ipc;
  if (loc->type != MSGPACK_OBJECT_MAP) return wrong_type(shm ? "shm" : "ipc", "a map", loc, err);
  if ((rc = mbd_obj_u64(loc, "offset", true, &r->offset, err)) ||
      (rc = mbd_obj_u64(loc, "size", true, &r->size, err)))
    return rc;
  if (r->offset > UINT64_MAX - r->size)
    return mbd_error_set(err, MBD_E_INVALID, "tensor byte range overflows (offset %" PRIu64 ")", r->offset);
  if (r->size < nbytes)
    return mbd_error_set(err, MBD_E_SHAPE, "tensor '%s' needs %zu bytes but its region has %" PRIu64,
                         r->name, nbytes, r->size);
  if (shm) {
    r->kind = MBD_TREF_SHM;
    rc = mbd_obj_str(loc, "name", true, r->shm_name, sizeof r->shm_name, err);
    if (rc) return rc;
    if (r->shm_name[0] != '/' || strchr(r->shm_name + 1, '/'))
      return mbd_error_set(err, MBD_E_INVALID, "shm name '%s' must be '/name' without further '/'",
                           r->shm_name);
    return MBD_OK;
  }
  r->kind = MBD_TREF_CUDA_IPC;
  const msgpack_object *h = mbd_obj_get(loc, "handle");
  if (!h) return mbd_error_set(err, MBD_E_INVALID, "missing required field 'handle'");
  if (h->type != MSGPACK_OBJECT_BIN || h->via.bin.size != MBD_IPC_HANDLE_BYTES)
    return mbd_error_set(err, MBD_E_INVALID, "field 'handle' must be %d bytes of binary",
                         MBD_IPC_HANDLE_BYTES);
  memcpy(r->ipc_handle, h->via.bin.ptr, MBD_IPC_HANDLE_BYTES);
  int64_t dev = 0;
  rc = mbd_obj_i64(loc, "device", true, &dev, err);
  if (rc) return rc;
  if (dev < 0 || dev > 1024) return mbd_error_set(err, MBD_E_INVALID, "bad CUDA device %" PRId64, dev);
  r->device = (int)dev;
  const msgpack_object *ev = mbd_obj_get(loc, "event"); /* optional: order after the client */
  if (ev) {
    if (ev->type != MSGPACK_OBJECT_BIN || ev->via.bin.size != MBD_IPC_HANDLE_BYTES)
      return mbd_error_set(err, MBD_E_INVALID, "field 'event' must be %d bytes of binary",
                           MBD_IPC_HANDLE_BYTES);
    memcpy(r->ipc_event, ev->via.bin.ptr, MBD_IPC_HANDLE_BYTES);
    r->has_event = true;
  }
  return MBD_OK;
}

int mbd_obj_tensor_refs(const msgpack_object *map, const char *key, bool required,
                        mbd_tensor_ref *out, size_t cap, size_t *n, mbd_error *err) {
  const msgpack_object *v;
  *n = 0;
  int rc = lookup(map, key, required, &v, err);
  if (rc <= 0) return rc;
  if (v->type != MSGPACK_OBJECT_ARRAY) return wrong_type(key, "an array of tensor maps", v, err);
  if (v->via.array.size > cap)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "field '%s' has %u tensors (at most %zu)", key,
                         v->via.array.size, cap);
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    rc = read_tref(&v->via.array.ptr[i], &out[i], err);
    if (rc) return mbd_error_prefix(err, "%s[%u]", key, i);
  }
  *n = v->via.array.size;
  return MBD_OK;
}

int mbd_body_append_str(const void *body, size_t len, const char *key, const char *val,
                        msgpack_sbuffer *out, mbd_error *err) {
  const uint8_t *p = body;
  uint64_t count = 0;
  size_t head = 0;
  if (len == 0) {
    head = 0;
  } else if ((p[0] & 0xf0) == 0x80) {
    count = p[0] & 0x0f, head = 1;
  } else if (p[0] == 0xde && len >= 3) {
    count = (uint64_t)p[1] << 8 | p[2], head = 3;
  } else if (p[0] == 0xdf && len >= 5) {
    count = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 | p[4], head = 5;
  } else {
    return mbd_error_set(err, MBD_E_FORMAT, "body is not a msgpack map");
  }
  if (count >= UINT32_MAX) return mbd_error_set(err, MBD_E_TOO_LARGE, "body map too large");
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, (size_t)count + 1);
  if (len > head) msgpack_sbuffer_write(out, (const char *)p + head, len - head);
  mbd_pack_kv_str(&pk, key, val);
  return MBD_OK;
}

bool mbd_digest_prefix_ok(const char *s) {
  size_t n = strlen(s);
  if (n < 8 || n > 64) return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

int mbd_obj_route_want(const msgpack_object *map, const char *key, mbd_route_want *out,
                       mbd_error *err) {
  memset(out, 0, sizeof *out);
  const msgpack_object *v;
  int rc = lookup(map, key, false, &v, err);
  if (rc <= 0) return rc;
  if (v->type != MSGPACK_OBJECT_MAP) return wrong_type(key, "a map", v, err);
  if ((rc = mbd_obj_str(v, "route_id", false, out->route_id, sizeof out->route_id, err)) ||
      (rc = mbd_obj_str(v, "backend", false, out->backend, sizeof out->backend, err)) ||
      (rc = mbd_obj_str(v, "gemm_mode", false, out->gemm_mode, sizeof out->gemm_mode, err)) ||
      (rc = mbd_obj_str(v, "dtype", false, out->dtype, sizeof out->dtype, err)) ||
      (rc = mbd_obj_str(v, "state", false, out->state, sizeof out->state, err)) ||
      (rc = mbd_obj_str(v, "family", false, out->family, sizeof out->family, err)) ||
      (rc = mbd_obj_str(v, "device", false, out->device_name, sizeof out->device_name, err)))
    return mbd_error_prefix(err, "%s", key);
  size_t idl = strlen(out->route_id);
  if (idl) {
    if (idl < 8)
      return mbd_error_set(err, MBD_E_INVALID, "route_id '%s' is too short (at least 8 hex chars)",
                           out->route_id);
    for (size_t i = 0; i < idl; i++) {
      if (!isxdigit((unsigned char)out->route_id[i]))
        return mbd_error_set(err, MBD_E_INVALID, "route_id '%s' is not hexadecimal", out->route_id);
      out->route_id[i] = (char)tolower((unsigned char)out->route_id[i]);
    }
  }
  /* Unknown names would silently match nothing; say which values exist instead. */
  mbd_backend_kind b;
  mbd_gemm_mode gm;
  mbd_dtype_policy dp;
  mbd_family f;
  mbd_state_dtype sd;
  if ((out->backend[0] && (rc = mbd_backend_parse(out->backend, &b, err))) ||
      (out->gemm_mode[0] && (rc = mbd_gemm_mode_parse(out->gemm_mode, &gm, err))) ||
      (out->dtype[0] && (rc = mbd_dtype_policy_parse(out->dtype, &dp, err))) ||
      (out->state[0] && (rc = mbd_state_dtype_parse(out->state, &sd, err))) ||
      (out->family[0] && (rc = mbd_family_parse(out->family, &f, err))))
    return mbd_error_prefix(err, "%s", key);
  return MBD_OK;
}

/* ---- packing -------------------------------------------------------------- */

void mbd_pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

void mbd_pack_kv_str(msgpack_packer *pk, const char *key, const char *val) {
  mbd_pack_str(pk, key);
  mbd_pack_str(pk, val);
}

void mbd_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t v) {
  mbd_pack_str(pk, key);
  msgpack_pack_uint64(pk, v);
}

void mbd_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t v) {
  mbd_pack_str(pk, key);
  msgpack_pack_int64(pk, v);
}

void mbd_pack_kv_f64(msgpack_packer *pk, const char *key, double v) {
  mbd_pack_str(pk, key);
  msgpack_pack_double(pk, v);
}

void mbd_pack_kv_bool(msgpack_packer *pk, const char *key, bool v) {
  mbd_pack_str(pk, key);
  if (v) msgpack_pack_true(pk);
  else msgpack_pack_false(pk);
}

void mbd_pack_tensor_ref(msgpack_packer *pk, const mbd_tensor_ref *r) {
  msgpack_pack_map(pk, 4);
  mbd_pack_kv_str(pk, "name", r->name);
  mbd_pack_kv_str(pk, "dtype", mbd_dtype_name(r->desc.dtype));
  mbd_pack_str(pk, "shape");
  int nd = r->desc.ndim < 0 ? 0 : r->desc.ndim > MBD_MAX_DIMS ? MBD_MAX_DIMS : r->desc.ndim;
  msgpack_pack_array(pk, (size_t)nd);
  for (int i = 0; i < nd; i++) msgpack_pack_int64(pk, r->desc.shape[i]);
  switch (r->kind) {
  case MBD_TREF_INLINE: mbd_pack_kv_u64(pk, "frame", r->frame); break;
  case MBD_TREF_SHM:
    mbd_pack_str(pk, "shm");
    msgpack_pack_map(pk, 3);
    mbd_pack_kv_str(pk, "name", r->shm_name);
    mbd_pack_kv_u64(pk, "offset", r->offset);
    mbd_pack_kv_u64(pk, "size", r->size);
    break;
  case MBD_TREF_CUDA_IPC:
    mbd_pack_str(pk, "ipc");
    msgpack_pack_map(pk, r->has_event ? 5 : 4);
    mbd_pack_str(pk, "handle");
    msgpack_pack_bin(pk, MBD_IPC_HANDLE_BYTES);
    msgpack_pack_bin_body(pk, r->ipc_handle, MBD_IPC_HANDLE_BYTES);
    mbd_pack_kv_i64(pk, "device", r->device);
    mbd_pack_kv_u64(pk, "offset", r->offset);
    mbd_pack_kv_u64(pk, "size", r->size);
    if (r->has_event) {
      mbd_pack_str(pk, "event");
      msgpack_pack_bin(pk, MBD_IPC_HANDLE_BYTES);
      msgpack_pack_bin_body(pk, r->ipc_event, MBD_IPC_HANDLE_BYTES);
    }
    break;
  }
}

void mbd_pack_route_want(msgpack_packer *pk, const mbd_route_want *w) {
  const char *keys[] = {"route_id", "backend", "gemm_mode", "dtype", "state", "family", "device"};
  const char *vals[] = {w->route_id, w->backend, w->gemm_mode, w->dtype,
                        w->state,    w->family,  w->device_name};
  const size_t nk = sizeof keys / sizeof keys[0];
  size_t n = 0;
  for (size_t i = 0; i < nk; i++) n += vals[i][0] != '\0';
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i < nk; i++)
    if (vals[i][0]) mbd_pack_kv_str(pk, keys[i], vals[i]);
}
