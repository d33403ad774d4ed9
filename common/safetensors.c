/* Safetensors reader and writer.
 *
 * The reader trusts nothing: model files come from outside, so every header
 * field is checked (types, ranges, overflow, overlap) before any pointer into
 * the data section is handed out, and each rejection names the file and the
 * tensor. The writer produces the exact layout the reference implementation
 * writes (compact JSON, header padded with spaces to 8 bytes, contiguous data),
 * so files load in Python's `safetensors`. */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/half.h"

#define ST_META_KEY "__metadata__"

struct mbd_safetensors {
  void *map;            /* mmap base, NULL for parsed buffers */
  size_t map_len;       /* bytes mapped */
  char *label;          /* file path or caller label, for messages */
  mbd_st_entry *entries;/* sorted by data offset */
  size_t *by_name;      /* indices into entries, sorted by name */
  size_t n;             /* tensors */
  char **meta_keys;     /* metadata, n_meta pairs */
  char **meta_vals;
  size_t n_meta;
};

/* Copies s into out with control and non-ASCII bytes escaped and a length cap,
 * so names taken from a hostile file are safe to print. */
static const char *shown(const char *s, char *out, size_t cap) {
  size_t j = 0;
  for (size_t i = 0; s[i] && j + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out[j++] = (char)c;
    } else {
      int w = snprintf(out + j, cap - j, "\\x%02x", c);
      if (w < 0) break;
      j += (size_t)w;
    }
  }
  out[j < cap ? j : cap - 1] = '\0';
  return out;
}

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "?";
}

static void st_free(mbd_safetensors *st) {
  if (!st) return;
  for (size_t i = 0; st->entries && i < st->n; i++) free((char *)st->entries[i].name);
  free(st->entries);
  free(st->by_name);
  for (size_t i = 0; i < st->n_meta; i++) {
    free(st->meta_keys[i]);
    free(st->meta_vals[i]);
  }
  free(st->meta_keys);
  free(st->meta_vals);
  free(st->label);
  if (st->map) munmap(st->map, st->map_len);
  free(st);
}

void mbd_safetensors_destroy(mbd_safetensors **st) {
  if (!st) return;
  st_free(*st);
  *st = NULL;
}

/* Orders entries by data offset (then size, then name, so ties are stable). */
static int cmp_offset(const void *a, const void *b) {
  const mbd_st_entry *x = a, *y = b;
  const char *px = x->data, *py = y->data;
  if (px != py) return px < py ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Reads a JSON integer in [0, INT64_MAX]; -1 when v is anything else. */
static int get_nonneg(const json_t *v, int64_t *out) {
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  if (x < 0) return -1;
  *out = (int64_t)x;
  return 0;
}

static int parse_dtype(const char *s, mbd_dtype *out) {
  static const mbd_dtype all[] = {MBD_DTYPE_F32, MBD_DTYPE_BF16, MBD_DTYPE_F16, MBD_DTYPE_I64};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (!strcmp(s, mbd_dtype_st_name(all[i]))) {
      *out = all[i];
      return 0;
    }
  }
  return -1;
}

/* Validates one tensor entry and fills e (name not yet set). data_len is the
 * size of the data section. */
