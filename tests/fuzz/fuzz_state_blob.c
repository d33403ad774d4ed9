/* Fuzz target: the session blob a client IMPORTs (kernels/state_blob.h) and
 * the state image inside it. An accepted blob must account for every byte
 * (header, image, logits), keep its pointers inside the buffer and its names
 * NUL-terminated; an accepted image must match the shape it was checked
 * against. Every byte a pointer covers is read (AddressSanitizer checks). */
#include <string.h>

#include "kernels/state_blob.h"
#include "mbd_fuzz.h"

/* A small shape with one u32 word and two parts, as a family's image has. */
static int check_image(const uint8_t *p, size_t len) {
  const mbd_state_shape shape = {.family = MBD_STATE_FAMILY_MAMBA2, .n_layer = 2, .d_inner = 8,
                                 .d_conv = 4, .d_state = 4};
  float a[12], b[16];
  const mbd_state_part parts[2] = {{a, 12}, {b, 16}};
  int64_t pos = -1;
  uint32_t words[1] = {0};
  mbd_error err = {0};
  int rc = mbd_state_image_check(p, len, &shape, 1, parts, 2, &pos, words, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.msg[0]);
    return rc;
  }
  MBD_FUZZ_CHECK(len == mbd_state_image_size(1, parts, 2));
  MBD_FUZZ_CHECK(pos >= 0);
  mbd_state_image_read_parts(p, 1, parts, 2);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_image(data, size);
  mbd_state_blob_info info;
  mbd_error err = {0};
  int rc = mbd_state_blob_parse(data, size, &info, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.msg[0]);
    return 0;
  }
  MBD_FUZZ_CHECK(memchr(info.model, 0, sizeof info.model) != NULL);
  MBD_FUZZ_CHECK(memchr(info.model_digest, 0, sizeof info.model_digest) != NULL);
  MBD_FUZZ_CHECK(memchr(info.route_id, 0, sizeof info.route_id) != NULL);
  MBD_FUZZ_CHECK(mbd_state_blob_size(info.state_bytes, info.vocab, info.has_logits) == size);
  const uint8_t *s = info.state;
  MBD_FUZZ_CHECK(s >= data && info.state_bytes <= size && s + info.state_bytes <= data + size);
  volatile uint8_t sink = 0;
  for (uint64_t i = 0; i < info.state_bytes; i++) sink ^= s[i];
  if (info.has_logits) {
    const uint8_t *l = (const uint8_t *)info.logits;
    MBD_FUZZ_CHECK(l >= s + info.state_bytes && l + info.vocab * 4 <= data + size);
    for (uint64_t i = 0; i < info.vocab * 4; i++) sink ^= l[i];
  }
  (void)sink;
  check_image(s, (size_t)info.state_bytes);
  return 0;
}

/* Seeds: a well-formed blob around a well-formed image, with and without logits. */
size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static uint8_t blobs[2][4096];
  static mbd_fuzz_seed seeds[2];
  const mbd_state_shape shape = {.family = MBD_STATE_FAMILY_MAMBA2, .n_layer = 2, .d_inner = 8,
                                 .d_conv = 4, .d_state = 4};
  float a[12], b[16];
  for (int i = 0; i < 12; i++) a[i] = (float)i * 0.5f;
  for (int i = 0; i < 16; i++) b[i] = (float)i - 3.0f;
  const mbd_state_part parts[2] = {{a, 12}, {b, 16}};
  const uint32_t words[1] = {7};
  size_t ibytes = mbd_state_image_size(1, parts, 2);
  for (int k = 0; k < 2; k++) {
    mbd_state_blob_info info;
    memset(&info, 0, sizeof info);
    strcpy(info.model, "tiny");
    memset(info.model_digest, 'a', 64);
    memset(info.route_id, 'b', 64);
    info.state_bytes = ibytes;
    info.vocab = 5;
    info.has_logits = k == 1;
    size_t n = mbd_state_blob_size(info.state_bytes, info.vocab, info.has_logits);
    if (!n || n > sizeof blobs[k]) return 0;
    void *sd = NULL, *ld = NULL;
    mbd_state_blob_write_header(blobs[k], n, &info, &sd, &ld);
    mbd_state_image_export(sd, ibytes, NULL, &shape, 3, words, 1, parts, 2, NULL);
    if (ld) memset(ld, 0x3f, info.vocab * 4);
    /* the seeds take the accepting paths, or they test nothing */
    mbd_state_blob_info got;
    MBD_FUZZ_CHECK(mbd_state_blob_parse(blobs[k], n, &got, NULL) == 0);
    MBD_FUZZ_CHECK(check_image(got.state, (size_t)got.state_bytes) == 0);
    seeds[k] = (mbd_fuzz_seed){blobs[k], n};
  }
  *out = seeds;
  return 2;
}
