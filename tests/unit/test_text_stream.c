/* The CLIs' text helpers (common/tokenizer/text_stream.h): ids pushed one at
 * a time, characters split across ids included, write exactly the decode of
 * all of them; an id outside the vocabulary is skipped and reported; the
 * prompt of a file is its bytes; an empty prompt is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tokenizer/text_stream.h"
#include "kernels/model/synth_tokenizer.h"

static void test_stream(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd-textstream-XXXXXX", path[200];
  assert_non_null(mkdtemp(dir));
  mbd_error err = {0};
  assert_int_equal(mbd_synth_tokenizer_write(400, dir, &err), MBD_OK);
  mbd_tokenizer *t = NULL;
  assert_int_equal(mbd_tokenizer_load(dir, &t, &err), MBD_OK);

  const char *text = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac 1 \xf0\x9f\x99\x82";
  int64_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(mbd_text_prompt_ids(t, text, NULL, false, &ids, &n, &err), MBD_OK);
  assert_true(n > 10); /* the multi-byte characters are several byte ids each */

  FILE *f = tmpfile();
  assert_non_null(f);
  mbd_text_stream *s = NULL;
  assert_int_equal(mbd_text_stream_new(t, false, f, &s, &err), MBD_OK);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(mbd_text_stream_push(s, &ids[i], 1, &err), MBD_OK);
    long at = ftell(f); /* only complete UTF-8 so far: a prefix of the text */
    assert_true(at >= 0 && (size_t)at <= strlen(text));
  }
  int64_t bad[2] = {100000, ids[0]};
  assert_int_equal(mbd_text_stream_push(s, bad, 2, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "100000"));
  assert_int_equal(mbd_text_stream_finish(s, &err), MBD_OK);
  assert_int_equal(mbd_text_stream_count(s), n + 1);
  mbd_text_stream_destroy(&s);
  assert_null(s);
  char got[256] = "";
  rewind(f);
  size_t gl = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  char want[256];
  snprintf(want, sizeof want, "%sh", text);
  assert_int_equal(gl, strlen(want));
  assert_memory_equal(got, want, gl);

  /* --prompt-file: the file's bytes, a final newline included */
  snprintf(path, sizeof path, "%s/p.txt", dir);
  f = fopen(path, "wb");
  fprintf(f, "%s\n", text);
  fclose(f);
  int64_t *fids = NULL;
  size_t fn = 0;
  assert_int_equal(mbd_text_prompt_ids(t, NULL, path, false, &fids, &fn, &err), MBD_OK);
  assert_true(fn > n);
  assert_memory_equal(fids, ids, n * sizeof *ids); /* the same pre-tokens up to the newline */
  free(fids);
  assert_int_equal(mbd_text_prompt_ids(t, "", NULL, false, &fids, &fn, &err), MBD_E_INVALID);
  assert_null(fids);
  snprintf(path, sizeof path, "%s/absent.txt", dir);
  assert_int_equal(mbd_text_prompt_ids(t, NULL, path, false, &fids, &fn, &err), MBD_E_IO);
  assert_non_null(strstr(err.msg, "absent.txt"));

  free(ids);
  mbd_tokenizer_destroy(&t);
  snprintf(path, sizeof path, "%s/p.txt", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_stream)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
