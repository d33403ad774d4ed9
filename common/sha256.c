/* SHA-256 (FIPS 180-4), portable C. Route ids and model identities hash with
 * it, so it must be exact on every platform: big-endian word loads are done
 * byte by byte, never through casts. */
#include "common/sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const uint32_t k_round[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

static inline uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

static void compress(uint32_t h[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
           (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                  k_round[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += hh;
}

void mbd_sha256_init(mbd_sha256_ctx *s) {
  static const uint32_t iv[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
  memcpy(s->h, iv, sizeof iv);
  s->nbytes = 0;
  s->buflen = 0;
}

void mbd_sha256_update(mbd_sha256_ctx *s, const void *data, size_t len) {
  const uint8_t *p = data;
  s->nbytes += len;
  if (s->buflen) {
    size_t take = 64 - s->buflen;
    if (take > len) take = len;
    memcpy(s->buf + s->buflen, p, take);
    s->buflen += take;
    p += take;
    len -= take;
    if (s->buflen < 64) return;
    compress(s->h, s->buf);
    s->buflen = 0;
  }
  for (; len >= 64; p += 64, len -= 64) compress(s->h, p);
  if (len) {
    memcpy(s->buf, p, len);
    s->buflen = len;
  }
}

void mbd_sha256_final(mbd_sha256_ctx *s, uint8_t out[32]) {
  uint64_t bits = s->nbytes * 8u;
  uint8_t pad[72] = {0x80};
  /* Pad to 56 mod 64, then the 64-bit big-endian bit length. */
  size_t padlen = (s->buflen < 56) ? 56 - s->buflen : 120 - s->buflen;
  for (int i = 0; i < 8; i++) pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
  uint64_t keep = s->nbytes;
  mbd_sha256_update(s, pad, padlen + 8);
  s->nbytes = keep;
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

void mbd_sha256(const void *data, size_t len, uint8_t out[32]) {
  mbd_sha256_ctx s;
  mbd_sha256_init(&s);
  mbd_sha256_update(&s, data, len);
  mbd_sha256_final(&s, out);
}

void mbd_sha256_hex(const uint8_t digest[32], char out[65]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  out[64] = '\0';
}

int mbd_sha256_file(const char *path, uint8_t out[32], mbd_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return mbd_error_set(err, MBD_E_IO, "cannot open '%s' to hash it: %s", path, strerror(errno));
  mbd_sha256_ctx s;
  mbd_sha256_init(&s);
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) mbd_sha256_update(&s, buf, n);
  int bad = ferror(f);
  int saved = errno;
  fclose(f);
  if (bad) return mbd_error_set(err, MBD_E_IO, "error reading '%s' to hash it: %s", path, strerror(saved));
  mbd_sha256_final(&s, out);
  return MBD_OK;
}
