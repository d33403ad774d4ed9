/* Worker shm tensor access: name rules, bounds (past the end, overflowing
 * offset + size, size below the tensor), read-only vs read-write, the LRU cache
 * (hits, eviction, re-created and resized objects re-mapped), and objects
 * truncated under a mapping that is read (an input) or written (an output). */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/shm.h"

#define ME ((int64_t)geteuid()) /* the objects below are the test's own */

/* Creates /mbd-test-<pid>-<i> of `size` bytes filled with byte `fill`. */
static void make_obj(char *name, size_t cap, int i, size_t size, int fill) {
  snprintf(name, cap, "/mbd-wtest-%d-%d", (int)getpid(), i);
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  if (size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    memset(p, fill, size);
    munmap(p, size);
  }
  close(fd);
}

static void test_names(void **state) {
  (void)state;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_name_check("/ok-name_1.x", &err), 0);
  const char *bad[] = {"",       "/",     "noslash", "/a/b", "/sp ace", "/tab\t", "/\x80hi",
                       "/.",     "/..",   "/.hidden", "/a:b", "/a*",    "/a\\b", NULL};
  for (int i = 0; bad[i]; i++) {
    assert_int_equal(mbd_shm_name_check(bad[i], &err), MBD_E_INVALID);
    assert_true(strlen(err.msg) > 0);
  }
  assert_int_equal(mbd_shm_name_check(NULL, &err), MBD_E_INVALID);
  char longname[200];
  memset(longname, 'a', sizeof longname);
  longname[0] = '/';
  longname[sizeof longname - 1] = '\0';
  assert_int_equal(mbd_shm_name_check(longname, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "longer"));
}

static void test_bounds(void **state) {
  (void)state;
  char name[64];
  make_obj(name, sizeof name, 0, 4096, 0x5a);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(4, &c, &err), 0);
  void *p = NULL;
  /* In range, the last byte exactly. */
  assert_int_equal(mbd_shm_cache_map(c, name, 4095, 1, 1, false, ME, &p, &err), 0);
  assert_int_equal(*(unsigned char *)p, 0x5a);
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 4096, 4096, false, ME, &p, &err), 0);
  /* Past the end: offset, size, both. */
  assert_int_equal(mbd_shm_cache_map(c, name, 4096, 1, 1, false, ME, &p, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "past the object's end"));
  assert_null(p);
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 4097, 4, false, ME, &p, &err), MBD_E_INVALID);
  assert_int_equal(mbd_shm_cache_map(c, name, 8192, 0, 0, false, ME, &p, &err), MBD_E_INVALID);
  /* offset + size overflows u64: must not wrap into "in range". */
  assert_int_equal(mbd_shm_cache_map(c, name, UINT64_MAX - 10, 100, 4, false, ME, &p, &err),
                   MBD_E_INVALID);
  assert_int_equal(mbd_shm_cache_map(c, name, 16, UINT64_MAX, 4, false, ME, &p, &err),
                   MBD_E_INVALID);
  /* Size smaller than the tensor. */
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 8, 16, false, ME, &p, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "smaller than the tensor"));
  /* Missing object, bad name. */
  assert_int_equal(mbd_shm_cache_map(c, "/mbd-wtest-does-not-exist", 0, 1, 1, false, ME, &p, &err),
                   MBD_E_NOT_FOUND);
  assert_int_equal(mbd_shm_cache_map(c, "/../etc/passwd", 0, 1, 1, false, ME, &p, &err),
                   MBD_E_INVALID);
  mbd_shm_cache_destroy(&c);
  assert_null(c);
  mbd_shm_cache_destroy(&c); /* NULL-safe */
  shm_unlink(name);
}