static int parse_entry(const char *label, const char *name, const json_t *v, const uint8_t *data,
                       uint64_t data_len, mbd_st_entry *e, mbd_error *err) {
  char nm[160];
  shown(name, nm, sizeof nm);
  if (!json_is_object(v))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: tensor '%s': entry is %s, expected an object",
                         label, nm, json_kind(v));
  const json_t *jd = json_object_get(v, "dtype");
  const json_t *js = json_object_get(v, "shape");
  const json_t *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: tensor '%s': 'dtype' is %s, expected a string",
                         label, nm, jd ? json_kind(jd) : "missing");
  char dn[48];
  if (parse_dtype(json_string_value(jd), &e->desc.dtype))
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "%s: tensor '%s': dtype '%s' is not supported (allowed: F32, BF16, F16, "
                         "I64); convert the checkpoint",
                         label, nm, shown(json_string_value(jd), dn, sizeof dn));
  if (!json_is_array(js))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: tensor '%s': 'shape' is %s, expected an array",
                         label, nm, js ? json_kind(js) : "missing");
  size_t nd = json_array_size(js);
  if (nd > MBD_MAX_DIMS)
    return mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: tensor '%s': %zu dims (at most %d supported)",
                         label, nm, nd, MBD_MAX_DIMS);
  e->desc.ndim = (int)nd;
  for (int i = 0; i < MBD_MAX_DIMS; i++) e->desc.shape[i] = 0;
  for (size_t i = 0; i < nd; i++) {
    if (get_nonneg(json_array_get(js, i), &e->desc.shape[i]))
      return mbd_error_set(err, MBD_E_FORMAT,
                           "%s: tensor '%s': shape[%zu] is not a non-negative integer", label, nm,
                           i);
  }
  if (!json_is_array(jo) || json_array_size(jo) != 2)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s': 'data_offsets' must be an array of 2 integers", label,
                         nm);
  int64_t begin, end;
  if (get_nonneg(json_array_get(jo, 0), &begin) || get_nonneg(json_array_get(jo, 1), &end))
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s': 'data_offsets' must hold non-negative integers", label,
                         nm);
  if (begin > end)
    return mbd_error_set(err, MBD_E_FORMAT, "%s: tensor '%s': data_offsets begin %lld > end %lld",
                         label, nm, (long long)begin, (long long)end);
  if ((uint64_t)end > data_len)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s': data_offsets end %lld is past the data section (%llu "
                         "bytes); the file is truncated or corrupt",
                         label, nm, (long long)end, (unsigned long long)data_len);
  size_t nbytes;
  mbd_error sub = {0};
  int rc = mbd_tensor_desc_nbytes(&e->desc, &nbytes, &sub);
  if (rc) return mbd_error_set(err, MBD_E_FORMAT, "%s: tensor '%s': %s", label, nm, sub.msg);
  if ((uint64_t)(end - begin) != (uint64_t)nbytes) {
    char d[96];
    mbd_tensor_desc_format(&e->desc, d, sizeof d);
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s': data_offsets span %lld bytes but %s needs %zu", label,
                         nm, (long long)(end - begin), d, nbytes);
  }
  e->data = data + begin;
  e->nbytes = nbytes;
  return MBD_OK;
}

static int parse_metadata(mbd_safetensors *st, const json_t *meta, mbd_error *err) {
  if (!json_is_object(meta))
    return mbd_error_set(err, MBD_E_FORMAT, "%s: '__metadata__' is %s, expected an object",
                         st->label, json_kind(meta));
  size_t n = json_object_size(meta);
  st->meta_keys = calloc(n ? n : 1, sizeof *st->meta_keys);
  st->meta_vals = calloc(n ? n : 1, sizeof *st->meta_vals);
  if (!st->meta_keys || !st->meta_vals)
    return mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory for metadata", st->label);
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)meta, k, v) {
    char ks[160];
    if (!json_is_string(v))
      return mbd_error_set(err, MBD_E_FORMAT, "%s: '__metadata__' key '%s' is %s, expected a string",
                           st->label, shown(k, ks, sizeof ks), json_kind(v));
    st->meta_keys[st->n_meta] = strdup(k);
    st->meta_vals[st->n_meta] = strdup(json_string_value(v));
    st->n_meta++; /* counted before the check so st_free releases a half pair */
    if (!st->meta_keys[st->n_meta - 1] || !st->meta_vals[st->n_meta - 1])
      return mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory for metadata", st->label);
  }
  return MBD_OK;
}

/* qsort has no context argument; the name index is sorted through a
 * thread-local pointer so concurrent parses in different threads stay safe. */
static _Thread_local const mbd_st_entry *t_sort_entries;

static int cmp_idx(const void *a, const void *b) {
  return strcmp(t_sort_entries[*(const size_t *)a].name, t_sort_entries[*(const size_t *)b].name);
}

