/* Tokenizer: every case of the shared Hugging Face fixtures (three
 * tokenizers: ids, ids with special tokens, decode with and without special
 * tokens, the incremental detokenizer's output), ids that split a character,
 * small hand-made tokenizer.json files for the components the fixtures do not
 * reach (Split behaviors, TemplateProcessing, added-token flags, NFKC, unk),
 * and malformed files, each refused with MBD_E_FORMAT naming its field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tokenizer/tokenizer.h"
#include "kernels/model/synth_tokenizer.h"

/* ---- helpers ------------------------------------------------------------ */

static const char *fixture_dir(const char *name, char *buf, size_t cap) {
  const char *fx = getenv("MBD_FIXTURES_DIR");
  snprintf(buf, cap, "%s/tokenizers/%s", fx ? fx : "../shared/fixtures", name);
  char probe[700];
  snprintf(probe, sizeof probe, "%s/cases.jsonl", buf);
  if (access(probe, R_OK)) {
    print_message("tokenizer fixtures not found (%s): skipped; set MBD_FIXTURES_DIR or SHARED_FIXTURES\n",
                  probe);
    return NULL;
  }
  return buf;
}

static mbd_tokenizer *load_str(const char *json, mbd_error *err) {
  mbd_tokenizer *t = NULL;
  int rc = mbd_tokenizer_load_bytes(json, strlen(json), "test.json", &t, err);
  if (rc) return NULL;
  return t;
}

static size_t encode(const mbd_tokenizer *t, const char *s, bool special, int32_t *out, size_t cap) {
  int32_t *ids = NULL;
  size_t n = 0;
  mbd_error err = {0};
  int rc = mbd_tokenizer_encode(t, s, strlen(s), special, &ids, &n, &err);
  if (rc) fail_msg("encode(%s): %s", s, err.msg);
  assert_true(n <= cap);
  memcpy(out, ids, n * sizeof *ids);
  free(ids);
  return n;
}

/* decode_n gives the length too: decoded text may hold NUL. */
static char *decode_n(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
  char *s = NULL;
  mbd_error err = {0};
  if (mbd_tokenizer_decode(t, ids, n, skip, &s, len, &err)) fail_msg("decode: %s", err.msg);
  assert_int_equal(s[*len], '\0');
  return s;
}

static char *decode(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
  size_t len = 0;
  return decode_n(t, ids, n, skip, &len);
}

/* Everything the detokenizer emits for ids, flush included. */
static char *detok_all(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
  mbd_detok *d = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_detok_new(t, skip, &d, &err), MBD_OK);
  char *buf = NULL;
  *len = 0;
  for (size_t i = 0; i < n; i++)
    if (mbd_detok_push(d, ids[i], &buf, len, &err)) fail_msg("detok push: %s", err.msg);
  if (mbd_detok_flush(d, &buf, len, &err)) fail_msg("detok flush: %s", err.msg);
  mbd_detok_destroy(&d);
  assert_null(d);
  return buf;
}

static bool ids_equal(const int32_t *a, size_t na, const json_t *arr) {
  if (json_array_size(arr) != na) return false;
  for (size_t i = 0; i < na; i++)
    if (json_integer_value(json_array_get(arr, i)) != a[i]) return false;
  return true;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
  char line[1024];
  size_t at = 0;
  for (size_t i = 0; i < n && at + 16 < sizeof line; i++)
    at += (size_t)snprintf(line + at, sizeof line - at, "%d ", (int)ids[i]);
  line[at] = '\0';
  print_message("    %s: %s\n", what, line);
}

/* ---- the fixtures -------------------------------------------------------- */