static void test_write_and_cache(void **state) {
  (void)state;
  char n[5][64];
  for (int i = 0; i < 5; i++) make_obj(n[i], sizeof n[i], 10 + i, 256, i);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(3, &c, &err), 0);
  void *p = NULL, *q = NULL;
  /* Writable mapping writes through to the object. */
  assert_int_equal(mbd_shm_cache_map(c, n[0], 8, 8, 8, true, ME, &p, &err), 0);
  memcpy(p, "ABCDEFGH", 8);
  assert_int_equal(mbd_shm_cache_map(c, n[0], 0, 256, 256, false, ME, &q, &err), 0);
  assert_memory_equal((char *)q + 8, "ABCDEFGH", 8);
  assert_int_equal(mbd_shm_cache_count(c), 2); /* rw and ro are separate mappings */
  uint64_t maps = mbd_shm_cache_maps(c);
  /* Hit: no new mmap. */
  assert_int_equal(mbd_shm_cache_map(c, n[0], 16, 8, 8, false, ME, &q, &err), 0);
  assert_int_equal(mbd_shm_cache_maps(c), maps);
  /* Bounded: mapping 4 more objects keeps at most 3. */
  for (int i = 1; i < 5; i++) {
    assert_int_equal(mbd_shm_cache_map(c, n[i], 0, 1, 1, false, ME, &q, &err), 0);
    assert_int_equal(*(unsigned char *)q, i);
    assert_true(mbd_shm_cache_count(c) <= 3);
  }
  assert_int_equal(mbd_shm_cache_maps(c), maps + 4);
  /* The most recent ones are hits; the oldest was evicted and maps again. */
  maps = mbd_shm_cache_maps(c);
  assert_int_equal(mbd_shm_cache_map(c, n[4], 0, 1, 1, false, ME, &q, &err), 0);
  assert_int_equal(mbd_shm_cache_maps(c), maps);
  assert_int_equal(mbd_shm_cache_map(c, n[1], 0, 1, 1, false, ME, &q, &err), 0);
  assert_int_equal(mbd_shm_cache_maps(c), maps + 1);
  /* Re-created under the same name with other content and a bigger size:
   * the stale mapping must not be served. */
  make_obj(n[4], sizeof n[4], 14, 8192, 0x77);
  assert_int_equal(mbd_shm_cache_map(c, n[4], 8000, 8, 8, false, ME, &q, &err), 0);
  assert_int_equal(*(unsigned char *)q, 0x77);
  /* Shrunk: the old range is now out of bounds. */
  make_obj(n[4], sizeof n[4], 14, 64, 0x11);
  assert_int_equal(mbd_shm_cache_map(c, n[4], 8000, 8, 8, false, ME, &q, &err), MBD_E_INVALID);
  mbd_shm_cache_destroy(&c);
  for (int i = 0; i < 5; i++) shm_unlink(n[i]);
}

static void test_readonly_object(void **state) {
  (void)state;
  char name[64];
  snprintf(name, sizeof name, "/mbd-wtest-%d-ro", (int)getpid());
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0400);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 64), 0);
  close(fd);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(2, &c, &err), 0);
  void *p = NULL;
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 64, 64, false, ME, &p, &err), 0);
  /* Refused even for a root worker: its owner could not write it. */
  assert_int_not_equal(mbd_shm_cache_map(c, name, 0, 64, 64, true, ME, &p, &err), 0);
  mbd_shm_cache *none = NULL;
  assert_int_equal(mbd_shm_cache_new(0, &none, &err), MBD_E_INVALID);
  assert_null(none);
  mbd_shm_cache_destroy(&c);
  shm_unlink(name);
}

/* Owner and type rules: another uid's object, an unknown caller, a FIFO (which
 * must not block the open), a symlink. */
static void test_owner_and_type(void **state) {
  (void)state;
  char name[64], fifo[64], link[64], path[96];
  make_obj(name, sizeof name, 7, 64, 1);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(2, &c, &err), 0);
  void *p = NULL;
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 64, 64, false, -1, &p, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "uid is unknown"));
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 64, 64, false, ME + 1, &p, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "belongs to uid"));
  snprintf(fifo, sizeof fifo, "/mbd-wtest-%d-fifo", (int)getpid());
  snprintf(path, sizeof path, "/dev/shm%s", fifo);
  unlink(path);
  if (mkfifo(path, 0600) == 0) {
    assert_int_equal(mbd_shm_cache_map(c, fifo, 0, 1, 1, false, ME, &p, &err), MBD_E_INVALID);
    assert_non_null(strstr(err.msg, "not a regular"));
    assert_int_equal(mbd_shm_cache_map(c, fifo, 0, 1, 1, true, ME, &p, &err), MBD_E_INVALID);
    unlink(path);
  }
  snprintf(link, sizeof link, "/mbd-wtest-%d-link", (int)getpid());
  snprintf(path, sizeof path, "/dev/shm%s", link);
  unlink(path);
  char target[96];
  snprintf(target, sizeof target, "/dev/shm%s", name);
  if (symlink(target, path) == 0) {
    assert_int_equal(mbd_shm_cache_map(c, link, 0, 64, 64, false, ME, &p, &err), MBD_E_INVALID);
    unlink(path);
  }
  mbd_shm_cache_destroy(&c);
  shm_unlink(name);
}