static int parse_into(mbd_safetensors *st, const uint8_t *buf, size_t len, mbd_error *err) {
  const char *label = st->label;
  json_t *root = NULL;
  int rc = MBD_OK;
  if (len < 8)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: file is %zu bytes, shorter than the 8-byte header length; not a "
                         "safetensors file",
                         label, len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
  if (hlen > MBD_ST_MAX_HEADER)
    return mbd_error_set(err, MBD_E_TOO_LARGE,
                         "%s: header length %llu exceeds the %d-byte limit; not a safetensors "
                         "file or corrupt",
                         label, (unsigned long long)hlen, MBD_ST_MAX_HEADER);
  if (hlen > len - 8)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "%s: header length %llu runs past the end of the %zu-byte file; the file "
                         "is truncated",
                         label, (unsigned long long)hlen, len);
  const uint8_t *data = buf + 8 + hlen;
  uint64_t data_len = (uint64_t)(len - 8 - (size_t)hlen);

  json_error_t jerr;
  root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    if (strstr(jerr.text, "duplicate"))
      return mbd_error_set(err, MBD_E_FORMAT, "%s: header has a duplicate tensor name (%s)", label,
                           jerr.text);
    return mbd_error_set(err, MBD_E_FORMAT, "%s: header is not valid JSON: %s at byte %d", label,
                         jerr.text, jerr.position);
  }
  if (!json_is_object(root)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: header is %s, expected a JSON object", label,
                       json_kind(root));
    goto fail;
  }
  size_t total = json_object_size(root);
  st->entries = calloc(total ? total : 1, sizeof *st->entries);
  st->by_name = calloc(total ? total : 1, sizeof *st->by_name);
  if (!st->entries || !st->by_name) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory for %zu header entries", label, total);
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, ST_META_KEY)) {
      if ((rc = parse_metadata(st, val, err))) goto fail;
      continue;
    }
    mbd_st_entry *e = &st->entries[st->n];
    if ((rc = parse_entry(label, key, val, data, data_len, e, err))) goto fail;
    e->name = strdup(key);
    if (!e->name) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory", label);
      goto fail;
    }
    st->n++;
  }
  if (st->n > 1) qsort(st->entries, st->n, sizeof *st->entries, cmp_offset);
  for (size_t i = 1; i < st->n; i++) {
    const mbd_st_entry *p = &st->entries[i - 1], *c = &st->entries[i];
    if ((const uint8_t *)c->data < (const uint8_t *)p->data + p->nbytes) {
      char a[160], b[160];
      rc = mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s' (bytes %lld..%lld) overlaps tensor '%s' (bytes "
                         "%lld..%lld)",
                         label, shown(c->name, a, sizeof a),
                         (long long)((const uint8_t *)c->data - data),
                         (long long)((const uint8_t *)c->data - data + (long long)c->nbytes),
                         shown(p->name, b, sizeof b), (long long)((const uint8_t *)p->data - data),
                         (long long)((const uint8_t *)p->data - data + (long long)p->nbytes));
      goto fail;
    }
  }
  for (size_t i = 0; i < st->n; i++) st->by_name[i] = i;
  t_sort_entries = st->entries;
  if (st->n > 1) qsort(st->by_name, st->n, sizeof *st->by_name, cmp_idx);
  t_sort_entries = NULL;
  for (size_t i = 1; i < st->n; i++) { /* jansson already rejects duplicates; belt and braces */
    if (!strcmp(st->entries[st->by_name[i]].name, st->entries[st->by_name[i - 1]].name)) {
      char a[160];
      rc = mbd_error_set(err, MBD_E_FORMAT, "%s: duplicate tensor name '%s'", label,
                         shown(st->entries[st->by_name[i]].name, a, sizeof a));
      goto fail;
    }
  }
fail:
  json_decref(root);
  return rc;
}

static mbd_safetensors *st_alloc(const char *label, mbd_error *err) {
  mbd_safetensors *st = calloc(1, sizeof *st);
  if (st) st->label = strdup(label ? label : "(safetensors)");
  if (!st || !st->label) {
    st_free(st);
    mbd_error_set(err, MBD_E_NOMEM, "out of memory opening %s", label ? label : "safetensors");
    return NULL;
  }
  return st;
}

int mbd_safetensors_parse(const void *buf, size_t len, const char *label, mbd_safetensors **out,
                          mbd_error *err) {
  *out = NULL;
  mbd_safetensors *st = st_alloc(label, err);
  if (!st) return MBD_E_NOMEM;
  int rc = parse_into(st, buf, buf ? len : 0, err);
  if (rc) {
    st_free(st);
    return rc;
  }
  *out = st;
  return MBD_OK;
}

