/* Protocol codec: body validation, typed getters (incl. wrong types), tensor
 * refs (one-of location rule, shapes, ranges), route constraints, and
 * pack -> parse round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/protocol.h"

/* A packer writing into a fresh sbuffer. */
typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} packbuf;

static void pb_init(packbuf *p) {
  msgpack_sbuffer_init(&p->sb);
  msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

static mbd_body *parse_ok(packbuf *p) {
  mbd_body *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_body_parse(p->sb.data, p->sb.size, &b, &err), 0);
  assert_non_null(b);
  return b;
}

static void test_cmd_names(void **state) {
  (void)state;
  assert_string_equal(mbd_cmd_name(MBD_CMD_FORWARD), "forward");
  assert_string_equal(mbd_cmd_name(MBD_CMD_ERROR), "ERROR");
  assert_string_equal(mbd_cmd_name(0x55), "unknown");
  assert_true(mbd_cmd_is_request(MBD_CMD_STATUS));
  assert_true(mbd_cmd_is_request(MBD_CMD_CLOSE));
  assert_false(mbd_cmd_is_request(MBD_CMD_FINAL));
  assert_false(mbd_cmd_is_request(MBD_CMD_READY));
  assert_true(mbd_cmd_is_session(MBD_CMD_STEP));
  assert_true(mbd_cmd_is_session(MBD_CMD_EXPORT));
  assert_false(mbd_cmd_is_session(MBD_CMD_OPEN));
  assert_false(mbd_cmd_is_session(MBD_CMD_IMPORT));
  assert_false(mbd_cmd_is_session(MBD_CMD_FORWARD));
}

static void test_body_empty_and_bad(void **state) {
  (void)state;
  mbd_body *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_body_parse(NULL, 0, &b, &err), 0);
  assert_int_equal(mbd_body_root(b)->type, MSGPACK_OBJECT_MAP);
  assert_int_equal(mbd_body_root(b)->via.map.size, 0);
  assert_null(mbd_obj_get(mbd_body_root(b), "x"));
  mbd_body_destroy(&b);
  assert_null(b);
  mbd_body_destroy(&b); /* NULL-safe */

  struct {
    const char *bytes;
    size_t len;
  } bad[] = {
      {"\x91\x01", 2},                 /* array, not a map */
      {"\x01", 1},                     /* integer */
      {"\x81\xa1k", 3},                /* truncated: value missing */
      {"\x80\x80", 2},                 /* trailing bytes */
      {"\xdf\xff\xff\xff\xff", 5},     /* map claiming 4G entries */
      {"\x81\xa1k\xdd\xff\xff\xff\xff", 8}, /* nested array claiming 4G */
      {"\x81\xa1k\xc1", 4},            /* reserved type byte */
      {"\x81\xa1k\xdb\x00\x00\x10\x00", 8}, /* str longer than buffer */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mbd_error_clear(&err);
    assert_int_equal(mbd_body_parse(bad[i].bytes, bad[i].len, &b, &err), MBD_E_FORMAT);
    assert_null(b);
    assert_true(strlen(err.msg) > 0);
    assert_int_equal(mbd_body_check(bad[i].bytes, bad[i].len, NULL), MBD_E_FORMAT);
  }
  /* Nesting deeper than the limit: {k:[[[[...]]]]}. */
  unsigned char deep[64];
  size_t n = 0;
  deep[n++] = 0x81;
  deep[n++] = 0xa1;
  deep[n++] = 'k';
  while (n < sizeof deep - 1) deep[n++] = 0x91;
  deep[n++] = 0x01;
  assert_int_equal(mbd_body_parse(deep, n, &b, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "nested"));
}

