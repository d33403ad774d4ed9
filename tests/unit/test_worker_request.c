/* Worker request decoding: every command's fields and their rejections, tensor
 * ref resolution (inline frame sizes and indices, shm alignment and outputs),
 * the session export blob (round trip, truncation, tampering), and the worker
 * command line. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/protocol.h"
#include "common/wire.h"
#include "worker/request.h"
#include "kernels/state_blob.h"
#include "worker/worker.h"
#include "support/wh_requests.h"

static int decode(uint8_t cmd, wh_pack *p, mbd_wreq *q, mbd_error *err) {
  mbd_body *b = NULL;
  assert_int_equal(mbd_body_parse(p->sb.data, p->sb.size, &b, err), 0);
  int rc = mbd_wreq_decode(cmd, mbd_body_root(b), q, err);
  mbd_body_destroy(&b);
  msgpack_sbuffer_destroy(&p->sb);
  return rc;
}

static void test_decode_generate(void **state) {
  (void)state;
  mbd_wreq q;
  mbd_error err = {0};
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 7);
  mbd_pack_kv_str(&p.pk, "session", "u/1");
  mbd_pack_kv_i64(&p.pk, "max_tokens", 5);
  mbd_pack_str(&p.pk, "stop");
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_int64(&p.pk, 3);
  msgpack_pack_int64(&p.pk, 9);
  mbd_pack_kv_f64(&p.pk, "temperature", 0.7);
  mbd_pack_kv_i64(&p.pk, "top_k", 40);
  mbd_pack_kv_f64(&p.pk, "top_p", 0.9);
  mbd_pack_kv_u64(&p.pk, "seed", 1234);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), 0);
  assert_string_equal(q.session, "u/1");
  assert_int_equal(q.max_tokens, 5);
  assert_int_equal(q.nstop, 2);
  assert_int_equal(q.stop[1], 9);
  assert_int_equal(q.top_k, 40);
  assert_int_equal(q.seed, 1234);
  assert_true(q.top_p > 0.89 && q.top_p < 0.91);
  assert_int_equal(q.partial_every, 1);

  /* Defaults: greedy, top_p 1. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "session", "u/1");
  mbd_pack_kv_i64(&p.pk, "max_tokens", 1);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), 0);
  assert_true(q.temperature == 0.0 && q.top_p == 1.0 && q.nstop == 0);

  /* Rejections, each naming the field. */
  struct {
    const char *key;
    double v;
    const char *needle;
  } bad[] = {{"max_tokens", 0, "max_tokens"},     {"max_tokens", 1e9, "max_tokens"},
             {"temperature", -1, "temperature"}, {"top_p", 0, "top_p"},
             {"top_p", 1.5, "top_p"},             {"top_k", -3, "top_k"},
             {"partial_every", 0, "partial_every"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wh_pack_init(&p);
    bool mt = !strcmp(bad[i].key, "max_tokens");
    msgpack_pack_map(&p.pk, mt ? 2 : 3);
    mbd_pack_kv_str(&p.pk, "session", "u/1");
    if (!mt) mbd_pack_kv_i64(&p.pk, "max_tokens", 4);
    if (!strcmp(bad[i].key, "temperature") || !strcmp(bad[i].key, "top_p"))
      mbd_pack_kv_f64(&p.pk, bad[i].key, bad[i].v);
    else
      mbd_pack_kv_i64(&p.pk, bad[i].key, (int64_t)bad[i].v);
    assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_INVALID);
    assert_non_null(strstr(err.msg, bad[i].needle));
  }
  /* Missing session; wrong type. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_i64(&p.pk, "max_tokens", 4);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "session"));
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_i64(&p.pk, "session", 7);
  mbd_pack_kv_i64(&p.pk, "max_tokens", 4);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_INVALID);
}

static void test_decode_tensor_cmds(void **state) {
  (void)state;
  mbd_wreq q;
  mbd_error err = {0};
  wh_pack p;
  int64_t s2[2] = {2, 3}, s1[1] = {3};
  /* GEMM with bias. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "bf16");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 3);
  wh_ref(&p.pk, "a", "bf16", 2, s2, 0);
  wh_ref(&p.pk, "b", "bf16", 2, s2, 1);
  wh_ref(&p.pk, "bias", "f32", 1, s1, 2);
  assert_int_equal(decode(MBD_CMD_GEMM, &p, &q, &err), 0);
  assert_int_equal(q.dtype, MBD_DTYPE_BF16);
  assert_int_equal(q.ntensors, 3);
  /* GEMM with one tensor, and i64 dtype: rejected. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref(&p.pk, "a", "f32", 2, s2, 0);
  assert_int_equal(decode(MBD_CMD_GEMM, &p, &q, &err), MBD_E_INVALID);
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "i64");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 0);
  assert_int_equal(decode(MBD_CMD_GEMM, &p, &q, &err), MBD_E_INVALID);
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "dtype", "f64");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 0);
  assert_int_equal(decode(MBD_CMD_GEMM, &p, &q, &err), MBD_E_INVALID);
  /* FORWARD needs model and exactly one tensor. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_kv_bool(&p.pk, "last_only", true);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref(&p.pk, "input_ids", "i64", 2, s2, 0);
  assert_int_equal(decode(MBD_CMD_FORWARD, &p, &q, &err), 0);
  assert_true(q.last_only);
  assert_string_equal(q.model, "tiny");
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref(&p.pk, "input_ids", "i64", 2, s2, 0);
  assert_int_equal(decode(MBD_CMD_FORWARD, &p, &q, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "model"));
  /* FORWARD from shm with a shm output. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 3);
  mbd_pack_kv_str(&p.pk, "model", "tiny");
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  wh_ref_shm(&p.pk, "input_ids", "i64", 2, s2, "/in", 0, 48);
  mbd_pack_str(&p.pk, "outputs");
  msgpack_pack_array(&p.pk, 1);
  wh_ref_shm(&p.pk, "logits", "f32", 2, s2, "/out", 64, 24);
  assert_int_equal(decode(MBD_CMD_FORWARD, &p, &q, &err), 0);
  assert_int_equal(q.tensors[0].kind, MBD_TREF_SHM);
  assert_int_equal(q.noutputs, 1);
  assert_string_equal(q.outputs[0].shm_name, "/out");
  assert_int_equal(q.outputs[0].offset, 64);
  /* STEP needs a token; STATUS is not a worker command. */
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 1);
  mbd_pack_kv_str(&p.pk, "session", "u/1");
  assert_int_equal(decode(MBD_CMD_STEP, &p, &q, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "token"));
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 0);
  assert_int_equal(decode(MBD_CMD_STATUS, &p, &q, &err), MBD_E_UNSUPPORTED);
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2);
  mbd_pack_kv_str(&p.pk, "session", "u/1");
  mbd_pack_kv_i64(&p.pk, "deadline_ms", -5);
  assert_int_equal(decode(MBD_CMD_CLOSE, &p, &q, &err), MBD_E_INVALID);
}

