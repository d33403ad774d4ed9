/* libmambad: connection, request/reply loop and the request verbs.
 *
 * One DEALER socket per client, one request in flight at a time. The request
 * id (F2 tag) ties replies to requests; anything tagged with another id is a
 * late reply to a request we already gave up on and is dropped. ZMQ_IMMEDIATE
 * keeps requests out of the queue of a broker that is not connected yet, so an
 * unreachable broker shows up as a clear TIMEOUT instead of a silent wait. */
#include "client/mambad.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/curve.h"
#include "common/defaults.h"
#include "common/prefix_hash.h"
#include "common/protocol.h"
#include "common/wire.h"

#define GRACE_MS 2000 /* how long past the deadline we wait for the broker's TIMEOUT */

struct mbd_client {
  void *zctx;               /* own ZeroMQ context: clients share nothing */
  void *sock;               /* DEALER connected to the broker */
  char endpoint[256];
  mbd_client_options opt;
  uint64_t next_id;         /* next request id; never 0 */
  uint32_t trace_salt;      /* random per client: request_id = salt + tag, unique across clients */
  mbd_reply_meta last;      /* who answered the last request */
  volatile sig_atomic_t *interrupt; /* when set nonzero, the running request is cancelled */
};

struct mbd_session {
  mbd_client *c;    /* borrowed */
  char id[128];     /* "<worker-uid>/<n>" */
  char model[64];
  char model_digest[72]; /* weights digest the broker chose at OPEN/IMPORT, "" if not told */
};

void mbd_client_options_init(mbd_client_options *o) {
  memset(o, 0, sizeof *o);
  o->wait_ms = 120000;
  o->connect_ms = 5000;
  o->max_message_bytes = (size_t)2 << 30;
}

int mbd_client_cancel(mbd_client *c, uint64_t request_id, mbd_error *err) {
  if (request_id == 0) return mbd_error_set(err, MBD_E_INVALID, "request id 0 is never used");
  mbd_msg *m = NULL;
  int rc = mbd_msg_new(MBD_CMD_CANCEL, request_id, &m, err);
  if (rc) return rc;
  rc = mbd_msg_send(&m, c->sock, ZMQ_DONTWAIT, err);
  if (rc) return mbd_error_prefix(err, "sending cancel of request %" PRIu64, request_id);
  return MBD_OK;
}

void mbd_client_set_interrupt(mbd_client *c, volatile sig_atomic_t *flag) { c->interrupt = flag; }

void mbd_generate_params_init(mbd_generate_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = 16;
  p->top_p = 1; /* off */
}

int mbd_client_new(const char *endpoint, const mbd_client_options *opt, mbd_client **out,
                   mbd_error *err) {
  *out = NULL;
  if (!endpoint || !*endpoint)
    return mbd_error_set(err, MBD_E_INVALID, "no broker endpoint given (e.g. ipc:///tmp/mambad/clients.sock)");
  if (strlen(endpoint) >= sizeof ((mbd_client *)0)->endpoint)
    return mbd_error_set(err, MBD_E_INVALID, "broker endpoint is longer than 255 bytes");
  mbd_client *c = calloc(1, sizeof *c);
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "out of memory allocating a client");
  if (opt) c->opt = *opt;
  else mbd_client_options_init(&c->opt);
  if (c->opt.wait_ms <= 0) c->opt.wait_ms = 120000;
  if (c->opt.connect_ms <= 0) c->opt.connect_ms = 5000;
  if (c->opt.max_message_bytes == 0) c->opt.max_message_bytes = (size_t)2 << 30;
  snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
  c->next_id = 1;
  {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40) ^
                 (uint64_t)(uintptr_t)c;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;
    c->trace_salt = (uint32_t)x;
  }
  int one = 1, zero = 0;
  c->zctx = zmq_ctx_new();
  if (!c->zctx) {
    mbd_error_set(err, MBD_E_IO, "creating a ZeroMQ context: %s", zmq_strerror(errno));
    goto fail;
  }
  c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
  if (!c->sock) {
    mbd_error_set(err, MBD_E_IO, "creating a DEALER socket: %s", zmq_strerror(errno));
    goto fail;
  }
  zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(c->sock, ZMQ_IMMEDIATE, &one, sizeof one);
  if (c->opt.curve_key || c->opt.server_key) {
    mbd_curve_pair own;
    char server[MBD_CURVE_KEY_LEN + 1];
    if (!c->opt.curve_key || !c->opt.server_key) {
      mbd_error_set(err, MBD_E_INVALID, "CURVE needs both curve_key (this client's secret file) "
                    "and server_key (the broker's public key)");
      goto fail;
    }
    if (mbd_curve_read_secret(c->opt.curve_key, &own, err) ||
        mbd_curve_read_public(c->opt.server_key, server, err) ||
        mbd_curve_client(c->sock, &own, server, err))
      goto fail;
    c->opt.curve_key = c->opt.server_key = NULL; /* borrowed strings: not kept */
  }
  if (zmq_connect(c->sock, endpoint) != 0) {
    mbd_error_set(err, MBD_E_INVALID,
                  "cannot connect to '%s': %s (endpoints look like ipc:///path or tcp://host:port)",
                  endpoint, zmq_strerror(errno));
    goto fail;
  }
  *out = c;
  return 0;
fail:
  mbd_client_destroy(&c);
  return err ? err->code : MBD_E_IO;
}

void mbd_client_destroy(mbd_client **pc) {
  if (!pc || !*pc) return;
  mbd_client *c = *pc;
  if (c->sock) zmq_close(c->sock);
  if (c->zctx) zmq_ctx_term(c->zctx);
  free(c);
  *pc = NULL;
}

const mbd_reply_meta *mbd_client_last_reply(const mbd_client *c) { return &c->last; }

/* ---- request / reply ---------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t deadline_(const mbd_client *c, const mbd_call_opts *o) {
  if (o && o->deadline_ms > 0) return o->deadline_ms;
  return c->opt.deadline_ms > 0 ? c->opt.deadline_ms : 0;
}

static const mbd_route_want *route_(const mbd_client *c, const mbd_call_opts *o) {
  return o && o->route ? o->route : &c->opt.route;
}

static void str_field(const msgpack_object *root, const char *key, char *dst, size_t cap) {
  const msgpack_object *v = mbd_obj_get(root, key);
  if (!v || v->type != MSGPACK_OBJECT_STR) return;
  size_t n = v->via.str.size < cap - 1 ? v->via.str.size : cap - 1;
  memcpy(dst, v->via.str.ptr, n);
  dst[n] = '\0';
}

/* Called for each PARTIAL of the current request; nonzero stops the request. */
typedef int (*partial_fn)(void *user, const mbd_msg *m, mbd_error *err);

void mbd_tensor_out_release(mbd_tensor_out *t) {
  if (!t) return;
  if (t->owner_ == t->data) {
    free(t->owner_);
  } else if (t->owner_) {
    zmq_msg_close(t->owner_);
    free(t->owner_);
  }
  memset(t, 0, sizeof *t);
}

