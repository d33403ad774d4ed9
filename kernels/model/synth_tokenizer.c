/* The synthetic checkpoints' tokenizer.json (see synth_tokenizer.h). Token
 * strings are written in the GPT-2 byte alphabet, where byte b stands for
 * itself when printable and for U+0100 + n otherwise (the n-th unprintable
 * byte), as tokenizers' ByteLevel does. */
#include "kernels/model/synth_tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Byte-level character of byte b, as UTF-8 into out (3 bytes room). */
static void byte_char(int b, char out[3]) {
  int n = 0, cp = b;
  bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  if (!printable) {
    for (int k = 0; k < b; k++)
      if (!((k >= '!' && k <= '~') || (k >= 0xa1 && k <= 0xac) || (k >= 0xae && k <= 0xff))) n++;
    cp = 256 + n;
  }
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = '\0';
  } else {
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    out[2] = '\0';
  }
}

/* Bytes in the order they enter a small vocabulary: common first. */
static void byte_order(int order[256]) {
  static const char common[] = " etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,'\"-\n:;!?()";
  bool used[256] = {false};
  int n = 0;
  for (const char *c = common; *c; c++) {
    order[n++] = (uint8_t)*c;
    used[(uint8_t)*c] = true;
  }
  for (int b = 0; b < 256; b++)
    if (!used[b]) order[n++] = b;
}

int mbd_synth_tokenizer_write(int64_t vocab, const char *dir, mbd_error *err) {
  if (vocab < 1) return mbd_error_set(err, MBD_E_INVALID, "synthetic tokenizer: vocab %lld < 1", (long long)vocab);
  json_t *root = json_object(), *v = json_object(), *merges = json_array();
  int rc = 0;
  json_object_set_new(v, "<|endoftext|>", json_integer(0));
  int order[256];
  byte_order(order);
  int64_t id = 1;
  for (int i = 0; i < 256 && id < vocab; i++) {
    char c[3];
    byte_char(order[i], c);
    json_object_set_new(v, c, json_integer(id++));
  }
  /* merges: strings over this alphabet ('G' stands for the space's Ġ), by
   * length; each is (its prefix) + (its last character), both already in */
  static const char *const alpha[] = {"\xc4\xa0", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u",
                                      "c", "m", "f", "w", "y", "p", "v", "b", "g", "k", "j", "q", "x", "z"};
  const int A = (int)(sizeof alpha / sizeof alpha[0]);
  for (int len = 2; id < vocab && len <= 8; len++) {
    int digits[8] = {0};
    for (;;) {
      char s[32] = "", prefix[32] = "";
      for (int k = 0; k < len; k++) {
        strcat(s, alpha[digits[k]]);
        if (k < len - 1) strcat(prefix, alpha[digits[k]]);
      }
      if (id >= vocab) break;
      json_object_set_new(v, s, json_integer(id++));
      json_t *m = json_array();
      json_array_append_new(m, json_string(prefix));
      json_array_append_new(m, json_string(alpha[digits[len - 1]]));
      json_array_append_new(merges, m);
      int k = len - 1; /* next string of this length, last character fastest */
      while (k >= 0 && ++digits[k] == A) digits[k--] = 0;
      if (k < 0) break;
    }
  }
  json_t *bl = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                         "use_regex", 1);
  json_object_set_new(root, "version", json_string("1.0"));
  json_object_set_new(root, "truncation", json_null());
  json_object_set_new(root, "padding", json_null());
  json_object_set_new(root, "added_tokens",
                      json_pack("[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}]", "id", 0, "content", "<|endoftext|>",
                                "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
  json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
  json_object_set_new(root, "pre_tokenizer", json_deep_copy(bl));
  json_object_set_new(root, "post_processor", json_deep_copy(bl));
  json_object_set_new(root, "decoder", bl);
  json_object_set_new(root, "model",
                      json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                                "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                                "byte_fallback", 0, "ignore_merges", 0, "vocab", v, "merges", merges));
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER))
    rc = mbd_error_set(err, MBD_E_IO, "%s: cannot write the synthetic tokenizer", path);
  json_decref(root);
  return rc;
}