static void test_getters(void **state) {
  (void)state;
  packbuf p;
  pb_init(&p);
  msgpack_pack_map(&p.pk, 9);
  mbd_pack_kv_str(&p.pk, "s", "hello");
  mbd_pack_kv_u64(&p.pk, "u", UINT64_MAX);
  mbd_pack_kv_i64(&p.pk, "i", -42);
  mbd_pack_kv_f64(&p.pk, "f", 0.25);
  mbd_pack_kv_bool(&p.pk, "b", true);
  mbd_pack_str(&p.pk, "arr");
  msgpack_pack_array(&p.pk, 3);
  msgpack_pack_int64(&p.pk, 7);
  msgpack_pack_int64(&p.pk, -1);
  msgpack_pack_uint64(&p.pk, 1000000000000ull);
  mbd_pack_str(&p.pk, "nil");
  msgpack_pack_nil(&p.pk);
  mbd_pack_str(&p.pk, "nul");
  msgpack_pack_str(&p.pk, 3);
  msgpack_pack_str_body(&p.pk, "a\0b", 3);
  mbd_pack_kv_u64(&p.pk, "big", (uint64_t)INT64_MAX + 1);
  mbd_body *b = parse_ok(&p);
  msgpack_sbuffer_destroy(&p.sb); /* the body holds its own copy */
  const msgpack_object *r = mbd_body_root(b);
  mbd_error err = {0};

  char s[16];
  assert_int_equal(mbd_obj_str(r, "s", true, s, sizeof s, &err), 0);
  assert_string_equal(s, "hello");
  assert_int_equal(mbd_obj_str(r, "s", true, s, 5, &err), MBD_E_INVALID); /* 5 bytes + NUL */
  assert_int_equal(mbd_obj_str(r, "nul", true, s, sizeof s, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "NUL"));
  uint64_t u = 0;
  assert_int_equal(mbd_obj_u64(r, "u", true, &u, &err), 0);
  assert_true(u == UINT64_MAX);
  int64_t i = 0;
  assert_int_equal(mbd_obj_i64(r, "i", true, &i, &err), 0);
  assert_int_equal(i, -42);
  assert_int_equal(mbd_obj_i64(r, "big", true, &i, &err), MBD_E_INVALID);
  assert_int_equal(mbd_obj_u64(r, "i", true, &u, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "'i'"));
  double f = 0;
  assert_int_equal(mbd_obj_f64(r, "f", true, &f, &err), 0);
  assert_true(f == 0.25);
  assert_int_equal(mbd_obj_f64(r, "i", true, &f, &err), 0); /* integers are numbers */
  assert_true(f == -42.0);
  bool bo = false;
  assert_int_equal(mbd_obj_bool(r, "b", true, &bo, &err), 0);
  assert_true(bo);

  /* Wrong types name the key and both types. */
  assert_int_equal(mbd_obj_str(r, "u", true, s, sizeof s, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "'u'"));
  assert_non_null(strstr(err.msg, "string"));
  assert_int_equal(mbd_obj_u64(r, "s", true, &u, &err), MBD_E_INVALID);
  assert_int_equal(mbd_obj_i64(r, "f", true, &i, &err), MBD_E_INVALID);
  assert_int_equal(mbd_obj_f64(r, "s", true, &f, &err), MBD_E_INVALID);
  assert_int_equal(mbd_obj_bool(r, "i", true, &bo, &err), MBD_E_INVALID);
  int64_t a[4];
  size_t n = 9;
  assert_int_equal(mbd_obj_i64_array(r, "s", true, a, 4, &n, &err), MBD_E_INVALID);

  /* Absent: optional leaves out untouched, required names the key. nil = absent. */
  u = 123;
  assert_int_equal(mbd_obj_u64(r, "missing", false, &u, &err), 0);
  assert_int_equal(u, 123);
  assert_int_equal(mbd_obj_u64(r, "nil", false, &u, &err), 0);
  assert_int_equal(u, 123);
  assert_int_equal(mbd_obj_u64(r, "missing", true, &u, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "missing"));
  assert_int_equal(mbd_obj_str(r, "nil", true, s, sizeof s, &err), MBD_E_INVALID);

  assert_int_equal(mbd_obj_i64_array(r, "arr", true, a, 4, &n, &err), 0);
  assert_int_equal(n, 3);
  assert_int_equal(a[0], 7);
  assert_int_equal(a[1], -1);
  assert_int_equal(a[2], 1000000000000ll);
  assert_int_equal(mbd_obj_i64_array(r, "arr", true, a, 2, &n, &err), MBD_E_TOO_LARGE);
  assert_int_equal(mbd_obj_i64_array(r, "missing", false, a, 2, &n, &err), 0);
  assert_int_equal(n, 0);
  /* getters on a non-map */
  assert_null(mbd_obj_get(&r->via.map.ptr[0].val, "s"));
  mbd_body_destroy(&b);
}