/* Reads integer array `key` into a malloc'd array (NULL when empty). */
static int i64_list(const msgpack_object *map, const char *key, int64_t **out, size_t *n,
                    mbd_error *err) {
  *out = NULL;
  *n = 0;
  const msgpack_object *a = mbd_obj_get(map, key);
  if (!a) return mbd_error_set(err, MBD_E_PROTOCOL, "reply lacks '%s'", key);
  if (a->type != MSGPACK_OBJECT_ARRAY)
    return mbd_error_set(err, MBD_E_PROTOCOL, "reply field '%s' is not an array", key);
  if (a->via.array.size == 0) return 0;
  int64_t *v = malloc(a->via.array.size * sizeof *v);
  if (!v) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading '%s'", key);
  for (size_t i = 0; i < a->via.array.size; i++) {
    const msgpack_object *e = &a->via.array.ptr[i];
    if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER && e->via.u64 <= INT64_MAX) {
      v[i] = (int64_t)e->via.u64;
    } else if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
      v[i] = e->via.i64;
    } else {
      free(v);
      return mbd_error_set(err, MBD_E_PROTOCOL, "reply field '%s'[%zu] is not an integer", key, i);
    }
  }
  *out = v;
  *n = a->via.array.size;
  return 0;
}

/* Copies a tensor out of a shm object someone else named in the reply. */
static int copy_from_shm(const mbd_tensor_ref *r, size_t nbytes, mbd_tensor_out *out,
                         mbd_error *err) {
  int fd = shm_open(r->shm_name, O_RDONLY, 0);
  if (fd < 0)
    return mbd_error_set(err, MBD_E_IO, "opening reply shm %s: %s", r->shm_name, strerror(errno));
  struct stat stt;
  void *map = MAP_FAILED;
  int rc = 0;
  if (fstat(fd, &stt) != 0 || (uint64_t)stt.st_size < r->offset ||
      nbytes > (uint64_t)stt.st_size - r->offset) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL, "reply shm %s is smaller than the tensor it holds",
                       r->shm_name);
    goto done;
  }
  out->data = malloc(nbytes ? nbytes : 1);
  if (!out->data) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory copying %zu bytes", nbytes);
    goto done;
  }
  out->owner_ = out->data;
  if (nbytes) {
    map = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      rc = mbd_error_set(err, MBD_E_IO, "mapping reply shm %s: %s", r->shm_name, strerror(errno));
      goto done;
    }
    memcpy(out->data, (const char *)map + r->offset, nbytes);
    munmap(map, (size_t)stt.st_size);
  }
done:
  close(fd);
  return rc;
}

/* The caller's device output `own` as the reply names it in r: same handle
 * and offset, and r's bytes within what own described. */
static int take_device(const mbd_tensor_ref *r, size_t nbytes, const mbd_tensor_in *own,
                       mbd_tensor_out *out, mbd_error *err) {
  size_t cap = 0;
  if (!own || !own->device || mbd_tensor_desc_nbytes(&own->desc, &cap, NULL) ||
      memcmp(r->ipc_handle, own->ipc_.mem, sizeof own->ipc_.mem) || r->offset != own->ipc_.offset ||
      nbytes > cap)
    return mbd_error_set(err, MBD_E_PROTOCOL,
                         "reply tensor '%s' is a CUDA IPC ref that is not the device output this "
                         "request passed",
                         r->name);
  out->data = (void *)(uintptr_t)own->device;
  out->on_device = true;
  return 0;
}

/* Moves tensor `idx` of a FINAL reply into out: inline frames are taken from
 * the message without a copy (copied only when misaligned); shm and device
 * refs into `own` (the caller's output) are borrowed. */
static int take_tensor(mbd_msg *fin, const mbd_body *body, size_t idx, const mbd_tensor_in *own_in,
                       mbd_tensor_out *out, mbd_error *err) {
  const mbd_shm *own = own_in ? own_in->shm : NULL;
  memset(out, 0, sizeof *out);
  enum { CAP = 64 };
  mbd_tensor_ref *refs = calloc(CAP, sizeof *refs);
  if (!refs) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading a reply");
  size_t n = 0, nbytes = 0;
  int rc = mbd_obj_tensor_refs(mbd_body_root(body), "tensors", true, refs, CAP, &n, err);
  if (rc != 0) {
    mbd_error_prefix(err, "reply from the service");
    goto done;
  }
  if (idx >= n) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL, "reply carries %zu tensors, expected at least %zu", n,
                       idx + 1);
    goto done;
  }
  const mbd_tensor_ref *r = &refs[idx];
  rc = mbd_tensor_desc_nbytes(&r->desc, &nbytes, err);
  if (rc != 0) goto done;
  snprintf(out->name, sizeof out->name, "%s", r->name);
  out->desc = r->desc;
  out->nbytes = nbytes;
  if (r->kind == MBD_TREF_INLINE) {
    size_t len = 0;
    if (r->frame >= mbd_msg_npayloads(fin) || (mbd_msg_payload(fin, r->frame, &len), len != nbytes)) {
      rc = mbd_error_set(err, MBD_E_PROTOCOL,
                         "reply tensor '%s' names payload %u, which is missing or not %zu bytes",
                         r->name, r->frame, nbytes);
      goto done;
    }
    zmq_msg_t *zm = malloc(sizeof *zm);
    if (!zm) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading a reply");
      goto done;
    }
    zmq_msg_init(zm);
    rc = mbd_msg_take_payload(fin, r->frame, zm, err);
    if (rc != 0) {
      zmq_msg_close(zm);
      free(zm);
      goto done;
    }
    void *d = zmq_msg_data(zm);
    if (((uintptr_t)d & 7u) == 0 && nbytes > 0) {
      out->data = d;
      out->owner_ = zm;
    } else { /* small or misaligned frame: copy so callers can index it as typed data */
      out->data = malloc(nbytes ? nbytes : 1);
      if (out->data) memcpy(out->data, d, nbytes);
      out->owner_ = out->data;
      zmq_msg_close(zm);
      free(zm);
      if (!out->data) rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading a reply");
    }
  } else if (r->kind == MBD_TREF_SHM) {
    if (own && strcmp(r->shm_name, mbd_shm_name(own)) == 0) {
      size_t sz = mbd_shm_size(own);
      if (r->offset > sz || nbytes > sz - r->offset) {
        rc = mbd_error_set(err, MBD_E_PROTOCOL, "reply tensor '%s' lies outside shm region %s",
                           r->name, r->shm_name);
        goto done;
      }
      out->data = (char *)mbd_shm_data(own) + r->offset;
    } else {
      rc = copy_from_shm(r, nbytes, out, err);
    }
  } else {
    rc = take_device(r, nbytes, own_in, out, err);
  }
done:
  if (rc != 0) mbd_tensor_out_release(out);
  free(refs);
  return rc;
}

/* Fills c->last and err from an ERROR reply; returns its (negative) code. */
static int error_reply(mbd_client *c, const mbd_msg *m, mbd_error *err) {
  size_t len = 0;
  const void *body = mbd_msg_body(m, &len);
  mbd_body *b = NULL;
  mbd_error perr;
  if (mbd_body_parse(body, len, &b, &perr) != 0)
    return mbd_error_set(err, MBD_E_PROTOCOL, "unreadable ERROR reply: %s", perr.msg);
  const msgpack_object *root = mbd_body_root(b);
  int64_t code = MBD_E_INTERNAL;
  char message[MBD_ERROR_MSG_MAX] = "";
  mbd_obj_i64(root, "code", false, &code, NULL);
  if (code >= 0 || code < -1000) code = MBD_E_INTERNAL;
  str_field(root, "message", message, sizeof message);
  str_field(root, "error", c->last.error, sizeof c->last.error);
  str_field(root, "route_id", c->last.route_id, sizeof c->last.route_id);
  str_field(root, "worker", c->last.worker, sizeof c->last.worker);
  c->last.code = (int)code;
  mbd_body_destroy(&b);
  return mbd_error_set(err, (int)code, "%s", message[0] ? message : "the service reported an error without a message");
}

