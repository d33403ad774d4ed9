/* Prompt-prefix hashes, shared by the worker's prefix state cache and the
 * clients that ask the broker to route to the worker holding a prefix.
 *
 * The hash of a prefix is SHA-256 over "mambad-prefix-v1", NUL, the model's
 * registry name, NUL, then the prefix's token ids as little-endian i64. The
 * model name is in it so that one worker's adverts of two models never mix;
 * the broker has already picked the workers serving the request's model and
 * weights digest. The routing hash is the first 8 bytes (big-endian) of that
 * digest: it only orders a preference, so a collision costs a cache miss,
 * never a wrong result (the worker compares the stored tokens themselves).
 *
 * Boundaries: a prompt of T tokens has a boundary at every multiple of the
 * block size in (0, T] and at every explicit cache point in (0, T]. */
#ifndef MBD_PREFIX_HASH_H
#define MBD_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256.h"

/* Explicit cache points one request may mark (PREFILL `cache_points`). */
#define MBD_PREFIX_POINTS_MAX 64
/* Routing hashes one request may carry (OPEN `prefix`) and one worker
 * advertises per heartbeat. */
#define MBD_PREFIX_HASHES_MAX 64

/* An incremental prefix hash: absorb tokens, read the digest of what was
 * absorbed so far at any point (absorbing can go on after a read). */
typedef struct mbd_prefix_hasher {
  mbd_sha256_ctx ctx; /* over the tag, the model name and the tokens so far */
  int64_t n;          /* tokens absorbed */
} mbd_prefix_hasher;

/* Starts the hash of model `model`'s prefixes ("" allowed). */
void mbd_prefix_hasher_init(mbd_prefix_hasher *h, const char *model);
/* Absorbs ids[0..n). */
void mbd_prefix_hasher_add(mbd_prefix_hasher *h, const int64_t *ids, int64_t n);
/* The digest of the tokens absorbed so far (h unchanged). */
void mbd_prefix_hasher_digest(const mbd_prefix_hasher *h, uint8_t out[32]);
/* The routing hash of a digest: its first 8 bytes, big-endian. */
uint64_t mbd_prefix_route_hash(const uint8_t digest[32]);

/* The boundaries of a prompt of T tokens, ascending and distinct, into
 * out[0..cap): multiples of block (block <= 0: none) and points[0..npoints)
 * (those outside (0, T] are ignored). Returns how many there are, which may
 * exceed cap (then only the first cap were written). */
size_t mbd_prefix_boundaries(int64_t T, int64_t block, const int64_t *points, size_t npoints,
                             int64_t *out, size_t cap);

/* The routing hashes of ids[0..T) at its boundaries, longest prefix last,
 * into out[0..cap): when there are more boundaries than cap, the cap longest.
 * Returns the count written. */
size_t mbd_prefix_route_hashes(const char *model, const int64_t *ids, int64_t T, int64_t block,
                               const int64_t *points, size_t npoints, uint64_t *out, size_t cap);

#endif