static int run_fixture(const char *name) {
  char dir[512];
  if (!fixture_dir(name, dir, sizeof dir)) return -1;
  mbd_tokenizer *t = NULL;
  mbd_error err = {0};
  if (mbd_tokenizer_load(dir, &t, &err)) fail_msg("loading %s: %s", dir, err.msg);
  assert_int_equal(strlen(mbd_tokenizer_digest(t)), 64);

  char path[700];
  snprintf(path, sizeof path, "%s/cases.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int n_cases = 0, n_bad = 0;
  while ((got = getline(&line, &cap, f)) > 0) {
    json_error_t je;
    json_t *c = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
    if (!c) fail_msg("%s line %d: %s", path, n_cases + 1, je.text);
    const json_t *jtext = json_object_get(c, "text"), *jids = json_object_get(c, "ids");
    const json_t *jspecial = json_object_get(c, "ids_special");
    const char *dec = json_string_value(json_object_get(c, "decoded"));
    const char *dec_skip = json_string_value(json_object_get(c, "decoded_skip_special"));
    assert_non_null(jtext);
    assert_non_null(dec);
    assert_non_null(dec_skip);
    size_t dec_len = json_string_length(json_object_get(c, "decoded"));
    size_t dec_skip_len = json_string_length(json_object_get(c, "decoded_skip_special"));
    if (!jspecial) jspecial = jids;
    const char *text = json_string_value(jtext);
    size_t text_len = json_string_length(jtext);
    bool bad = false;

    int32_t *ids = NULL, *ids_sp = NULL;
    size_t n = 0, n_sp = 0;
    if (mbd_tokenizer_encode(t, text, text_len, false, &ids, &n, &err)) fail_msg("encode: %s", err.msg);
    if (mbd_tokenizer_encode(t, text, text_len, true, &ids_sp, &n_sp, &err)) fail_msg("encode: %s", err.msg);
    if (!ids_equal(ids, n, jids) || !ids_equal(ids_sp, n_sp, jspecial)) {
      if (n_bad < 5) {
        print_message("  %s case %d (%s): ids differ for %.80s\n", name, n_cases + 1,
                      json_string_value(json_object_get(c, "kind")), text);
        print_ids("got", ids, n);
        int32_t want[4096];
        size_t nw = json_array_size(jids) < 4096 ? json_array_size(jids) : 4096;
        for (size_t i = 0; i < nw; i++) want[i] = (int32_t)json_integer_value(json_array_get(jids, i));
        print_ids("want", want, nw);
      }
      bad = true;
    }
    /* decode the reference ids, so a decode bug shows apart from an encode bug */
    size_t nr = json_array_size(jids);
    int32_t *ref = malloc((nr + 1) * sizeof *ref);
    for (size_t i = 0; i < nr; i++) ref[i] = (int32_t)json_integer_value(json_array_get(jids, i));
    size_t dl0 = 0, dl1 = 0, l0 = 0, l1 = 0;
    char *d0 = decode_n(t, ref, nr, false, &dl0), *d1 = decode_n(t, ref, nr, true, &dl1);
    char *s0 = detok_all(t, ref, nr, false, &l0), *s1 = detok_all(t, ref, nr, true, &l1);
    if (dl0 != dec_len || memcmp(d0, dec, dec_len) || dl1 != dec_skip_len ||
        memcmp(d1, dec_skip, dec_skip_len)) {
      if (n_bad < 5) print_message("  %s case %d: decode differs: got \"%.80s\" want \"%.80s\"\n", name, n_cases + 1, d0, dec);
      bad = true;
    }
    if (l0 != dec_len || memcmp(s0, dec, dec_len) || l1 != dec_skip_len || memcmp(s1, dec_skip, dec_skip_len)) {
      if (n_bad < 5) print_message("  %s case %d: detokenizer output differs from decode\n", name, n_cases + 1);
      bad = true;
    }
    n_bad += bad;
    free(d0);
    free(d1);
    free(s0);
    free(s1);
    free(ref);
    free(ids);
    free(ids_sp);
    json_decref(c);
    n_cases++;
  }
  free(line);
  fclose(f);
  print_message("  %s: %d cases, %d differ (vocab %lld, sha256 %.16s...)\n", name, n_cases, n_bad,
                (long long)mbd_tokenizer_vocab_size(t), mbd_tokenizer_digest(t));
  mbd_tokenizer_destroy(&t);
  assert_null(t);
  assert_true(n_cases >= 100);
  return n_bad;
}

static void test_fixture_neox(void **state) {
  (void)state;
  int bad = run_fixture("neox-like");
  if (bad < 0) skip();
  assert_int_equal(bad, 0);
}

static void test_fixture_qwen3(void **state) {
  (void)state;
  int bad = run_fixture("qwen3");
  if (bad < 0) skip();
  assert_int_equal(bad, 0);
}

static void test_fixture_gpt4o(void **state) {
  (void)state;
  int bad = run_fixture("gpt4o");
  if (bad < 0) skip();
  assert_int_equal(bad, 0);
}

/* ---- incremental detokenization over ids that split characters ----------- */

static void test_detok_split_chars(void **state) {
  (void)state;
  char dir[512];
  if (!fixture_dir("neox-like", dir, sizeof dir)) skip();
  mbd_tokenizer *t = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_tokenizer_load(dir, &t, &err), MBD_OK);
  assert_int_equal(mbd_tokenizer_vocab_size(t), 8000);

  /* id of each single-byte token, and decode([id]) against id_bytes.jsonl */
  int32_t byte_tok[256];
  for (int i = 0; i < 256; i++) byte_tok[i] = -1;
  char path[700];
  snprintf(path, sizeof path, "%s/id_bytes.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *line = NULL;
  size_t cap = 0;
  int n_ids = 0;
  while (getline(&line, &cap, f) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    assert_non_null(o);
    int32_t id = (int32_t)json_integer_value(json_object_get(o, "id"));
    const char *hex = json_string_value(json_object_get(o, "hex"));
    size_t nb = strlen(hex) / 2;
    char bytes[256];
    assert_true(nb < sizeof bytes);
    for (size_t i = 0; i < nb; i++) {
      unsigned v;
      sscanf(hex + 2 * i, "%2x", &v);
      bytes[i] = (char)v;
    }
    if (nb == 1) byte_tok[(uint8_t)bytes[0]] = id;
    size_t il = 0;
    const char *ib = mbd_tokenizer_id_bytes(t, id, &il);
    assert_non_null(ib);
    assert_int_equal(il, nb);
    assert_memory_equal(ib, bytes, nb);
    char *d = decode(t, &id, 1, false);
    bool valid = true;
    for (size_t i = 0; i < nb; i++) valid &= (uint8_t)bytes[i] < 0x80;
    if (valid) assert_memory_equal(d, bytes, nb);
    free(d);
    json_decref(o);
    n_ids++;
  }
  free(line);
  fclose(f);
  assert_int_equal(n_ids, 8000);
  for (int b = 0; b < 256; b++) assert_true(byte_tok[b] >= 0);

  static const struct {
    const char *bytes;   /* fed one byte-token at a time */
    const char *after[5];/* what each push emits */
    const char *flush;
  } k[] = {
      {"\xc3\xa9", {"", "\xc3\xa9"}, ""},
      {"\xe2\x82\xac!", {"", "", "\xe2\x82\xac", "!"}, ""},
      {"\xf0\x9f\x98\x80", {"", "", "", "\xf0\x9f\x98\x80"}, ""},
      {"a\xf0\x9f", {"a", "", ""}, "\xef\xbf\xbd"},
      {"\xc3(", {"", "\xef\xbf\xbd("}, ""},
      {"\x80\xe2\x82", {"\xef\xbf\xbd", "", ""}, "\xef\xbf\xbd"},
      /* a surrogate: ED is a valid start until A0 comes; then 3 x U+FFFD */
      {"\xed\xa0\x80", {"", "\xef\xbf\xbd\xef\xbf\xbd", "\xef\xbf\xbd"}, ""},
  };
  for (size_t c = 0; c < sizeof k / sizeof k[0]; c++) {
    mbd_detok *d = NULL;
    size_t nb = strlen(k[c].bytes);
    int32_t ids[8];
    for (size_t i = 0; i < nb; i++) ids[i] = byte_tok[(uint8_t)k[c].bytes[i]];
    /* each push emits only complete characters; the whole equals decode */
    assert_int_equal(mbd_detok_new(t, false, &d, &err), MBD_OK);
    char *acc = NULL;
    size_t acc_len = 0;
    for (size_t i = 0; i < nb; i++) {
      size_t before = acc_len;
      assert_int_equal(mbd_detok_push(d, ids[i], &acc, &acc_len, &err), MBD_OK);
      assert_int_equal(acc_len - before, strlen(k[c].after[i]));
      assert_memory_equal(acc + before, k[c].after[i], acc_len - before);
    }
    size_t before = acc_len;
    assert_int_equal(mbd_detok_flush(d, &acc, &acc_len, &err), MBD_OK);
    assert_string_equal(acc + before, k[c].flush);
    char *whole = decode(t, ids, nb, false);
    assert_string_equal(acc, whole);
    free(whole);
    free(acc);
    mbd_detok_destroy(&d);
  }

  /* random id streams over the whole vocabulary: concatenation == decode */
  uint64_t rng = 12345;
  for (int round = 0; round < 300; round++) {
    int32_t ids[64];
    size_t n = 1 + (size_t)(round % 63);
    for (size_t i = 0; i < n; i++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t r = (uint32_t)(rng >> 33);
      ids[i] = r % 3 ? byte_tok[(r >> 8) & 0xff] : (int32_t)((r >> 8) % 8000);
    }
    for (int skip = 0; skip < 2; skip++) {
      size_t len = 0;
      char *s = detok_all(t, ids, n, skip, &len);
      size_t dl = 0;
      char *d = decode_n(t, ids, n, skip, &dl);
      assert_int_equal(len, dl);
      assert_memory_equal(s, d, len);
      free(s);
      free(d);
    }
  }
  /* ids outside the vocabulary */
  mbd_detok *d = NULL;
  assert_int_equal(mbd_detok_new(t, false, &d, &err), MBD_OK);
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(mbd_detok_push(d, 8000, &buf, &len, &err), MBD_E_INVALID);
  assert_int_equal(mbd_detok_push(d, -1, &buf, &len, &err), MBD_E_INVALID);
  mbd_detok_destroy(&d);
  free(buf);
  int32_t bad_id = 9000;
  char *s = NULL;
  assert_int_equal(mbd_tokenizer_decode(t, &bad_id, 1, false, &s, &len, &err), MBD_E_INVALID);
  assert_null(s);
  mbd_tokenizer_destroy(&t);
}

/* ---- inputs every tokenizer must handle ---------------------------------- */

static void test_empty_and_invalid_utf8(void **state) {
  (void)state;
  char dir[512];
  if (!fixture_dir("neox-like", dir, sizeof dir)) skip();
  mbd_tokenizer *t = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_tokenizer_load(dir, &t, &err), MBD_OK);
  int32_t *ids = NULL;
  size_t n = 99;
  assert_int_equal(mbd_tokenizer_encode(t, "", 0, true, &ids, &n, &err), MBD_OK);
  assert_int_equal(n, 0);
  free(ids);
  char *s = decode(t, NULL, 0, false);
  assert_string_equal(s, "");
  free(s);
  static const char *const bad[] = {"\xff", "ab\xc3", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\x80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ids = (int32_t *)1;
    assert_int_equal(mbd_tokenizer_encode(t, bad[i], strlen(bad[i]), false, &ids, &n, &err), MBD_E_INVALID);
    assert_null(ids);
    assert_non_null(strstr(err.msg, "UTF-8"));
  }
  /* NUL is a character like any other */
  assert_int_equal(mbd_tokenizer_encode(t, "a\0b", 3, false, &ids, &n, &err), MBD_OK);
  assert_true(n >= 2);
  free(ids);
  /* ... also where the normalizer runs: NFC keeps it and composes around it */
  static const char nul_text[] = "\xc3\xa9\0e\xcc\x81";
  assert_int_equal(mbd_tokenizer_encode(t, nul_text, sizeof nul_text - 1, false, &ids, &n, &err), MBD_OK);
  size_t dl = 0;
  char *d = decode_n(t, ids, n, false, &dl);
  assert_int_equal(dl, 5);
  assert_memory_equal(d, "\xc3\xa9\0\xc3\xa9", 5);
  free(d);
  free(ids);
  assert_int_equal(mbd_tokenizer_token_id(t, "<|endoftext|>"), 0);
  assert_true(mbd_tokenizer_is_special(t, 0));
  assert_false(mbd_tokenizer_is_special(t, 5));
  assert_int_equal(mbd_tokenizer_token_id(t, "no such token here"), -1);
  size_t tl = 0;
  const char *tok = mbd_tokenizer_id_token(t, mbd_tokenizer_token_id(t, "\xc4\xa0the"), &tl);
  assert_non_null(tok);
  assert_int_equal(tl, 5);
  assert_memory_equal(tok, "\xc4\xa0the", 5);
  assert_null(mbd_tokenizer_id_token(t, 8000, &tl));
  assert_null(mbd_tokenizer_id_bytes(t, -1, &tl));
  assert_int_equal(tl, 0);
  mbd_tokenizer_destroy(&t);
  mbd_tokenizer_destroy(&t); /* NULL-safe */
}