static int request_(mbd_client *c, int64_t deadline_ms, mbd_msg **req,
                        partial_fn on_partial, void *user, mbd_msg **final, mbd_error *err) {
  *final = NULL;
  uint64_t id = c->next_id++;
  if (c->next_id == 0) c->next_id = 1;
  memset(&c->last, 0, sizeof c->last);
  c->last.request_id = id;
  snprintf(c->last.trace, sizeof c->last.trace, "%08x%08" PRIx64, c->trace_salt, id);
  uint8_t cmd = mbd_msg_cmd(*req);
  mbd_msg_set_tag(*req, id);
  int64_t wait = deadline_ms > 0 ? deadline_ms + GRACE_MS : c->opt.wait_ms;
  int64_t end = now_ms() + wait;

  /* Wait until the broker is connected (ZMQ_IMMEDIATE), then send. */
  zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLOUT};
  int64_t send_end = now_ms() + (c->opt.connect_ms < wait ? c->opt.connect_ms : wait);
  for (;;) {
    int64_t left = send_end - now_ms();
    if (left < 0) left = 0;
    int r = zmq_poll(&it, 1, (long)left);
    if (r > 0) break;
    if (r < 0 && errno == EINTR) continue;
    mbd_msg_destroy(req);
    if (r < 0) return mbd_error_set(err, MBD_E_IO, "polling the broker socket: %s", zmq_strerror(errno));
    return mbd_error_set(err, MBD_E_TIMEOUT,
                         "broker at %s not reachable within %" PRId64 " ms (is it running? start one with `mambad up --config FILE.yaml`)",
                         c->endpoint, c->opt.connect_ms < wait ? c->opt.connect_ms : wait);
  }
  int rc = mbd_msg_send(req, c->sock, ZMQ_DONTWAIT, err);
  if (rc != 0) return mbd_error_prefix(err, "sending %s to %s", mbd_cmd_name(cmd), c->endpoint);

  it.events = ZMQ_POLLIN;
  bool cancelled = false;
  for (;;) {
    if (c->interrupt && *c->interrupt && !cancelled) {
      /* The broker answers ERROR CANCELLED at once; wait a little for it so
       * the id's last message is consumed here, not by the next request. */
      cancelled = true;
      mbd_client_cancel(c, id, NULL);
      if (end > now_ms() + GRACE_MS) end = now_ms() + GRACE_MS;
    }
    int64_t left = end - now_ms();
    if (left <= 0 && cancelled)
      return mbd_error_set(err, MBD_E_CANCELLED, "%s (request %" PRIu64 ") cancelled",
                           mbd_cmd_name(cmd), id);
    if (left <= 0)
      return mbd_error_set(err, MBD_E_TIMEOUT,
                           "no reply to %s (request %" PRIu64 ") from %s within %" PRId64 " ms",
                           mbd_cmd_name(cmd), id, c->endpoint, wait);
    /* With an interrupt flag, wake up now and then: a signal may land just
     * before the poll, which then would not see EINTR. */
    if (c->interrupt && !cancelled && left > 100) left = 100;
    int r = zmq_poll(&it, 1, (long)left);
    if (r < 0 && errno != EINTR)
      return mbd_error_set(err, MBD_E_IO, "polling the broker socket: %s", zmq_strerror(errno));
    if (r <= 0) continue;
    mbd_msg *m = NULL;
    mbd_error rerr;
    mbd_error_clear(&rerr);
    rc = mbd_msg_recv(c->sock, false, c->opt.max_message_bytes, &m, &rerr);
    if (rc == MBD_E_IO) continue;
    if (rc != 0) {
      bool ours = m && mbd_msg_tag(m) == id;
      mbd_msg_destroy(&m);
      if (ours) {
        mbd_error_set(err, rc, "reply to %s: %s", mbd_cmd_name(cmd), rerr.msg);
        return rc;
      }
      continue; /* malformed and not ours: nothing to act on */
    }
    if (mbd_msg_tag(m) != id) { /* late reply of an abandoned request */
      mbd_msg_destroy(&m);
      continue;
    }
    uint8_t rcmd = mbd_msg_cmd(m);
    if (rcmd == MBD_CMD_PARTIAL) {
      rc = on_partial ? on_partial(user, m, err) : 0;
      mbd_msg_destroy(&m);
      if (rc != 0) return rc;
      continue;
    }
    if (rcmd == MBD_CMD_ERROR) {
      rc = error_reply(c, m, err);
      mbd_msg_destroy(&m);
      return rc;
    }
    if (rcmd != MBD_CMD_FINAL) {
      mbd_msg_destroy(&m);
      return mbd_error_set(err, MBD_E_PROTOCOL, "unexpected %s reply to %s", mbd_cmd_name(rcmd),
                           mbd_cmd_name(cmd));
    }
    *final = m;
    return 0;
  }
}

/* The FINAL of a request: the message (it owns the inline payloads that
 * take_tensor may move out) and its parsed body. */
typedef struct reply {
  mbd_msg *fin;
  mbd_body *body;
} reply;

static void reply_free(reply *r) {
  mbd_body_destroy(&r->body);
  mbd_msg_destroy(&r->fin);
}

static int final_body(mbd_client *c, const mbd_msg *m, mbd_body **out, mbd_error *err) {
  size_t len = 0;
  const void *body = mbd_msg_body(m, &len);
  int rc = mbd_body_parse(body, len, out, err);
  if (rc != 0) return mbd_error_prefix(err, "reply from the service");
  const msgpack_object *root = mbd_body_root(*out);
  str_field(root, "route_id", c->last.route_id, sizeof c->last.route_id);
  str_field(root, "worker", c->last.worker, sizeof c->last.worker);
  str_field(root, "model_digest", c->last.model_digest, sizeof c->last.model_digest);
  return 0;
}

/* Packs "model" and, for "NAME@DIGEST", "model_digest" (a lower-cased hex
 * prefix of >= 8 chars); *nkeys (1 or 2) is how many keys it will pack, so
 * call it once with pk NULL to count. */
static int pack_model(msgpack_packer *pk, const char *model, size_t *nkeys, mbd_error *err) {
  char name[64], digest[72] = "";
  const char *at = strrchr(model, '@');
  size_t nl = at ? (size_t)(at - model) : strlen(model);
  if (nl == 0 || nl >= sizeof name)
    return mbd_error_set(err, MBD_E_INVALID, "model '%s': the name is empty or too long", model);
  memcpy(name, model, nl);
  name[nl] = '\0';
  if (at) {
    size_t dl = strlen(at + 1);
    for (size_t i = 0; i < dl && i + 1 < sizeof digest; i++)
      digest[i] = (char)tolower((unsigned char)at[1 + i]);
    digest[dl < sizeof digest ? dl : sizeof digest - 1] = '\0';
    if (!mbd_digest_prefix_ok(digest))
      return mbd_error_set(err, MBD_E_INVALID,
                           "model '%s': after '@' comes a hex prefix of 8 to 64 characters of the "
                           "weights digest (mambad status lists the digests)",
                           model);
  }
  *nkeys = digest[0] ? 2 : 1;
  if (!pk) return 0;
  mbd_pack_kv_str(pk, "model", name);
  if (digest[0]) mbd_pack_kv_str(pk, "model_digest", digest);
  return 0;
}

