/* The tokenizer's parts as the loader builds them and the encoder, decoder and
 * detokenizer read them. Private to common/tokenizer/: nothing outside it
 * includes this header. Sequences in tokenizer.json (normalizers,
 * pre-tokenizers, decoders, post-processors) are flattened into one list of
 * steps each, which keeps their meaning: each step applies in order to every
 * piece the steps before it produced. */
#ifndef MBD_TOK_INTERNAL_H
#define MBD_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

/* Ids at or above this are refused as "huge": no published vocabulary comes
 * near it and every per-id table stays a few hundred MB at most. */
#define TOK_MAX_IDS (1 << 24)
/* Nesting of Sequence components accepted by the loader. */
#define TOK_MAX_DEPTH 8
#define TOK_MAX_STEPS 32

/* ---- string -> id map (tok_strmap.c) ---------------------------------- */

/* Open-addressing hash map from byte strings (NULs allowed) to ids; keys are
 * copied into the map's own blob. */
typedef struct tok_strmap {
  uint32_t *slots;   /* [cap] entry index + 1, 0 = empty */
  size_t cap;        /* power of two */
  uint32_t *key_off; /* [n] key start in blob */
  uint32_t *key_len; /* [n] key length */
  int32_t *val;      /* [n] id */
  size_t n, n_cap;   /* entries used / allocated */
  char *blob;        /* all keys, back to back */
  size_t blob_len, blob_cap;
} tok_strmap;

void tok_strmap_free(tok_strmap *m);
/* Inserts key -> id; when the key is present already, leaves it and returns 1.
 * 0 when inserted, MBD_E_NOMEM on allocation failure. */
int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t id);
/* The id of key, or -1. */
int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len);

/* ---- BPE merges (tok_bpe.c) ------------------------------------------- */

/* (left id, right id) -> (rank, merged id), open addressing; one slot is one
 * 16-byte entry so a lookup touches one cache line. */
typedef struct tok_merge_slot {
  uint64_t key;     /* (left << 32 | right) + 1, 0 = empty */
  int32_t rank;
  int32_t merged;
} tok_merge_slot;

typedef struct tok_merges {
  tok_merge_slot *slot; /* [cap] */
  size_t cap, n;
} tok_merges;

void tok_merges_free(tok_merges *m);
/* Inserts or overwrites (a later duplicate wins, as in the library). */
int tok_merges_put(tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged);

/* ---- components ------------------------------------------------------- */

typedef enum tok_norm_kind { TOK_NORM_NFC, TOK_NORM_NFKC, TOK_NORM_NFD, TOK_NORM_NFKD } tok_norm_kind;

