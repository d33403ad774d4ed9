/* The state formats, with one owner here: the recurrent-state image a backend
 * exports for one sequence, and the session blob the worker's EXPORT returns and
 * IMPORT accepts around it. Both are little-endian, carry a magic and a
 * version, and are documented in docs/protocol.md ("Session blob").
 *
 * State image (MBD_STATE_IMAGE_HEADER = 40 bytes, then the family's payload):
 *   0   "MBDMSTA1"   magic (8 bytes)
 *   8   u32 version (1)
 *   12  u32 n_layer  u32 d_inner  u32 d_conv  u32 d_state   (the family's shape)
 *   28  u32 family   (MBD_STATE_FAMILY_*; 0 = Mamba-1)
 *   32  i64 position (tokens consumed)
 *   40  payload, laid out by the family (Mamba-1: f32 conv[n_layer][d_conv-1]
 *       [d_inner] then f32 ssm[n_layer][d_inner][d_state], kernels/model/mamba1.h)
 * Every backend of a family writes the same image, so a state moves between
 * CPU and GPU workers byte for byte (the route check decides whether it may).
 *
 * Session blob (total a multiple of 8, so it travels as an I64 tensor "state",
 * i64 [size/8]):
 *   0   "MBDSESS1"             magic (8 bytes)
 *   8   u32 version (1)        u32 flags (bit 0: logits present)
 *   16  u64 state_bytes        u64 vocab
 *   32  char model[64]         model name, NUL-padded
 *   96  char model_digest[72]  model identity (hex SHA-256), NUL-padded
 *   168 char route_id[72]      exporting worker's route id, NUL-padded
 *   240 16 bytes zero
 *   256 state image (state_bytes), then f32 logits[vocab] when flag 0 is set,
 *       then zero padding to a multiple of 8.
 * IMPORT refuses a blob whose model digest or route id differs from the
 * importing worker's: continuation is bit-exact only on the same route. */
#ifndef MBD_KERNELS_STATE_BLOB_H
#define MBD_KERNELS_STATE_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- state image ---- */

#define MBD_STATE_IMAGE_MAGIC "MBDMSTA1"
#define MBD_STATE_IMAGE_VERSION 1
#define MBD_STATE_IMAGE_HEADER 40

/* Model families as the image records them. */
#define MBD_STATE_FAMILY_MAMBA1 0u
#define MBD_STATE_FAMILY_MAMBA2 1u
#define MBD_STATE_FAMILY_MAMBA3 2u

/* What the header records of a state's shape. */
typedef struct mbd_state_shape {
  uint32_t family;  /* MBD_STATE_FAMILY_* */
  uint32_t n_layer; /* the four dims as the family defines them */
  uint32_t d_inner;
  uint32_t d_conv;
  uint32_t d_state;
} mbd_state_shape;

/* Writes the 40-byte header of a state of shape s at position pos into p. */
void mbd_state_image_write_header(void *p, const mbd_state_shape *s, int64_t pos);
/* Checks magic, version, family and shape against want (len >= header size)
 * and returns the position; MBD_E_FORMAT / MBD_E_SHAPE naming what differs.
 * The caller checks the payload size. */
int mbd_state_image_read_header(const void *p, size_t len, const mbd_state_shape *want,
                                int64_t *pos, mbd_error *err);
/* A run of f32 in a state image's payload (little-endian IEEE bits, after the
 * header and the family's u32 words): the family's arrays, in order. */
typedef struct mbd_state_part {
  float *v; /* [n] (read only by export) */
  size_t n;
} mbd_state_part;

/* Bytes of an image whose payload is nwords u32 words, then the parts. */
size_t mbd_state_image_size(size_t nwords, const mbd_state_part *parts, size_t nparts);
/* Writes the image of a state of shape at pos: header, words, parts.
 * MBD_E_TOO_LARGE when cap is short; *len (may be NULL) gets the size. */
int mbd_state_image_export(void *buf, size_t cap, size_t *len, const mbd_state_shape *shape,
                           int64_t pos, const uint32_t *words, size_t nwords,
                           const mbd_state_part *parts, size_t nparts, mbd_error *err);
/* Checks an image of len bytes against shape and the payload's size, and
 * returns its position and its nwords words, changing nothing; the caller
 * checks the words, then copies the parts in with mbd_state_image_read_parts. */
int mbd_state_image_check(const void *buf, size_t len, const mbd_state_shape *shape,
                          size_t nwords, const mbd_state_part *parts, size_t nparts,
                          int64_t *pos, uint32_t *words, mbd_error *err);
void mbd_state_image_read_parts(const void *buf, size_t nwords, const mbd_state_part *parts,
                                size_t nparts);

/* ---- session blob ---- */

#define MBD_STATE_BLOB_MAGIC "MBDSESS1"
#define MBD_STATE_BLOB_VERSION 1
#define MBD_STATE_BLOB_HEADER 256

typedef struct mbd_state_blob_info {
  char model[64];        /* model name */
  char model_digest[65]; /* hex SHA-256 */
  char route_id[65];     /* hex SHA-256 */
  uint64_t state_bytes;  /* state image size */
  uint64_t vocab;        /* logits entries */
  bool has_logits;
  const void *state;     /* into the blob */
  const float *logits;   /* into the blob (may be unaligned: copy with memcpy) */
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