/* ---- body building ------------------------------------------------------ */

static void pack_tensors(msgpack_packer *pk, const char *key, const char *const *names,
                              const mbd_tensor_in *const *ts, size_t n, uint32_t *next_frame) {
  mbd_pack_str(pk, key);
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) {
    mbd_tensor_ref r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", names[i]);
    r.desc = ts[i]->desc;
    size_t nb = 0;
    mbd_tensor_desc_nbytes(&ts[i]->desc, &nb, NULL);
    if (ts[i]->device) {
      const mbd_tensor_ipc_ *x = &ts[i]->ipc_;
      _Static_assert(sizeof x->mem == MBD_IPC_HANDLE_BYTES && sizeof x->event == MBD_IPC_HANDLE_BYTES,
                     "IPC handle sizes");
      r.kind = MBD_TREF_CUDA_IPC;
      memcpy(r.ipc_handle, x->mem, sizeof r.ipc_handle);
      r.device = x->device;
      r.offset = x->offset;
      r.size = nb;
      if ((r.has_event = x->has_event)) memcpy(r.ipc_event, x->event, sizeof r.ipc_event);
    } else if (ts[i]->shm) {
      r.kind = MBD_TREF_SHM;
      snprintf(r.shm_name, sizeof r.shm_name, "%s", mbd_shm_name(ts[i]->shm));
      r.offset = ts[i]->offset;
      r.size = nb;
    } else {
      r.kind = MBD_TREF_INLINE;
      r.frame = (*next_frame)++;
    }
    mbd_pack_tensor_ref(pk, &r);
  }
}

static int add_payloads(mbd_msg *m, const mbd_tensor_in *const *ts, size_t n,
                             mbd_error *err) {
  for (size_t i = 0; i < n; i++) {
    if (ts[i]->shm || ts[i]->device) continue;
    size_t nb = 0;
    int rc = mbd_tensor_desc_nbytes(&ts[i]->desc, &nb, err);
    if (rc != 0) return rc;
    /* Copied: a request that times out may still sit in ZeroMQ's queue after
     * we return, and the caller's buffer must be free to go by then. */
    rc = mbd_msg_add_payload_copy(m, ts[i]->data, nb, err);
    if (rc != 0) return rc;
  }
  return 0;
}

static int check_in(const mbd_tensor_in *t, const char *what, mbd_error *err) {
  if (!t) return mbd_error_set(err, MBD_E_INVALID, "%s: no tensor given", what);
  size_t nb = 0;
  int rc = mbd_tensor_desc_nbytes(&t->desc, &nb, err);
  if (rc != 0) return mbd_error_prefix(err, "%s", what);
  if (t->device) {
    return 0; /* mbd_tensor_device checked it against its allocation */
  } else if (t->shm) {
    size_t sz = mbd_shm_size(t->shm);
    if (t->offset > sz || nb > sz - t->offset)
      return mbd_error_set(err, MBD_E_INVALID,
                           "%s: %zu bytes at offset %" PRIu64 " do not fit shm region %s of %zu bytes",
                           what, nb, t->offset, mbd_shm_name(t->shm), sz);
  } else if (!t->data && nb > 0) {
    return mbd_error_set(err, MBD_E_INVALID, "%s: no data and no shm region", what);
  }
  return 0;
}

/* An output (mbd_call_opts.output or forward's out_ref): shm or device. */
static int check_out(const mbd_tensor_in *t, const char *what, mbd_error *err) {
  int rc = check_in(t, what, err);
  if (rc == 0 && !t->shm && !t->device)
    rc = mbd_error_set(err, MBD_E_INVALID, "%s: an output must be a shm or device tensor", what);
  return rc;
}

/* Whether any of ts[0..n) or out is device memory: the request then carries
 * this host's id, so the broker picks a worker that can open the handles. */
static bool any_device(const mbd_tensor_in *const *ts, size_t n, const mbd_tensor_in *out) {
  for (size_t i = 0; i < n; i++)
    if (ts[i] && ts[i]->device) return true;
  return out && out->device;
}

static void pack_host_id(msgpack_packer *pk) {
  char host[128];
  mbd_client_host_id(host, sizeof host);
  mbd_pack_kv_str(pk, "host_id", host);
}

/* Packs "outputs": [out] and the host id when needed (the keys
 * out_keys() counted). */
static void pack_out(msgpack_packer *pk, const char *name, const mbd_tensor_in *const *ts,
                     size_t n, const mbd_tensor_in *out, uint32_t *frame) {
  if (out) {
    const char *names[1] = {name};
    pack_tensors(pk, "outputs", names, &out, 1, frame);
  }
  if (any_device(ts, n, out)) pack_host_id(pk);
}

static size_t out_keys(const mbd_tensor_in *const *ts, size_t n, const mbd_tensor_in *out) {
  return (out != NULL) + any_device(ts, n, out);
}

/* A request body being packed. */
typedef struct req_body {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} req_body;

static void body_init(req_body *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

/* request_id (what the broker and the worker log for this request: the id
 * request_ will give it, with the client's salt) and deadline_ms when set:
 * 1 + (deadline_ms > 0) map entries. */
static void pack_head(msgpack_packer *pk, const mbd_client *c, int64_t deadline_ms) {
  char rid[24];
  snprintf(rid, sizeof rid, "%08x%08" PRIx64, c->trace_salt, c->next_id);
  mbd_pack_kv_str(pk, "request_id", rid);
  if (deadline_ms > 0) mbd_pack_kv_i64(pk, "deadline_ms", deadline_ms);
}

/* Starts a routed request body: {request_id, deadline_ms?, route, + extra keys}. */
static void route_head(msgpack_packer *pk, const mbd_client *c, int64_t dl,
                       const mbd_route_want *want, size_t extra) {
  msgpack_pack_map(pk, 2 + (dl > 0) + extra);
  pack_head(pk, c, dl);
  mbd_pack_str(pk, "route");
  mbd_pack_route_want(pk, want);
}

/* Sends a request whose body the caller packed into rb (released here,
 * whatever happens), with payloads ts, and returns its FINAL in *out. */
static int roundtrip(mbd_client *c, int64_t dl, uint8_t cmd, req_body *rb,
                     const mbd_tensor_in *const *ts, size_t n, partial_fn pf, void *user,
                     reply *out, mbd_error *err) {
  out->fin = NULL;
  out->body = NULL;
  mbd_msg *m = NULL;
  int rc = mbd_msg_new(cmd, 0, &m, err);
  if (rc == 0) rc = mbd_msg_take_body(m, &rb->sb, err);
  if (rc == 0) rc = add_payloads(m, ts, n, err);
  msgpack_sbuffer_destroy(&rb->sb);
  if (rc != 0) {
    mbd_msg_destroy(&m);
    return rc;
  }
  rc = request_(c, dl, &m, pf, user, &out->fin, err);
  if (rc != 0) return rc;
  rc = final_body(c, out->fin, &out->body, err);
  if (rc != 0) mbd_msg_destroy(&out->fin);
  return rc;
}

/* roundtrip for the requests answered by one tensor (the first of the
 * reply's "tensors"); `own` is the caller's shm output region, if any. */
static int roundtrip_tensor(mbd_client *c, int64_t dl, uint8_t cmd, req_body *rb,
                            const mbd_tensor_in *const *ts, size_t n, const mbd_tensor_in *own,
                            mbd_tensor_out *out, mbd_error *err) {
  reply r;
  int rc = roundtrip(c, dl, cmd, rb, ts, n, NULL, NULL, &r, err);
  if (rc != 0) return rc;
  rc = take_tensor(r.fin, r.body, 0, own, out, err);
  reply_free(&r);
  return rc;
}

/* ---- status ------------------------------------------------------------- */

static int64_t int_field(const msgpack_object *map, const char *key, int64_t dflt) {
  const msgpack_object *v = mbd_obj_get(map, key);
  if (!v) return dflt;
  if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (int64_t)v->via.u64;
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return v->via.i64;
  if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32) return (int64_t)v->via.f64;
  return dflt;
}

