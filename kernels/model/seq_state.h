/* The recurrent state of one sequence on the CPU, as every family keeps it:
 * a position and one zeroed f32 buffer, laid out as the family's state image
 * payload (kernels/state_blob.h), described by the model it belongs to. A
 * family's typed state (mbd_mamba1_state ...) is an mbd_seq_state behind its
 * own opaque name; the family only says where its arrays lie in the buffer.
 * So new, destroy, reset, export, import and the prefill driver's "is this
 * state one of this model's" check are written once. */
#ifndef MBD_KERNELS_MODEL_SEQ_STATE_H
#define MBD_KERNELS_MODEL_SEQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/state_blob.h"

#define MBD_SEQ_STATE_MAX_WORDS 4

/* What a model's states are: their image header and size. Two states of one
 * description are interchangeable; a state fits a model whose description
 * equals its own. */
typedef struct mbd_seq_state_desc {
  mbd_state_shape shape;                   /* the image header's family and dims */
  uint32_t words[MBD_SEQ_STATE_MAX_WORDS]; /* u32 words before the floats */
  size_t nwords;                           /* how many of words the image holds */
  size_t floats;                           /* f32 payload after the words */
} mbd_seq_state_desc;

typedef struct mbd_seq_state {
  mbd_seq_state_desc desc; /* the shape it was made for */
  int64_t pos;             /* tokens consumed since new, reset or import */
  float *buf;              /* [desc.floats], the image payload's layout */
} mbd_seq_state;

/* A zeroed state of description desc. */
int mbd_seq_state_new(const mbd_seq_state_desc *desc, mbd_seq_state **out, mbd_error *err);
/* NULL-safe; nulls *s. */
void mbd_seq_state_destroy(mbd_seq_state **s);
/* Back to zeros at position 0. */
void mbd_seq_state_reset(mbd_seq_state *s);

/* Whether s's description equals want. */
int mbd_seq_state_fits(const mbd_seq_state_desc *want, const mbd_seq_state *s);

/* The state image of s: its size; written into buf (MBD_E_TOO_LARGE when cap
 * is short; *len may be NULL); read back, refusing an image of another
 * family, shape, words or size (MBD_E_FORMAT / MBD_E_SHAPE, s unchanged). */
size_t mbd_seq_state_export_size(const mbd_seq_state *s);
int mbd_seq_state_export(const mbd_seq_state *s, void *buf, size_t cap, size_t *len,
                         mbd_error *err);
int mbd_seq_state_import(mbd_seq_state *s, const void *buf, size_t len, mbd_error *err);

#endif
