/* Real broker + one real worker: FORWARD logits equal the in-process model bit
 * for bit (inline and shm, full and last-only); GEMM equals the in-process CPU
 * GEMM; sessions (prefill, step, generate) equal the in-process model and the
 * fixture's greedy tokens; every FINAL carries route_id and worker; malformed
 * requests and bad shm refs each get an ERROR and the worker keeps serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/cpu/gemm.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

static wh g_h;
static wh_fixture g_f;

static int setup(void **state) {
  (void)state;
  int rc = wh_init(&g_h);
  if (rc) return rc == 77 ? 0 : -1;
  if (wh_fixture_load(&g_h, &g_f)) return -1;
  wh_start_broker(&g_h);
  wh_start_worker(&g_h, "wA", NULL);
  return wh_wait_workers(&g_h, 1, 30000);
}

static int teardown(void **state) {
  (void)state;
  wh_fini(&g_h);
  wh_fixture_free(&g_f);
  return 0;
}

/* Checks a FORWARD is still served correctly (the worker survived). */
static void assert_alive(void) {
  int64_t ids[3] = {1, 2, 3};
  mbd_msg *m = wh_wait(&g_h, wh_send_forward(&g_h, ids, 1, 3, true), 30000);
  assert_non_null(m);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
}

static void test_forward_bitwise(void **state) {
  (void)state;
  const int64_t B = g_f.B, T = g_f.T, V = g_f.V;
  mbd_msg *m = wh_wait(&g_h, wh_send_forward(&g_h, g_f.ids, B, T, false), 60000);
  assert_non_null(m);
  assert_int_equal(wh_code(m), 0);
  char rid[80] = "", wname[80] = "";
  assert_int_equal(wh_str(m, "route_id", rid, sizeof rid), 0);
  assert_int_equal(strlen(rid), 64);
  assert_int_equal(wh_str(m, "worker", wname, sizeof wname), 0);
  assert_string_equal(wname, "wA");
  size_t len = 0;
  const float *got = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)(B * T * V) * 4);
  float *ref = malloc((size_t)(T * V) * 4);
  for (int64_t b = 0; b < B; b++) { /* each row alone in-process */
    mbd_mamba1_state *s = NULL;
    assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
    wh_ref_prefill(&g_f, s, g_f.ids + b * T, T, ref);
    assert_memory_equal(got + b * T * V, ref, (size_t)(T * V) * 4);
    mbd_mamba1_state_destroy(&s);
  }
  mbd_msg_destroy(&m);
  /* last_only: [B,V] = the last rows. */
  m = wh_wait(&g_h, wh_send_forward(&g_h, g_f.ids, B, T, true), 60000);
  assert_int_equal(wh_code(m), 0);
  const float *last = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)(B * V) * 4);
  mbd_mamba1_state *s = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
  wh_ref_prefill(&g_f, s, g_f.ids + 2 * T, T, ref);
  assert_memory_equal(last + 2 * V, ref + (T - 1) * V, (size_t)V * 4);
  mbd_mamba1_state_destroy(&s);
  mbd_msg_destroy(&m);
  free(ref);
}

