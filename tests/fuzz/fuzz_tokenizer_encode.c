/* Fuzz target: encode of arbitrary bytes with a fixed tokenizer (the neox-like
 * fixture when $MBD_FIXTURES_DIR has it, else a built-in byte-level BPE).
 * Invalid UTF-8 is refused with MBD_E_INVALID; valid text gives ids inside the
 * vocabulary, decode(encode(x)) equals NFC(x) (byte-level BPE loses nothing
 * but the normalizer's work), and the incremental detokenizer's output equals
 * decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/tokenizer/tokenizer.h"
#include "mbd_fuzz.h"

/* 256 byte tokens (the GPT-2 characters), a few merges, NFC. */
static char *builtin_json(void) {
  size_t cap = 16384, n = 0;
  char *j = malloc(cap);
  n += (size_t)snprintf(j + n, cap - n,
                        "{\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                        "\"add_prefix_space\": false}, \"decoder\": {\"type\": \"ByteLevel\"}, "
                        "\"added_tokens\": [{\"id\": 259, \"content\": \"<|e|>\", \"special\": true, "
                        "\"normalized\": false}], \"model\": {\"vocab\": {");
  int k = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    int cp = printable ? b : 256 + k++;
    n += (size_t)snprintf(j + n, cap - n, "\"\\u%04x\": %d, ", cp, b);
  }
  snprintf(j + n, cap - n, "\"th\": 256, \"\\u0120th\": 257, \"\\u0120the\": 258}, \"merges\": "
                           "[\"t h\", \"\\u0120 th\", \"\\u0120th e\"]}}");
  return j;
}

static mbd_tokenizer *g_tok; /* loaded once per process */

static const mbd_tokenizer *fixed(void) {
  if (g_tok) return g_tok;
  mbd_error err = {0};
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizers/neox-like", fx ? fx : "");
  if (!fx || mbd_tokenizer_load(path, &g_tok, &err)) {
    char *j = builtin_json();
    int rc = mbd_tokenizer_load_bytes(j, strlen(j), "builtin", &g_tok, &err);
    free(j);
    if (rc) fprintf(stderr, "fuzz_tokenizer_encode: %s\n", err.msg);
    MBD_FUZZ_CHECK(rc == 0);
  }
  return g_tok;
}

__attribute__((destructor)) static void drop(void) { mbd_tokenizer_destroy(&g_tok); }

static void check(const mbd_tokenizer *t, const uint8_t *data, size_t size);

/* Short valid inputs run again repeated 300 times, past the point where the
 * encoder starts caching pieces. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const mbd_tokenizer *t = fixed();
  check(t, data, size);
  if (size && size <= 32) {
    uint8_t *rep = malloc(size * 300 + 300);
    size_t n = 0;
    for (int i = 0; i < 300; i++) {
      memcpy(rep + n, data, size);
      n += size;
      rep[n++] = (uint8_t)(i % 3 ? ' ' : '\n');
    }
    check(t, rep, n);
    free(rep);
  }
  return 0;
}

static void check(const mbd_tokenizer *t, const uint8_t *data, size_t size) {
  int32_t *ids = NULL;
  size_t n = 0;
  mbd_error err = {0};
  int rc = mbd_tokenizer_encode(t, (const char *)data, size, false, &ids, &n, &err);
  utf8proc_int32_t cp;
  bool valid = true;
  for (size_t i = 0; i < size && valid;) {
    utf8proc_ssize_t k = utf8proc_iterate(data + i, (utf8proc_ssize_t)(size - i), &cp);
    if (k <= 0) valid = false;
    else i += (size_t)k;
  }
  if (!valid) {
    MBD_FUZZ_CHECK(rc == MBD_E_INVALID && ids == NULL);
    return;
  }
  MBD_FUZZ_CHECK(rc == 0);
  for (size_t i = 0; i < n; i++) MBD_FUZZ_CHECK(ids[i] >= 0 && ids[i] < mbd_tokenizer_vocab_size(t));
  char *s = NULL;
  size_t len = 0;
  MBD_FUZZ_CHECK(mbd_tokenizer_decode(t, ids, n, false, &s, &len, &err) == 0);
  utf8proc_uint8_t *nfc = NULL;
  utf8proc_ssize_t nl = size ? utf8proc_map(data, (utf8proc_ssize_t)size, &nfc,
                                            (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE))
                             : 0;
  MBD_FUZZ_CHECK(nl >= 0);
  MBD_FUZZ_CHECK((size_t)nl == len && (!len || !memcmp(nfc, s, len)));
  free(nfc);

  mbd_detok *d = NULL;
  MBD_FUZZ_CHECK(mbd_detok_new(t, false, &d, &err) == 0);
  char *acc = NULL;
  size_t acc_len = 0;
  for (size_t i = 0; i < n; i++) MBD_FUZZ_CHECK(mbd_detok_push(d, ids[i], &acc, &acc_len, &err) == 0);
  MBD_FUZZ_CHECK(mbd_detok_flush(d, &acc, &acc_len, &err) == 0);
  MBD_FUZZ_CHECK(acc_len == len && !memcmp(acc, s, len));
  mbd_detok_destroy(&d);
  free(acc);
  free(s);
  free(ids);
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("The quick brown fox jumps over the lazy dog."),
      S("  indented\n\tcode(x) -> y  # comment\r\n<|endoftext|>"),
      S("Caf\xc3\xa9 cafe\xcc\x81 \xef\xac\x81 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd 12345"),
      S("I'm, you're; they'll've -- 3.14e10 !!! ???"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
