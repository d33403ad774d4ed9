/* shm refs replayed as an attacker would: a second uid (nobody) names another
 * user's objects, directories and FIFOs through the real broker and worker;
 * each is refused with an error, nothing of the other user is read or written,
 * and the worker serves on. A client shrinking its own object while the worker
 * reads it gets errors, never a dead worker. Needs root (to become nobody and
 * to own the victim's objects); skips with the reason otherwise. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/procs.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"
#include "support/security.h"

static wh g_h;
static pid_t g_worker;

#define M 4
#define K 8
#define N 3

/* Packs a GEMM {dtype f32, tensors: [a (shm name/offset/size), b inline frame 0],
 * outputs?: [c in shm out_name]}. */
static void pack_gemm(wh_pack *k, const char *a_name, uint64_t a_size, const char *out_name) {
  wh_pack_init(k);
  msgpack_pack_map(&k->pk, out_name ? 3 : 2);
  mbd_pack_kv_str(&k->pk, "dtype", "f32");
  int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N};
  mbd_tensor_ref a, b, c;
  memset(&a, 0, sizeof a);
  strcpy(a.name, "a");
  mbd_tensor_desc_make(&a.desc, MBD_DTYPE_F32, 2, sa, NULL);
  a.kind = MBD_TREF_SHM;
  snprintf(a.shm_name, sizeof a.shm_name, "%s", a_name);
  a.size = a_size;
  b = a;
  strcpy(b.name, "b");
  mbd_tensor_desc_make(&b.desc, MBD_DTYPE_F32, 2, sb, NULL);
  b.kind = MBD_TREF_INLINE;
  b.frame = 0;
  mbd_pack_str(&k->pk, "tensors");
  msgpack_pack_array(&k->pk, 2);
  mbd_pack_tensor_ref(&k->pk, &a);
  mbd_pack_tensor_ref(&k->pk, &b);
  if (out_name) {
    c = a;
    strcpy(c.name, "c");
    mbd_tensor_desc_make(&c.desc, MBD_DTYPE_F32, 2, sc, NULL);
    snprintf(c.shm_name, sizeof c.shm_name, "%s", out_name);
    c.size = M * N * 4;
    mbd_pack_str(&k->pk, "outputs");
    msgpack_pack_array(&k->pk, 1);
    mbd_pack_tensor_ref(&k->pk, &c);
  }
}

static float g_b[N * K];

/* GEMM reply code (0 = FINAL); the error message goes into msg. */
static int gemm(wh *h, const char *a_name, uint64_t a_size, const char *out_name, char *msg,
                size_t cap) {
  wh_pack k;
  pack_gemm(&k, a_name, a_size, out_name);
  const void *pl[1] = {g_b};
  size_t len[1] = {sizeof g_b};
  mbd_msg *m = wh_call(h, MBD_CMD_GEMM, &k.sb, 1, pl, len);
  if (!m) return 1;
  int code = wh_code(m);
  if (msg) {
    msg[0] = '\0';
    wh_str(m, "message", msg, cap);
  }
  mbd_msg_destroy(&m);
  return code;
}

/* Creates shm object name (mode, size bytes of `fill`) as the current uid. */
static int make_obj(const char *name, mode_t mode, size_t size, int fill) {
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, mode);
  if (fd < 0) return -1;
  fchmod(fd, mode); /* the umask may have removed bits */
  if (ftruncate(fd, (off_t)size)) return -1;
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  memset(p, fill, size);
  munmap(p, size);
  close(fd);
  return 0;
}

static bool obj_all(const char *name, size_t size, int fill) {
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) return false;
  unsigned char *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return false;
  bool ok = true;
  for (size_t i = 0; i < size; i++) ok = ok && p[i] == fill;
  munmap(p, size);
  return ok;
}

static int setup(void **state) {
  (void)state;
  if (wh_init(&g_h)) return -1;
  wh_start_broker(&g_h);
  g_worker = wh_start_worker(&g_h, "w0", NULL);
  if (wh_wait_workers(&g_h, 1, 20000)) return -1;
  sec_open_socket(&g_h);
  for (int i = 0; i < N * K; i++) g_b[i] = (float)(i % 5) - 2.0f;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  wh_fini(&g_h);
  return 0;
}

static char g_secret[64], g_target[64];

static int attacks(wh *h) {
  char msg[512];
  /* Read a root-only object through the worker. */
  SEC_CHECK(gemm(h, g_secret, M * K * 4, NULL, msg, sizeof msg) == MBD_E_INVALID);
  SEC_CHECK(strstr(msg, "belongs to uid 0"));
  /* Overwrite it through outputs (the input is nobody's own object). */
  char own[64];
  snprintf(own, sizeof own, "/mbd-sec-own-%d", (int)getpid());
  SEC_CHECK(make_obj(own, 0600, M * K * 4, 0) == 0);
  SEC_CHECK(gemm(h, own, M * K * 4, g_target, msg, sizeof msg) == MBD_E_INVALID);
  SEC_CHECK(strstr(msg, "belongs to uid 0"));
  /* Directories and escapes. */
  SEC_CHECK(gemm(h, "/..", 1 << 20, NULL, msg, sizeof msg) == MBD_E_INVALID);
  SEC_CHECK(gemm(h, "/.", 1 << 20, NULL, msg, sizeof msg) == MBD_E_INVALID);
  /* A FIFO of nobody's own: refused, and the worker does not hang in open(). */
  char fifo[64], path[96];
  snprintf(fifo, sizeof fifo, "/mbd-sec-fifo-%d", (int)getpid());
  snprintf(path, sizeof path, "/dev/shm%s", fifo);
  unlink(path);
  SEC_CHECK(mkfifo(path, 0600) == 0);
  SEC_CHECK(gemm(h, fifo, M * K * 4, NULL, msg, sizeof msg) == MBD_E_INVALID);
  SEC_CHECK(strstr(msg, "not a regular"));
  unlink(path);
  /* Its own object works, and the worker is still serving. */
  SEC_CHECK(gemm(h, own, M * K * 4, NULL, msg, sizeof msg) == 0);
  shm_unlink(own);
  return 0;
}