static void test_input_resolution(void **state) {
  (void)state;
  mbd_error err = {0};
  mbd_msg *m = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_FORWARD, 7, &m, &err), 0);
  int64_t ids[6] = {1, 2, 3, 4, 5, 6};
  assert_int_equal(mbd_msg_add_payload_copy(m, ids, sizeof ids, &err), 0);
  mbd_tensor_ref r;
  memset(&r, 0, sizeof r);
  strcpy(r.name, "input_ids");
  int64_t s[2] = {2, 3};
  assert_int_equal(mbd_tensor_desc_make(&r.desc, MBD_DTYPE_I64, 2, s, &err), 0);
  r.kind = MBD_TREF_INLINE;
  const void *data = NULL;
  size_t nb = 0;
  assert_int_equal(mbd_wreq_input(&r, m, NULL, &data, &nb, &err), 0);
  assert_int_equal(nb, 48);
  assert_memory_equal(data, ids, 48);
  /* Frame index past the payloads; size mismatch. */
  r.frame = 1;
  assert_int_equal(mbd_wreq_input(&r, m, NULL, &data, &nb, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "payload frame 1"));
  r.frame = 0;
  r.desc.shape[1] = 4;
  assert_int_equal(mbd_wreq_input(&r, m, NULL, &data, &nb, &err), MBD_E_SHAPE);
  assert_null(data);
  /* CUDA IPC on a CPU worker. */
  r.kind = MBD_TREF_CUDA_IPC;
  assert_int_equal(mbd_wreq_input(&r, m, NULL, &data, &nb, &err), MBD_E_UNSUPPORTED);
  mbd_msg_destroy(&m);

  /* shm: aligned input ok; misaligned offset rejected; outputs. */
  char name[64];
  snprintf(name, sizeof name, "/mbd-wreq-%d", (int)getpid());
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 1024), 0);
  int64_t *p = mmap(NULL, 1024, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(p != MAP_FAILED);
  memcpy(p + 8, ids, sizeof ids);
  mbd_shm_cache *c = NULL;
  assert_int_equal(mbd_shm_cache_new(4, &c, &err), 0);
  r.desc.shape[1] = 3;
  r.kind = MBD_TREF_SHM;
  strcpy(r.shm_name, name);
  r.offset = 64;
  r.size = 48;
  /* The caller's uid is unknown: refused; stamped as the object's owner, served. */
  assert_int_equal(mbd_wreq_input(&r, NULL, c, &data, &nb, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "uid is unknown"));
  r.caller_known = true;
  r.caller_uid = (uint32_t)geteuid();
  assert_int_equal(mbd_wreq_input(&r, NULL, c, &data, &nb, &err), 0);
  assert_memory_equal(data, ids, 48);
  r.offset = 65;
  assert_int_equal(mbd_wreq_input(&r, NULL, c, &data, &nb, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "multiple"));
  r.offset = 1000;
  assert_int_equal(mbd_wreq_input(&r, NULL, c, &data, &nb, &err), MBD_E_INVALID);
  /* Output: must be shm, exact dtype/shape. */
  mbd_tensor_desc want;
  int64_t ls[2] = {2, 3};
  assert_int_equal(mbd_tensor_desc_make(&want, MBD_DTYPE_F32, 2, ls, &err), 0);
  mbd_tensor_ref o = r;
  o.desc = want;
  o.offset = 0;
  o.size = 24;
  void *dst = NULL;
  assert_int_equal(mbd_wreq_output(&o, &want, c, &dst, &err), 0);
  ((float *)dst)[0] = 1.5f;
  assert_true(((float *)(void *)p)[0] == 1.5f);
  o.desc.shape[1] = 4;
  assert_int_equal(mbd_wreq_output(&o, &want, c, &dst, &err), MBD_E_SHAPE);
  o.desc = want;
  o.kind = MBD_TREF_INLINE;
  assert_int_equal(mbd_wreq_output(&o, &want, c, &dst, &err), MBD_E_INVALID);
  mbd_shm_cache_destroy(&c);
  munmap(p, 1024);
  shm_unlink(name);
}

