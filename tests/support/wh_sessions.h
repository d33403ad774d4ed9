/* Many sessions at once through the worker harness, as the durable-session
 * tests drive them on CPU and GPU workers alike: open and prefill n sessions,
 * stream n GENERATEs while a worker is signalled mid-stream, EXPORT, CLOSE,
 * and what the broker's STATUS says (counters, the workers' route). These helpers check every reply with
 * cmocka assertions, so they run only inside a cmocka test. */
#ifndef MBD_TEST_WH_SESSIONS_H
#define MBD_TEST_WH_SESSIONS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "support/worker_harness.h"

/* The prompt of session i: its tokens (borrowed) and their count in *len. */
typedef const int64_t *(*wh_prompt_fn)(int i, int64_t *len);

/* Opens n sessions of model "tiny" into sids[i] and prefills session i with
 * prompt(i) (last_only), all sent at once; each reply must come within
 * timeout_ms and succeed. */
void wh_open_prefill(wh *h, char (*sids)[64], int n, wh_prompt_fn prompt, int timeout_ms);

/* GENERATE of max_tokens on sessions [0, n) at once (even i: greedy; odd i:
 * temperature 0.9, seed 1000 + i). Sends `sig` to `victim` once a quarter of
 * all tokens streamed (victim 0: none) and asserts that it happened. Every
 * stream must end in a FINAL within timeout_ms whose max_tokens tokens go to
 * out[i * max_tokens ...]; the streamed tokens must be their prefix, all but
 * at most the last one streamed. */
void wh_generate_all(wh *h, char (*sids)[64], int n, int64_t max_tokens, pid_t victim, int sig,
                     int timeout_ms, int64_t *out);

/* EXPORT of session sid, which must succeed within timeout_ms: a copy of the
 * state blob (caller frees) and its size in *n. */
uint8_t *wh_export(wh *h, const char *sid, int timeout_ms, size_t *n);

/* CLOSE of session sid, which must succeed. */
void wh_close(wh *h, const char *sid);

/* The broker's STATUS reply, which must succeed (caller destroys). */
mbd_msg *wh_status(wh *h);

/* The counter `name` of the broker's STATUS, which must be there. */
uint64_t wh_counter(wh *h, const char *name);

/* `inflight` of the i-th worker STATUS lists; -1 when it lists fewer. */
int64_t wh_worker_inflight(wh *h, int i);

/* Asserts that the broker lists n workers, all of backend `backend` ("cpu",
 * "cuda") and of one route id (printed). */
void wh_assert_one_route(wh *h, int n, const char *backend);

#endif