/* ---- hand-made tokenizers ------------------------------------------------ */

/* Vocabulary a b - b- -a ab -- with merges in that rank order, so where the
 * pieces end shows in the ids. No decoder: tokens join with spaces. */
#define SPLIT_MODEL                                                                           \
  "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"b-\": 3, \"-a\": 4, " \
  "\"ab\": 5, \"--\": 6}, \"merges\": [[\"b\", \"-\"], [\"-\", \"a\"], [\"a\", \"b\"], \"- -\"]}"

static void check_split(const char *pattern, const char *behavior, bool invert, const char *text,
                        const int32_t *want, size_t n_want) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": %s, \"behavior\": \"%s\", "
           "\"invert\": %s}, " SPLIT_MODEL "}",
           pattern, behavior, invert ? "true" : "false");
  mbd_error err = {0};
  mbd_tokenizer *t = load_str(json, &err);
  if (!t) fail_msg("%s", err.msg);
  int32_t ids[32];
  size_t n = encode(t, text, false, ids, 32);
  if (n != n_want || memcmp(ids, want, n * sizeof *ids)) {
    print_ids("got", ids, n);
    fail_msg("Split %s %s invert=%d on \"%s\"", pattern, behavior, invert, text);
  }
  mbd_tokenizer_destroy(&t);
}

