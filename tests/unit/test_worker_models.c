/* Model identities of a checkpoint directory: the model digest (config and
 * weights only) and the tokenizer digest (SHA-256 of tokenizer.json, or ""
 * without one) that READY reports per model. Built in a scratch directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sha256.h"
#include "worker/models.h"

static void write_file(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
}

static void remove_file(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  unlink(path);
}

static void test_tokenizer_digest(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd-models-XXXXXX";
  assert_non_null(mkdtemp(dir));
  write_file(dir, "config.json", "{\"d_model\": 8}");
  write_file(dir, "model.safetensors", "not really weights");
  mbd_error err = {0};
  char d1[65], d2[65], t[65];
  assert_int_equal(mbd_worker_model_digest(dir, d1, &err), 0);
  memset(t, 'x', sizeof t);
  assert_int_equal(mbd_worker_tokenizer_digest(dir, t, &err), 0);
  assert_string_equal(t, ""); /* no tokenizer.json: no field */
  const char *tok = "{\"model\": {\"type\": \"BPE\"}}";
  write_file(dir, "tokenizer.json", tok);
  assert_int_equal(mbd_worker_tokenizer_digest(dir, t, &err), 0);
  uint8_t h[32];
  char want[65];
  mbd_sha256(tok, strlen(tok), h);
  mbd_sha256_hex(h, want);
  assert_string_equal(t, want);
  /* The model digest stays over config and weights only. */
  assert_int_equal(mbd_worker_model_digest(dir, d2, &err), 0);
  assert_string_equal(d1, d2);
  /* Another tokenizer, another digest. */
  write_file(dir, "tokenizer.json", "{}");
  assert_int_equal(mbd_worker_tokenizer_digest(dir, d2, &err), 0);
  assert_string_not_equal(d2, want);
  remove_file(dir, "tokenizer.json");
  remove_file(dir, "model.safetensors");
  remove_file(dir, "config.json");
  assert_int_equal(rmdir(dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tokenizer_digest)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
