/* Session export blob: what EXPORT returns and IMPORT accepts.
 *
 * Layout (little-endian), total size a multiple of 8 so it travels as an I64
 * tensor ("state", i64 [size/8]):
 *   0   "MBDSESS1"             magic (8 bytes)
 *   8   u32 version (1)        u32 flags (bit 0: logits present)
 *   16  u64 state_bytes        u64 vocab
 *   32  char model[64]         model name, NUL-padded
 *   96  char model_digest[72]  model identity (hex SHA-256), NUL-padded
 *   168 char route_id[72]      exporting worker's route id, NUL-padded
 *   240 16 bytes zero
 *   256 state image (backend export, state_bytes), then f32 logits[vocab]
 *       when flag 0 is set, then zero padding to a multiple of 8.
 * IMPORT refuses a blob whose model digest or route id differs from the
 * importing worker's: continuation is bit-exact only on the same route. */
#ifndef MBD_WORKER_STATE_BLOB_H
#define MBD_WORKER_STATE_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define MBD_STATE_BLOB_MAGIC "MBDSESS1"
#define MBD_STATE_BLOB_VERSION 1
#define MBD_STATE_BLOB_HEADER 256

typedef struct mbd_state_blob_info {
  char model[64];        /* model name */
  char model_digest[65]; /* hex SHA-256 */
  char route_id[65];     /* hex SHA-256 */
  uint64_t state_bytes;  /* backend state image size */
  uint64_t vocab;        /* logits entries */
  bool has_logits;
  const void *state;     /* into the blob */
  const float *logits;   /* into the blob (may be unaligned-safe: copy with memcpy) */
} mbd_state_blob_info;

/* Total blob size for the given parts; 0 on overflow. */
size_t mbd_state_blob_size(uint64_t state_bytes, uint64_t vocab, bool has_logits);
/* Writes the header into blob (size from mbd_state_blob_size) and returns
 * pointers where the caller writes the state image and the logits. */
void mbd_state_blob_write_header(void *blob, size_t size, const mbd_state_blob_info *info,
                                 void **state_dst, void **logits_dst);
/* Parses and checks a blob: magic, version, sizes (overflow-safe, exact
 * total), NUL-terminated names. MBD_E_FORMAT with the reason otherwise. */
int mbd_state_blob_parse(const void *blob, size_t size, mbd_state_blob_info *out, mbd_error *err);

#endif