static void test_split_behaviors(void **state) {
  (void)state;
  const char *dash = "{\"String\": \"-\"}";
  check_split(dash, "Isolated", false, "ab-ab", (int32_t[]){5, 2, 5}, 3);
  check_split(dash, "Removed", false, "ab-ab", (int32_t[]){5, 5}, 2);
  check_split(dash, "MergedWithPrevious", false, "ab-ab", (int32_t[]){0, 3, 5}, 3);
  check_split(dash, "MergedWithNext", false, "ab-ab", (int32_t[]){5, 4, 1}, 3);
  check_split(dash, "Isolated", false, "ab--ab", (int32_t[]){5, 2, 2, 5}, 4);
  check_split(dash, "Contiguous", false, "ab--ab", (int32_t[]){5, 6, 5}, 3);
  check_split(dash, "Removed", true, "ab-ab", (int32_t[]){2}, 1);
  check_split("{\"Regex\": \"-+\"}", "Isolated", false, "ab--ab", (int32_t[]){5, 6, 5}, 3);
  check_split("{\"Regex\": \"[a-z]+\"}", "Removed", true, "ab-ab", (int32_t[]){5, 5}, 2);
  /* ^ anchors at each line, as in Oniguruma's Ruby syntax ("\n" is not in the
   * vocabulary: dropped) */
  check_split("{\"Regex\": \"^a\"}", "Isolated", false, "ab\nab", (int32_t[]){0, 1, 0, 1}, 4);
  /* \s is White_Space, as in Oniguruma: U+180E is not a space (PCRE2 alone says it is) */
  check_split("{\"Regex\": \"\\\\s+\"}", "Isolated", false, "a\xe1\xa0\x8e" "b", (int32_t[]){5}, 1);
  check_split("{\"Regex\": \"[\\\\s]+\"}", "Isolated", false, "a\xe1\xa0\x8e" "b", (int32_t[]){5}, 1);
  check_split("{\"Regex\": \"\\\\S+\"}", "Isolated", false, "a\xe1\xa0\x8e" "b", (int32_t[]){5}, 1);
  check_split("{\"Regex\": \"\\\\s\"}", "Removed", false, "ab ab", (int32_t[]){5, 5}, 2);
  /* a literal String pattern is not a regex */
  check_split("{\"String\": \"-+\"}", "Isolated", false, "ab--ab", (int32_t[]){0, 3, 4, 1}, 4);
}

