/* SHA-256 (FIPS 180-4), incremental. Used for route ids and model identities. */
#ifndef MBD_SHA256_H
#define MBD_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct mbd_sha256_ctx {
  uint32_t h[8];      /* chaining state */
  uint64_t nbytes;    /* total bytes absorbed */
  uint8_t buf[64];    /* partial block */
  size_t buflen;      /* bytes in buf */
} mbd_sha256_ctx; /* (named _ctx: mbd_sha256 is the one-shot function) */

void mbd_sha256_init(mbd_sha256_ctx *s);
void mbd_sha256_update(mbd_sha256_ctx *s, const void *data, size_t len);
void mbd_sha256_final(mbd_sha256_ctx *s, uint8_t out[32]);
/* One-shot convenience. */
void mbd_sha256(const void *data, size_t len, uint8_t out[32]);
/* Lower-case hex of a 32-byte digest into out (65 bytes incl. NUL). */
void mbd_sha256_hex(const uint8_t digest[32], char out[65]);
/* Hashes a whole file (streamed); MBD_E_IO names the path on failure. */
int mbd_sha256_file(const char *path, uint8_t out[32], mbd_error *err);

#endif