/* A counter of a map: its unsigned value, 0 when absent or not one. */
static uint64_t count_field(const msgpack_object *map, const char *key) {
  const msgpack_object *v = mbd_obj_get(map, key);
  return v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? v->via.u64 : 0;
}

/* The durable-session counters of STATUS's `counters` and the budget of its
 * `config`; not reported when the counters are absent (an older broker). */
static void parse_durable(const msgpack_object *root, mbd_durable_status *d) {
  memset(d, 0, sizeof *d);
  d->budget_mb = -1;
  const msgpack_object *ctr = mbd_obj_get(root, "counters");
  if (!ctr || ctr->type != MSGPACK_OBJECT_MAP || !mbd_obj_get(ctr, "durable_sessions")) return;
  d->reported = true;
  d->sessions = count_field(ctr, "durable_sessions");
  d->checkpoint_bytes = count_field(ctr, "checkpoint_bytes");
  d->checkpoints = count_field(ctr, "checkpoints");
  d->checkpoints_dropped = count_field(ctr, "checkpoints_dropped");
  d->sessions_rehomed = count_field(ctr, "sessions_rehomed");
  d->replayed_tokens = count_field(ctr, "replayed_tokens");
  d->generates_resumed = count_field(ctr, "generates_resumed");
  d->sessions_lost = count_field(ctr, "sessions_lost");
  const msgpack_object *cfg = mbd_obj_get(root, "config");
  if (cfg && cfg->type == MSGPACK_OBJECT_MAP) d->budget_mb = int_field(cfg, "durable_mb", -1);
}

static int parse_worker(const msgpack_object *w, mbd_worker_info *wi, mbd_error *err) {
  if (w->type != MSGPACK_OBJECT_MAP)
    return mbd_error_set(err, MBD_E_PROTOCOL, "STATUS reply: a worker entry is not a map");
  str_field(w, "name", wi->name, sizeof wi->name);
  str_field(w, "uid", wi->uid, sizeof wi->uid);
  str_field(w, "host_id", wi->host_id, sizeof wi->host_id);
  str_field(w, "route_id", wi->route_id, sizeof wi->route_id);
  const msgpack_object *r = mbd_obj_get(w, "route");
  size_t rl = r && r->type == MSGPACK_OBJECT_STR ? r->via.str.size : 0;
  wi->route = malloc(rl + 1);
  if (!wi->route) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
  if (rl) memcpy(wi->route, r->via.str.ptr, rl);
  wi->route[rl] = '\0';
  wi->pid = int_field(w, "pid", 0);
  wi->capacity = int_field(w, "capacity", 0);
  wi->load = int_field(w, "load", int_field(w, "inflight", 0));
  wi->sessions = int_field(w, "sessions", -1);
  wi->heartbeat_age_ms = int_field(w, "heartbeat_age_ms", -1);
  wi->uptime_ms = int_field(w, "uptime_ms", -1);
  const msgpack_object *pc = mbd_obj_get(w, "prefix_cache");
  if (pc && pc->type == MSGPACK_OBJECT_MAP) {
    mbd_prefix_cache_info *x = &wi->prefix_cache;
    wi->has_prefix_cache = true;
    x->lookups = int_field(pc, "lookups", 0);
    x->hits = int_field(pc, "hits", 0);
    x->hit_tokens = int_field(pc, "hit_tokens", 0);
    x->inserts = int_field(pc, "inserts", 0);
    x->evictions = int_field(pc, "evictions", 0);
    x->bytes = int_field(pc, "bytes", 0);
    x->entries = int_field(pc, "entries", 0);
    x->device_hits = int_field(pc, "device_hits", 0);
    x->demotions = int_field(pc, "demotions", 0);
    x->device_bytes = int_field(pc, "device_bytes", 0);
    x->device_entries = int_field(pc, "device_entries", 0);
  }
  wi->alive = true;
  const msgpack_object *a = mbd_obj_get(w, "alive");
  if (a && a->type == MSGPACK_OBJECT_BOOLEAN) wi->alive = a->via.boolean;
  const msgpack_object *ms = mbd_obj_get(w, "models");
  if (!ms || ms->type != MSGPACK_OBJECT_ARRAY || ms->via.array.size == 0) return 0;
  wi->models = calloc(ms->via.array.size, sizeof *wi->models);
  if (!wi->models) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
  wi->n_models = ms->via.array.size;
  for (size_t i = 0; i < wi->n_models; i++) {
    const msgpack_object *mo = &ms->via.array.ptr[i];
    mbd_model_info *mi = &wi->models[i];
    if (mo->type == MSGPACK_OBJECT_STR) { /* a bare name */
      size_t n = mo->via.str.size < sizeof mi->name - 1 ? mo->via.str.size : sizeof mi->name - 1;
      memcpy(mi->name, mo->via.str.ptr, n);
    } else if (mo->type == MSGPACK_OBJECT_MAP) {
      str_field(mo, "name", mi->name, sizeof mi->name);
      str_field(mo, "digest", mi->digest, sizeof mi->digest);
      str_field(mo, "tokenizer_digest", mi->tokenizer_digest, sizeof mi->tokenizer_digest);
    }
  }
  return 0;
}

/* STATUS "models": one entry per (name, digest) the live workers serve. */
static int parse_models(const msgpack_object *root, mbd_status_report *rep, mbd_error *err) {
  const msgpack_object *ms = mbd_obj_get(root, "models");
  if (!ms || ms->type != MSGPACK_OBJECT_ARRAY || ms->via.array.size == 0) return 0;
  rep->models = calloc(ms->via.array.size, sizeof *rep->models);
  if (!rep->models) return mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
  for (size_t i = 0; i < ms->via.array.size; i++) {
    const msgpack_object *mo = &ms->via.array.ptr[i];
    if (mo->type != MSGPACK_OBJECT_MAP) continue;
    mbd_model_entry *e = &rep->models[rep->n_models++];
    str_field(mo, "name", e->name, sizeof e->name);
    str_field(mo, "digest", e->digest, sizeof e->digest);
    str_field(mo, "tokenizer_digest", e->tokenizer_digest, sizeof e->tokenizer_digest);
    e->workers = int_field(mo, "workers", 0);
    const msgpack_object *d = mbd_obj_get(mo, "default");
    e->is_default = d && d->type == MSGPACK_OBJECT_BOOLEAN && d->via.boolean;
  }
  return 0;
}