/* FORWARD with input and output in shared memory: logits written in place. */
static void test_forward_shm(void **state) {
  (void)state;
  const int64_t T = g_f.T, V = g_f.V;
  char name[64];
  snprintf(name, sizeof name, "/mbd-wserve-%d", (int)getpid());
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  assert_true(fd >= 0);
  size_t in_bytes = (size_t)T * 8, out_off = 4096, out_bytes = (size_t)(T * V) * 4;
  size_t total = out_off + out_bytes;
  assert_int_equal(ftruncate(fd, (off_t)total), 0);
  uint8_t *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  assert_true(p != MAP_FAILED);
  memcpy(p, g_f.ids, in_bytes);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  int64_t s2[2] = {1, T}, s3[3] = {1, T, V};
  mbd_tensor_ref in, out;
  memset(&in, 0, sizeof in);
  strcpy(in.name, "input_ids");
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, s2, NULL);
  in.kind = MBD_TREF_SHM;
  strcpy(in.shm_name, name);
  in.offset = 0;
  in.size = in_bytes;
  out = in;
  strcpy(out.name, "logits");
  mbd_tensor_desc_make(&out.desc, MBD_DTYPE_F32, 3, s3, NULL);
  out.offset = out_off;
  out.size = out_bytes;
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  mbd_pack_tensor_ref(&k.pk, &in);
  mbd_pack_str(&k.pk, "outputs");
  msgpack_pack_array(&k.pk, 1);
  mbd_pack_tensor_ref(&k.pk, &out);
  mbd_msg *m = wh_call(&g_h, MBD_CMD_FORWARD, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  assert_int_equal(mbd_msg_npayloads(m), 0); /* nothing inline */
  mbd_msg_destroy(&m);
  float *ref = malloc(out_bytes);
  mbd_mamba1_state *s = NULL;
  assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
  wh_ref_prefill(&g_f, s, g_f.ids, T, ref);
  assert_memory_equal(p + out_off, ref, out_bytes);
  mbd_mamba1_state_destroy(&s);
  free(ref);

  /* Bad shm refs: each an ERROR INVALID/NOT_FOUND, worker keeps serving. */
  struct {
    const char *obj;
    uint64_t off, size;
    int code;
  } bad[] = {
      {name, total, 8 * (uint64_t)T, MBD_E_INVALID},          /* offset past the end */
      {name, 8, total, MBD_E_INVALID},                        /* runs past the end */
      {name, 3, in_bytes, MBD_E_INVALID},                     /* misaligned */
      {"/mbd-no-such-object-xyz", 0, in_bytes, MBD_E_NOT_FOUND},
      {"bad-name", 0, in_bytes, MBD_E_INVALID},
      {"/a/b", 0, in_bytes, MBD_E_INVALID},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mbd_tensor_ref r = in;
    snprintf(r.shm_name, sizeof r.shm_name, "%s", bad[i].obj);
    r.offset = bad[i].off;
    r.size = bad[i].size;
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 2);
    mbd_pack_kv_str(&k.pk, "model", "tiny");
    mbd_pack_str(&k.pk, "tensors");
    msgpack_pack_array(&k.pk, 1);
    mbd_pack_tensor_ref(&k.pk, &r);
    m = wh_call(&g_h, MBD_CMD_FORWARD, &k.sb, 0, NULL, NULL);
    assert_non_null(m);
    int code = wh_code(m);
    /* The broker's codec may catch overflow-shaped refs first: INVALID either way. */
    assert_int_equal(code, bad[i].code);
    mbd_msg_destroy(&m);
  }
  /* An output of the wrong shape. */
  out.desc.shape[2] = V + 1;
  out.size = total - out_off;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  mbd_pack_tensor_ref(&k.pk, &in);
  mbd_pack_str(&k.pk, "outputs");
  msgpack_pack_array(&k.pk, 1);
  mbd_pack_tensor_ref(&k.pk, &out);
  m = wh_call(&g_h, MBD_CMD_FORWARD, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), MBD_E_SHAPE);
  mbd_msg_destroy(&m);
  munmap(p, total);
  shm_unlink(name);
  assert_alive();
}