static void test_second_uid_refused(void **state) {
  (void)state;
  snprintf(g_secret, sizeof g_secret, "/mbd-sec-secret-%d", (int)getpid());
  snprintf(g_target, sizeof g_target, "/mbd-sec-target-%d", (int)getpid());
  assert_int_equal(make_obj(g_secret, 0600, M * K * 4, 0x42), 0);
  assert_int_equal(make_obj(g_target, 0600, M * N * 4, 0x17), 0);
  assert_int_equal(sec_as_nobody(&g_h, attacks), 0);
  assert_true(obj_all(g_target, M * N * 4, 0x17)); /* nothing written */
  /* The owner itself is served from the same objects. */
  assert_int_equal(gemm(&g_h, g_secret, M * K * 4, g_target, NULL, 0), 0);
  assert_false(obj_all(g_target, M * N * 4, 0x17));
  shm_unlink(g_secret);
  shm_unlink(g_target);
  assert_int_equal(waitpid(g_worker, NULL, WNOHANG), 0); /* alive */
}

/* A big input that another thread shrinks and regrows while requests read it:
 * every reply is FINAL or an ERROR, and the worker stays up. */
#define BIG_M 512
#define BIG_K 2048
static char g_big[64];
static volatile int g_stop_toggle;

static void *toggler(void *arg) {
  (void)arg;
  int fd = shm_open(g_big, O_RDWR, 0);
  while (fd >= 0 && !g_stop_toggle) {
    if (ftruncate(fd, 4096) || ftruncate(fd, (off_t)BIG_M * BIG_K * 4)) break;
    usleep(300); /* mostly full-size, so reads start and then lose their pages */
  }
  if (fd >= 0) close(fd);
  return NULL;
}

static void test_shrink_during_reads(void **state) {
  (void)state;
  snprintf(g_big, sizeof g_big, "/mbd-sec-big-%d", (int)getpid());
  size_t bytes = (size_t)BIG_M * BIG_K * 4;
  assert_int_equal(make_obj(g_big, 0600, bytes, 0), 0);
  int64_t sa[2] = {BIG_M, BIG_K}, sb2[2] = {N, BIG_K};
  float *b = calloc((size_t)N * BIG_K, sizeof *b);
  assert_non_null(b);
  pthread_t t;
  g_stop_toggle = 0;
  assert_int_equal(pthread_create(&t, NULL, toggler, NULL), 0);
  int finals = 0, errors = 0, trapped = 0;
  for (int i = 0; i < 150; i++) {
    wh_pack k;
    wh_pack_init(&k);
    msgpack_pack_map(&k.pk, 2);
    mbd_pack_kv_str(&k.pk, "dtype", "f32");
    mbd_tensor_ref a, r2;
    memset(&a, 0, sizeof a);
    strcpy(a.name, "a");
    mbd_tensor_desc_make(&a.desc, MBD_DTYPE_F32, 2, sa, NULL);
    a.kind = MBD_TREF_SHM;
    strcpy(a.shm_name, g_big);
    a.size = bytes;
    r2 = a;
    strcpy(r2.name, "b");
    mbd_tensor_desc_make(&r2.desc, MBD_DTYPE_F32, 2, sb2, NULL);
    r2.kind = MBD_TREF_INLINE;
    mbd_pack_str(&k.pk, "tensors");
    msgpack_pack_array(&k.pk, 2);
    mbd_pack_tensor_ref(&k.pk, &a);
    mbd_pack_tensor_ref(&k.pk, &r2);
    const void *pl[1] = {b};
    size_t len[1] = {(size_t)N * BIG_K * 4};
    mbd_msg *m = wh_call(&g_h, MBD_CMD_GEMM, &k.sb, 1, pl, len);
    assert_non_null(m);
    int code = wh_code(m);
    char msg[512] = "";
    wh_str(m, "message", msg, sizeof msg);
    trapped += strstr(msg, "shrank") != NULL;
    mbd_msg_destroy(&m);
    assert_true(code == 0 || code == MBD_E_INVALID);
    if (code) errors++;
    else finals++;
  }
  g_stop_toggle = 1;
  pthread_join(t, NULL);
  printf("shrinking object: %d FINAL, %d ERROR (%d trapped mid-read)\n", finals, errors, trapped);
  assert_int_equal(waitpid(g_worker, NULL, WNOHANG), 0); /* alive */
  assert_int_equal(gemm(&g_h, "/mbd-sec-missing", M * K * 4, NULL, NULL, 0), MBD_E_NOT_FOUND);
  shm_unlink(g_big);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_uid_refused),
      cmocka_unit_test(test_shrink_during_reads),
  };
  int rc = sec_init();
  if (rc) return rc;
  return cmocka_run_group_tests(tests, setup, teardown);
}
