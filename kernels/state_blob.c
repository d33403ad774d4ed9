/* State image header and session blob: encoding and validation (see
 * state_blob.h). */
#include "kernels/state_blob.h"

#include <string.h>

#include "common/half.h"

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* ---- state image ---- */

static void put_f32s(void *p, const float *v, size_t n) {
  uint8_t *q = p;
  for (size_t i = 0; i < n; i++) put_u32(q + 4 * i, mbd_f32_to_bits(v[i]));
}

static void get_f32s(const void *p, float *v, size_t n) {
  const uint8_t *q = p;
  for (size_t i = 0; i < n; i++) v[i] = mbd_bits_to_f32(get_u32(q + 4 * i));
}

size_t mbd_state_image_size(size_t nwords, const mbd_state_part *parts, size_t nparts) {
  size_t n = MBD_STATE_IMAGE_HEADER + 4 * nwords;
  for (size_t i = 0; i < nparts; i++) n += parts[i].n * sizeof(float);
  return n;
}

int mbd_state_image_export(void *buf, size_t cap, size_t *len, const mbd_state_shape *shape,
                           int64_t pos, const uint32_t *words, size_t nwords,
                           const mbd_state_part *parts, size_t nparts, mbd_error *err) {
  size_t need = mbd_state_image_size(nwords, parts, nparts);
  if (cap < need)
    return mbd_error_set(err, MBD_E_TOO_LARGE, "state export needs %zu bytes, buffer has %zu",
                         need, cap);
  uint8_t *p = buf;
  mbd_state_image_write_header(p, shape, pos);
  p += MBD_STATE_IMAGE_HEADER;
  for (size_t i = 0; i < nwords; i++, p += 4) put_u32(p, words[i]);
  for (size_t i = 0; i < nparts; i++) {
    put_f32s(p, parts[i].v, parts[i].n);
    p += 4 * parts[i].n;
  }
  if (len) *len = need;
  return MBD_OK;
}

int mbd_state_image_check(const void *buf, size_t len, const mbd_state_shape *shape,
                          size_t nwords, const mbd_state_part *parts, size_t nparts,
                          int64_t *pos, uint32_t *words, mbd_error *err) {
  int rc = mbd_state_image_read_header(buf, len, shape, pos, err);
  if (rc) return rc;
  size_t want = mbd_state_image_size(nwords, parts, nparts);
  if (len != want)
    return mbd_error_set(err, MBD_E_FORMAT, "state import: %zu bytes, expected %zu", len, want);
  const uint8_t *p = (const uint8_t *)buf + MBD_STATE_IMAGE_HEADER;
  for (size_t i = 0; i < nwords; i++) words[i] = get_u32(p + 4 * i);
  return MBD_OK;
}

void mbd_state_image_read_parts(const void *buf, size_t nwords, const mbd_state_part *parts,
                                size_t nparts) {
  const uint8_t *p = (const uint8_t *)buf + MBD_STATE_IMAGE_HEADER + 4 * nwords;
  for (size_t i = 0; i < nparts; i++) {
    get_f32s(p, parts[i].v, parts[i].n);
    p += 4 * parts[i].n;
  }
}

void mbd_state_image_write_header(void *buf, const mbd_state_shape *s, int64_t pos) {
  uint8_t *p = buf;
  memcpy(p, MBD_STATE_IMAGE_MAGIC, 8);
  put_u32(p + 8, MBD_STATE_IMAGE_VERSION);
  put_u32(p + 12, s->n_layer);
  put_u32(p + 16, s->d_inner);
  put_u32(p + 20, s->d_conv);
  put_u32(p + 24, s->d_state);
  put_u32(p + 28, s->family);
  put_u64(p + 32, (uint64_t)pos);
}

int mbd_state_image_read_header(const void *buf, size_t len, const mbd_state_shape *want,
                                int64_t *pos, mbd_error *err) {
  const uint8_t *p = buf;
  if (!buf || len < MBD_STATE_IMAGE_HEADER || memcmp(p, MBD_STATE_IMAGE_MAGIC, 8) != 0)
    return mbd_error_set(err, MBD_E_FORMAT, "state import: not a state image (bad magic)");
  if (get_u32(p + 8) != MBD_STATE_IMAGE_VERSION)
    return mbd_error_set(err, MBD_E_FORMAT, "state import: version %u, this build reads %d",
                         get_u32(p + 8), MBD_STATE_IMAGE_VERSION);
  if (get_u32(p + 28) != want->family)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "state import: state is of model family %u, this model is family %u",
                         get_u32(p + 28), want->family);
  if (get_u32(p + 12) != want->n_layer || get_u32(p + 16) != want->d_inner ||
      get_u32(p + 20) != want->d_conv || get_u32(p + 24) != want->d_state)
    return mbd_error_set(err, MBD_E_SHAPE,
                         "state import: state is for layers=%u d_inner=%u d_conv=%u d_state=%u, "
                         "model has %u/%u/%u/%u",
                         get_u32(p + 12), get_u32(p + 16), get_u32(p + 20), get_u32(p + 24),
                         want->n_layer, want->d_inner, want->d_conv, want->d_state);
  uint64_t v = get_u64(p + 32);
  if (v > (uint64_t)INT64_MAX)
    return mbd_error_set(err, MBD_E_FORMAT, "state import: bad position");
  *pos = (int64_t)v;
  return MBD_OK;
}