int mbd_safetensors_open(const char *path, mbd_safetensors **out, mbd_error *err) {
  *out = NULL;
  int rc = MBD_OK;
  mbd_safetensors *st = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mbd_error_set(err, MBD_E_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb)) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot stat '%s': %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISREG(sb.st_mode)) {
    rc = mbd_error_set(err, MBD_E_IO, "'%s' is not a regular file", path);
    goto fail;
  }
  if (!(st = st_alloc(path, err))) {
    rc = MBD_E_NOMEM;
    goto fail;
  }
  const void *base = NULL;
  if (sb.st_size > 0) {
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      rc = mbd_error_set(err, MBD_E_IO, "cannot mmap '%s' (%lld bytes): %s", path,
                         (long long)sb.st_size, strerror(errno));
      goto fail;
    }
    st->map = m;
    st->map_len = (size_t)sb.st_size;
    base = m;
  }
  if ((rc = parse_into(st, base, st->map_len, err))) goto fail;
  close(fd);
  *out = st;
  return MBD_OK;
fail:
  st_free(st);
  close(fd);
  return rc;
}

size_t mbd_safetensors_count(const mbd_safetensors *st) { return st ? st->n : 0; }

const mbd_st_entry *mbd_safetensors_at(const mbd_safetensors *st, size_t i) {
  return (st && i < st->n) ? &st->entries[i] : NULL;
}

