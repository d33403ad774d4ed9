/* Internal layout of the broker core, shared by broker/core.c (the request
 * state machine) and broker/rehome.c (re-homing a lost worker's durable
 * sessions): the request record, the core's state, and the core's queue and
 * placement steps that re-homing drives. Nothing outside broker/ includes it. */
#ifndef MBD_BROKER_CORE_IMPL_H
#define MBD_BROKER_CORE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/caller.h"
#include "broker/core.h"
#include "broker/reclaim.h"
#include "broker/status.h"

#define TICKET_BUCKETS 4096
#define FAILED_MAX 64     /* start failures kept for STATUS */
#define SEEN_UIDS 1024    /* registered uids remembered for session errors */
#define POISON_CRASHES 2  /* workers that died running a request before it is not re-sent */
#define PROBE_ROUNDS 5    /* liveness probes after a socket reports a disconnect */

/* WAITING: on no worker (queued, or being placed); INFLIGHT: sent, not
 * answered; ZOMBIE: answered by the broker (timeout), the worker's slot stays
 * busy until its reply arrives or it dies. */
typedef enum { RQ_WAITING, RQ_INFLIGHT, RQ_ZOMBIE } rq_state;

typedef struct breq {
  uint64_t ticket;                 /* current ticket while in flight */
  uint64_t client_tag;             /* the client's request id */
  char rid[40];                    /* the body's request_id (the client's trace id), "" if none */
  uint8_t client[MBD_BW_IDENT_MAX];
  size_t client_len;
  char caller[MBD_BCALLER_ID_MAX]; /* the stamped caller id; "" = anonymous (then the routing id counts) */
  int64_t caller_pid;              /* local caller's process (ipc peer credentials), 0 = unknown */
  char session_id[2 * MBD_BW_UID_MAX]; /* session commands: the whole id */
  uint8_t cmd;
  mbd_route_want want;
  char model[MBD_BW_NAME_MAX];
  char digest[MBD_BW_DIGEST_MAX];  /* the model's weights digest: the client's pin (a prefix) or,
                                      once resolved, the full digest every send must match */
  bool digest_fixed;               /* digest is the full one chosen for this request */
  char tokenizer[MBD_BW_DIGEST_MAX]; /* with digest_fixed: the tokenizer digest chosen with it */
  char session_uid[MBD_BW_UID_MAX]; /* session commands: the owning worker's uid */
  bool is_session;
  bool internal;                   /* the broker's own (a durable session's restore): no client */
  int64_t token;                   /* STEP: the token it feeds (durable sessions log it) */
  bool has_ipc;                    /* carries CUDA IPC tensors: same-host GPU workers only */
  int ipc_device;                  /* device of the first IPC tensor (GPU-affine routing) */
  uint64_t *pfx;                   /* `prefix`: the prompt's routing hashes, or NULL (owned) */
  size_t npfx;
  char client_host[MBD_BW_NAME_MAX]; /* the client's host_id (required with IPC tensors) */
  int64_t start_ms, deadline_ms;   /* absolute, monotonic */
  size_t bytes;                    /* body + payload bytes the broker holds for it */
  mbd_msg *orig;                   /* kept for a re-send (stateless) or until first send */
  uint64_t worker_gen;             /* worker it is on (in flight / zombie) */
  char worker_name[MBD_BW_NAME_MAX];
  bool retried;                    /* re-sent at least once after a worker loss */
  int sends;                       /* times sent to a worker */
  int crashes;                     /* workers that died (not re-registered) while running it */
  char crashed_on[POISON_CRASHES][MBD_BW_NAME_MAX]; /* their names */
  rq_state state;
  bool queued, hashed;             /* linked in the queue / the ticket hash */
  struct breq *hnext;              /* ticket hash chain */
  struct breq *qprev, *qnext;      /* queue */
  struct breq *aprev, *anext;      /* all requests */
} breq;

struct mbd_bcore {
  mbd_broker_config cfg;
  mbd_bcore_send_fn send;
  void *ctx;
  mbd_registry *reg;
  breq *buckets[TICKET_BUCKETS];
  breq *qhead, *qtail;
  size_t qlen;
  size_t qbytes;                   /* sum of the queued requests' bytes */
  breq *all;
  size_t pending;                  /* queued + in flight (not zombies) */
  uint64_t next_ticket, next_gen;
  int64_t next_hb_ms;
  int64_t next_reap_ms;            /* next sweep for sessions of departed clients */
  mbd_breclaim *reclaim;           /* sessions by their client's process or connection */
  mbd_bdurable *durable;           /* session checkpoints and logs (broker/durable.h) */
  bool wake;                       /* a durable session's restore ended: re-place its requests */
  bool shutting;
  int64_t now_ms;                  /* the clock at the current entry point */
  int64_t probe_t0[2];             /* per side (mbd_bdest): when a disconnect was reported */
  int probe_next[2];               /* next probe round; PROBE_ROUNDS = none pending */
  mbd_bcore_probe_fn probe;        /* client liveness probe, or NULL */
  mbd_bcore_stats st;
  mbd_bstart_failure failed[FAILED_MAX]; /* workers that reported they could not start */
  size_t nfailed;
  char seen_uids[SEEN_UIDS][MBD_BW_UID_MAX]; /* uids that registered (ring), so a session
                                               of a lost worker is told from an unknown one */
  size_t nseen, seen_next;
  int64_t warn_at_ms;              /* when the last worker-input warning was logged */
  uint64_t warn_suppressed;        /* worker-input warnings not logged since */
};

/* Links r at the queue's head (front) or tail, WAITING. */
void mbd_bcore_q_push(mbd_bcore *c, breq *r, bool front);

/* Links r (not queued) just before `at` (NULL = at the tail). */
void mbd_bcore_q_insert_before(mbd_bcore *c, breq *r, breq *at);

/* Unlinks r from the queue (no-op when not queued). */
void mbd_bcore_q_del(mbd_bcore *c, breq *r);

/* Answers r with an ERROR and frees it, or turns an in-flight request into a
 * zombie (answered; the worker's slot stays busy until it replies or dies).
 * A restore (r->internal) that fails loses its session instead. */
void mbd_bcore_req_fail(mbd_bcore *c, breq *r, int code, const char *msg);

/* Tries to place r (not queued). Returns true when it left r's fate decided
 * (sent or answered), false when it should wait for capacity. */
bool mbd_bcore_place(mbd_bcore *c, breq *r);

/* Moves queued requests to workers with spare capacity, oldest first. */
void mbd_bcore_drain(mbd_bcore *c);

#endif
