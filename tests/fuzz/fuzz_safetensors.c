/* Fuzz target: the safetensors header parser on arbitrary file images. On
 * success every entry must lie inside the buffer and agree with its descriptor;
 * every byte it points at is read (AddressSanitizer checks the bounds). */
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"
#include "mbd_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  int rc = mbd_safetensors_parse(data, size, "fuzz", &st, &err);
  if (rc) {
    MBD_FUZZ_CHECK(rc < 0 && err.code == rc && err.msg[0] && st == NULL);
    MBD_FUZZ_CHECK(!strncmp(err.msg, "fuzz", 4)); /* every message names the source */
    return 0;
  }
  MBD_FUZZ_CHECK(st != NULL);
  size_t n = mbd_safetensors_count(st);
  const uint8_t *prev_end = data + 8;
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < n; i++) {
    const mbd_st_entry *e = mbd_safetensors_at(st, i);
    size_t nb = 0;
    MBD_FUZZ_CHECK(mbd_tensor_desc_nbytes(&e->desc, &nb, NULL) == 0 && nb == e->nbytes);
    const uint8_t *p = e->data;
    MBD_FUZZ_CHECK(p >= prev_end && p + nb <= data + size); /* sorted, no overlap, in bounds */
    if (nb) prev_end = p + nb;
    for (size_t j = 0; j < nb; j++) sink ^= p[j];
    MBD_FUZZ_CHECK(mbd_safetensors_find(st, e->name) == e);
    const mbd_st_entry *got = NULL;
    MBD_FUZZ_CHECK(mbd_safetensors_expect(st, e->name, e->desc.dtype, e->desc.ndim, e->desc.shape,
                                          &got, NULL) == 0 &&
                   got == e);
  }
  MBD_FUZZ_CHECK(mbd_safetensors_at(st, n) == NULL);
  (void)mbd_safetensors_metadata(st, "format");
  (void)sink;
  mbd_safetensors_destroy(&st);
  MBD_FUZZ_CHECK(st == NULL);
  return 0;
}

/* Seeds: small well-formed files covering every dtype, metadata, empty and
 * zero-size tensors, built once. */
static uint8_t *make_file(const char *hdr, size_t data_len, size_t *len) {
  size_t hl = strlen(hdr);
  uint8_t *b = calloc(1, 8 + hl + data_len);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, hdr, hl);
  for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 31 + 7);
  *len = 8 + hl + data_len;
  return b;
}

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static const struct {
    const char *hdr;
    size_t data;
  } k[] = {
      {"{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
       "\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}",
       32},
      {"{}", 0},
      {"{\"x\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}    ", 8},
      {"{\"h\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,3],\"data_offsets\":[0,6]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[6,6]}}",
       8},
  };
  static mbd_fuzz_seed seeds[sizeof k / sizeof k[0]];
  static int built;
  if (!built) {
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
      seeds[i].data = make_file(k[i].hdr, k[i].data, &seeds[i].len);
    built = 1;
  }
  *out = seeds;
  return sizeof k / sizeof k[0];
}