const mbd_st_entry *mbd_safetensors_find(const mbd_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  size_t lo = 0, hi = st->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const mbd_st_entry *e = &st->entries[st->by_name[mid]];
    int c = strcmp(name, e->name);
    if (!c) return e;
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

int mbd_safetensors_expect(const mbd_safetensors *st, const char *name, mbd_dtype dtype, int ndim,
                           const int64_t *shape, const mbd_st_entry **out, mbd_error *err) {
  const mbd_st_entry *e = mbd_safetensors_find(st, name);
  if (out) *out = NULL;
  if (!e)
    return mbd_error_set(err, MBD_E_NOT_FOUND, "%s: tensor '%s' not found (%zu tensors in file)",
                         st ? st->label : "(null)", name, mbd_safetensors_count(st));
  bool ok = e->desc.dtype == dtype && e->desc.ndim == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = e->desc.shape[i] == shape[i];
  if (!ok) {
    mbd_tensor_desc want = {.dtype = dtype, .ndim = ndim};
    for (int i = 0; i < ndim && i < MBD_MAX_DIMS; i++) want.shape[i] = shape[i];
    if (ndim > MBD_MAX_DIMS) want.ndim = MBD_MAX_DIMS;
    char a[128], b[128];
    mbd_tensor_desc_format(&want, a, sizeof a);
    mbd_tensor_desc_format(&e->desc, b, sizeof b);
    return mbd_error_set(err, MBD_E_SHAPE, "%s: tensor '%s': expected %s, found %s", st->label,
                         name, a, b);
  }
  if (out) *out = e;
  return MBD_OK;
}

const char *mbd_safetensors_metadata(const mbd_safetensors *st, const char *key) {
  for (size_t i = 0; st && key && i < st->n_meta; i++)
    if (!strcmp(st->meta_keys[i], key)) return st->meta_vals[i];
  return NULL;
}

/* ---- checkpoint directories ---- */

#define ST_SINGLE "model.safetensors"
#define ST_INDEX "model.safetensors.index.json"
#define ST_MAX_SHARD_NAME 255

struct mbd_st_dir {
  char *dir;               /* the directory, for messages */
  mbd_safetensors **st;    /* open files */
  size_t n;
  mbd_progress *progress;  /* reads counted (behind a pointer: readers take a const dir) */
  char *what;              /* "loading DIR", the progress label */
};

void mbd_st_dir_destroy(mbd_st_dir **pd) {
  if (!pd || !*pd) return;
  mbd_st_dir *d = *pd;
  if (d->progress) mbd_progress_end(d->progress);
  free(d->progress);
  free(d->what);
  for (size_t i = 0; i < d->n; i++) mbd_safetensors_destroy(&d->st[i]);
  free(d->st);
  free(d->dir);
  free(d);
  *pd = NULL;
}

size_t mbd_st_dir_shards(const mbd_st_dir *d) { return d ? d->n : 0; }

/* A shard name from the index: a plain file name inside the directory. */
static bool shard_name_ok(const char *f) {
  size_t n = strlen(f);
  return n > 0 && n <= ST_MAX_SHARD_NAME && !strchr(f, '/') && !strstr(f, "..");
}

/* Opens the distinct shards the index lists (in first-listed order), then
 * checks the weight map against what the shards hold. */
static int dir_open_index(mbd_st_dir *d, const char *path, mbd_error *err) {
  char sh[128];
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
  const char **names = NULL; /* borrowed from root, [MBD_ST_MAX_SHARDS] */
  int rc = MBD_OK;
  if (!root) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: not JSON (line %d: %s)", path, je.line, je.text);
    goto done;
  }
  if (!json_is_object(map) || json_object_size(map) == 0) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: not a safetensors index (%s)", path,
                       !json_is_object(root) ? "not a JSON object"
                       : !map                ? "no weight_map"
                       : !json_is_object(map) ? "weight_map is not an object"
                                              : "weight_map is empty");
    goto done;
  }
  names = calloc(MBD_ST_MAX_SHARDS, sizeof *names);
  d->st = calloc(MBD_ST_MAX_SHARDS, sizeof *d->st);
  if (!names || !d->st) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory", path);
    goto done;
  }
  const char *key;
  json_t *val;
  json_object_foreach(map, key, val) {
    const char *file = json_string_value(val);
    if (!file || !shard_name_ok(file)) {
      rc = mbd_error_set(err, MBD_E_FORMAT,
                         "%s: tensor '%s' maps to %s: a shard must be a file name in %s", path,
                         shown(key, sh, sizeof sh), file ? "a bad file name" : json_kind(val),
                         d->dir);
      goto done;
    }
    bool seen = false;
    for (size_t i = 0; i < d->n && !seen; i++) seen = !strcmp(names[i], file);
    if (seen) continue;
    if (d->n == MBD_ST_MAX_SHARDS) {
      rc = mbd_error_set(err, MBD_E_UNSUPPORTED, "%s: more than %d shards", path,
                         MBD_ST_MAX_SHARDS);
      goto done;
    }
    char fp[4096];
    snprintf(fp, sizeof fp, "%s/%s", d->dir, file);
    if ((rc = mbd_safetensors_open(fp, &d->st[d->n], err))) goto done;
    names[d->n++] = file;
  }
  /* Every listed tensor is where the index says. */
  json_object_foreach(map, key, val) {
    const char *file = json_string_value(val);
    size_t i = 0;
    while (strcmp(names[i], file)) i++;
    if (!mbd_safetensors_find(d->st[i], key)) {
      rc = mbd_error_set(err, MBD_E_FORMAT, "%s: lists tensor '%s' in %s, which does not hold it",
                         path, shown(key, sh, sizeof sh), file);
      goto done;
    }
  }
  /* Every tensor of every shard is listed there (so also: in no other shard). */
  for (size_t i = 0; i < d->n; i++)
    for (size_t k = 0; k < mbd_safetensors_count(d->st[i]); k++) {
      const char *name = mbd_safetensors_at(d->st[i], k)->name;
      const char *want = json_string_value(json_object_get(map, name));
      if (!want || strcmp(want, names[i])) {
        rc = mbd_error_set(err, MBD_E_FORMAT, "%s: shard %s holds tensor '%s', which the index %s",
                           path, names[i], shown(name, sh, sizeof sh),
                           want ? "places in another shard" : "does not list");
        goto done;
      }
    }
done:
  free(names);
  json_decref(root);
  return rc;
}