static void test_template_and_added_flags(void **state) {
  (void)state;
  const char *json =
      "{\"added_tokens\": ["
      "{\"id\": 3, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
      "{\"id\": 4, \"content\": \"</s>\", \"special\": true, \"normalized\": false},"
      "{\"id\": 6, \"content\": \"[M]\", \"lstrip\": true, \"rstrip\": true, \"normalized\": false},"
      "{\"id\": 7, \"content\": \"b\", \"single_word\": true, \"normalized\": false}],"
      "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
      "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
      "{\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {"
      "\"<s>\": {\"id\": \"<s>\", \"ids\": [3], \"tokens\": [\"<s>\"]},"
      "\"</s>\": {\"id\": \"</s>\", \"ids\": [4], \"tokens\": [\"</s>\"]}}},"
      "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, \"ab\": 5}, "
      "\"merges\": [\"a b\"]}}";
  mbd_error err = {0};
  mbd_tokenizer *t = load_str(json, &err);
  if (!t) fail_msg("%s", err.msg);
  assert_int_equal(mbd_tokenizer_vocab_size(t), 8);
  int32_t ids[32];
  size_t n = encode(t, "ab", false, ids, 32); /* "b" is not a single word here */
  assert_int_equal(n, 1);
  assert_int_equal(ids[0], 5);
  n = encode(t, "ab", true, ids, 32);
  assert_int_equal(n, 3);
  assert_memory_equal(ids, ((int32_t[]){3, 5, 4}), 3 * sizeof *ids);
  n = encode(t, "a b", false, ids, 32);
  assert_int_equal(n, 3);
  assert_memory_equal(ids, ((int32_t[]){0, 2, 7}), 3 * sizeof *ids);
  n = encode(t, "a  [M]  a", false, ids, 32); /* lstrip and rstrip take the spaces */
  assert_int_equal(n, 3);
  assert_memory_equal(ids, ((int32_t[]){0, 6, 0}), 3 * sizeof *ids);
  n = encode(t, "<s>ab</s>", false, ids, 32);
  assert_int_equal(n, 3);
  assert_memory_equal(ids, ((int32_t[]){3, 5, 4}), 3 * sizeof *ids);
  char *s = decode(t, ids, n, false);
  assert_string_equal(s, "<s> ab </s>");
  free(s);
  s = decode(t, ids, n, true);
  assert_string_equal(s, "ab");
  free(s);
  size_t len;
  s = detok_all(t, ids, n, false, &len);
  assert_string_equal(s, "<s> ab </s>");
  free(s);
  assert_int_equal(mbd_tokenizer_token_id(t, "b"), 7); /* added tokens first */
  assert_int_equal(mbd_tokenizer_token_id(t, "ab"), 5);
  size_t tl = 0;
  assert_null(mbd_tokenizer_id_bytes(t, 5, &tl)); /* no ByteLevel decoder */
  assert_non_null(mbd_tokenizer_id_token(t, 5, &tl));
  assert_int_equal(tl, 2);
  mbd_tokenizer_destroy(&t);
}

