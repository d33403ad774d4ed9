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

#include "common/progress.h"
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

/* ---- checkpoint directories ----
 *
 * The one weight loader every model family and backend reads through: a
 * directory's tensors, from DIR/model.safetensors or, when it exists, from the
 * shards that DIR/model.safetensors.index.json names ({"weight_map": {tensor:
 * shard file}, "metadata": {...}} as Hugging Face writes it). The index is
 * checked as strictly as a file header: a JSON object whose weight_map is a
 * non-empty object of strings; shard names plain file names (no '/', no
 * "..", at most 255 bytes); at most MBD_ST_MAX_SHARDS shards; every listed
 * tensor present in the shard it names; no tensor in two shards; no tensor
 * in a shard that the index does not list. MBD_E_FORMAT (or MBD_E_UNSUPPORTED
 * for too many shards) naming the index and the tensor or shard otherwise;
 * a shard's own errors are those of mbd_safetensors_open. */
#define MBD_ST_MAX_SHARDS 256

typedef struct mbd_st_dir mbd_st_dir; /* opaque: the open files of a checkpoint */

/* Opens and validates DIR's tensors as above. On success *out owns them. */
int mbd_st_dir_open(const char *dir, mbd_st_dir **out, mbd_error *err);
/* Unmaps and frees; NULL-safe; nulls *d. Ends the progress job (its closing
 * report, when it made any). */
void mbd_st_dir_destroy(mbd_st_dir **d);
/* Reports loading progress through o (copied; NULL or no fn: silent): every
 * tensor that mbd_st_dir_get_float / mbd_st_dir_read_f32 hands out counts
 * as read, against all the tensors and bytes of the checkpoint, labelled
 * "loading DIR". Checkpoints below o->min_bytes stay quiet. */
int mbd_st_dir_set_progress(mbd_st_dir *d, const mbd_progress_opts *o, mbd_error *err);
/* Files open (1 without an index). */
size_t mbd_st_dir_shards(const mbd_st_dir *d);
/* The tensor `name` in whichever file holds it; NULL when absent. */
const mbd_st_entry *mbd_st_dir_find(const mbd_st_dir *d, const char *name);
/* Finds a floating-point (F32/BF16/F16) tensor of exactly `shape`:
 * MBD_E_NOT_FOUND "model DIR: tensor NAME is missing", MBD_E_SHAPE for another
 * dtype or shape (naming found and expected). */
int mbd_st_dir_get_float(const mbd_st_dir *d, const char *name, int ndim, const int64_t *shape,
                         const mbd_st_entry **out, mbd_error *err);
/* As mbd_st_dir_get_float, then every element widened to f32 (exact) into a
 * new array the caller frees; *n (may be NULL) gets the element count. */
int mbd_st_dir_read_f32(const mbd_st_dir *d, const char *name, int ndim, const int64_t *shape,
                        float **out, size_t *n, mbd_error *err);
/* Element i of a floating-point entry as f32 (exact widening; unaligned-safe). */
float mbd_st_entry_f32(const mbd_st_entry *e, size_t i);

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
/* Reports the progress of later writes through o (copied; NULL: silent),
 * labelled "writing PATH"; files below o->min_bytes stay quiet. */
void mbd_st_writer_set_progress(mbd_st_writer *w, const mbd_progress_opts *o);
void mbd_st_writer_destroy(mbd_st_writer **w);

#endif