int mbd_client_status(mbd_client *c, mbd_status_report **out, mbd_error *err) {
  *out = NULL;
  req_body rb;
  body_init(&rb);
  int64_t dl = deadline_(c, NULL);
  msgpack_pack_map(&rb.pk, dl > 0 ? 2 : 1);
  pack_head(&rb.pk, c, dl);
  reply rp;
  int rc = roundtrip(c, dl, MBD_CMD_STATUS, &rb, NULL, 0, NULL, NULL, &rp, err);
  if (rc != 0) return rc;
  mbd_status_report *rep = calloc(1, sizeof *rep);
  if (!rep) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
    goto done;
  }
  const msgpack_object *root = mbd_body_root(rp.body);
  rep->queue = int_field(root, "queue", 0);
  parse_durable(root, &rep->durable);
  if ((rc = parse_models(root, rep, err)) != 0) goto done;
  const msgpack_object *fs = mbd_obj_get(root, "failed");
  if (fs && fs->type == MSGPACK_OBJECT_ARRAY && fs->via.array.size > 0) {
    rep->failed = calloc(fs->via.array.size, sizeof *rep->failed);
    if (!rep->failed) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
      goto done;
    }
    for (size_t i = 0; i < fs->via.array.size; i++) {
      const msgpack_object *fo = &fs->via.array.ptr[i];
      if (fo->type != MSGPACK_OBJECT_MAP) continue;
      mbd_failed_worker *fw = &rep->failed[rep->n_failed++];
      str_field(fo, "name", fw->name, sizeof fw->name);
      str_field(fo, "error", fw->error, sizeof fw->error);
      str_field(fo, "models", fw->models, sizeof fw->models);
      fw->age_ms = int_field(fo, "age_ms", -1);
    }
  }
  const msgpack_object *ws = mbd_obj_get(root, "workers");
  if (ws && ws->type == MSGPACK_OBJECT_ARRAY && ws->via.array.size > 0) {
    rep->workers = calloc(ws->via.array.size, sizeof *rep->workers);
    if (!rep->workers) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading STATUS");
      goto done;
    }
    for (size_t i = 0; i < ws->via.array.size; i++) {
      rep->n_workers = i + 1;
      rc = parse_worker(&ws->via.array.ptr[i], &rep->workers[i], err);
      if (rc != 0) goto done;
    }
  }
  *out = rep;
  rep = NULL;
done:
  mbd_status_report_free(&rep);
  reply_free(&rp);
  return rc;
}

void mbd_status_report_free(mbd_status_report **pr) {
  if (!pr || !*pr) return;
  mbd_status_report *r = *pr;
  for (size_t i = 0; i < r->n_workers; i++) {
    free(r->workers[i].route);
    free(r->workers[i].models);
  }
  free(r->workers);
  free(r->models);
  free(r->failed);
  free(r);
  *pr = NULL;
}

/* ---- stateless requests -------------------------------------------------- */

int mbd_client_gemm(mbd_client *c, const mbd_call_opts *o, const char *dtype,
                    const mbd_tensor_in *a, const mbd_tensor_in *b, const mbd_tensor_in *bias,
                    mbd_tensor_out *out_c, mbd_error *err) {
  memset(out_c, 0, sizeof *out_c);
  int rc = check_in(a, "gemm input a", err);
  if (rc == 0) rc = check_in(b, "gemm input b", err);
  if (rc == 0 && bias) rc = check_in(bias, "gemm bias", err);
  const mbd_tensor_in *out = o ? o->output : NULL;
  if (rc == 0 && out) rc = check_out(out, "gemm output c", err);
  if (rc != 0) return rc;
  const char *names[3] = {"a", "b", "bias"};
  const mbd_tensor_in *ts[3] = {a, b, bias};
  size_t n = bias ? 3 : 2;
  int64_t dl = deadline_(c, o);
  req_body rb;
  body_init(&rb);
  route_head(&rb.pk, c, dl, route_(c, o), 1 + (dtype && *dtype) + out_keys(ts, n, out));
  if (dtype && *dtype) mbd_pack_kv_str(&rb.pk, "dtype", dtype);
  uint32_t frame = 0;
  pack_tensors(&rb.pk, "tensors", names, ts, n, &frame);
  pack_out(&rb.pk, "c", ts, n, out, &frame);
  return roundtrip_tensor(c, dl, MBD_CMD_GEMM, &rb, ts, n, out, out_c, err);
}

int mbd_client_forward(mbd_client *c, const mbd_call_opts *o, const char *model,
                       const mbd_tensor_in *input_ids, bool last_only,
                       const mbd_tensor_in *out_ref, mbd_tensor_out *logits, mbd_error *err) {
  memset(logits, 0, sizeof *logits);
  if (!model || !*model) return mbd_error_set(err, MBD_E_INVALID, "forward: no model name given");
  int rc = check_in(input_ids, "forward input_ids", err);
  if (!out_ref && o) out_ref = o->output;
  if (rc == 0 && out_ref) rc = check_out(out_ref, "forward output", err);
  if (rc != 0) return rc;
  if (input_ids->desc.dtype != MBD_DTYPE_I64 || input_ids->desc.ndim != 2)
    return mbd_error_set(err, MBD_E_SHAPE, "forward: input_ids must be i64 [B,T]");
  size_t nmk = 0;
  if ((rc = pack_model(NULL, model, &nmk, err)) != 0) return mbd_error_prefix(err, "forward");
  const char *names[1] = {"input_ids"};
  const mbd_tensor_in *ts[1] = {input_ids};
  int64_t dl = deadline_(c, o);
  req_body rb;
  body_init(&rb);
  route_head(&rb.pk, c, dl, route_(c, o), 1 + nmk + last_only + out_keys(ts, 1, out_ref));
  pack_model(&rb.pk, model, &nmk, NULL);
  if (last_only) mbd_pack_kv_bool(&rb.pk, "last_only", true);
  uint32_t frame = 0;
  pack_tensors(&rb.pk, "tensors", names, ts, 1, &frame);
  pack_out(&rb.pk, "logits", ts, 1, out_ref, &frame);
  return roundtrip_tensor(c, dl, MBD_CMD_FORWARD, &rb, ts, 1, out_ref, logits, err);
}

/* ---- sessions ------------------------------------------------------------ */

/* Sends an OPEN or IMPORT packed in rb and makes the session its reply names. */
static int open_session(mbd_client *c, int64_t dl, uint8_t cmd, req_body *rb,
                        const mbd_tensor_in *const *ts, size_t n, const char *model,
                        mbd_session **out, mbd_error *err) {
  reply r;
  int rc = roundtrip(c, dl, cmd, rb, ts, n, NULL, NULL, &r, err);
  if (rc != 0) return rc;
  mbd_session *s = calloc(1, sizeof *s);
  if (!s) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory allocating a session");
  } else if ((rc = mbd_obj_str(mbd_body_root(r.body), "session", true, s->id, sizeof s->id,
                               err)) != 0) {
    free(s);
    rc = mbd_error_prefix(err, "reply to OPEN/IMPORT");
  } else {
    s->c = c;
    snprintf(s->model, sizeof s->model, "%.*s", (int)strcspn(model, "@"), model);
    snprintf(s->model_digest, sizeof s->model_digest, "%s", c->last.model_digest);
    *out = s;
  }
  reply_free(&r);
  return rc;
}

