/* Text in and text out for the command-line tools: the prompt of `--prompt
 * TEXT` / `--prompt-file F` encoded to ids, and generated ids streamed to a
 * FILE as text as they arrive. `mambad generate --prompt` (through the
 * service) and `mambad run --prompt` (in process) both use it, so the two
 * read and print text alike. */
#ifndef MBD_TEXT_STREAM_H
#define MBD_TEXT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

/* Encodes the prompt: `text` itself, or (when `file` is non-NULL) the bytes
 * of that file as they are. *ids (I64, the caller frees) gets *n >= 1 ids.
 * MBD_E_IO naming the file, MBD_E_INVALID for invalid UTF-8 or a prompt that
 * encodes to no tokens. */
int mbd_text_prompt_ids(const mbd_tokenizer *t, const char *text, const char *file,
                        bool add_special, int64_t **ids, size_t *n, mbd_error *err);

/* Streams ids to `out` as text (nothing is written when out is NULL), only
 * ever complete UTF-8: everything written, finish included, is
 * mbd_tokenizer_decode of all ids pushed. Borrows t and out. */
typedef struct mbd_text_stream mbd_text_stream;
int mbd_text_stream_new(const mbd_tokenizer *t, bool skip_special, FILE *out,
                        mbd_text_stream **s, mbd_error *err);
/* NULL-safe; nulls *s. */
void mbd_text_stream_destroy(mbd_text_stream **s);
/* Writes the text ids[0..n) complete and flushes `out`. An id outside the
 * vocabulary is skipped and the push returns MBD_E_INVALID naming the first
 * such id (the others' text is written); MBD_E_IO when out cannot be written. */
int mbd_text_stream_push(mbd_text_stream *s, const int64_t *ids, size_t n, mbd_error *err);
/* Writes what is held back (an incomplete character becomes U+FFFD) and
 * flushes; the stream can take more ids afterwards. */
int mbd_text_stream_finish(mbd_text_stream *s, mbd_error *err);
/* Ids pushed so far. */
size_t mbd_text_stream_count(const mbd_text_stream *s);

#endif