typedef enum tok_split_behavior {
  TOK_SPLIT_REMOVED,
  TOK_SPLIT_ISOLATED,
  TOK_SPLIT_MERGED_WITH_PREVIOUS,
  TOK_SPLIT_MERGED_WITH_NEXT,
  TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum tok_pre_kind { TOK_PRE_BYTE_LEVEL, TOK_PRE_SPLIT } tok_pre_kind;

typedef struct tok_pre {
  tok_pre_kind kind;
  pcre2_code *re;       /* Split's pattern, or ByteLevel's GPT-2 regex (NULL: use_regex false) */
  bool add_prefix_space;/* ByteLevel */
  tok_split_behavior behavior; /* Split (ByteLevel splits Isolated) */
  bool invert;          /* Split: the matches are the pieces' complement */
} tok_pre;

typedef struct tok_added {
  char *pattern;        /* what is matched: content, normalized when `normalized` */
  size_t len;           /* bytes of pattern (> 0) */
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* Added tokens of one matching pass (raw text or normalized text), longest
 * pattern first so the first hit at a position is the longest. */
typedef struct tok_added_set {
  tok_added *tok;       /* [n] */
  size_t n;
  uint8_t first[256];   /* 1 when some pattern starts with this byte */
} tok_added_set;

typedef enum tok_id_kind { TOK_ID_HOLE = 0, TOK_ID_MODEL, TOK_ID_ADDED, TOK_ID_SPECIAL } tok_id_kind;

struct mbd_tokenizer {
  char digest[65];            /* sha256 hex of the JSON bytes */
  int64_t n_ids;              /* largest id + 1 */
  uint8_t *kind;              /* [n_ids] tok_id_kind */
  /* id -> token string: the added token's content or the vocabulary entry */
  char *str_blob;
  uint32_t *str_off;          /* [n_ids + 1] */
  /* id -> bytes the ByteLevel decoder gives for it alone (when used) */
  char *byte_blob;
  uint32_t *byte_off;         /* [n_ids + 1] */

  tok_strmap vocab;           /* model vocabulary, model-space strings */
  tok_strmap vocab_bytes;     /* byte-level: raw bytes of each entry (ignore_merges only) */
  tok_strmap added_by_content;/* added tokens' content -> id */
  tok_merges merges;
  int32_t unk_id;             /* -1: none */
  bool fuse_unk, byte_fallback, ignore_merges;
  bool byte_level;            /* a ByteLevel pre-tokenizer maps bytes to model chars */
  int32_t byte_id[256];       /* byte-level: id of each byte's char, -1 when absent */

  tok_norm_kind norm[TOK_MAX_STEPS];
  size_t n_norm;
  tok_pre pre[TOK_MAX_STEPS];
  size_t n_pre;

  tok_added_set added_raw;    /* normalized: false, matched in the input */
  tok_added_set added_norm;   /* normalized: true, matched in normalized text */

  bool has_decoder;           /* false: tokens joined with " " */
  size_t n_dec_byte_level;    /* decoder steps, all ByteLevel */

  int32_t *post_prefix;       /* TemplateProcessing ids before $A */
  size_t n_post_prefix;
  int32_t *post_suffix;       /* ... and after it */
  size_t n_post_suffix;
};

/* ---- UTF-8 and the GPT-2 byte table (tok_utf8.c) ---------------------- */

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), or -k (k >= 1)
 * when it is not valid: k is the length of the maximal invalid subpart (what
 * one U+FFFD replaces). *truncated tells that the bytes so far were a valid
 * start and the input ended (more bytes could still complete it). */
int tok_utf8_seq(const uint8_t *s, size_t n, bool *truncated);
/* Offset of the first invalid byte, or len when s is valid UTF-8. */
size_t tok_utf8_check(const char *s, size_t len);
/* Decodes the code point at s (valid UTF-8 assumed); *adv gets its length. */
int32_t tok_utf8_cp(const char *s, size_t n, size_t *adv);
/* Writes cp as UTF-8 into out (>= 4 bytes), returns its length. */
size_t tok_utf8_put(int32_t cp, char *out);
/* Appends s[0..n) with each maximal invalid subpart replaced by U+FFFD (as
 * Rust's String::from_utf8_lossy) to *buf. */
int tok_utf8_lossy_append(const char *s, size_t n, char **buf, size_t *len, size_t *cap);
/* The GPT-2 table: code point that stands for each byte. */
void tok_byte_chars(int32_t out[256]);
/* Inverse: byte of a table code point, or -1. */
int tok_char_byte(int32_t cp);
/* Unicode White_Space, and "word" characters (\w: letters, marks, decimal
 * digits, connector punctuation), from utf8proc's categories. */
bool tok_is_space(int32_t cp);
bool tok_is_word(int32_t cp);

/* Growable byte buffer helpers shared by encode/decode. */
int tok_buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

/* ---- pipeline pieces -------------------------------------------------- */

/* Normalizes s[0..n) with the tokenizer's steps; *out is s itself (nothing
 * to do) or a malloc'd string the caller frees. */
int tok_normalize(const mbd_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len,
                  bool *owned, mbd_error *err);

/* Split of text into added-token matches and plain spans, as the library's
 * AddedVocabulary::find_matches. */
typedef struct tok_segment {
  size_t off, len; /* span in the text */
  int32_t id;      /* the added token's id, -1 for plain text */
} tok_segment;
int tok_added_split(const tok_added_set *set, const char *s, size_t n, tok_segment **segs,
                    size_t *n_segs, size_t *cap);

/* Encoder scratch: per-call buffers, so a tokenizer is shared by threads. */
typedef struct tok_ids {
  int32_t *p;
  size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *v, int32_t id);

typedef struct tok_bpe_scratch tok_bpe_scratch;
tok_bpe_scratch *tok_bpe_scratch_new(void);
void tok_bpe_scratch_free(tok_bpe_scratch *s);
/* Runs the BPE model on one pre-tokenized piece (input-space bytes) and
 * appends its ids. */
int tok_bpe_word(const mbd_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n, tok_ids *out);

typedef struct tok_pre_scratch tok_pre_scratch;
tok_pre_scratch *tok_pre_scratch_new(const mbd_tokenizer *t);
void tok_pre_scratch_free(tok_pre_scratch *s);
/* Pre-tokenizes s[0..n) and hands each piece to the BPE model. */
int tok_pretokenize(const mbd_tokenizer *t, tok_pre_scratch *ps, tok_bpe_scratch *bs, const char *s,
                    size_t n, tok_ids *out, mbd_error *err);

/* ---- loading helpers -------------------------------------------------- */

/* Compiles pattern[0..len) (UTF + UCP, JIT when available; literal: a plain
 * string), or the GPT-2 pre-tokenizer regex when pattern is NULL. NULL on
 * error, with PCRE2's reason in why. */
pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, char *why, size_t why_cap);

/* Reads post_processor (field names it in errors) into t->post_prefix/suffix;
 * needs t->kind and t->n_ids. */
struct json_t;
int tok_post_load(mbd_tokenizer *t, const struct json_t *pp, const char *field, int depth,
                  const char *what, mbd_error *err);

/* Decode of ids into *text, shared by decode and the detokenizer. */
int tok_decode_ids(const mbd_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                   char **text, size_t *len, mbd_error *err);

#endif