/* OPEN, with the routing hashes h[0..nh) as `prefix` when nh > 0. */
static int open_with(mbd_client *c, const mbd_call_opts *o, const char *model, const uint64_t *h,
                     size_t nh, mbd_session **out, mbd_error *err) {
  *out = NULL;
  if (!model || !*model) return mbd_error_set(err, MBD_E_INVALID, "open: no model name given");
  size_t nmk = 0;
  int rc = pack_model(NULL, model, &nmk, err);
  if (rc != 0) return mbd_error_prefix(err, "open");
  int64_t dl = deadline_(c, o);
  req_body rb;
  body_init(&rb);
  route_head(&rb.pk, c, dl, route_(c, o), nmk + (nh > 0));
  pack_model(&rb.pk, model, &nmk, NULL);
  if (nh) {
    mbd_pack_str(&rb.pk, "prefix");
    msgpack_pack_array(&rb.pk, nh);
    for (size_t i = 0; i < nh; i++) msgpack_pack_uint64(&rb.pk, h[i]);
  }
  return open_session(c, dl, MBD_CMD_OPEN, &rb, NULL, 0, model, out, err);
}

int mbd_session_open(mbd_client *c, const mbd_call_opts *o, const char *model, mbd_session **out,
                     mbd_error *err) {
  return open_with(c, o, model, NULL, 0, out, err);
}

int mbd_session_open_prompt(mbd_client *c, const mbd_call_opts *o, const char *model,
                            const int64_t *prompt, int64_t n, int64_t block,
                            const int64_t *points, size_t npoints, mbd_session **out,
                            mbd_error *err) {
  *out = NULL;
  if (!model || !*model) return mbd_error_set(err, MBD_E_INVALID, "open: no model name given");
  if (n < 0 || (n > 0 && !prompt) || (npoints && !points) || npoints > MBD_PREFIX_POINTS_MAX)
    return mbd_error_set(err, MBD_E_INVALID,
                         "open: a prompt of n >= 0 tokens and at most %d cache points",
                         MBD_PREFIX_POINTS_MAX);
  char name[64]; /* the hashes are of the registry name, without "@digest" */
  snprintf(name, sizeof name, "%.*s", (int)strcspn(model, "@"), model);
  uint64_t h[MBD_PREFIX_HASHES_MAX];
  size_t nh = mbd_prefix_route_hashes(name, prompt, n, block > 0 ? block : MBD_DEFAULT_PREFIX_BLOCK,
                                      points, npoints, h, MBD_PREFIX_HASHES_MAX);
  return open_with(c, o, model, h, nh, out, err);
}

const char *mbd_session_id(const mbd_session *s) { return s->id; }
const char *mbd_session_model_digest(const mbd_session *s) { return s->model_digest; }

/* Starts a session request body: {request_id, session, deadline_ms?, + extra keys}. */
static void session_head(msgpack_packer *pk, const mbd_session *s, int64_t dl, size_t extra) {
  msgpack_pack_map(pk, 2 + (dl > 0) + extra);
  pack_head(pk, s->c, dl);
  mbd_pack_kv_str(pk, "session", s->id);
}

int mbd_session_prefill(mbd_session *s, const mbd_call_opts *o, const mbd_tensor_in *input_ids,
                        bool last_only, mbd_tensor_out *logits, mbd_error *err) {
  return mbd_session_prefill_cached(s, o, input_ids, last_only, NULL, 0, logits, err);
}

int mbd_session_prefill_cached(mbd_session *s, const mbd_call_opts *o,
                               const mbd_tensor_in *input_ids, bool last_only,
                               const int64_t *points, size_t npoints, mbd_tensor_out *logits,
                               mbd_error *err) {
  memset(logits, 0, sizeof *logits);
  int rc = check_in(input_ids, "prefill input_ids", err);
  const mbd_tensor_in *out = o ? o->output : NULL;
  if (rc == 0 && out) rc = check_out(out, "prefill output", err);
  if (rc != 0) return rc;
  if (npoints > MBD_PREFIX_POINTS_MAX || (npoints && !points))
    return mbd_error_set(err, MBD_E_INVALID, "prefill: at most %d cache points",
                         MBD_PREFIX_POINTS_MAX);
  const char *names[1] = {"input_ids"};
  const mbd_tensor_in *ts[1] = {input_ids};
  int64_t dl = deadline_(s->c, o);
  req_body rb;
  body_init(&rb);
  session_head(&rb.pk, s, dl, 1 + last_only + (npoints > 0) + out_keys(ts, 1, out));
  if (last_only) mbd_pack_kv_bool(&rb.pk, "last_only", true);
  if (npoints) {
    mbd_pack_str(&rb.pk, "cache_points");
    msgpack_pack_array(&rb.pk, npoints);
    for (size_t i = 0; i < npoints; i++) msgpack_pack_int64(&rb.pk, points[i]);
  }
  uint32_t frame = 0;
  pack_tensors(&rb.pk, "tensors", names, ts, 1, &frame);
  pack_out(&rb.pk, "logits", ts, 1, out, &frame);
  return roundtrip_tensor(s->c, dl, MBD_CMD_PREFILL, &rb, ts, 1, out, logits, err);
}

int mbd_session_step(mbd_session *s, const mbd_call_opts *o, int64_t token,
                     mbd_tensor_out *logits, mbd_error *err) {
  memset(logits, 0, sizeof *logits);
  const mbd_tensor_in *out = o ? o->output : NULL;
  int rc = out ? check_out(out, "step output", err) : 0;
  if (rc != 0) return rc;
  int64_t dl = deadline_(s->c, o);
  req_body rb;
  body_init(&rb);
  session_head(&rb.pk, s, dl, 1 + out_keys(NULL, 0, out));
  mbd_pack_kv_i64(&rb.pk, "token", token);
  uint32_t frame = 0;
  pack_out(&rb.pk, "logits", NULL, 0, out, &frame);
  return roundtrip_tensor(s->c, dl, MBD_CMD_STEP, &rb, NULL, 0, out, logits, err);
}

typedef struct gen_ctx {
  mbd_token_cb cb;
  void *user;
} gen_ctx;

static int gen_partial(void *user, const mbd_msg *m, mbd_error *err) {
  gen_ctx *g = user;
  size_t len = 0;
  const void *body = mbd_msg_body(m, &len);
  mbd_body *b = NULL;
  int rc = mbd_body_parse(body, len, &b, err);
  if (rc != 0) return mbd_error_prefix(err, "PARTIAL reply to GENERATE");
  int64_t *toks = NULL;
  size_t n = 0;
  rc = i64_list(mbd_body_root(b), "tokens", &toks, &n, err);
  if (rc == 0 && g->cb && n > 0) g->cb(g->user, toks, n);
  free(toks);
  mbd_body_destroy(&b);
  return rc;
}