static void pack_tensor_base(msgpack_packer *pk, int extra, const char *dtype, int ndim,
                             const int64_t *shape) {
  msgpack_pack_map(pk, (size_t)(3 + extra));
  mbd_pack_kv_str(pk, "name", "x");
  mbd_pack_kv_str(pk, "dtype", dtype);
  mbd_pack_str(pk, "shape");
  msgpack_pack_array(pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_int64(pk, shape[i]);
}

/* Parses {"tensors": [ one tensor built by fn ]} and returns the status. */
typedef void (*tensor_fn)(msgpack_packer *pk);
static int parse_one_tensor(tensor_fn fn, mbd_tensor_ref *out, mbd_error *err) {
  packbuf p;
  pb_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  fn(&p.pk);
  mbd_body *b = parse_ok(&p);
  size_t n = 99;
  int rc = mbd_obj_tensor_refs(mbd_body_root(b), "tensors", true, out, 2, &n, err);
  if (rc == 0) assert_int_equal(n, 1);
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&p.sb);
  return rc;
}

static const int64_t k_shape[2] = {2, 3};
static void t_frame(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "f32", 2, k_shape);
  mbd_pack_kv_u64(pk, "frame", 1);
}
static void t_none(msgpack_packer *pk) { pack_tensor_base(pk, 0, "f32", 2, k_shape); }
static void t_two(msgpack_packer *pk) {
  pack_tensor_base(pk, 2, "f32", 2, k_shape);
  mbd_pack_kv_u64(pk, "frame", 0);
  mbd_pack_str(pk, "shm");
  msgpack_pack_map(pk, 3);
  mbd_pack_kv_str(pk, "name", "/x");
  mbd_pack_kv_u64(pk, "offset", 0);
  mbd_pack_kv_u64(pk, "size", 24);
}
static void t_shm_small(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "f32", 2, k_shape);
  mbd_pack_str(pk, "shm");
  msgpack_pack_map(pk, 3);
  mbd_pack_kv_str(pk, "name", "/x");
  mbd_pack_kv_u64(pk, "offset", 0);
  mbd_pack_kv_u64(pk, "size", 23);
}
static void t_shm_overflow(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "f32", 2, k_shape);
  mbd_pack_str(pk, "shm");
  msgpack_pack_map(pk, 3);
  mbd_pack_kv_str(pk, "name", "/x");
  mbd_pack_kv_u64(pk, "offset", UINT64_MAX - 8);
  mbd_pack_kv_u64(pk, "size", 24);
}
static void t_shm_badname(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "f32", 2, k_shape);
  mbd_pack_str(pk, "shm");
  msgpack_pack_map(pk, 3);
  mbd_pack_kv_str(pk, "name", "../etc/passwd");
  mbd_pack_kv_u64(pk, "offset", 0);
  mbd_pack_kv_u64(pk, "size", 24);
}
static void t_ipc_shorthandle(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "bf16", 2, k_shape);
  mbd_pack_str(pk, "ipc");
  msgpack_pack_map(pk, 4);
  mbd_pack_str(pk, "handle");
  msgpack_pack_bin(pk, 10);
  msgpack_pack_bin_body(pk, "0123456789", 10);
  mbd_pack_kv_i64(pk, "device", 0);
  mbd_pack_kv_u64(pk, "offset", 0);
  mbd_pack_kv_u64(pk, "size", 12);
}
static void t_baddtype(msgpack_packer *pk) {
  pack_tensor_base(pk, 1, "f64", 2, k_shape);
  mbd_pack_kv_u64(pk, "frame", 0);
}
static void t_negdim(msgpack_packer *pk) {
  int64_t sh[2] = {2, -3};
  pack_tensor_base(pk, 1, "f32", 2, sh);
  mbd_pack_kv_u64(pk, "frame", 0);
}
static void t_rank9(msgpack_packer *pk) {
  int64_t sh[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  pack_tensor_base(pk, 1, "f32", 9, sh);
  mbd_pack_kv_u64(pk, "frame", 0);
}
static void t_hugedims(msgpack_packer *pk) {
  int64_t sh[3] = {INT64_MAX, INT64_MAX, 4};
  pack_tensor_base(pk, 1, "f32", 3, sh);
  mbd_pack_kv_u64(pk, "frame", 0);
}
static void t_notmap(msgpack_packer *pk) { msgpack_pack_int(pk, 3); }

static void test_tensor_refs_rules(void **state) {
  (void)state;
  mbd_tensor_ref r;
  mbd_error err = {0};
  assert_int_equal(parse_one_tensor(t_frame, &r, &err), 0);
  assert_int_equal(r.kind, MBD_TREF_INLINE);
  assert_int_equal(r.frame, 1);
  assert_int_equal(r.desc.ndim, 2);
  assert_int_equal(r.desc.shape[1], 3);
  assert_string_equal(r.name, "x");

  assert_int_equal(parse_one_tensor(t_none, &r, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "exactly one"));
  assert_int_equal(parse_one_tensor(t_two, &r, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "exactly one"));
  assert_non_null(strstr(err.msg, "tensors[0]"));
  assert_int_equal(parse_one_tensor(t_shm_small, &r, &err), MBD_E_SHAPE);
  assert_int_equal(parse_one_tensor(t_shm_overflow, &r, &err), MBD_E_INVALID);
  assert_int_equal(parse_one_tensor(t_shm_badname, &r, &err), MBD_E_INVALID);
  assert_int_equal(parse_one_tensor(t_ipc_shorthandle, &r, &err), MBD_E_INVALID);
  assert_int_equal(parse_one_tensor(t_baddtype, &r, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "f64"));
  assert_int_equal(parse_one_tensor(t_negdim, &r, &err), MBD_E_SHAPE);
  assert_int_equal(parse_one_tensor(t_rank9, &r, &err), MBD_E_SHAPE);
  assert_int_equal(parse_one_tensor(t_hugedims, &r, &err), MBD_E_TOO_LARGE);
  assert_int_equal(parse_one_tensor(t_notmap, &r, &err), MBD_E_INVALID);
}

static void test_tensor_refs_roundtrip(void **state) {
  (void)state;
  mbd_tensor_ref in[3];
  memset(in, 0, sizeof in);
  mbd_error err = {0};
  int64_t s0[2] = {4, 5}, s1[1] = {7}, s2[3] = {1, 2, 3};
  strcpy(in[0].name, "input_ids");
  assert_int_equal(mbd_tensor_desc_make(&in[0].desc, MBD_DTYPE_I64, 2, s0, &err), 0);
  in[0].kind = MBD_TREF_INLINE;
  in[0].frame = 2;
  strcpy(in[1].name, "state");
  assert_int_equal(mbd_tensor_desc_make(&in[1].desc, MBD_DTYPE_F32, 1, s1, &err), 0);
  in[1].kind = MBD_TREF_SHM;
  strcpy(in[1].shm_name, "/mbd-test");
  in[1].offset = 4096;
  in[1].size = 64;
  strcpy(in[2].name, "logits");
  assert_int_equal(mbd_tensor_desc_make(&in[2].desc, MBD_DTYPE_BF16, 3, s2, &err), 0);
  in[2].kind = MBD_TREF_CUDA_IPC;
  for (int i = 0; i < MBD_IPC_HANDLE_BYTES; i++) in[2].ipc_handle[i] = (uint8_t)(i * 7);
  in[2].device = 3;
  in[2].offset = 256;
  in[2].size = 12;

  packbuf p;
  pb_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 3);
  for (int i = 0; i < 3; i++) mbd_pack_tensor_ref(&p.pk, &in[i]);
  mbd_body *b = parse_ok(&p);
  mbd_tensor_ref out[3];
  size_t n = 0;
  assert_int_equal(mbd_obj_tensor_refs(mbd_body_root(b), "tensors", true, out, 3, &n, &err), 0);
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    assert_string_equal(out[i].name, in[i].name);
    assert_int_equal(out[i].kind, in[i].kind);
    assert_int_equal(out[i].desc.dtype, in[i].desc.dtype);
    assert_int_equal(out[i].desc.ndim, in[i].desc.ndim);
    assert_memory_equal(out[i].desc.shape, in[i].desc.shape, sizeof in[i].desc.shape);
  }
  assert_int_equal(out[0].frame, 2);
  assert_string_equal(out[1].shm_name, "/mbd-test");
  assert_int_equal(out[1].offset, 4096);
  assert_int_equal(out[1].size, 64);
  assert_memory_equal(out[2].ipc_handle, in[2].ipc_handle, MBD_IPC_HANDLE_BYTES);
  assert_int_equal(out[2].device, 3);
  assert_int_equal(out[2].offset, 256);
  /* cap smaller than the array */
  assert_int_equal(mbd_obj_tensor_refs(mbd_body_root(b), "tensors", true, out, 2, &n, &err),
                   MBD_E_TOO_LARGE);
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&p.sb);
}