static void test_gemm(void **state) {
  (void)state;
  enum { M = 5, N = 3, K = 37 };
  float a[M * K], b[N * K], bias[N], ref[M * N];
  for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7919) % 101) / 17.0f - 2.5f;
  for (int i = 0; i < N * K; i++) b[i] = (float)((i * 104729) % 89) / 13.0f - 3.0f;
  for (int i = 0; i < N; i++) bias[i] = 0.125f * (float)i;
  mbd_cpu_ctx *ctx = NULL;
  assert_int_equal(mbd_cpu_ctx_new(1, MBD_CPU_ISA_AUTO, &ctx, NULL), 0);
  assert_int_equal(mbd_cpu_gemm(ctx, MBD_GEMM_NT, M, N, K, MBD_DTYPE_F32, a, K, MBD_DTYPE_F32, b,
                                K, bias, ref, N, NULL),
                   0);
  mbd_cpu_ctx_destroy(&ctx);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 2);
  mbd_pack_kv_str(&k.pk, "dtype", "f32");
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 3);
  int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[1] = {N};
  wh_ref(&k.pk, "a", "f32", 2, sa, 0);
  wh_ref(&k.pk, "b", "f32", 2, sb, 1);
  wh_ref(&k.pk, "bias", "f32", 1, sc, 2);
  const void *pl[3] = {a, b, bias};
  size_t lens[3] = {sizeof a, sizeof b, sizeof bias};
  mbd_msg *m = wh_call(&g_h, MBD_CMD_GEMM, &k.sb, 3, pl, lens);
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const void *c = wh_tensor(m, &len);
  assert_int_equal(len, sizeof ref);
  assert_memory_equal(c, ref, sizeof ref);
  mbd_msg_destroy(&m);
  /* K mismatch -> SHAPE. */
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 1);
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 2);
  int64_t sb2[2] = {N * K / 4, 4};
  wh_ref(&k.pk, "a", "f32", 2, sa, 0);
  wh_ref(&k.pk, "b", "f32", 2, sb2, 1);
  size_t lens2[2] = {sizeof a, (size_t)(N * K / 4) * 16};
  m = wh_call(&g_h, MBD_CMD_GEMM, &k.sb, 2, pl, lens2);
  assert_int_equal(wh_code(m), MBD_E_SHAPE);
  mbd_msg_destroy(&m);
}

static void test_session_flow(void **state) {
  (void)state;
  const int64_t T = g_f.T, V = g_f.V, G = g_f.G;
  for (int64_t b = 0; b < g_f.B; b++) {
    char sid[64] = "";
    mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    assert_non_null(strchr(sid, '/'));
    /* Prefill the prompt; logits equal the in-process model. */
    m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, g_f.ids + b * T, T, false), 30000);
    assert_int_equal(wh_code(m), 0);
    size_t len = 0;
    const float *got = wh_tensor(m, &len);
    assert_int_equal(len, (size_t)(T * V) * 4);
    float *ref = malloc((size_t)(T * V) * 4);
    mbd_mamba1_state *s = NULL;
    assert_int_equal(mbd_mamba1_state_new(g_f.model, &s, NULL), 0);
    wh_ref_prefill(&g_f, s, g_f.ids + b * T, T, ref);
    assert_memory_equal(got, ref, (size_t)(T * V) * 4);
    mbd_msg_destroy(&m);
    /* One STEP with the first greedy token; logits equal the reference step. */
    int64_t tok = g_f.greedy[b * (T + G) + T];
    m = wh_wait(&g_h, wh_send_step(&g_h, sid, tok), 30000);
    assert_int_equal(wh_code(m), 0);
    got = wh_tensor(m, &len);
    assert_int_equal(len, (size_t)V * 4);
    int64_t one = tok;
    wh_ref_prefill(&g_f, s, &one, 1, ref);
    assert_memory_equal(got, ref, (size_t)V * 4);
    mbd_msg_destroy(&m);
    mbd_mamba1_state_destroy(&s);
    free(ref);
    /* GENERATE the remaining G-1 greedy tokens; PARTIALs stream them. */
    uint64_t tag = wh_send_generate(&g_h, sid, G - 1, 0.0, 0);
    int64_t streamed[64];
    int nstream = 0;
    mbd_msg *fin = NULL;
    double end = wh_now() + 60;
    while (!fin && wh_now() < end) {
      mbd_msg *r = wh_recv(&g_h, 100);
      if (!r) continue;
      assert_int_equal(mbd_msg_tag(r), tag);
      if (mbd_msg_cmd(r) == MBD_CMD_PARTIAL) {
        int64_t t[64];
        int n = wh_tokens(r, t, 64);
        assert_true(n > 0);
        for (int i = 0; i < n && nstream < 64; i++) streamed[nstream++] = t[i];
        mbd_msg_destroy(&r);
      } else {
        fin = r;
      }
    }
    assert_non_null(fin);
    assert_int_equal(wh_code(fin), 0);
    int64_t toks[64];
    int n = wh_tokens(fin, toks, 64);
    assert_int_equal(n, G - 1);
    assert_memory_equal(toks, g_f.greedy + b * (T + G) + T + 1, (size_t)(G - 1) * 8);
    assert_true(nstream <= n);
    assert_memory_equal(streamed, toks, (size_t)nstream * 8);
    char reason[16] = "";
    wh_str(fin, "reason", reason, sizeof reason);
    assert_string_equal(reason, "length");
    mbd_msg_destroy(&fin);
    /* CLOSE; then the id is unknown. */
    wh_pack k;
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 1);
    mbd_pack_kv_str(&k.pk, "session", sid);
    m = wh_call(&g_h, MBD_CMD_CLOSE, &k.sb, 0, NULL, NULL);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    m = wh_wait(&g_h, wh_send_step(&g_h, sid, 1), 30000);
    assert_int_equal(wh_code(m), MBD_E_NOT_FOUND);
    mbd_msg_destroy(&m);
  }
}

