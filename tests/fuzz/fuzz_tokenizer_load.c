/* Fuzz target: tokenizer.json loading. Whatever the bytes, the loader returns
 * an error naming the source (and a NULL tokenizer), or a tokenizer that
 * encodes and decodes a fixed text with every id inside its vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tokenizer.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_tokenizer *t = (mbd_tokenizer *)1;
  mbd_error err = {0};
  int rc = mbd_tokenizer_load_bytes((const char *)data, size, "fuzz.json", &t, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && t == NULL);
    MBD_FUZZ_CHECK(!strncmp(err.msg, "fuzz.json: ", 11) || rc == MBD_E_NOMEM);
    return 0;
  }
  MBD_FUZZ_CHECK(t != NULL && mbd_tokenizer_vocab_size(t) > 0);
  MBD_FUZZ_CHECK(strlen(mbd_tokenizer_digest(t)) == 64);
  static const char text[] = "Hello, w\xc3\xb6rld! <s> 123  ab\tab\n\xe2\x82\xac";
  int32_t *ids = NULL;
  size_t n = 0;
  rc = mbd_tokenizer_encode(t, text, sizeof text - 1, true, &ids, &n, &err);
  if (!rc) {
    for (size_t i = 0; i < n; i++) MBD_FUZZ_CHECK(ids[i] >= 0 && ids[i] < mbd_tokenizer_vocab_size(t));
    char *s = NULL;
    size_t len = 0;
    MBD_FUZZ_CHECK(mbd_tokenizer_decode(t, ids, n, false, &s, &len, &err) == 0);
    MBD_FUZZ_CHECK(s != NULL && s[len] == '\0');
    free(s);
  } else {
    MBD_FUZZ_CHECK(ids == NULL && err.code == rc); /* a Split regex may hit its match limit */
  }
  free(ids);
  mbd_tokenizer_destroy(&t);
  MBD_FUZZ_CHECK(t == NULL);
  return 0;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
#define S(txt) {(const uint8_t *)(txt), sizeof(txt) - 1}
  static const mbd_fuzz_seed seeds[] = {
      S("{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 6, \"content\": \"<s>\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 7, "
        "\"content\": \"  \", \"normalized\": true, \"special\": false}], \"normalizer\": {\"type\": \"NFC\"}, "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
        "\"use_regex\": true}, \"post_processor\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": "
        "\"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
        "\"vocab\": {\"H\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"He\": 4, \"ll\": 5}, \"merges\": [\"H e\", "
        "[\"l\", \"l\"]]}}"),
      S("{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}]}, "
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"\\\\p{L}+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
        "{\"type\": \"Split\", \"pattern\": {\"String\": \"b\"}, \"behavior\": \"MergedWithNext\"}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}]}, "
        "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}]}, "
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"a\"}}, "
        "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"a\": {\"ids\": [0]}}}, "
        "\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3}, \"merges\": [\"a b\"], "
        "\"ignore_merges\": true}}"),
      S("{\"added_tokens\": [{\"id\": 3, \"content\": \"[M]\", \"lstrip\": true, \"rstrip\": true, "
        "\"single_word\": true}], \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
        "\"behavior\": \"Contiguous\", \"invert\": true}, \"model\": {\"vocab\": {\"a\": 0, \"-\": 1, "
        "\"<unk>\": 2}, \"merges\": [], \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true}}"),
  };
#undef S
  *out = seeds;
  return sizeof seeds / sizeof seeds[0];
}
