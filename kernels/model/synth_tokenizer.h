/* A tokenizer.json for synthetic checkpoints, so demos and tests have text
 * end to end: a byte-level BPE (GPT-2 byte characters, NFC, the GPT-2
 * pre-tokenizer regex, ByteLevel decoder, like GPT-NeoX's) whose ids are
 * exactly 0 .. vocab-1: id 0 is the special <|endoftext|> (the synthetic
 * config's eos_token_id), then the 256 bytes, then merges spelling short
 * strings of space and lower-case letters, shortest first, until the
 * vocabulary is full. A vocabulary under 257 keeps only the most common bytes. */
#ifndef MBD_SYNTH_TOKENIZER_H
#define MBD_SYNTH_TOKENIZER_H

#include <stdint.h>

#include "common/status.h"

/* Writes dir/tokenizer.json (dir must exist) with `vocab` ids (>= 1). */
int mbd_synth_tokenizer_write(int64_t vocab, const char *dir, mbd_error *err);

#endif