/* Packs {session, max_tokens?, outputs: [ref of dtype dt, shape [n]]} (n < 0: two outputs). */
static void pack_out_req(wh_pack *p, bool generate, const char *dt, int64_t n) {
  wh_pack_init(p);
  msgpack_pack_map(&p->pk, generate ? 3 : 2);
  mbd_pack_kv_str(&p->pk, "session", "u/1");
  if (generate) mbd_pack_kv_i64(&p->pk, "max_tokens", 4);
  mbd_pack_str(&p->pk, "outputs");
  msgpack_pack_array(&p->pk, n < 0 ? 2 : 1);
  int64_t sh[1] = {n < 0 ? 4 : n};
  for (int i = 0; i < (n < 0 ? 2 : 1); i++) wh_ref_shm(&p->pk, "o", dt, 1, sh, "/mbd-o", 0, (uint64_t)sh[0] * 8);
}

/* GENERATE and EXPORT take one I64 [n] output (n = max_tokens for GENERATE). */
static void test_decode_outputs(void **state) {
  (void)state;
  mbd_wreq q;
  mbd_error err = {0};
  wh_pack p;
  pack_out_req(&p, true, "i64", 4);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), 0);
  assert_int_equal(q.noutputs, 1);
  assert_int_equal(q.outputs[0].kind, MBD_TREF_SHM);
  pack_out_req(&p, true, "i64", 5);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "max_tokens"));
  pack_out_req(&p, true, "f32", 4);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_SHAPE);
  pack_out_req(&p, true, "i64", -1);
  assert_int_equal(decode(MBD_CMD_GENERATE, &p, &q, &err), MBD_E_SHAPE);
  pack_out_req(&p, false, "i64", 1000);
  assert_int_equal(decode(MBD_CMD_EXPORT, &p, &q, &err), 0);
  assert_int_equal(q.noutputs, 1);
  pack_out_req(&p, false, "f32", 1000);
  assert_int_equal(decode(MBD_CMD_EXPORT, &p, &q, &err), MBD_E_SHAPE);
}