int mbd_st_dir_open(const char *dir, mbd_st_dir **out, mbd_error *err) {
  *out = NULL;
  mbd_st_dir *d = calloc(1, sizeof *d);
  if (!d || !(d->dir = strdup(dir ? dir : ""))) {
    free(d);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory opening %s", dir);
  }
  char path[4096];
  int rc;
  snprintf(path, sizeof path, "%s/%s", d->dir, ST_INDEX);
  struct stat sb;
  if (stat(path, &sb) == 0) {
    rc = dir_open_index(d, path, err);
  } else {
    snprintf(path, sizeof path, "%s/%s", d->dir, ST_SINGLE);
    d->st = calloc(1, sizeof *d->st);
    rc = d->st ? mbd_safetensors_open(path, &d->st[0], err)
               : mbd_error_set(err, MBD_E_NOMEM, "out of memory opening %s", path);
    if (!rc) d->n = 1;
  }
  if (rc) {
    mbd_st_dir_destroy(&d);
    return rc;
  }
  *out = d;
  return MBD_OK;
}

int mbd_st_dir_set_progress(mbd_st_dir *d, const mbd_progress_opts *o, mbd_error *err) {
  if (!o || !o->fn) return MBD_OK;
  uint64_t bytes = 0, tensors = 0;
  for (size_t i = 0; i < d->n; i++)
    for (size_t k = 0; k < mbd_safetensors_count(d->st[i]); k++, tensors++)
      bytes += mbd_safetensors_at(d->st[i], k)->nbytes;
  size_t wl = strlen(d->dir) + 16;
  free(d->progress);
  free(d->what);
  d->progress = malloc(sizeof *d->progress);
  d->what = malloc(wl);
  if (!d->progress || !d->what) {
    free(d->progress);
    free(d->what);
    d->progress = NULL;
    d->what = NULL;
    return mbd_error_set(err, MBD_E_NOMEM, "model %s: out of memory", d->dir);
  }
  snprintf(d->what, wl, "loading %s", d->dir);
  mbd_progress_begin(d->progress, o, d->what, "tensors", bytes, tensors);
  return MBD_OK;
}

const mbd_st_entry *mbd_st_dir_find(const mbd_st_dir *d, const char *name) {
  const mbd_st_entry *e = NULL;
  for (size_t i = 0; d && i < d->n && !e; i++) e = mbd_safetensors_find(d->st[i], name);
  return e;
}

int mbd_st_dir_get_float(const mbd_st_dir *d, const char *name, int ndim, const int64_t *shape,
                         const mbd_st_entry **out, mbd_error *err) {
  *out = NULL;
  const mbd_st_entry *e = mbd_st_dir_find(d, name);
  if (!e)
    return mbd_error_set(err, MBD_E_NOT_FOUND, "model %s: tensor %s is missing", d->dir, name);
  if (e->desc.dtype != MBD_DTYPE_F32 && e->desc.dtype != MBD_DTYPE_BF16 &&
      e->desc.dtype != MBD_DTYPE_F16)
    return mbd_error_set(err, MBD_E_SHAPE, "model %s: tensor %s has dtype %s, want a float type",
                         d->dir, name, mbd_dtype_name(e->desc.dtype));
  bool ok = e->desc.ndim == ndim && ndim <= MBD_MAX_DIMS;
  for (int i = 0; ok && i < ndim; i++) ok = e->desc.shape[i] == shape[i];
  if (!ok) {
    char got[128], want[128];
    mbd_tensor_desc wd = {.dtype = e->desc.dtype,
                          .ndim = ndim < MBD_MAX_DIMS ? ndim : MBD_MAX_DIMS};
    for (int i = 0; i < wd.ndim; i++) wd.shape[i] = shape[i];
    mbd_tensor_desc_format(&e->desc, got, sizeof got);
    mbd_tensor_desc_format(&wd, want, sizeof want);
    return mbd_error_set(err, MBD_E_SHAPE, "model %s: tensor %s is %s, config says %s", d->dir,
                         name, got, want);
  }
  if (d->progress) mbd_progress_add(d->progress, e->nbytes, 1);
  *out = e;
  return MBD_OK;
}

