/* Hugging Face tokenizer.json, loaded and run in C: byte-level BPE with its
 * normalizers, pre-tokenizers, added tokens, decoders and post-processors, so
 * that text in and text out give exactly the ids and strings that the
 * `tokenizers` library gives (tests/unit/test_tokenizer.c checks every case of
 * the shared fixtures). Regexes run on PCRE2 (UTF + UCP), normalization on
 * utf8proc; no Unicode tables are written here.
 *
 * A loaded tokenizer is immutable: encode and decode may run from several
 * threads at once. Ownership: `char *` / `int32_t *` results are the caller's
 * (free()); `const char *` results are borrowed from the tokenizer. */
#ifndef MBD_TOKENIZER_H
#define MBD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct mbd_tokenizer mbd_tokenizer;

/* Loads `path`: a tokenizer.json file, or a model directory holding one.
 * Malformed input (bad JSON, unknown component types, merges naming missing
 * tokens, negative or huge ids) fails with MBD_E_FORMAT naming the field. */
int mbd_tokenizer_load(const char *path, mbd_tokenizer **out, mbd_error *err);
/* Same from bytes in memory (the fuzz target's entry); `what` names the
 * source in error messages. */
int mbd_tokenizer_load_bytes(const char *json, size_t len, const char *what, mbd_tokenizer **out,
                             mbd_error *err);
/* NULL-safe; nulls *t. */
void mbd_tokenizer_destroy(mbd_tokenizer **t);

/* SHA-256 (64 lower-case hex digits) of the tokenizer.json bytes loaded: the
 * tokenizer's part of a model's identity. */
const char *mbd_tokenizer_digest(const mbd_tokenizer *t);
/* Number of ids, added tokens included (largest id + 1). */
int64_t mbd_tokenizer_vocab_size(const mbd_tokenizer *t);
/* Id of a token's exact string (vocabulary or added token), or -1. */
int32_t mbd_tokenizer_token_id(const mbd_tokenizer *t, const char *token);
/* Whether id is an added token marked special (what skip_special drops). */
bool mbd_tokenizer_is_special(const mbd_tokenizer *t, int32_t id);
/* The token string of id as the vocabulary spells it (for a byte-level BPE
 * in the GPT-2 alphabet, e.g. "\xc4\xa0the" for " the"), borrowed and NOT
 * NUL-terminated: *len gets its length. NULL for an id outside the vocabulary. */
const char *mbd_tokenizer_id_token(const mbd_tokenizer *t, int32_t id, size_t *len);
/* The raw bytes the decoder gives for id alone, before invalid UTF-8 is
 * replaced (a token may hold part of a character): borrowed, NOT
 * NUL-terminated, *len its length. NULL for an id outside the vocabulary or
 * when the decoder is not ByteLevel (then decode the id instead). */
const char *mbd_tokenizer_id_bytes(const mbd_tokenizer *t, int32_t id, size_t *len);

/* text[0..len) (UTF-8; invalid UTF-8 is MBD_E_INVALID) -> *ids[0..*n).
 * add_special: apply the post-processor's template (BOS/EOS). */
int mbd_tokenizer_encode(const mbd_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n, mbd_error *err);
/* ids -> *text[0..*len) (NUL-terminated), invalid UTF-8 replaced by U+FFFD as
 * the library does. An id outside the vocabulary is MBD_E_INVALID. */
int mbd_tokenizer_decode(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len, mbd_error *err);

/* Incremental detokenizer for streaming: fed one id at a time, it emits only
 * complete UTF-8, holding back a character split across ids, so that the
 * concatenation of everything it emits (flush included) equals
 * mbd_tokenizer_decode of all the ids. */
typedef struct mbd_detok mbd_detok;
int mbd_detok_new(const mbd_tokenizer *t, bool skip_special, mbd_detok **out, mbd_error *err);
void mbd_detok_destroy(mbd_detok **d);
/* Appends the text that id completes to *buf (realloc'd; *len updated,
 * NUL-terminated). */
int mbd_detok_push(mbd_detok *d, int32_t id, char **buf, size_t *len, mbd_error *err);
/* Appends what is held back (an incomplete character becomes U+FFFD). */
int mbd_detok_flush(mbd_detok *d, char **buf, size_t *len, mbd_error *err);

#endif