/* Outputs written from host results (STEP logits, GENERATE tokens, EXPORT
 * state): into shm at an offset, bounded by the ref's size; CUDA IPC refs on
 * a backend without device memory are refused, never dereferenced. */
static void test_output_put(void **state) {
  (void)state;
  mbd_error err = {0};
  char name[64];
  snprintf(name, sizeof name, "/mbd-wput-%d", (int)getpid());
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  mbd_shm_cache *c = NULL;
  assert_int_equal(mbd_shm_cache_new(4, &c, &err), 0);
  mbd_backend_ops ops;
  memset(&ops, 0, sizeof ops);
  mbd_backend be = {.ops = &ops};
  mbd_tensor_ref o;
  memset(&o, 0, sizeof o);
  strcpy(o.name, "tokens");
  int64_t sh[1] = {8};
  assert_int_equal(mbd_tensor_desc_make(&o.desc, MBD_DTYPE_I64, 1, sh, &err), 0);
  o.kind = MBD_TREF_SHM;
  strcpy(o.shm_name, name);
  o.offset = 1024;
  o.size = 64;
  o.caller_known = true;
  o.caller_uid = (uint32_t)geteuid();
  int64_t toks[3] = {7, 8, 9};
  assert_int_equal(mbd_wreq_output_put(&be, c, &o, 8, toks, sizeof toks, &err), 0);
  fd = shm_open(name, O_RDONLY, 0);
  int64_t back[4] = {0};
  assert_int_equal(pread(fd, back, sizeof back, 1024), (ssize_t)sizeof back);
  close(fd);
  assert_int_equal(back[0], 0);
  assert_memory_equal(back + 1, toks, sizeof toks);
  /* past the ref's size (and an overflowing offset) */
  assert_int_equal(mbd_wreq_output_put(&be, c, &o, 48, toks, sizeof toks, &err), MBD_E_INVALID);
  assert_int_equal(mbd_wreq_output_put(&be, c, &o, UINT64_MAX - 4, toks, sizeof toks, &err),
                   MBD_E_INVALID);
  /* another owner */
  o.caller_uid = (uint32_t)geteuid() + 1;
  assert_int_equal(mbd_wreq_output_put(&be, c, &o, 0, toks, sizeof toks, &err), MBD_E_INVALID);
  /* CUDA IPC without device memory */
  o.kind = MBD_TREF_CUDA_IPC;
  void *dst = NULL;
  bool on_device = true;
  assert_int_equal(mbd_wreq_output_put(&be, c, &o, 0, toks, sizeof toks, &err), MBD_E_UNSUPPORTED);
  assert_int_equal(mbd_wreq_output_get(&be, &o, 0, back, 8, &err), MBD_E_UNSUPPORTED);
  assert_int_equal(mbd_wreq_output_at(&be, c, &o, &o.desc, &dst, &on_device, &err),
                   MBD_E_UNSUPPORTED);
  assert_null(dst);
  assert_false(on_device);
  const void *in = NULL;
  size_t nb = 0;
  assert_int_equal(mbd_wreq_input_dev(&be, &o, &in, &nb, &err), MBD_E_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "GPU worker"));
  mbd_shm_cache_destroy(&c);
  shm_unlink(name);
}