int mbd_session_generate(mbd_session *s, const mbd_call_opts *o, const mbd_generate_params *p,
                         mbd_token_cb cb, void *user, int64_t **tokens, size_t *n_tokens,
                         char reason[16], mbd_error *err) {
  *tokens = NULL;
  *n_tokens = 0;
  if (reason) reason[0] = '\0';
  if (!p || p->max_tokens <= 0)
    return mbd_error_set(err, MBD_E_INVALID, "generate: max_tokens must be > 0");
  if (p->temperature < 0 || p->top_p < 0 || p->top_p > 1 || p->top_k < 0)
    return mbd_error_set(err, MBD_E_INVALID,
                         "generate: temperature must be >= 0, top_k >= 0 and top_p in [0,1]");
  bool sampled = p->temperature > 0;
  const mbd_tensor_in *out = o ? o->output : NULL;
  int rc = out ? check_out(out, "generate output", err) : 0;
  if (rc != 0) return rc;
  int64_t dl = deadline_(s->c, o);
  req_body rb;
  body_init(&rb);
  msgpack_packer *pk = &rb.pk;
  session_head(pk, s, dl, 2 + (sampled ? 4 : 0) + out_keys(NULL, 0, out));
  uint32_t frame = 0;
  pack_out(pk, "tokens", NULL, 0, out, &frame);
  mbd_pack_kv_i64(pk, "max_tokens", p->max_tokens);
  mbd_pack_str(pk, "stop");
  msgpack_pack_array(pk, p->n_stop);
  for (size_t i = 0; i < p->n_stop; i++) msgpack_pack_int64(pk, p->stop[i]);
  if (sampled) {
    mbd_pack_kv_f64(pk, "temperature", p->temperature);
    mbd_pack_kv_i64(pk, "top_k", p->top_k);
    mbd_pack_kv_f64(pk, "top_p", p->top_p > 0 ? p->top_p : 1); /* 0 means off too */
    mbd_pack_kv_u64(pk, "seed", p->seed);
  }
  gen_ctx g = {cb, user};
  reply rp;
  rc = roundtrip(s->c, dl, MBD_CMD_GENERATE, &rb, NULL, 0, gen_partial, &g, &rp, err);
  if (rc != 0) return rc;
  rc = i64_list(mbd_body_root(rp.body), "tokens", tokens, n_tokens, err);
  int64_t pb = 0;
  if (mbd_obj_i64(mbd_body_root(rp.body), "peak_batch", false, &pb, NULL) == 0) s->c->last.peak_batch = pb;
  if (rc == 0 && reason) {
    char r[16] = "";
    str_field(mbd_body_root(rp.body), "reason", r, sizeof r);
    memcpy(reason, r, sizeof r);
  }
  reply_free(&rp);
  return rc;
}

int mbd_session_export(mbd_session *s, const mbd_call_opts *o, mbd_session_state **out,
                       mbd_error *err) {
  *out = NULL;
  const mbd_tensor_in *dst = o ? o->output : NULL;
  int rc = dst ? check_out(dst, "export output", err) : 0;
  if (rc != 0) return rc;
  int64_t dl = deadline_(s->c, o);
  req_body rb;
  body_init(&rb);
  session_head(&rb.pk, s, dl, out_keys(NULL, 0, dst));
  uint32_t frame = 0;
  pack_out(&rb.pk, "state", NULL, 0, dst, &frame);
  reply rp;
  rc = roundtrip(s->c, dl, MBD_CMD_EXPORT, &rb, NULL, 0, NULL, NULL, &rp, err);
  if (rc != 0) return rc;
  mbd_session_state *st = calloc(1, sizeof *st);
  if (!st) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading exported state");
    goto done;
  }
  const msgpack_object *root = mbd_body_root(rp.body);
  snprintf(st->model, sizeof st->model, "%s", s->model);
  str_field(root, "model", st->model, sizeof st->model);
  snprintf(st->route_id, sizeof st->route_id, "%s", s->c->last.route_id);
  str_field(root, "route_id", st->route_id, sizeof st->route_id);
  snprintf(st->model_digest, sizeof st->model_digest, "%s", s->model_digest);
  str_field(root, "model_digest", st->model_digest, sizeof st->model_digest);
  const msgpack_object *ts = mbd_obj_get(root, "tensors");
  if (!ts || ts->type != MSGPACK_OBJECT_ARRAY || ts->via.array.size == 0) {
    rc = mbd_error_set(err, MBD_E_PROTOCOL, "EXPORT reply carries no state tensors");
    goto done;
  }
  st->tensors = calloc(ts->via.array.size, sizeof *st->tensors);
  if (!st->tensors) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory reading exported state");
    goto done;
  }
  for (size_t i = 0; i < ts->via.array.size; i++) {
    rc = take_tensor(rp.fin, rp.body, i, i == 0 ? dst : NULL, &st->tensors[i], err);
    if (rc != 0) goto done;
    st->n_tensors = i + 1;
  }
  *out = st;
  st = NULL;
done:
  mbd_session_state_free(&st);
  reply_free(&rp);
  return rc;
}

void mbd_session_state_free(mbd_session_state **pst) {
  if (!pst || !*pst) return;
  mbd_session_state *st = *pst;
  for (size_t i = 0; i < st->n_tensors; i++) mbd_tensor_out_release(&st->tensors[i]);
  free(st->tensors);
  free(st);
  *pst = NULL;
}

int mbd_session_import(mbd_client *c, const mbd_call_opts *o, const mbd_session_state *st,
                       mbd_session **out, mbd_error *err) {
  *out = NULL;
  if (!st || st->n_tensors == 0 || st->n_tensors > 64)
    return mbd_error_set(err, MBD_E_INVALID, "import: the state holds no (or too many) tensors");
  mbd_route_want want;
  if (o && o->route) {
    want = *o->route;
  } else {
    memset(&want, 0, sizeof want);
    snprintf(want.route_id, sizeof want.route_id, "%s", st->route_id);
  }
  mbd_tensor_in ins[64];
  const mbd_tensor_in *ts[64];
  const char *names[64];
  bool dev = false;
  for (size_t i = 0; i < st->n_tensors; i++) {
    memset(&ins[i], 0, sizeof ins[i]);
    ins[i].desc = st->tensors[i].desc;
    ins[i].data = st->tensors[i].data;
    if (st->tensors[i].on_device) { /* exported into device memory: sent from there */
      int rc = mbd_tensor_device(st->tensors[i].data, &st->tensors[i].desc, NULL, &ins[i], err);
      if (rc != 0) return mbd_error_prefix(err, "import");
      dev = true;
    }
    ts[i] = &ins[i];
    names[i] = st->tensors[i].name[0] ? st->tensors[i].name : "state";
  }
  int64_t dl = deadline_(c, o);
  req_body rb;
  body_init(&rb);
  bool pin = mbd_digest_prefix_ok(st->model_digest);
  route_head(&rb.pk, c, dl, &want, 2 + pin + dev);
  if (dev) pack_host_id(&rb.pk);
  mbd_pack_kv_str(&rb.pk, "model", st->model);
  if (pin) mbd_pack_kv_str(&rb.pk, "model_digest", st->model_digest);
  uint32_t frame = 0;
  pack_tensors(&rb.pk, "tensors", names, ts, st->n_tensors, &frame);
  return open_session(c, dl, MBD_CMD_IMPORT, &rb, ts, st->n_tensors, st->model, out, err);
}

int mbd_session_close(mbd_session **ps, mbd_error *err) {
  if (!ps || !*ps) return 0;
  mbd_session *s = *ps;
  int64_t dl = deadline_(s->c, NULL);
  req_body rb;
  body_init(&rb);
  session_head(&rb.pk, s, dl, 0);
  reply rp;
  int rc = roundtrip(s->c, dl, MBD_CMD_CLOSE, &rb, NULL, 0, NULL, NULL, &rp, err);
  reply_free(&rp);
  free(s);
  *ps = NULL;
  return rc;
}