/* GENERATE stops at (and includes) a stop token: reason "stop". */
static void test_generate_stop(void **state) {
  (void)state;
  const int64_t T = g_f.T, G = g_f.G;
  const int64_t *gr = g_f.greedy + T; /* prompt 0's greedy continuation */
  int64_t stop_tok = gr[5];
  int64_t first = 0;
  while (gr[first] != stop_tok) first++; /* it may occur earlier */
  char sid[64] = "";
  mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, g_f.ids, T, true), 30000);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 3);
  mbd_pack_kv_str(&k.pk, "session", sid);
  mbd_pack_kv_i64(&k.pk, "max_tokens", G);
  mbd_pack_str(&k.pk, "stop");
  msgpack_pack_array(&k.pk, 2);
  msgpack_pack_int64(&k.pk, g_f.V + 5); /* never produced */
  msgpack_pack_int64(&k.pk, stop_tok);
  m = wh_call(&g_h, MBD_CMD_GENERATE, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), 0);
  int64_t toks[64];
  assert_int_equal(wh_tokens(m, toks, 64), first + 1);
  assert_memory_equal(toks, gr, (size_t)(first + 1) * 8);
  char reason[16] = "";
  wh_str(m, "reason", reason, sizeof reason);
  assert_string_equal(reason, "stop");
  mbd_msg_destroy(&m);
  /* The session consumed every returned token: one more greedy token is the
   * fixture's next one. */
  if (first + 1 < G) {
    m = wh_wait(&g_h, wh_send_generate(&g_h, sid, 1, 0, 0), 30000);
    assert_int_equal(wh_code(m), 0);
    assert_int_equal(wh_tokens(m, toks, 64), 1);
    assert_int_equal(toks[0], gr[first + 1]);
    mbd_msg_destroy(&m);
  }
}