static void test_nfkc_and_unk(void **state) {
  (void)state;
  mbd_error err = {0};
#define FMT                                                                                 \
  "{\"normalizer\": %s, \"model\": {\"vocab\": {\"f\": 0, \"i\": 1, \"fi\": 2, \"<unk>\": 3}, " \
  "\"merges\": [\"f i\"], \"unk_token\": %s, \"fuse_unk\": true}}"
  char json[512];
  int32_t ids[8];
  snprintf(json, sizeof json, FMT, "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}]}", "null");
  mbd_tokenizer *t = load_str(json, &err);
  if (!t) fail_msg("%s", err.msg);
  assert_int_equal(encode(t, "\xef\xac\x81", false, ids, 8), 1); /* U+FB01 -> "fi" */
  assert_int_equal(ids[0], 2);
  mbd_tokenizer_destroy(&t);
  snprintf(json, sizeof json, FMT, "{\"type\": \"NFC\"}", "null");
  t = load_str(json, &err);
  assert_non_null(t);
  assert_int_equal(encode(t, "\xef\xac\x81", false, ids, 8), 0); /* no unk: dropped */
  mbd_tokenizer_destroy(&t);
  snprintf(json, sizeof json, FMT, "null", "\"<unk>\"");
  t = load_str(json, &err);
  assert_non_null(t);
  size_t n = encode(t, "f\xef\xac\x81\xef\xac\x81i", false, ids, 8); /* two unknowns fuse */
  assert_int_equal(n, 3);
  assert_memory_equal(ids, ((int32_t[]){0, 3, 1}), 3 * sizeof *ids);
  mbd_tokenizer_destroy(&t);
#undef FMT
}

