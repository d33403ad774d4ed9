/* The broker core's peers without sockets, for the broker's unit tests: a
 * send callback that records every message, and fake workers (a CPU route,
 * a registry record, a READY message). */
#ifndef MBD_TEST_FAKE_PEERS_H
#define MBD_TEST_FAKE_PEERS_H

#include <stdbool.h>
#include <stdint.h>

#include "broker/core.h"
#include "broker/registry.h"
#include "common/route.h"
#include "common/wire.h"

#define FP_SENT_MAX 64 /* messages recorded between two fp_clear */

/* What the core sent. */
typedef struct fp_sent {
  mbd_bdest dest[FP_SENT_MAX]; /* to a client or a worker */
  mbd_msg *m[FP_SENT_MAX];     /* the messages, owned */
  int n;                       /* entries in use */
  int fail_worker_rc;          /* nonzero: sends to workers fail with this (and record nothing) */
} fp_sent;

/* An mbd_bcore_send_fn recording into ctx, an fp_sent. */
int fp_send(void *ctx, mbd_bdest d, mbd_msg **m, mbd_error *err);

/* Destroys the recorded messages. */
void fp_clear(fp_sent *s);

/* Index of the first recorded message with this cmd (and to this peer when
 * peer is not NULL), or -1. */
int fp_find(const fp_sent *s, uint8_t cmd, const char *peer);

/* As fp_find, the message itself, or NULL. */
mbd_msg *fp_find_msg(const fp_sent *s, uint8_t cmd, const char *peer);

/* A CPU route of dtype policy p (x86-64-v3, state capacity 4). */
void fp_route(mbd_route_identity *r, mbd_dtype_policy p);

/* A registry record of worker `ident` (uid "u" ident, capacity 4) on the
 * fp_route of f32, serving model "m" with weights digest `digest`. */
void fp_worker(mbd_bworker *w, const char *ident, const char *digest);

/* What a fake worker's READY says besides its routing id and name. */
typedef struct fp_ready {
  const char *uid;              /* NULL: the routing id */
  mbd_dtype_policy policy;      /* of its fp_route (0: f32) */
  int capacity;
  const char *model;            /* NULL: "m" */
  const char *digest;           /* the model's weights digest, NULL: "d" */
  const char *tokenizer_digest; /* NULL: not sent */
  const char *host_id;          /* NULL: not sent */
  bool gpu;                     /* a CUDA worker ("NVIDIA H200") on `device`, sent */
  int device;                   /* with gpu: its CUDA ordinal */
  bool bad_route_id;            /* a route_id that is not the route's */
} fp_ready;

/* The READY of worker `ident` (its peer and name). */
mbd_msg *fp_ready_msg(const char *ident, const fp_ready *o);

#endif
