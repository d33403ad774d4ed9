/* SHA-256: FIPS 180-4 vectors, padding boundaries, incremental updates split
 * at every offset, file hashing. Expected digests come from Python's hashlib. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"

static void hex_of(const void *data, size_t len, char out[65]) {
  uint8_t d[32];
  mbd_sha256(data, len, d);
  mbd_sha256_hex(d, out);
}

static void test_fips_vectors(void **state) {
  (void)state;
  char h[65];
  hex_of("", 0, h);
  assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  hex_of("abc", 3, h);
  assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hex_of(m448, strlen(m448), h);
  assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
                     "nopqrlmnopqrsmnopqrstnopqrstu";
  hex_of(m896, strlen(m896), h);
  assert_string_equal(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

static void test_million_a(void **state) {
  (void)state;
  char *a = malloc(1000000);
  assert_non_null(a);
  memset(a, 'a', 1000000);
  char h[65];
  hex_of(a, 1000000, h);
  assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  /* Same through odd-sized updates that straddle block boundaries. */
  mbd_sha256_ctx s;
  mbd_sha256_init(&s);
  for (size_t off = 0, step = 1; off < 1000000; off += step, step = step % 131 + 7) {
    size_t n = off + step > 1000000 ? 1000000 - off : step;
    mbd_sha256_update(&s, a + off, n);
  }
  uint8_t d[32];
  mbd_sha256_final(&s, d);
  mbd_sha256_hex(d, h);
  assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(a);
}

static uint8_t *pattern(size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + 3);
  return p;
}

/* Lengths around the 55/56/64 padding boundaries. */
static void test_padding_boundaries(void **state) {
  (void)state;
  static const struct {
    size_t n;
    const char *hex;
  } v[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {57, "35df609437dcfea3279283ab79fd554e2bf78f8f7ae2de532d8ee300b09e8f73"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
      {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"},
  };
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    uint8_t *p = pattern(v[i].n);
    char h[65];
    hex_of(p, v[i].n, h);
    assert_string_equal(h, v[i].hex);
    free(p);
  }
}

/* Two-part updates split at every offset equal the one-shot digest. */
static void test_incremental_every_split(void **state) {
  (void)state;
  const size_t n = 200;
  uint8_t *p = pattern(n);
  uint8_t ref[32], d[32];
  mbd_sha256(p, n, ref);
  for (size_t cut1 = 0; cut1 <= n; cut1++) {
    for (size_t cut2 = cut1; cut2 <= n; cut2 += 13) {
      mbd_sha256_ctx s;
      mbd_sha256_init(&s);
      mbd_sha256_update(&s, p, cut1);
      mbd_sha256_update(&s, p + cut1, cut2 - cut1);
      mbd_sha256_update(&s, p + cut2, 0);
      mbd_sha256_update(&s, p + cut2, n - cut2);
      mbd_sha256_final(&s, d);
      assert_memory_equal(d, ref, 32);
    }
  }
  free(p);
}

static void test_file(void **state) {
  (void)state;
  char path[] = "/tmp/mbd_sha256_test_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  uint8_t *p = pattern(200000);
  assert_int_equal(write(fd, p, 200000), 200000);
  close(fd);
  uint8_t d[32];
  char h[65];
  mbd_error err = {0};
  assert_int_equal(mbd_sha256_file(path, d, &err), MBD_OK);
  mbd_sha256_hex(d, h);
  assert_string_equal(h, "ec0ebf98b6f2954bf0f7b839402b1ba245996c39d18e155414e91a2b4353c157");
  unlink(path);
  free(p);
  assert_int_equal(mbd_sha256_file(path, d, &err), MBD_E_IO);
  assert_int_equal(err.code, MBD_E_IO);
  assert_non_null(strstr(err.msg, path));
  /* A directory is not hashable: an error, not a digest of nothing. */
  assert_int_equal(mbd_sha256_file("/", d, &err), MBD_E_IO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fips_vectors),
      cmocka_unit_test(test_million_a),
      cmocka_unit_test(test_padding_boundaries),
      cmocka_unit_test(test_incremental_every_split),
      cmocka_unit_test(test_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
