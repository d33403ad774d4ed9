/* Results written into the client's shared memory instead of the reply
 * (mbd_call_opts.output), through libmambad, the real broker and a CPU
 * worker:
 *  - a session fed inline and one whose PREFILL, STEP, GENERATE and EXPORT
 *    results go to shm outputs see equal bits (memcmp), a session imported
 *    from the state in shm continues with the same bits, and GEMM into shm
 *    equals GEMM inline;
 *  - outputs of the wrong shape are refused before any compute;
 *  - an output object that another thread keeps shrinking and regrowing
 *    while the worker writes results into it gives FINALs or ERRORs, never a
 *    dead worker (the SIGBUS guard of worker/shm.h), and the worker serves
 *    on. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/mambad.h"
#include "support/worker_harness.h"

static wh g_h;
static pid_t g_worker;
static mbd_client *g_c;
static const int64_t V = 512;

static int setup(void **st) {
  (void)st;
  int rc = wh_init(&g_h);
  if (rc == 77) {
    printf("SKIP: binaries or fixture missing\n");
    exit(77);
  }
  if (rc) return -1;
  wh_start_broker(&g_h);
  g_worker = wh_start_worker(&g_h, "w0", "--threads", "1", NULL);
  if (wh_wait_workers(&g_h, 1, 30000)) return -1;
  mbd_error e = {0};
  return mbd_client_new(g_h.clients, NULL, &g_c, &e) ? -1 : 0;
}

static int teardown(void **st) {
  (void)st;
  mbd_client_destroy(&g_c);
  wh_fini(&g_h);
  return 0;
}

static void desc1(mbd_tensor_desc *d, mbd_dtype dt, int64_t n) {
  int64_t sh[1] = {n};
  assert_int_equal(mbd_tensor_desc_make(d, dt, 1, sh, NULL), 0);
}

static void desc2(mbd_tensor_desc *d, mbd_dtype dt, int64_t a, int64_t b) {
  int64_t sh[2] = {a, b};
  assert_int_equal(mbd_tensor_desc_make(d, dt, 2, sh, NULL), 0);
}

static void test_session_shm_outputs(void **st) {
  (void)st;
  const int64_t P = 7, G = 6;
  int64_t ids[7] = {5, 17, 3, 499, 0, 64, 250};
  mbd_error e = {0};
  mbd_session *sa = NULL, *sb = NULL, *sc = NULL;
  assert_int_equal(mbd_session_open(g_c, NULL, "tiny", &sa, &e), 0);
  assert_int_equal(mbd_session_open(g_c, NULL, "tiny", &sb, &e), 0);
  mbd_shm *shm = NULL;
  const size_t OFF_P = 4096, OFF_S = OFF_P + (size_t)(P * V) * 4, OFF_G = OFF_S + (size_t)V * 4,
               OFF_X = OFF_G + 4096, SIZE = OFF_X + ((size_t)1 << 20);
  assert_int_equal(mbd_shm_create(NULL, SIZE, &shm, &e), 0);
  memset(mbd_shm_data(shm), 0xab, SIZE);
  char *base = mbd_shm_data(shm);
  mbd_tensor_desc idd, pld, sld, gd, xd;
  desc1(&idd, MBD_DTYPE_I64, P);
  desc2(&pld, MBD_DTYPE_F32, P, V);
  desc1(&sld, MBD_DTYPE_F32, V);
  desc1(&gd, MBD_DTYPE_I64, G);
  desc1(&xd, MBD_DTYPE_I64, (int64_t)((SIZE - OFF_X) / 8));
  mbd_tensor_in in = {.desc = idd, .data = ids}, po, so, go, xo;
  assert_int_equal(mbd_shm_tensor(shm, OFF_P, &pld, &po, &e), 0);
  assert_int_equal(mbd_shm_tensor(shm, OFF_S, &sld, &so, &e), 0);
  assert_int_equal(mbd_shm_tensor(shm, OFF_G, &gd, &go, &e), 0);
  assert_int_equal(mbd_shm_tensor(shm, OFF_X, &xd, &xo, &e), 0);
  /* PREFILL */
  mbd_tensor_out la, lb;
  assert_int_equal(mbd_session_prefill(sa, NULL, &in, false, &la, &e), 0);
  mbd_call_opts o = {.output = &po};
  int rc = mbd_session_prefill(sb, &o, &in, false, &lb, &e);
  if (rc) printf("prefill: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_ptr_equal(lb.data, base + OFF_P);
  assert_int_equal(lb.nbytes, la.nbytes);
  assert_memory_equal(lb.data, la.data, la.nbytes);
  mbd_tensor_out_release(&la);
  mbd_tensor_out_release(&lb);
  /* STEP */
  o.output = &so;
  for (int64_t tok = 1; tok < 4; tok++) {
    assert_int_equal(mbd_session_step(sa, NULL, tok * 37, &la, &e), 0);
    assert_int_equal(mbd_session_step(sb, &o, tok * 37, &lb, &e), 0);
    assert_ptr_equal(lb.data, base + OFF_S);
    assert_memory_equal(lb.data, la.data, (size_t)V * 4);
    mbd_tensor_out_release(&la);
    mbd_tensor_out_release(&lb);
  }
  /* GENERATE: the tokens land in shm as well as in *tokens */
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = G;
  int64_t *ta = NULL, *tb = NULL;
  size_t na = 0, nb = 0;
  assert_int_equal(mbd_session_generate(sa, NULL, &gp, NULL, NULL, &ta, &na, NULL, &e), 0);
  o.output = &go;
  rc = mbd_session_generate(sb, &o, &gp, NULL, NULL, &tb, &nb, NULL, &e);
  if (rc) printf("generate: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(na, (size_t)G);
  assert_int_equal(nb, na);
  assert_memory_equal(ta, tb, na * 8);
  assert_memory_equal(base + OFF_G, ta, na * 8);
  free(ta);
  free(tb);
  /* a token output of the wrong length is refused up front */
  gp.max_tokens = G + 1;
  assert_int_equal(mbd_session_generate(sb, &o, &gp, NULL, NULL, &tb, &nb, NULL, &e), MBD_E_SHAPE);
  /* EXPORT into shm: the same bytes as the inline export */
  mbd_session_state *xa = NULL, *xb = NULL;
  assert_int_equal(mbd_session_export(sa, NULL, &xa, &e), 0);
  o.output = &xo;
  rc = mbd_session_export(sb, &o, &xb, &e);
  if (rc) printf("export: %s\n", e.msg);
  assert_int_equal(rc, 0);
  assert_ptr_equal(xb->tensors[0].data, base + OFF_X);
  assert_int_equal(xb->tensors[0].nbytes, xa->tensors[0].nbytes);
  assert_memory_equal(xb->tensors[0].data, xa->tensors[0].data, xa->tensors[0].nbytes);
  /* IMPORT of the state in shm continues like the original */
  assert_int_equal(mbd_session_import(g_c, NULL, xb, &sc, &e), 0);
  assert_int_equal(mbd_session_step(sa, NULL, 9, &la, &e), 0);
  assert_int_equal(mbd_session_step(sc, NULL, 9, &lb, &e), 0);
  assert_memory_equal(la.data, lb.data, la.nbytes);
  mbd_tensor_out_release(&la);
  mbd_tensor_out_release(&lb);
  /* a STEP output of the wrong shape is refused, the session goes on */
  o.output = &po;
  assert_int_equal(mbd_session_step(sb, &o, 1, &lb, &e), MBD_E_SHAPE);
  assert_int_equal(mbd_session_step(sb, NULL, 1, &lb, &e), 0);
  mbd_tensor_out_release(&lb);
  mbd_session_state_free(&xa);
  mbd_session_state_free(&xb);
  assert_int_equal(mbd_session_close(&sa, &e), 0);
  assert_int_equal(mbd_session_close(&sb, &e), 0);
  assert_int_equal(mbd_session_close(&sc, &e), 0);
  mbd_shm_destroy(&shm);
}

/* A device tensor from a build without CUDA, or host memory in one with
 * CUDA, is refused by the library before anything is sent. */
static void test_device_tensor_refused_here(void **st) {
  (void)st;
  int64_t x[4] = {0};
  mbd_tensor_desc d;
  desc1(&d, MBD_DTYPE_I64, 4);
  mbd_tensor_in t;
  mbd_error e = {0};
  int rc = mbd_tensor_device(x, &d, NULL, &t, &e);
  assert_true(rc == MBD_E_UNSUPPORTED || rc == MBD_E_INVALID);
  assert_null(t.device);
}

#define BM 512
#define BK 8
#define BN 2048
static char g_out[96];
static volatile int g_stop;

static void *toggler(void *arg) {
  (void)arg;
  int fd = shm_open(g_out, O_RDWR, 0);
  while (fd >= 0 && !g_stop) {
    if (ftruncate(fd, 4096) || ftruncate(fd, (off_t)BM * BN * 4)) break;
    usleep(200);
  }
  if (fd >= 0) close(fd);
  return NULL;
}

static void test_output_shrunk_during_writes(void **st) {
  (void)st;
  mbd_error e = {0};
  mbd_shm *shm = NULL;
  assert_int_equal(mbd_shm_create(NULL, (size_t)BM * BN * 4, &shm, &e), 0);
  snprintf(g_out, sizeof g_out, "%s", mbd_shm_name(shm));
  float *a = calloc((size_t)BM * BK, 4), *b = calloc((size_t)BN * BK, 4);
  assert_non_null(a);
  assert_non_null(b);
  for (int i = 0; i < BM * BK; i++) a[i] = (float)(i % 7);
  for (int i = 0; i < BN * BK; i++) b[i] = (float)(i % 5);
  mbd_tensor_desc ad, bd, cd;
  desc2(&ad, MBD_DTYPE_F32, BM, BK);
  desc2(&bd, MBD_DTYPE_F32, BN, BK);
  desc2(&cd, MBD_DTYPE_F32, BM, BN);
  mbd_tensor_in ta = {.desc = ad, .data = a}, tb = {.desc = bd, .data = b}, out;
  assert_int_equal(mbd_shm_tensor(shm, 0, &cd, &out, &e), 0);
  mbd_call_opts o = {.output = &out};
  pthread_t t;
  g_stop = 0;
  assert_int_equal(pthread_create(&t, NULL, toggler, NULL), 0);
  int finals = 0, errors = 0, trapped = 0;
  for (int i = 0; i < 120; i++) {
    mbd_tensor_out c;
    int rc = mbd_client_gemm(g_c, &o, "f32", &ta, &tb, NULL, &c, &e);
    if (rc) {
      assert_int_equal(rc, MBD_E_INVALID); /* shrank mid-write, or past the end at lookup */
      trapped += strstr(e.msg, "shrank") != NULL;
      errors++;
    } else {
      finals++;
      mbd_tensor_out_release(&c);
    }
  }
  g_stop = 1;
  pthread_join(t, NULL);
  printf("shrinking output: %d FINAL, %d ERROR (%d trapped mid-write)\n", finals, errors, trapped);
  assert_int_equal(waitpid(g_worker, NULL, WNOHANG), 0); /* alive */
  /* and serving: the same GEMM into the full-size object gives the inline bits */
  mbd_tensor_out c, want;
  assert_int_equal(mbd_client_gemm(g_c, NULL, "f32", &ta, &tb, NULL, &want, &e), 0);
  assert_int_equal(mbd_client_gemm(g_c, &o, "f32", &ta, &tb, NULL, &c, &e), 0);
  assert_memory_equal(c.data, want.data, want.nbytes);
  mbd_tensor_out_release(&c);
  mbd_tensor_out_release(&want);
  mbd_shm_destroy(&shm);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_session_shm_outputs),
      cmocka_unit_test(test_device_tensor_refused_here),
      cmocka_unit_test(test_output_shrunk_during_writes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