float mbd_st_entry_f32(const mbd_st_entry *e, size_t i) {
  const unsigned char *p = e->data;
  if (e->desc.dtype == MBD_DTYPE_F32) {
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return e->desc.dtype == MBD_DTYPE_BF16 ? mbd_bf16_to_f32(h) : mbd_f16_to_f32(h);
}

int mbd_st_dir_read_f32(const mbd_st_dir *d, const char *name, int ndim, const int64_t *shape,
                        float **out, size_t *n_out, mbd_error *err) {
  *out = NULL;
  const mbd_st_entry *e = NULL;
  int rc = mbd_st_dir_get_float(d, name, ndim, shape, &e, err);
  if (rc) return rc;
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  float *v = malloc(n * sizeof(float) + 4);
  if (!v)
    return mbd_error_set(err, MBD_E_NOMEM, "model %s: out of memory reading %s", d->dir, name);
  for (size_t i = 0; i < n; i++) v[i] = mbd_st_entry_f32(e, i);
  *out = v;
  if (n_out) *n_out = n;
  return MBD_OK;
}

/* ---- writer ---- */

typedef struct wr_tensor {
  char *name;
  mbd_tensor_desc desc;
  const void *data; /* borrowed */
  size_t nbytes;
} wr_tensor;

struct mbd_st_writer {
  wr_tensor *t;
  size_t n, cap;
  json_t *meta; /* object of strings, insertion order */
  mbd_progress_opts progress; /* fn NULL: silent */
};

void mbd_st_writer_set_progress(mbd_st_writer *w, const mbd_progress_opts *o) {
  if (o) w->progress = *o;
  else memset(&w->progress, 0, sizeof w->progress);
}

int mbd_st_writer_new(mbd_st_writer **out, mbd_error *err) {
  *out = NULL;
  mbd_st_writer *w = calloc(1, sizeof *w);
  if (w) w->meta = json_object();
  if (!w || !w->meta) {
    free(w);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory creating a safetensors writer");
  }
  *out = w;
  return MBD_OK;
}

void mbd_st_writer_destroy(mbd_st_writer **pw) {
  if (!pw || !*pw) return;
  mbd_st_writer *w = *pw;
  for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
  free(w->t);
  json_decref(w->meta);
  free(w);
  *pw = NULL;
}

int mbd_st_writer_add(mbd_st_writer *w, const char *name, const mbd_tensor_desc *desc,
                      const void *data, mbd_error *err) {
  if (!name || !*name || !strcmp(name, ST_META_KEY))
    return mbd_error_set(err, MBD_E_INVALID, "safetensors writer: invalid tensor name '%s'",
                         name ? name : "(null)");
  for (size_t i = 0; i < w->n; i++)
    if (!strcmp(w->t[i].name, name))
      return mbd_error_set(err, MBD_E_INVALID, "safetensors writer: tensor '%s' added twice", name);
  if (mbd_dtype_size(desc->dtype) == 0)
    return mbd_error_set(err, MBD_E_INVALID, "safetensors writer: tensor '%s': bad dtype %d", name,
                         (int)desc->dtype);
  size_t nbytes;
  int rc = mbd_tensor_desc_nbytes(desc, &nbytes, err);
  if (rc) {
    if (err) mbd_error_prefix(err, "safetensors writer: tensor '%s'", name);
    return rc;
  }
  if (nbytes && !data)
    return mbd_error_set(err, MBD_E_INVALID, "safetensors writer: tensor '%s' has no data", name);
  json_t *probe = json_string(name); /* names must be valid UTF-8 to appear in JSON */
  if (!probe)
    return mbd_error_set(err, MBD_E_INVALID, "safetensors writer: tensor name is not valid UTF-8");
  json_decref(probe);
  if (w->n == w->cap) {
    size_t nc = w->cap ? 2 * w->cap : 16;
    wr_tensor *nt = realloc(w->t, nc * sizeof *nt);
    if (!nt) return mbd_error_set(err, MBD_E_NOMEM, "safetensors writer: out of memory");
    w->t = nt;
    w->cap = nc;
  }
  char *copy = strdup(name);
  if (!copy) return mbd_error_set(err, MBD_E_NOMEM, "safetensors writer: out of memory");
  w->t[w->n++] = (wr_tensor){.name = copy, .desc = *desc, .data = data, .nbytes = nbytes};
  return MBD_OK;
}

int mbd_st_writer_set_metadata(mbd_st_writer *w, const char *key, const char *value,
                               mbd_error *err) {
  json_t *v = value ? json_string(value) : NULL;
  if (!key || !v || json_object_set_new(w->meta, key, v))
    return mbd_error_set(err, MBD_E_INVALID,
                         "safetensors writer: metadata key/value must be non-NULL UTF-8 strings");
  return MBD_OK;
}

/* Builds the header JSON text (compact, metadata first, insertion order). */
static char *build_header(const mbd_st_writer *w, mbd_error *err) {
  json_t *root = json_object();
  char *text = NULL;
  if (!root) goto nomem;
  if (json_object_size(w->meta) && json_object_set(root, ST_META_KEY, w->meta)) goto nomem;
  uint64_t off = 0;
  for (size_t i = 0; i < w->n; i++) {
    const wr_tensor *t = &w->t[i];
    json_t *shape = json_array();
    json_t *offs = json_pack("[II]", (json_int_t)off, (json_int_t)(off + t->nbytes));
    json_t *ent = json_pack("{s:s,s:o,s:o}", "dtype", mbd_dtype_st_name(t->desc.dtype), "shape",
                            shape, "data_offsets", offs);
    if (!ent) goto nomem; /* json_pack steals shape/offs even on failure */
    for (int d = 0; d < t->desc.ndim; d++)
      if (json_array_append_new(shape, json_integer((json_int_t)t->desc.shape[d]))) {
        json_decref(ent);
        goto nomem;
      }
    if (json_object_set_new(root, t->name, ent)) goto nomem;
    off += t->nbytes;
  }
  text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (!text) mbd_error_set(err, MBD_E_NOMEM, "safetensors writer: out of memory for header");
  return text;
nomem:
  json_decref(root);
  mbd_error_set(err, MBD_E_NOMEM, "safetensors writer: out of memory for header");
  return NULL;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

int mbd_st_writer_write(mbd_st_writer *w, const char *path, mbd_error *err) {
  int rc = MBD_OK, fd = -1;
  bool created = false;
  char *hdr = NULL, *tmp = NULL;
  if (!(hdr = build_header(w, err))) return MBD_E_NOMEM;
  size_t hl = strlen(hdr);
  size_t padded = (hl + 7u) & ~(size_t)7u; /* 8 + padded keeps the data section 8-aligned */
  size_t plen = strlen(path);
  if (!(tmp = malloc(plen + 16))) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory writing '%s'", path);
    goto fail;
  }
  snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
  fd = mkstemp(tmp);
  if (fd < 0) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot create a temporary file next to '%s': %s", path,
                       strerror(errno));
    goto fail;
  }
  created = true;
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  static const char spaces[8] = "        ";
  int bad = write_all(fd, len8, 8) || write_all(fd, hdr, hl) || write_all(fd, spaces, padded - hl);
  uint64_t total = 0;
  for (size_t i = 0; i < w->n; i++) total += w->t[i].nbytes;
  char *what = malloc(plen + 16);
  if (what) snprintf(what, plen + 16, "writing %s", path);
  mbd_progress pr;
  mbd_progress_begin(&pr, what ? &w->progress : NULL, what, "tensors", total, w->n);
  for (size_t i = 0; !bad && i < w->n; i++) {
    if (w->t[i].nbytes) bad = write_all(fd, w->t[i].data, w->t[i].nbytes);
    mbd_progress_add(&pr, w->t[i].nbytes, 1);
  }
  mbd_progress_end(&pr);
  free(what);
  if (!bad) bad = fchmod(fd, 0644) || fsync(fd);
  if (bad) {
    rc = mbd_error_set(err, MBD_E_IO, "writing '%s' failed: %s", tmp, strerror(errno));
    goto fail;
  }
  if (close(fd)) {
    fd = -1;
    rc = mbd_error_set(err, MBD_E_IO, "closing '%s' failed: %s", tmp, strerror(errno));
    goto fail;
  }
  fd = -1;
  if (rename(tmp, path)) {
    rc = mbd_error_set(err, MBD_E_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    goto fail;
  }
  free(tmp);
  free(hdr);
  return MBD_OK;
fail:
  if (fd >= 0) close(fd);
  if (created) unlink(tmp);
  free(tmp);
  free(hdr);
  return rc;
}