static int want_from(const char *const *kv, size_t nkv, mbd_route_want *w, mbd_error *err) {
  packbuf p;
  pb_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "route");
  msgpack_pack_map(&p.pk, nkv);
  for (size_t i = 0; i < nkv; i++) mbd_pack_kv_str(&p.pk, kv[2 * i], kv[2 * i + 1]);
  mbd_body *b = parse_ok(&p);
  int rc = mbd_obj_route_want(mbd_body_root(b), "route", w, err);
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&p.sb);
  return rc;
}

static void test_route_want(void **state) {
  (void)state;
  mbd_route_want w, w2;
  mbd_error err = {0};
  const char *good[] = {"route_id", "ABCDEF0123", "backend", "cuda", "gemm_mode", "deterministic",
                        "dtype",    "bf16",       "state",   "bf16", "family",    "inference",
                        "device",   "NVIDIA H200"};
  assert_int_equal(want_from(good, 7, &w, &err), 0);
  assert_string_equal(w.state, "bf16");
  assert_string_equal(w.route_id, "abcdef0123"); /* lower-cased */
  assert_string_equal(w.backend, "cuda");
  assert_string_equal(w.device_name, "NVIDIA H200");
  char txt[256];
  mbd_route_want_format(&w, txt, sizeof txt);
  assert_non_null(strstr(txt, "dtype=bf16"));
  assert_non_null(strstr(txt, "state=bf16"));

  /* pack -> parse round trip */
  packbuf p;
  pb_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "route");
  mbd_pack_route_want(&p.pk, &w);
  mbd_body *b = parse_ok(&p);
  assert_int_equal(mbd_obj_route_want(mbd_body_root(b), "route", &w2, &err), 0);
  assert_memory_equal(&w, &w2, sizeof w);
  /* absent key = any route, fully zeroed */
  memset(&w2, 0x5a, sizeof w2);
  assert_int_equal(mbd_obj_route_want(mbd_body_root(b), "nope", &w2, &err), 0);
  mbd_route_want zero;
  memset(&zero, 0, sizeof zero);
  assert_memory_equal(&w2, &zero, sizeof zero);
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&p.sb);

  const char *shortid[] = {"route_id", "abc"};
  assert_int_equal(want_from(shortid, 1, &w, &err), MBD_E_INVALID);
  const char *nothex[] = {"route_id", "zzzzzzzzzz"};
  assert_int_equal(want_from(nothex, 1, &w, &err), MBD_E_INVALID);
  const char *badmode[] = {"gemm_mode", "fast"};
  assert_int_equal(want_from(badmode, 1, &w, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "deterministic")); /* names the valid values */
  const char *badbackend[] = {"backend", "tpu"};
  assert_int_equal(want_from(badbackend, 1, &w, &err), MBD_E_INVALID);
  const char *longdtype[] = {"dtype", "bfloat16-long"};
  assert_int_equal(want_from(longdtype, 1, &w, &err), MBD_E_INVALID);
  const char *badstate[] = {"state", "f16"};
  assert_int_equal(want_from(badstate, 1, &w, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "f32, bf16")); /* names the valid values */
}