/* ---- malformed tokenizer.json -------------------------------------------- */

static void test_malformed(void **state) {
  (void)state;
#define M "\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"
  static const struct {
    const char *json;
    const char *field; /* the message must name it */
  } k[] = {
      {"", "bad JSON"},
      {"{\"model\": ", "bad JSON"},
      {"[1, 2]", "top level"},
      {"{}", "model"},
      {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type"},
      {"{\"model\": {\"vocab\": [], \"merges\": []}}", "model.vocab"},
      {"{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}", "model.vocab[\"a\"]"},
      {"{\"model\": {\"vocab\": {\"a\": 99999999999}, \"merges\": []}}", "too large"},
      {"{\"model\": {\"vocab\": {\"a\": 1.5}, \"merges\": []}}", "not an integer"},
      {"{\"model\": {\"vocab\": {\"a\": 5000000}, \"merges\": []}}", "far beyond"},
      {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", "two tokens"},
      {"{\"model\": {\"vocab\": {\"a\": 0}}}", "model.merges"},
      {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}", "model.merges[0]"},
      {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", "\"ab\" is not in model.vocab"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", "model.merges[0]"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", "model.merges[0]"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"?\"}}", "model.unk_token"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}", "model.dropout"},
      {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"fuse_unk\": 3}}", "fuse_unk"},
      {"{\"added_tokens\": [{\"id\": -4, \"content\": \"x\"}], " M "}", "added_tokens[0]"},
      {"{\"added_tokens\": [{\"id\": 16777216, \"content\": \"x\"}], " M "}", "too large"},
      {"{\"added_tokens\": [{\"id\": 5}], " M "}", "added_tokens[0]"},
      {"{\"added_tokens\": [{\"id\": 5, \"content\": \"\"}], " M "}", "added_tokens[0]"},
      {"{\"added_tokens\": [{\"id\": 5, \"content\": \"x\", \"special\": \"yes\"}], " M "}", "added_tokens[0]"},
      {"{\"added_tokens\": 7, " M "}", "added_tokens"},
      {"{\"normalizer\": {\"type\": \"Lowercase\"}, " M "}", "normalizer.type"},
      {"{\"normalizer\": {\"type\": \"Sequence\"}, " M "}", "normalizer.normalizers"},
      {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {}]}, " M "}",
       "normalizer.normalizers[1].type"},
      {"{\"normalizer\": 5, " M "}", "normalizer"},
      {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, " M "}", "pre_tokenizer.type"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, " M "}",
       "pre_tokenizer.pattern"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": \"x\", \"behavior\": \"Isolated\"}, " M "}",
       "pre_tokenizer.pattern"},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"behavior\": \"Sideways\"}, " M "}",
       "pre_tokenizer.behavior"},
      {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, "
       "{\"type\": \"Split\", \"pattern\": {\"String\": \"x\"}, \"behavior\": \"Isolated\"}]}, " M "}",
       "pre_tokenizer.pretokenizers[1]"},
      {"{\"decoder\": {\"type\": \"WordPiece\"}, " M "}", "decoder.type"},
      {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, {\"type\": 3}]}, " M "}",
       "decoder.decoders[1].type"},
      {"{\"post_processor\": {\"type\": \"BertProcessing\"}, " M "}", "post_processor.type"},
      {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
       " {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}, " M "}",
       "post_processor.special_tokens[\"<s>\"]"},
      {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
       " {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [77]}}}, " M "}",
       "post_processor.special_tokens[\"<s>\"].ids[0]"},
      {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [], \"special_tokens\": {}}, " M "}",
       "post_processor.single"},
      {"{\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": \"X\"}]}, " M "}",
       "post_processor.processors[1].type"},
      {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": ["
       "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", "
       "\"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": ["
       "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", "
       "\"normalizers\": []}]}]}]}]}]}]}]}]}]}, " M "}",
       "nested too deeply"},
  };
#undef M
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    mbd_tokenizer *t = (mbd_tokenizer *)1;
    mbd_error err = {0};
    int rc = mbd_tokenizer_load_bytes(k[i].json, strlen(k[i].json), "bad.json", &t, &err);
    if (rc != MBD_E_FORMAT || !strstr(err.msg, k[i].field) || strncmp(err.msg, "bad.json: ", 10))
      fail_msg("case %zu: rc %d, message \"%s\" should name \"%s\"", i, rc, err.msg, k[i].field);
    assert_null(t);
  }
  mbd_tokenizer *t = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_tokenizer_load("/nonexistent/tokenizer.json", &t, &err), MBD_E_IO);
  assert_int_equal(mbd_tokenizer_load("/tmp", &t, &err) != 0, 1); /* a directory without tokenizer.json */
  assert_null(t);
}