/* ---- session blob ---- */

size_t mbd_state_blob_size(uint64_t state_bytes, uint64_t vocab, bool has_logits) {
  uint64_t lb = has_logits ? vocab : 0;
  if (lb > (UINT64_MAX >> 3)) return 0;
  lb *= 4;
  uint64_t t = MBD_STATE_BLOB_HEADER;
  if (state_bytes > UINT64_MAX - t) return 0;
  t += state_bytes;
  if (lb > UINT64_MAX - t - 7) return 0;
  t = (t + lb + 7) & ~(uint64_t)7;
  if (t > SIZE_MAX) return 0;
  return (size_t)t;
}

static void put_str(uint8_t *p, size_t cap, const char *s) {
  size_t n = strnlen(s, cap - 1);
  memset(p, 0, cap);
  memcpy(p, s, n);
}

void mbd_state_blob_write_header(void *blob, size_t size, const mbd_state_blob_info *info,
                                 void **state_dst, void **logits_dst) {
  uint8_t *p = blob;
  memset(p, 0, size);
  memcpy(p, MBD_STATE_BLOB_MAGIC, 8);
  put_u32(p + 8, MBD_STATE_BLOB_VERSION);
  put_u32(p + 12, info->has_logits ? 1u : 0u);
  put_u64(p + 16, info->state_bytes);
  put_u64(p + 24, info->vocab);
  put_str(p + 32, 64, info->model);
  put_str(p + 96, 72, info->model_digest);
  put_str(p + 168, 72, info->route_id);
  *state_dst = p + MBD_STATE_BLOB_HEADER;
  *logits_dst = info->has_logits ? p + MBD_STATE_BLOB_HEADER + info->state_bytes : NULL;
}

/* Copies a NUL-padded field; it must contain a NUL within cap. */
static int get_str(const uint8_t *p, size_t cap, char *dst, size_t dcap, const char *what,
                   mbd_error *err) {
  size_t n = strnlen((const char *)p, cap);
  if (n >= cap || n >= dcap)
    return mbd_error_set(err, MBD_E_FORMAT, "state blob: %s field is not NUL-terminated", what);
  memcpy(dst, p, n);
  dst[n] = '\0';
  return MBD_OK;
}

int mbd_state_blob_parse(const void *blob, size_t size, mbd_state_blob_info *out, mbd_error *err) {
  memset(out, 0, sizeof *out);
  const uint8_t *p = blob;
  if (!blob || size < MBD_STATE_BLOB_HEADER)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "state blob of %zu bytes is shorter than its %d-byte header: pass the "
                         "bytes EXPORT returned, unchanged",
                         size, MBD_STATE_BLOB_HEADER);
  if (memcmp(p, MBD_STATE_BLOB_MAGIC, 8))
    return mbd_error_set(err, MBD_E_FORMAT, "not a mambad session export (bad magic)");
  uint32_t ver = get_u32(p + 8), flags = get_u32(p + 12);
  if (ver != MBD_STATE_BLOB_VERSION)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "session export version %u; this worker reads version %d", ver,
                         MBD_STATE_BLOB_VERSION);
  if (flags & ~1u) return mbd_error_set(err, MBD_E_FORMAT, "state blob: unknown flags 0x%x", flags);
  out->has_logits = flags & 1u;
  out->state_bytes = get_u64(p + 16);
  out->vocab = get_u64(p + 24);
  int rc;
  if ((rc = get_str(p + 32, 64, out->model, sizeof out->model, "model", err))) return rc;
  if ((rc = get_str(p + 96, 72, out->model_digest, sizeof out->model_digest, "model digest", err)))
    return rc;
  if ((rc = get_str(p + 168, 72, out->route_id, sizeof out->route_id, "route id", err))) return rc;
  size_t want = mbd_state_blob_size(out->state_bytes, out->vocab, out->has_logits);
  if (want == 0 || want != size)
    return mbd_error_set(err, MBD_E_FORMAT,
                         "state blob is %zu bytes but its header describes %llu state bytes and "
                         "%llu logits (truncated or altered?)",
                         size, (unsigned long long)out->state_bytes,
                         (unsigned long long)(out->has_logits ? out->vocab : 0));
  out->state = p + MBD_STATE_BLOB_HEADER;
  out->logits = out->has_logits ? (const float *)(const void *)(p + MBD_STATE_BLOB_HEADER +
                                                                 out->state_bytes)
                                : NULL;
  return MBD_OK;
}