/* The broker's header reader: wanted keys decoded, a huge other value skipped;
 * a FINAL body gains one entry with the others' bytes kept. */
static void test_body_parse_keys_and_append(void **state) {
  (void)state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  mbd_pack_kv_str(&pk, "model", "m");
  mbd_pack_str(&pk, "junk");
  msgpack_pack_array(&pk, 100000);
  for (int i = 0; i < 100000; i++) msgpack_pack_int(&pk, i & 0x7f);
  mbd_pack_kv_u64(&pk, "deadline_ms", 1234);
  msgpack_pack_int(&pk, 7); /* a non-string key: skipped */
  msgpack_pack_int(&pk, 8);
  static const char *const keys[] = {"model", "deadline_ms", "absent", NULL};
  mbd_body *b = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_body_parse_keys(sb.data, sb.size, keys, 1024, &b, &err), 0);
  const msgpack_object *root = mbd_body_root(b);
  assert_int_equal(root->via.map.size, 2);
  char model[8] = "";
  uint64_t dl = 0;
  assert_int_equal(mbd_obj_str(root, "model", true, model, sizeof model, NULL), 0);
  assert_string_equal(model, "m");
  assert_int_equal(mbd_obj_u64(root, "deadline_ms", true, &dl, NULL), 0);
  assert_int_equal(dl, 1234);
  assert_null(mbd_obj_get(root, "junk"));
  mbd_body_destroy(&b);
  /* a wanted field beyond the cap */
  static const char *const big[] = {"junk", NULL};
  assert_int_equal(mbd_body_parse_keys(sb.data, sb.size, big, 1024, &b, &err), MBD_E_TOO_LARGE);
  assert_null(b);
  /* truncated */
  assert_int_equal(mbd_body_parse_keys(sb.data, sb.size - 1, keys, 1024, &b, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_body_parse_keys("", 0, keys, 1024, &b, &err), 0);
  mbd_body_destroy(&b);
  /* append */
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  assert_int_equal(mbd_body_append_str(sb.data, sb.size, "model_digest", "abc", &out, &err), 0);
  assert_int_equal(mbd_body_parse(out.data, out.size, &b, &err), 0);
  root = mbd_body_root(b);
  assert_int_equal(root->via.map.size, 5);
  assert_int_equal(mbd_obj_str(root, "model_digest", true, model, sizeof model, NULL), 0);
  assert_string_equal(model, "abc");
  assert_non_null(mbd_obj_get(root, "junk"));
  mbd_body_destroy(&b);
  msgpack_sbuffer_clear(&out);
  assert_int_equal(mbd_body_append_str("", 0, "k", "v", &out, &err), 0);
  assert_int_equal(mbd_body_parse(out.data, out.size, &b, &err), 0);
  assert_int_equal(mbd_body_root(b)->via.map.size, 1);
  mbd_body_destroy(&b);
  assert_int_equal(mbd_body_append_str("\x91\x01", 2, "k", "v", &out, &err), MBD_E_FORMAT);
  msgpack_sbuffer_destroy(&out);
  msgpack_sbuffer_destroy(&sb);
  assert_true(mbd_digest_prefix_ok("0123abcd"));
  assert_false(mbd_digest_prefix_ok("0123abc"));
  assert_false(mbd_digest_prefix_ok("0123ABCD"));
}