/* ---- one tokenizer, several threads ------------------------------------- */

typedef struct thread_job {
  const mbd_tokenizer *t;
  const json_t *cases; /* array of the fixture's case objects */
  int offset;          /* each thread starts elsewhere in the list */
  int bad;
} thread_job;

static void *encode_all(void *arg) {
  thread_job *j = arg;
  size_t n_cases = json_array_size(j->cases);
  for (size_t k = 0; k < 3 * n_cases; k++) {
    const json_t *c = json_array_get(j->cases, (k + (size_t)j->offset) % n_cases);
    const json_t *text = json_object_get(c, "text");
    int32_t *ids = NULL;
    size_t n = 0;
    mbd_error err = {0};
    if (mbd_tokenizer_encode(j->t, json_string_value(text), json_string_length(text), false, &ids, &n, &err) ||
        !ids_equal(ids, n, json_object_get(c, "ids")))
      j->bad++;
    free(ids);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  char dir[512];
  if (!fixture_dir("qwen3", dir, sizeof dir)) skip();
  mbd_tokenizer *t = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_tokenizer_load(dir, &t, &err), MBD_OK);
  char path[700];
  snprintf(path, sizeof path, "%s/cases.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  json_t *cases = json_array();
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  while ((got = getline(&line, &cap, f)) > 0)
    json_array_append_new(cases, json_loadb(line, (size_t)got, JSON_ALLOW_NUL, NULL));
  free(line);
  fclose(f);
  thread_job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (thread_job){t, cases, i * 97, 0};
    assert_int_equal(pthread_create(&th[i], NULL, encode_all, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(jobs[i].bad, 0);
  }
  json_decref(cases);
  mbd_tokenizer_destroy(&t);
}

/* ---- the synthetic checkpoints' tokenizer ------------------------------- */

static void test_synth_tokenizer(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd_synthtok_XXXXXX";
  assert_non_null(mkdtemp(dir));
  static const int64_t sizes[] = {1, 100, 257, 512, 50280};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    mbd_error err = {0};
    assert_int_equal(mbd_synth_tokenizer_write(sizes[k], dir, &err), MBD_OK);
    mbd_tokenizer *t = NULL;
    if (mbd_tokenizer_load(dir, &t, &err)) fail_msg("vocab %lld: %s", (long long)sizes[k], err.msg);
    assert_int_equal(mbd_tokenizer_vocab_size(t), sizes[k]); /* every id the model can emit */
    assert_true(mbd_tokenizer_is_special(t, 0));
    for (int32_t id = 0; id < sizes[k]; id++) {
      char *s = NULL;
      size_t len = 0;
      assert_int_equal(mbd_tokenizer_decode(t, &id, 1, false, &s, &len, &err), MBD_OK);
      free(s);
    }
    if (sizes[k] >= 257) { /* all bytes present: text survives the round trip */
      const char *text = "the quick brown fox, Zebra! 12 caf\xc3\xa9 \xf0\x9f\x98\x80<|endoftext|>";
      int32_t ids[256];
      size_t n = encode(t, text, false, ids, 256);
      assert_int_equal(ids[n - 1], 0);
      char *s = decode(t, ids, n, false);
      assert_string_equal(s, text);
      free(s);
      if (sizes[k] == 50280) assert_true(n < 30); /* merges do work */
    }
    mbd_tokenizer_destroy(&t);
  }
  char path[64];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture_neox),
      cmocka_unit_test(test_fixture_qwen3),
      cmocka_unit_test(test_fixture_gpt4o),
      cmocka_unit_test(test_detok_split_chars),
      cmocka_unit_test(test_empty_and_invalid_utf8),
      cmocka_unit_test(test_split_behaviors),
      cmocka_unit_test(test_template_and_added_flags),
      cmocka_unit_test(test_nfkc_and_unk),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_synth_tokenizer),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
