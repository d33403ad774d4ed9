/* The prefix state cache of one model: recurrent-state images at prompt
 * prefix boundaries, so a PREFILL whose prompt starts with a cached prefix
 * restores that state and feeds only the rest.
 *
 * Why this is bit-exact: every kernel is batch-invariant and a prefill of T
 * tokens in any chunking gives the bits of feeding them one by one, so the
 * state after k tokens is one value whatever produced it; restoring it and
 * prefilling tokens k..T gives the bits of the whole prefill.
 *
 * An entry is keyed by SHA-256 over the worker's route id, the model's weights
 * digest and the prefix hash (common/prefix_hash.h: model name and tokens),
 * and it keeps the prefix's tokens, compared on every hit: a hash collision
 * can cost a miss, never a wrong state. It holds the backend's state image
 * (MBDMSTA1, kernels/state_blob.h) after the prefix and the logits after its
 * last token (a prompt that is exactly a cached prefix needs no compute).
 *
 * Memory, two tiers. Host: entries within `budget` bytes of host memory
 * (each counts its whole allocation); the least recently used go first; an
 * entry larger than the budget is not kept. Device (optional, mbd_pcache_dev:
 * a GPU worker's backend stashes): the state of a new entry goes to a device
 * stash while the device budget allows (its tokens and logits stay in host
 * memory and count in the host budget), so storing and restoring it are
 * device-to-device copies. A device entry that leaves the device tier for a
 * newer one is demoted to the host tier (one device-to-host copy of its
 * state) when it was hit while there and the host budget can hold it, and
 * dropped otherwise: prompts that never share a prefix pay no device-to-host
 * copy. Stashes are allocated as needed up to the device budget and reused,
 * never freed before the cache; when the device has no room for another,
 * the device budget shrinks to what is held. No locks: the compute thread only. */
#ifndef MBD_WORKER_PREFIX_CACHE_H
#define MBD_WORKER_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct mbd_pcache mbd_pcache;

/* Counters since start (lookups..evictions) and what is held now. */
typedef struct mbd_pcache_stats {
  uint64_t lookups;    /* prefills of a fresh session that asked for a cached prefix */
  uint64_t hits;       /* of those, the ones that found one */
  uint64_t hit_tokens; /* prompt tokens not prefilled thanks to hits */
  uint64_t inserts;    /* entries stored */
  uint64_t evictions;  /* entries dropped for the budget */
  uint64_t bytes;      /* host bytes held now */
  uint64_t entries;    /* held now, both tiers */
  uint64_t device_hits;    /* of the hits, those served from the device tier */
  uint64_t demotions;      /* device entries moved to the host tier */
  uint64_t device_bytes;   /* device bytes the device tier's entries hold now */
  uint64_t device_entries; /* of the entries, those in the device tier */
} mbd_pcache_stats;

/* A prompt's boundaries (common/prefix_hash.h) with their entry keys, made
 * once per PREFILL; plain data owned by the job. */
typedef struct mbd_pcache_plan {
  int64_t *pos;       /* [n] ascending boundaries (prefix lengths) */
  uint8_t (*key)[32]; /* [n] entry keys */
  uint64_t *route;    /* [n] routing hashes (what heartbeats advertise) */
  size_t n;
  size_t next;        /* first boundary the prefill has not reached yet */
} mbd_pcache_plan;

/* What a hit restores; the pointers are borrowed until the next insert. */
typedef struct mbd_pcache_hit {
  int64_t pos;          /* prefix length */
  const void *state;    /* host state image after the prefix, or NULL: */
  const void *stash;    /* the device stash holding it (device tier), else NULL */
  size_t state_bytes;
  const float *logits;  /* [vocab] after the prefix's last token */
} mbd_pcache_hit;

/* Fills a new entry: the state after the prefix, as a host image of
 * state_bytes into `state` or, when state is NULL, into the device stash
 * `stash`; and the logits ([vocab]) after the prefix. A status when it cannot
 * (nothing is kept). */
typedef int (*mbd_pcache_fill_fn)(void *ctx, void *state, void *stash, size_t state_bytes,
                                  float *logits, mbd_error *err);

/* The device tier: stashes of one size (a backend's, or a test's stand-in). */
typedef struct mbd_pcache_dev {
  void *ctx;          /* passed to every call */
  size_t stash_bytes; /* device bytes per stash (> 0) */
  size_t budget;      /* device bytes of stashes at most */
  /* One new stash; MBD_E_NOMEM when the device has no room. */
  int (*alloc)(void *ctx, void **stash, mbd_error *err);
  void (*free)(void *ctx, void *stash);
  /* The state image in stash (state_bytes of it) into host dst. */
  int (*export)(void *ctx, const void *stash, void *dst, size_t state_bytes, mbd_error *err);
} mbd_pcache_dev;

/* A cache of model `model` (registry name) with weights `digest` on route
 * `route_id`, holding at most budget bytes (> 0) of entries whose logits have
 * `vocab` entries. */
int mbd_pcache_new(size_t budget, const char *model, const char *digest, const char *route_id,
                   size_t vocab, mbd_pcache **out, mbd_error *err);
/* Gives c a device tier (copied), before its first insert. */
void mbd_pcache_set_device(mbd_pcache *c, const mbd_pcache_dev *dev);
/* Frees every entry and stash; NULL-safe; nulls *c. */
void mbd_pcache_destroy(mbd_pcache **c);

/* The plan of prompt ids[0..T): boundaries at multiples of block and at
 * points[0..np) (common/prefix_hash.h), each with its key. *out is NULL (and
 * MBD_OK returned) when the prompt has no boundary. */
int mbd_pcache_plan_new(const mbd_pcache *c, const int64_t *ids, int64_t T, int64_t block,
                        const int64_t *points, size_t np, mbd_pcache_plan **out, mbd_error *err);
/* NULL-safe; nulls *p. */
void mbd_pcache_plan_free(mbd_pcache_plan **p);

/* Counts a lookup and finds the longest prefix of p held (tokens compared
 * with ids); on a hit fills *hit, counts it with its tokens, makes the entry
 * the most recently used and sets p->next past it. */
bool mbd_pcache_lookup(mbd_pcache *c, mbd_pcache_plan *p, const int64_t *ids, mbd_pcache_hit *hit);
/* Whether boundary i of p is held (no counters, no LRU change). */
bool mbd_pcache_contains(const mbd_pcache *c, const mbd_pcache_plan *p, size_t i,
                         const int64_t *ids);
/* Stores boundary i of p (prefix ids[0..p->pos[i])) with a state of
 * state_bytes that fill writes (into a device stash while the device tier
 * has room, else a host image), evicting or demoting least recently used
 * entries to fit. Already held, or larger than the whole budget: nothing
 * happens (MBD_OK). MBD_E_NOMEM, or fill's status (nothing kept). */
int mbd_pcache_insert(mbd_pcache *c, const mbd_pcache_plan *p, size_t i, const int64_t *ids,
                      size_t state_bytes, mbd_pcache_fill_fn fill, void *ctx, mbd_error *err);

void mbd_pcache_stats_get(const mbd_pcache *c, mbd_pcache_stats *out);
/* Routing hashes of the held entries, most recently used first, into
 * out[0..cap); returns the count. */
size_t mbd_pcache_adverts(const mbd_pcache *c, uint64_t *out, size_t cap);
/* Changes whenever the entries or counters change (for publishing only on change). */
uint64_t mbd_pcache_version(const mbd_pcache *c);

#endif