/* An object truncated under a live mapping: the access does not kill the
 * process, the cache reports the fault once, and the object maps again. */
static void test_truncated_under_mapping(void **state) {
  (void)state;
  char name[64];
  make_obj(name, sizeof name, 8, 3 * 4096, 0x11);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(2, &c, &err), 0);
  void *p = NULL;
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 3 * 4096, 3 * 4096, false, ME, &p, &err), 0);
  volatile const unsigned char *b = p;
  assert_int_equal(b[8192], 0x11);
  int fd = shm_open(name, O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 100), 0);
  close(fd);
  mbd_shm_cache_watch(c);
  assert_int_equal(mbd_shm_cache_check(c, &err), 0);
  unsigned char seen = b[8192]; /* past the new end: SIGBUS, trapped */
  assert_int_equal(seen, 0);
  assert_int_equal(mbd_shm_cache_faults(c), 1);
  assert_int_equal(mbd_shm_cache_check(c, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "shrank"));
  assert_int_equal(mbd_shm_cache_check(c, &err), 0); /* reported once */
  /* The next lookup sees the real size: the old range is refused, a fitting one served. */
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 3 * 4096, 3 * 4096, false, ME, &p, &err),
                   MBD_E_INVALID);
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 100, 100, false, ME, &p, &err), 0);
  assert_int_equal(((const unsigned char *)p)[0], 0x11);
  mbd_shm_cache_destroy(&c);
  shm_unlink(name);
}

/* An output object truncated under a live read-write mapping: the write
 * does not kill the process, lands in private memory (the object's bytes
 * within its new size are untouched), and the cache reports it once. */
static void test_truncated_output_write(void **state) {
  (void)state;
  char name[64];
  make_obj(name, sizeof name, 9, 3 * 4096, 0x22);
  mbd_shm_cache *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_shm_cache_new(2, &c, &err), 0);
  void *p = NULL;
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 3 * 4096, 3 * 4096, true, ME, &p, &err), 0);
  int fd = shm_open(name, O_RDWR, 0);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 100), 0);
  mbd_shm_cache_watch(c);
  memset(p, 0x33, 3 * 4096); /* the first page exists, the rest faults: trapped */
  assert_int_equal(mbd_shm_cache_faults(c), 1);
  assert_int_equal(mbd_shm_cache_check(c, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, name));
  assert_int_equal(mbd_shm_cache_check(c, &err), 0);
  /* Bytes written before the fault may have reached what is left of the
   * object (the client's own, which it shrank); the reply is an ERROR, so the
   * client does not take them for a result. */
  unsigned char seen[100];
  assert_int_equal(pread(fd, seen, sizeof seen, 0), (ssize_t)sizeof seen);
  close(fd);
  for (size_t i = 0; i < sizeof seen; i++) assert_true(seen[i] == 0x22 || seen[i] == 0x33);
  /* Served again at its real size. */
  assert_int_equal(mbd_shm_cache_map(c, name, 0, 100, 100, true, ME, &p, &err), 0);
  ((unsigned char *)p)[0] = 0x44;
  fd = shm_open(name, O_RDONLY, 0);
  assert_int_equal(pread(fd, seen, 1, 0), 1);
  close(fd);
  assert_int_equal(seen[0], 0x44);
  mbd_shm_cache_destroy(&c);
  shm_unlink(name);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_write_and_cache),
      cmocka_unit_test(test_readonly_object),
      cmocka_unit_test(test_owner_and_type),
      cmocka_unit_test(test_truncated_under_mapping),
      cmocka_unit_test(test_truncated_output_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
