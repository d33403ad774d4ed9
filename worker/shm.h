/* POSIX shared-memory tensor access for the worker: validated, bounded, cached.
 *
 * A client on the same host names a tensor as (shm object name, offset, size).
 * The worker never trusts those numbers: the name is checked ("/" + 1..62
 * printable characters, no further '/'), the object's real size comes from
 * fstat, and offset + size <= object size is checked without overflow. Each
 * object is mmap'ed once (read-only, or read-write for outputs) and kept in a
 * small LRU cache; every lookup re-opens the name and compares the inode, so an
 * object that was unlinked and re-created (or resized) is re-mapped instead of
 * served stale. A pointer handed out stays valid while fewer than max_entries
 * other objects are mapped after it (a request touches a handful; the cache
 * holds dozens).
 *
 * Known limit: a client that ftruncate()s an object below a range the worker is
 * reading at that moment makes the access fault (SIGBUS); clients own their
 * objects, so this is documented rather than trapped. */
#ifndef MBD_WORKER_SHM_H
#define MBD_WORKER_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct mbd_shm_cache mbd_shm_cache;

/* max_entries: mappings kept (>= 1); the least recently used is unmapped first. */
int mbd_shm_cache_new(size_t max_entries, mbd_shm_cache **out, mbd_error *err);
/* Unmaps everything; NULL-safe; nulls *c. */
void mbd_shm_cache_destroy(mbd_shm_cache **c);

/* Checks a shm object name; MBD_E_INVALID with the reason otherwise. */
int mbd_shm_name_check(const char *name, mbd_error *err);

/* Resolves [offset, offset + size) of object `name` to a pointer. `need` is the
 * tensor's byte size: size must be >= need. writable: map read-write (outputs).
 * Errors (request-level, the worker keeps serving): MBD_E_INVALID for a bad
 * name, offset/size past the object's end, overflowing ranges, size < need;
 * MBD_E_NOT_FOUND when the object does not exist; MBD_E_IO otherwise. */
int mbd_shm_cache_map(mbd_shm_cache *c, const char *name, uint64_t offset, uint64_t size,
                      size_t need, bool writable, void **out, mbd_error *err);

/* Mappings currently held, and mmap calls made so far (for tests and metrics). */
size_t mbd_shm_cache_count(const mbd_shm_cache *c);
uint64_t mbd_shm_cache_maps(const mbd_shm_cache *c);

#endif
