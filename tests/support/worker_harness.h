/* The real mambad-broker and mambad-worker processes under test (fork/exec
 * from $MBD_BIN_DIR, ipc:// endpoints in a mkdtemp directory) and a client
 * DEALER that talks to the broker with the wire API, so every test exercises
 * the processes exactly as deployed. Request builders: wh_requests.h; the
 * fixture and its in-process reference: wh_fixture.h. */
#ifndef MBD_TEST_WORKER_HARNESS_H
#define MBD_TEST_WORKER_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <msgpack.h>

#include "common/protocol.h"
#include "common/wire.h"
#include "support/events.h"
#include "support/procs.h"

#define WH_MAX_PROCS 8

typedef struct wh {
  char dir[256];       /* mkdtemp directory holding the ipc sockets (and logs) */
  char clients[320];   /* broker client endpoint */
  char workers[320];   /* broker worker endpoint */
  char bin[512];       /* $MBD_BIN_DIR */
  char model_dir[512]; /* fixture tiny-d64 */
  bool worker_logs;    /* true: each worker's output goes to dir/<name>.log */
  const char *client_inflight; /* broker --client-inflight when set (one test client
                                  that drives the traffic of many) */
  pid_t broker;              /* the broker process, 0 when none */
  pid_t procs[WH_MAX_PROCS]; /* workers, by start order (0: already stopped) */
  int nprocs;                /* entries of procs in use */
  void *zctx, *sock;         /* client DEALER */
  uint64_t next_tag;         /* tag of the next request */
} wh;

/* Monotonic clock in seconds, at nanosecond resolution (fine enough to
 * time one decode step). */
double wh_now(void);

/* Returns 0, or 77 (skip) with the reason printed when binaries or fixtures
 * are missing. */
int wh_init(wh *h);

/* wh_init for a test: exits 77 (ctest: skipped) with the reason printed, or
 * 1 when the temporary directory cannot be made. */
void wh_init_or_skip(wh *h);

/* Starts the broker (heartbeat 200 ms, liveness 3) and connects the client. */
void wh_start_broker(wh *h);

/* Starts a worker serving the fixture as model "tiny"; extra args NULL-terminated. */
pid_t wh_start_worker(wh *h, const char *name, ...);

/* Path of the log of worker `name` (h->worker_logs) into out[cap]. */
void wh_worker_log(const wh *h, const char *name, char *out, size_t cap);

/* Stops a process with sig and reaps it; returns its exit status (or -sig). */
int wh_stop(pid_t p, int sig);

/* Stops the workers and the broker, closes the client, removes dir. */
void wh_fini(wh *h);

/* Sends cmd with body sb (consumed) and n inline payloads; returns the tag. */
uint64_t wh_send(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
                 const size_t *lens);

/* Next reply (any tag), or NULL after timeout_ms. */
mbd_msg *wh_recv(wh *h, int timeout_ms);

/* Waits for the FINAL/ERROR of `tag` (PARTIALs of it are dropped; other tags
 * are a test bug here). NULL on timeout. */
mbd_msg *wh_wait(wh *h, uint64_t tag, int timeout_ms);

/* wh_send, then wh_wait with a 60 s guard. */
mbd_msg *wh_call(wh *h, uint8_t cmd, msgpack_sbuffer *sb, int n, const void *const *pl,
                 const size_t *lens);

/* Collects the FINAL/ERROR of tags [t0, t0+n) into out[] (PARTIALs dropped;
 * entries already set count as collected). Returns the number still missing
 * after timeout_ms. */
size_t wh_collect(wh *h, uint64_t t0, size_t n, mbd_msg **out, int timeout_ms);

/* Destroys m[0..n) (NULL entries allowed). */
void wh_free_all(mbd_msg **m, size_t n);

/* Body of a reply (caller destroys). */
mbd_body *wh_body(const mbd_msg *m);

/* Error code of an ERROR reply (0 for FINAL, 999 for NULL); prints the message. */
int wh_code(const mbd_msg *m);

/* Waits until the broker lists n workers (STATUS). Returns 0 or -1. */
int wh_wait_workers(wh *h, int n, int timeout_ms);

/* The payload bytes of the first tensor of a FINAL (pointer into m). */
const void *wh_tensor(const mbd_msg *m, size_t *len);

/* A string field of a reply body into dst. */
int wh_str(const mbd_msg *m, const char *key, char *dst, size_t cap);

/* An integer field of a reply body, or -1 when absent. */
int64_t wh_i64(const mbd_msg *m, const char *key);

/* Token array `tokens` of a reply into out[cap]; returns count or -1. */
int wh_tokens(const mbd_msg *m, int64_t *out, size_t cap);

#endif