static void test_malformed(void **state) {
  (void)state;
  char sid[64] = "";
  mbd_msg *m = wh_open(&g_h, sid, sizeof sid);
  assert_int_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  /* GENERATE before any token: STATE. */
  m = wh_wait(&g_h, wh_send_generate(&g_h, sid, 4, 0, 0), 30000);
  assert_int_equal(wh_code(m), MBD_E_STATE);
  mbd_msg_destroy(&m);
  /* Token outside the vocabulary. */
  m = wh_wait(&g_h, wh_send_step(&g_h, sid, g_f.V), 30000);
  assert_int_equal(wh_code(m), MBD_E_INVALID);
  mbd_msg_destroy(&m);
  m = wh_wait(&g_h, wh_send_step(&g_h, sid, -1), 30000);
  assert_int_equal(wh_code(m), MBD_E_INVALID);
  mbd_msg_destroy(&m);
  /* Prefill with a token out of range: INVALID. */
  int64_t badids[2] = {1, 1 << 20};
  m = wh_wait(&g_h, wh_send_prefill(&g_h, sid, badids, 2, true), 30000);
  assert_int_equal(wh_code(m), MBD_E_INVALID);
  mbd_msg_destroy(&m);
  /* Unknown session of this worker (same uid prefix, never opened). */
  char fake[80];
  snprintf(fake, sizeof fake, "%.*s/999999", (int)(strchr(sid, '/') - sid), sid);
  m = wh_wait(&g_h, wh_send_step(&g_h, fake, 1), 30000);
  assert_int_not_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  /* Unknown model. */
  wh_pack k;
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 1);
  mbd_pack_kv_str(&k.pk, "model", "nope");
  m = wh_call(&g_h, MBD_CMD_OPEN, &k.sb, 0, NULL, NULL);
  assert_int_not_equal(wh_code(m), 0);
  mbd_msg_destroy(&m);
  /* FORWARD: wrong dtype, wrong rank, missing frame, frame size mismatch. */
  int64_t ids[4] = {1, 2, 3, 4};
  const void *pl[1] = {ids};
  size_t lens[1] = {sizeof ids};
  struct {
    const char *dt;
    int ndim;
    int64_t shape[3];
    int frame;
    int npl;
    int code;
  } bad[] = {
      {"f32", 2, {1, 8}, 0, 1, MBD_E_SHAPE},  {"i64", 1, {4}, 0, 1, MBD_E_SHAPE},
      {"i64", 2, {1, 4}, 3, 1, MBD_E_INVALID}, {"i64", 2, {1, 3}, 0, 1, MBD_E_SHAPE},
      {"i64", 2, {0, 4}, 0, 1, MBD_E_SHAPE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 2);
    mbd_pack_kv_str(&k.pk, "model", "tiny");
    mbd_pack_str(&k.pk, "tensors");
    msgpack_pack_array(&k.pk, 1);
    wh_ref(&k.pk, "input_ids", bad[i].dt, bad[i].ndim, bad[i].shape, bad[i].frame);
    m = wh_call(&g_h, MBD_CMD_FORWARD, &k.sb, bad[i].npl, pl, lens);
    assert_int_equal(wh_code(m), bad[i].code);
    mbd_msg_destroy(&m);
  }
  /* Missing tensors; wrong field types. */
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 2);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_kv_str(&k.pk, "last_only", "yes");
  m = wh_call(&g_h, MBD_CMD_FORWARD, &k.sb, 0, NULL, NULL);
  assert_int_equal(wh_code(m), MBD_E_INVALID);
  mbd_msg_destroy(&m);
  /* IMPORT of garbage: FORMAT. */
  wh_pack_init(&k);
  msgpack_pack_map(&k.pk, 2);
  mbd_pack_kv_str(&k.pk, "model", "tiny");
  mbd_pack_str(&k.pk, "tensors");
  msgpack_pack_array(&k.pk, 1);
  int64_t s1[1] = {4};
  wh_ref(&k.pk, "state", "i64", 1, s1, 0);
  m = wh_call(&g_h, MBD_CMD_IMPORT, &k.sb, 1, pl, lens);
  assert_int_equal(wh_code(m), MBD_E_FORMAT);
  mbd_msg_destroy(&m);
  assert_alive();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_bitwise), cmocka_unit_test(test_forward_shm),
      cmocka_unit_test(test_gemm),            cmocka_unit_test(test_session_flow),
      cmocka_unit_test(test_generate_stop), cmocka_unit_test(test_malformed),
  };
  if (!getenv("MBD_BIN_DIR") || !getenv("MBD_FIXTURES_DIR")) return 77;
  return cmocka_run_group_tests(tests, setup, teardown);
}
