/* Prompt-prefix hashes and boundaries. See prefix_hash.h. */
#include "common/prefix_hash.h"

#include <stdlib.h>
#include <string.h>

#define TAG "mambad-prefix-v1"

void mbd_prefix_hasher_init(mbd_prefix_hasher *h, const char *model) {
  static const uint8_t nul = 0;
  mbd_sha256_init(&h->ctx);
  mbd_sha256_update(&h->ctx, TAG, sizeof TAG - 1);
  mbd_sha256_update(&h->ctx, &nul, 1);
  if (model) mbd_sha256_update(&h->ctx, model, strlen(model));
  mbd_sha256_update(&h->ctx, &nul, 1);
  h->n = 0;
}

void mbd_prefix_hasher_add(mbd_prefix_hasher *h, const int64_t *ids, int64_t n) {
  uint8_t buf[8 * 64];
  for (int64_t i = 0; i < n;) {
    size_t k = 0;
    for (; k < 64 && i < n; k++, i++) { /* little-endian whatever the host */
      uint64_t v = (uint64_t)ids[i];
      for (int b = 0; b < 8; b++) buf[8 * k + (size_t)b] = (uint8_t)(v >> (8 * b));
    }
    mbd_sha256_update(&h->ctx, buf, 8 * k);
  }
  h->n += n;
}

void mbd_prefix_hasher_digest(const mbd_prefix_hasher *h, uint8_t out[32]) {
  mbd_sha256_ctx c = h->ctx;
  mbd_sha256_final(&c, out);
}

uint64_t mbd_prefix_route_hash(const uint8_t d[32]) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | d[i];
  return v;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

size_t mbd_prefix_boundaries(int64_t T, int64_t block, const int64_t *points, size_t npoints,
                             int64_t *out, size_t cap) {
  /* Merge the block multiples (ascending) with the sorted, valid points. */
  int64_t pts[MBD_PREFIX_POINTS_MAX];
  size_t np = 0;
  for (size_t i = 0; i < npoints && np < MBD_PREFIX_POINTS_MAX; i++)
    if (points[i] > 0 && points[i] <= T) pts[np++] = points[i];
  qsort(pts, np, sizeof *pts, cmp_i64);
  size_t n = 0, pi = 0;
  int64_t next_block = block > 0 ? block : INT64_MAX, last = 0;
  for (;;) {
    int64_t b = next_block <= T ? next_block : INT64_MAX;
    int64_t p = pi < np ? pts[pi] : INT64_MAX;
    int64_t k = b < p ? b : p;
    if (k == INT64_MAX) break;
    if (k == b) next_block = next_block > INT64_MAX - block ? INT64_MAX : next_block + block;
    if (k == p) pi++;
    if (k == last) continue;
    if (n < cap) out[n] = k;
    n++;
    last = k;
  }
  return n;
}

size_t mbd_prefix_route_hashes(const char *model, const int64_t *ids, int64_t T, int64_t block,
                               const int64_t *points, size_t npoints, uint64_t *out, size_t cap) {
  size_t total = mbd_prefix_boundaries(T, block, points, npoints, NULL, 0);
  if (!total || !cap) return 0;
  int64_t *ks = malloc(total * sizeof *ks);
  if (!ks) return 0;
  mbd_prefix_boundaries(T, block, points, npoints, ks, total);
  size_t first = total > cap ? total - cap : 0, n = 0;
  mbd_prefix_hasher h;
  mbd_prefix_hasher_init(&h, model);
  for (size_t i = 0; i < total; i++) {
    mbd_prefix_hasher_add(&h, ids + h.n, ks[i] - h.n);
    if (i < first) continue;
    uint8_t d[32];
    mbd_prefix_hasher_digest(&h, d);
    out[n++] = mbd_prefix_route_hash(d);
  }
  free(ks);
  return n;
}