static void test_route_want_matches(void **state) {
  (void)state;
  mbd_route_identity r;
  memset(&r, 0, sizeof r);
  r.mode = MBD_GEMM_DETERMINISTIC;
  r.policy = MBD_POLICY_BF16;
  r.backend = MBD_BACKEND_CUDA;
  strcpy(r.device_name, "NVIDIA H200");
  char id[65];
  mbd_route_id_hex(&r, id);
  mbd_route_want w;
  mbd_error err = {0};
  char pref[9];
  memcpy(pref, id, 8);
  pref[8] = '\0';
  const char *kv[] = {"route_id", pref, "dtype", "bf16"};
  assert_int_equal(want_from(kv, 2, &w, &err), 0);
  assert_true(mbd_route_matches(&w, &r, id));
  const char *kv2[] = {"dtype", "f32"};
  assert_int_equal(want_from(kv2, 1, &w, &err), 0);
  assert_false(mbd_route_matches(&w, &r, id));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cmd_names),          cmocka_unit_test(test_body_empty_and_bad),
      cmocka_unit_test(test_getters),            cmocka_unit_test(test_tensor_refs_rules),
      cmocka_unit_test(test_tensor_refs_roundtrip), cmocka_unit_test(test_route_want),
      cmocka_unit_test(test_route_want_matches),
      cmocka_unit_test(test_body_parse_keys_and_append),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
