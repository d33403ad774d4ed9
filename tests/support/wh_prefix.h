/* The prefix state cache through the client library, as the CPU and GPU
 * prefix-cache tests drive it against the harness's broker: one request that
 * opens a session on its prompt's routing hashes and prefills with a cache
 * point, a worker's cache counters from STATUS, and waiting for the broker to
 * list a number of workers. These helpers check every reply with cmocka
 * assertions, so they run only inside a cmocka test. */
#ifndef MBD_TEST_WH_PREFIX_H
#define MBD_TEST_WH_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/mambad.h"

/* One request on model `model`: OPEN with the routing hashes of ids[n] and
 * one cache point at `point`, PREFILL last_only with that point, GENERATE
 * `gen` greedy tokens, CLOSE. The last position's logits ([vocab] f32) go to
 * logits and the tokens to toks[gen]; every call must succeed (`label` names
 * the request in a failure). */
void wh_prefix_request(mbd_client *c, const char *model, const int64_t *ids, int64_t n,
                       int64_t point, int64_t vocab, int64_t gen, int label, float *logits,
                       int64_t *toks);

/* The prefix cache counters of worker `name` into *x (all 0 when it reports
 * none or is not listed); true when it reports them. */
bool wh_prefix_stats(mbd_client *c, const char *name, mbd_prefix_cache_info *x);

/* Waits until the broker lists exactly n workers, polling STATUS every
 * 100 ms; fails the test after timeout_ms. */
void wh_wait_listed(mbd_client *c, size_t n, int timeout_ms);

#endif
