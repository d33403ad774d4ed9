/* POSIX shared-memory tensor access for the worker: validated, owner-checked,
 * bounded, cached, and safe against objects that shrink under it.
 *
 * A client on the same host names a tensor as (shm object name, offset, size).
 * The worker never trusts those numbers nor its own privileges on the object:
 *  - the name must match "/" + [A-Za-z0-9_.-]{1,62} not starting with '.', so
 *    "/." and "/.." are refused and nothing resolves outside /dev/shm;
 *  - the object is opened with O_NOFOLLOW | O_NONBLOCK (a FIFO cannot block the
 *    worker), must be a regular file on the /dev/shm file system, must belong
 *    to the requesting client's uid (vouched for by the broker, see
 *    docs/security.md) and grant its owner read (inputs) or write (outputs);
 *  - its real size comes from fstat and offset + size <= object size is checked
 *    without overflow.
 * Each object is mmap'ed once (read-only, or read-write for outputs) and kept in
 * a small LRU cache; every lookup re-opens the name and compares the inode, so an
 * object that was unlinked and re-created (or resized) is re-mapped instead of
 * served stale. A pointer handed out stays valid while fewer than max_entries
 * other objects are mapped after it (a request touches a handful; the cache
 * holds dozens).
 *
 * Truncation. A client may ftruncate() an object below a range the worker is
 * touching. The access would raise SIGBUS; a process-wide SIGBUS handler finds
 * the cached mapping holding the faulting address, maps anonymous zero pages
 * over the whole mapping (MAP_FIXED, so the access and every later one succeed)
 * and flags the cache. The request in progress computes on zeros, and its
 * reply is turned into an ERROR by mbd_shm_cache_check; the poisoned mapping is
 * dropped at its next lookup. Faults on addresses no cache owns go to the
 * handler that was installed before (or the default action). Outputs written
 * into a poisoned mapping land in private memory the client never sees. */
#ifndef MBD_WORKER_SHM_H
#define MBD_WORKER_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct mbd_shm_cache mbd_shm_cache;

/* max_entries: mappings kept (>= 1); the least recently used is unmapped first.
 * The first cache of the process installs the SIGBUS handler. */
int mbd_shm_cache_new(size_t max_entries, mbd_shm_cache **out, mbd_error *err);
/* Unmaps everything; NULL-safe; nulls *c. */
void mbd_shm_cache_destroy(mbd_shm_cache **c);

/* Checks a shm object name against the pattern above; MBD_E_INVALID with the
 * reason otherwise. */
int mbd_shm_name_check(const char *name, mbd_error *err);

/* Resolves [offset, offset + size) of object `name` to a pointer. `need` is the
 * tensor's byte size: size must be >= need. writable: map read-write (outputs).
 * owner_uid: the requesting client's uid; the object must belong to it (< 0 =
 * the client's uid is not known: refused).
 * Errors (request-level, the worker keeps serving): MBD_E_INVALID for a bad
 * name, a non-regular object, another owner, missing owner permission,
 * offset/size past the object's end, overflowing ranges, size < need;
 * MBD_E_NOT_FOUND when the object does not exist; MBD_E_IO otherwise. */
int mbd_shm_cache_map(mbd_shm_cache *c, const char *name, uint64_t offset, uint64_t size,
                      size_t need, bool writable, int64_t owner_uid, void **out, mbd_error *err);

/* Starts watching for truncation faults: clears the cache's fault flag. The
 * worker calls it when it starts a request and before touching a mapping
 * outside one. NULL-safe. */
void mbd_shm_cache_watch(mbd_shm_cache *c);
/* MBD_E_INVALID naming the object when a mapping faulted since the last watch
 * or check (the flag is cleared), else 0. NULL-safe. */
int mbd_shm_cache_check(mbd_shm_cache *c, mbd_error *err);

/* Mappings currently held, mmap calls made so far, faults trapped (for tests
 * and metrics). */
size_t mbd_shm_cache_count(const mbd_shm_cache *c);
uint64_t mbd_shm_cache_maps(const mbd_shm_cache *c);
uint64_t mbd_shm_cache_faults(const mbd_shm_cache *c);

#endif
