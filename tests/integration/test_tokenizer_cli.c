/* `mambad tokenize` and `mambad detokenize`, the real binary over pipes, on
 * every case of the shared tokenizer fixtures: the ids written must be the
 * fixture's ids (and ids_special with --add-special-tokens), the texts its
 * decoded strings (and decoded_skip_special with --skip-special-tokens); a bad
 * input line fails with exit 1 naming the line, after the good lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/procs.h"

static char g_tmp[256];

static const char *mambad(void) {
  static char path[1024];
  const char *b = getenv("MBD_BIN_DIR");
  snprintf(path, sizeof path, "%s/mambad", b ? b : "build/bin");
  return access(path, X_OK) ? NULL : path;
}

/* Lines of a file as parsed JSON objects. */
static json_t *read_jsonl(const char *path) {
  json_t *all = json_array();
  FILE *f = fopen(path, "r");
  if (!f) return all;
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  while ((got = getline(&line, &cap, f)) > 0) {
    json_error_t je;
    json_t *o = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
    if (!o) fail_msg("%s: %s in \"%.80s\"", path, je.text, line);
    json_array_append_new(all, o);
  }
  free(line);
  fclose(f);
  return all;
}

static void write_jsonl(const char *path, const json_t *cases, const char *key, const char *as) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  size_t i;
  const json_t *c;
  json_array_foreach(cases, i, c) {
    json_t *o = json_object();
    json_object_set(o, as, json_object_get(c, key));
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    fprintf(f, "%s\n", s);
    free(s);
    json_decref(o);
  }
  fclose(f);
}

static void run_one(const char *name) {
  const char *bin = mambad();
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char dir[512], cases_path[700];
  snprintf(dir, sizeof dir, "%s/tokenizers/%s", fx ? fx : "../shared/fixtures", name);
  snprintf(cases_path, sizeof cases_path, "%s/cases.jsonl", dir);
  if (!bin || access(cases_path, R_OK)) {
    print_message("skipped: %s\n", !bin ? "mambad binary not found ($MBD_BIN_DIR)" : "tokenizer fixtures not found");
    skip();
  }
  json_t *cases = read_jsonl(cases_path);
  assert_true(json_array_size(cases) >= 100);
  char in[512], out[512];
  snprintf(in, sizeof in, "%s/texts.jsonl", g_tmp);
  write_jsonl(in, cases, "text", "text");
  for (int special = 0; special < 2; special++) {
    snprintf(out, sizeof out, "%s/ids.jsonl", g_tmp);
    assert_int_equal(procs_sh("'%s' tokenize --tokenizer '%s' %s < '%s' > '%s'", bin, dir,
                              special ? "--add-special-tokens" : "", in, out), 0);
    json_t *got = read_jsonl(out);
    assert_int_equal(json_array_size(got), json_array_size(cases));
    for (size_t i = 0; i < json_array_size(cases); i++) {
      const json_t *c = json_array_get(cases, i);
      const json_t *want = json_object_get(c, "ids");
      if (special && json_object_get(c, "ids_special")) want = json_object_get(c, "ids_special");
      if (!json_equal(json_object_get(json_array_get(got, i), "ids"), want))
        fail_msg("%s case %zu: tokenize ids differ", name, i + 1);
    }
    json_decref(got);
  }
  snprintf(in, sizeof in, "%s/refids.jsonl", g_tmp);
  write_jsonl(in, cases, "ids", "ids");
  for (int skip = 0; skip < 2; skip++) {
    snprintf(out, sizeof out, "%s/texts_out.jsonl", g_tmp);
    assert_int_equal(procs_sh("'%s' detokenize --tokenizer '%s/tokenizer.json' %s < '%s' > '%s'", bin, dir,
                              skip ? "--skip-special-tokens" : "", in, out), 0);
    json_t *got = read_jsonl(out);
    assert_int_equal(json_array_size(got), json_array_size(cases));
    for (size_t i = 0; i < json_array_size(cases); i++) {
      const json_t *want = json_object_get(json_array_get(cases, i), skip ? "decoded_skip_special" : "decoded");
      if (!json_equal(json_object_get(json_array_get(got, i), "text"), want))
        fail_msg("%s case %zu: detokenize text differs", name, i + 1);
    }
    json_decref(got);
  }
  json_decref(cases);
}

static void test_neox(void **state) {
  (void)state;
  run_one("neox-like");
}

static void test_qwen3(void **state) {
  (void)state;
  run_one("qwen3");
}

static void test_gpt4o(void **state) {
  (void)state;
  run_one("gpt4o");
}

static void test_bad_lines(void **state) {
  (void)state;
  const char *bin = mambad();
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char dir[512], probe[700];
  snprintf(dir, sizeof dir, "%s/tokenizers/neox-like", fx ? fx : "../shared/fixtures");
  snprintf(probe, sizeof probe, "%s/tokenizer.json", dir);
  if (!bin || access(probe, R_OK)) skip();
  char in[512], out[512], errf[512];
  snprintf(in, sizeof in, "%s/bad.jsonl", g_tmp);
  snprintf(out, sizeof out, "%s/bad_out.jsonl", g_tmp);
  snprintf(errf, sizeof errf, "%s/bad_err.txt", g_tmp);
  static const struct {
    const char *cmd, *line, *msg;
  } k[] = {
      {"tokenize", "{\"text\": 5}", "line 2"},
      {"tokenize", "not json", "line 2"},
      {"detokenize", "{\"ids\": [1, -3]}", "ids[1]"},
      {"detokenize", "{\"ids\": [8000]}", "not in the vocabulary"},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fprintf(f, "%s\n%s\n%s\n", !strcmp(k[i].cmd, "tokenize") ? "{\"text\": \"ok\"}" : "{\"ids\": [2]}", k[i].line,
            !strcmp(k[i].cmd, "tokenize") ? "{\"text\": \"never read\"}" : "{\"ids\": [3]}");
    fclose(f);
    assert_int_equal(procs_sh("'%s' %s --tokenizer '%s' < '%s' > '%s' 2> '%s'", bin, k[i].cmd, dir, in, out, errf), 1);
    json_t *got = read_jsonl(out);
    assert_int_equal(json_array_size(got), 1); /* the good first line came out */
    json_decref(got);
    char msg[1024] = {0};
    f = fopen(errf, "r");
    assert_non_null(f);
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    msg[n] = '\0';
    if (!strstr(msg, k[i].msg)) fail_msg("%s: \"%s\" should mention \"%s\"", k[i].cmd, msg, k[i].msg);
  }
  assert_int_equal(procs_sh("'%s' tokenize < /dev/null > /dev/null 2>&1", bin), 2);          /* no --tokenizer */
  assert_int_equal(procs_sh("'%s' tokenize --tokenizer /nonexistent < /dev/null 2>/dev/null", bin), 1);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_tmp, sizeof g_tmp, "/tmp/mbd_tokcli_XXXXXX");
  return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  procs_sh("rm -rf '%s'", g_tmp);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_neox),
      cmocka_unit_test(test_qwen3),
      cmocka_unit_test(test_gpt4o),
      cmocka_unit_test(test_bad_lines),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
