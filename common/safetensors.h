/* Safetensors reader (mmap, every header field validated) and writer.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"k": "v"}}
 * then the data section; offsets are relative to the data section. The reader
 * rejects: short files, N past the end, bad JSON, unknown dtypes, shape/size
 * mismatch, offsets outside the data section, overlapping or overflowing
 * ranges; each with a message naming the file and the tensor.
 *
 * Error codes: MBD_E_IO (open/mmap/write), MBD_E_TOO_LARGE (header length over
 * MBD_ST_MAX_HEADER), MBD_E_UNSUPPORTED (a well-formed tensor this build cannot
 * hold: dtype other than F32/BF16/F16/I64, more than MBD_MAX_DIMS dims),
 * MBD_E_FORMAT (everything else malformed, including duplicate names and
 * overlapping ranges). Gaps between tensors are accepted. */
#ifndef MBD_SAFETENSORS_H
#define MBD_SAFETENSORS_H

#include <stddef.h>

#include "common/status.h"
#include "common/tensor.h"

/* Largest accepted JSON header, as in the reference implementation. */
#define MBD_ST_MAX_HEADER 100000000

typedef struct mbd_safetensors mbd_safetensors; /* opaque reader */

/* One tensor of an open file; pointers stay valid until the reader is destroyed. */
typedef struct mbd_st_entry {
  const char *name;     /* NUL-terminated tensor name */
  mbd_tensor_desc desc; /* dtype + shape */
  const void *data;     /* first byte, inside the mapping (may be unaligned) */
  size_t nbytes;        /* == mbd_tensor_desc_nbytes(desc) */
} mbd_st_entry;

/* Maps `path` read-only and validates it. On success *out owns the mapping. */
int mbd_safetensors_open(const char *path, mbd_safetensors **out, mbd_error *err);
/* Validates an in-memory file image (borrowed: must outlive the reader). Used by
 * tests and the fuzzer; `label` names the source in error messages. */
int mbd_safetensors_parse(const void *buf, size_t len, const char *label, mbd_safetensors **out,
                          mbd_error *err);
/* Unmaps and frees; NULL-safe; sets *st to NULL. */
void mbd_safetensors_destroy(mbd_safetensors **st);

size_t mbd_safetensors_count(const mbd_safetensors *st);
/* Entries in file order of their data offsets. */
const mbd_st_entry *mbd_safetensors_at(const mbd_safetensors *st, size_t i);
/* NULL when absent. */
const mbd_st_entry *mbd_safetensors_find(const mbd_safetensors *st, const char *name);
/* Finds `name` and checks its dtype and shape (ndim, dims); MBD_E_NOT_FOUND or
 * MBD_E_SHAPE with a message naming expected vs found. */
int mbd_safetensors_expect(const mbd_safetensors *st, const char *name, mbd_dtype dtype, int ndim,
                           const int64_t *shape, const mbd_st_entry **out, mbd_error *err);
/* Metadata value or NULL. */
const char *mbd_safetensors_metadata(const mbd_safetensors *st, const char *key);

/* Writer: collect tensors (bytes borrowed until write), then write atomically
 * (temp file + rename). Data is laid out in insertion order, contiguous (as the
 * reference requires), the data section starting 8-byte aligned (header padded
 * with spaces). Names must be non-empty, unique UTF-8, not "__metadata__". */
typedef struct mbd_st_writer mbd_st_writer;
int mbd_st_writer_new(mbd_st_writer **out, mbd_error *err);
int mbd_st_writer_add(mbd_st_writer *w, const char *name, const mbd_tensor_desc *desc,
                      const void *data, mbd_error *err);
int mbd_st_writer_set_metadata(mbd_st_writer *w, const char *key, const char *value,
                               mbd_error *err);
int mbd_st_writer_write(mbd_st_writer *w, const char *path, mbd_error *err);
void mbd_st_writer_destroy(mbd_st_writer **w);

#endif
