/* The prefix state cache applied to PREFILL jobs (worker/prefix_cache.h has
 * the cache itself): the scheduler calls these three at a PREFILL's first
 * slice, before each chunk and after it, and the compute thread packs the
 * counters for the heartbeat.
 *
 * Only a PREFILL of a fresh session (nothing consumed since OPEN) is planned:
 * its prompt's boundaries are the multiples of --prefix-block and the
 * request's `cache_points`. Chunks end at boundaries, and at each boundary not
 * yet held the session's state image and last logits are stored. A
 * `last_only` PREFILL also looks up its longest held prefix first and, on a
 * hit, restores that state and logits and prefills only the rest (a prefill
 * returning every position's logits computes them all, so it only stores). */
#ifndef MBD_WORKER_PREFIX_JOB_H
#define MBD_WORKER_PREFIX_JOB_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/state.h"

/* First slice of PREFILL job j on session s: marks s as no longer fresh and,
 * when it was and its model has a cache, plans j and may restore a cached
 * prefix (j->done = its length; when that is the whole prompt, j->out holds
 * the result). A status only when restoring failed (the PREFILL fails). */
int mbd_wpfx_begin(mbd_wstate *st, mbd_wjob *j, mbd_wsession *s, mbd_error *err);
/* The next chunk of j: at most c tokens, ending at j's next boundary. */
int64_t mbd_wpfx_chunk(const mbd_wjob *j, int64_t c);
/* After a chunk that left s with logits `logits` ([vocab]): when j->done is
 * a boundary not held yet, stores s's state there (a failure is logged; the
 * PREFILL goes on). */
void mbd_wpfx_after(mbd_wstate *st, mbd_wjob *j, mbd_wsession *s, const float *logits);

/* Model m's prefix cache, when --prefix-cache-mb and --prefix-block are on,
 * with a device tier of --prefix-cache-device-mb when the backend keeps
 * state stashes (kernels/backend.h) for m. */
int mbd_wpfx_model_init(mbd_wstate *st, mbd_wmodel *m, mbd_error *err);

/* Sum of every model cache's version (changes when anything to report changed). */
uint64_t mbd_wpfx_version(const mbd_wstate *st);
/* Packs the heartbeat's `prefix` value: {lookups, hits, hit_tokens, inserts,
 * evictions, bytes, entries, device_hits, demotions, device_bytes,
 * device_entries} summed over the models, and `hashes`: the routing
 * hashes of up to MBD_PREFIX_HASHES_MAX held entries, most recently used
 * first. False (nothing packed) when no model has a cache. */
bool mbd_wpfx_pack(const mbd_wstate *st, msgpack_packer *pk);

#endif