static void test_state_blob(void **state) {
  (void)state;
  mbd_state_blob_info in;
  memset(&in, 0, sizeof in);
  strcpy(in.model, "tiny");
  memset(in.model_digest, 'a', 64);
  memset(in.route_id, 'b', 64);
  in.state_bytes = 13; /* odd on purpose: padding */
  in.vocab = 5;
  in.has_logits = true;
  size_t n = mbd_state_blob_size(in.state_bytes, in.vocab, true);
  assert_int_equal(n % 8, 0);
  assert_true(n >= MBD_STATE_BLOB_HEADER + 13 + 20);
  uint8_t *blob = malloc(n);
  void *sd, *ld;
  mbd_state_blob_write_header(blob, n, &in, &sd, &ld);
  memset(sd, 0x42, 13);
  float lg[5] = {1, 2, 3, 4, 5};
  memcpy(ld, lg, sizeof lg);
  mbd_state_blob_info out;
  mbd_error err = {0};
  assert_int_equal(mbd_state_blob_parse(blob, n, &out, &err), 0);
  assert_string_equal(out.model, "tiny");
  assert_string_equal(out.route_id, in.route_id);
  assert_int_equal(out.state_bytes, 13);
  assert_true(out.has_logits);
  assert_memory_equal(out.logits, lg, sizeof lg);
  /* Truncated, extended, bad magic, bad version, unterminated name, huge sizes. */
  assert_int_equal(mbd_state_blob_parse(blob, n - 8, &out, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_state_blob_parse(blob, 100, &out, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_state_blob_parse(NULL, 0, &out, &err), MBD_E_FORMAT);
  uint8_t *bad = malloc(n);
  memcpy(bad, blob, n);
  bad[0] = 'X';
  assert_int_equal(mbd_state_blob_parse(bad, n, &out, &err), MBD_E_FORMAT);
  memcpy(bad, blob, n);
  bad[8] = 2;
  assert_int_equal(mbd_state_blob_parse(bad, n, &out, &err), MBD_E_FORMAT);
  memcpy(bad, blob, n);
  memset(bad + 32, 'x', 64);
  assert_int_equal(mbd_state_blob_parse(bad, n, &out, &err), MBD_E_FORMAT);
  memcpy(bad, blob, n);
  memset(bad + 16, 0xff, 8); /* state_bytes = 2^64-1: overflow must not pass */
  assert_int_equal(mbd_state_blob_parse(bad, n, &out, &err), MBD_E_FORMAT);
  memcpy(bad, blob, n);
  memset(bad + 24, 0xff, 8); /* vocab huge */
  assert_int_equal(mbd_state_blob_parse(bad, n, &out, &err), MBD_E_FORMAT);
  assert_int_equal(mbd_state_blob_size(UINT64_MAX, 1, true), 0);
  free(bad);
  free(blob);
}

static void test_opts(void **state) {
  (void)state;
  mbd_worker_opts o;
  mbd_error err = {0};
  char *ok[] = {"w", "--connect", "ipc:///tmp/x", "--name", "w1", "--model", "tiny=/m/t",
                "--dtype", "bf16", "--capacity", "8", "--max-batch", "4", "--host-id", "h"};
  assert_int_equal(mbd_worker_opts_parse(15, ok, &o, &err), 0);
  assert_string_equal(o.models[0].name, "tiny");
  assert_string_equal(o.models[0].dir, "/m/t");
  assert_int_equal(o.policy, MBD_POLICY_BF16);
  assert_int_equal(o.capacity, 8);
  assert_string_equal(o.host_id, "h");
  char *noconn[] = {"w", "--name", "w1"};
  assert_int_equal(mbd_worker_opts_parse(3, noconn, &o, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "--connect"));
  char *badmode[] = {"w", "--connect", "x", "--name", "w", "--gemm-mode", "fast"};
  assert_int_equal(mbd_worker_opts_parse(7, badmode, &o, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "cublas-pedantic")); /* lists the valid values */
  char *badmodel[] = {"w", "--connect", "x", "--name", "w", "--model", "nodir"};
  assert_int_equal(mbd_worker_opts_parse(7, badmodel, &o, &err), MBD_E_INVALID);
  char *dup[] = {"w", "--connect", "x", "--name", "w", "--model", "a=/x", "--model", "a=/y"};
  assert_int_equal(mbd_worker_opts_parse(9, dup, &o, &err), MBD_E_INVALID);
  char *badnum[] = {"w", "--connect", "x", "--name", "w", "--capacity", "0"};
  assert_int_equal(mbd_worker_opts_parse(7, badnum, &o, &err), MBD_E_INVALID);
  char *badname[] = {"w", "--connect", "x", "--name", "a/b"};
  assert_int_equal(mbd_worker_opts_parse(5, badname, &o, &err), MBD_E_INVALID);
  char *missing[] = {"w", "--connect"};
  assert_int_equal(mbd_worker_opts_parse(2, missing, &o, &err), MBD_E_INVALID);
  char *hostdef[] = {"w", "--connect", "x", "--name", "w"};
  assert_int_equal(mbd_worker_opts_parse(5, hostdef, &o, &err), 0);
  assert_true(strlen(o.host_id) > 0);
  assert_int_equal(o.state, MBD_STATE_F32); /* the default state dtype */
  char *sbf[] = {"w", "--connect", "x", "--name", "w", "--state-dtype", "bf16"};
  assert_int_equal(mbd_worker_opts_parse(7, sbf, &o, &err), 0);
  assert_int_equal(o.state, MBD_STATE_BF16);
  char *sbad[] = {"w", "--connect", "x", "--name", "w", "--state-dtype", "f16"};
  assert_int_equal(mbd_worker_opts_parse(7, sbad, &o, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "--state-dtype: invalid state dtype 'f16' (valid: f32, bf16)"));
  assert_non_null(strstr(mbd_worker_usage(), "--state-dtype f32|bf16"));
}

/* Copies src to dst byte for byte; flips byte `flip` of the copy when >= 0. */
static void copy_file(const char *src, const char *dst, long flip) {
  FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[65536];
  size_t n;
  long at = 0;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
    if (flip >= at && flip < at + (long)n) buf[flip - at] ^= 0x01;
    at += (long)n;
    assert_int_equal(fwrite(buf, 1, n, out), n);
  }
  fclose(in);
  assert_int_equal(fclose(out), 0);
}

/* The model digest covers config.json and every *.safetensors by content:
 * a copy of the fixture has the same digest, one flipped byte in either file
 * gives another. */
static void test_model_digest(void **state) {
  (void)state;
  const char *fx = getenv("MBD_FIXTURES_DIR");
  mbd_error err = {0};
  char d1[65], d2[65], dir[1024];
  assert_int_equal(mbd_worker_model_digest("/nonexistent-dir", d1, &err), MBD_E_NOT_FOUND);
  assert_int_equal(mbd_worker_model_digest("/", d1, &err), MBD_E_NOT_FOUND); /* no weights */
  if (!fx) {
    print_message("MBD_FIXTURES_DIR is not set (ctest sets it): fixture digests skipped\n");
    skip();
  }
  snprintf(dir, sizeof dir, "%s/mamba1/tiny-d64", fx);
  assert_int_equal(mbd_worker_model_digest(dir, d1, &err), 0);
  assert_int_equal(strlen(d1), 64);
  assert_int_equal(mbd_worker_model_digest(dir, d2, &err), 0);
  assert_string_equal(d1, d2);

  char tmp[] = "/tmp/mbd-digest-XXXXXX";
  assert_non_null(mkdtemp(tmp));
  const char *files[] = {"config.json", "model.safetensors", "expected.safetensors"};
  char src[1200], dst[1200];
  for (int changed = -1; changed < 2; changed++) {
    for (int i = 0; i < 3; i++) {
      snprintf(src, sizeof src, "%s/%s", dir, files[i]);
      snprintf(dst, sizeof dst, "%s/%s", tmp, files[i]);
      copy_file(src, dst, i == changed ? 100 : -1); /* byte 100: inside the JSON / the header */
    }
    assert_int_equal(mbd_worker_model_digest(tmp, d2, &err), 0);
    if (changed < 0) assert_string_equal(d1, d2);
    else if (!strcmp(d1, d2)) fail_msg("a flipped byte in %s left the digest %s", files[changed], d2);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(dst, sizeof dst, "%s/%s", tmp, files[i]);
    unlink(dst);
  }
  rmdir(tmp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_generate), cmocka_unit_test(test_decode_tensor_cmds),
      cmocka_unit_test(test_input_resolution),
      cmocka_unit_test(test_decode_outputs),
      cmocka_unit_test(test_output_put), cmocka_unit_test(test_state_blob),
      cmocka_unit_test(test_opts),            cmocka_unit_test(test_model_digest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
