/* Durable sessions: checkpoints, token logs, re-homing. See durable.h.
 *
 * Records are found by the client's id and by the id on the current worker
 * (two chained hashes); both are the same until a re-home. A record's log
 * holds the tokens consumed since its checkpoint in the order the session
 * consumed them: one session runs one request at a time and its replies come
 * over one ordered connection, and the worker sends a checkpoint only after
 * the replies of every token it covers (worker/checkpoint.h). */
#include "broker/durable.h"

#include <inttypes.h>
#include <stdarg.h>
#include <sys/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/caller.h"
#include "broker/registry.h"
#include "common/defaults.h"
#include "common/log.h"
#include "common/protocol.h"

#define LOG "broker"
#define BUCKETS 4096
#define ID_MAX 64
#define LOST_KEEP_MS 60000 /* LOST records answer their session's requests this long */
#define TOKENS_MAX_BYTES ((size_t)(1u << 20) * 9 + 4096) /* a reply's token array, msgpack */

typedef struct drec {
  char id[ID_MAX];                  /* the client's session id */
  char wid[ID_MAX];                 /* the id on the worker that holds it now */
  char uid[MBD_BW_UID_MAX];         /* that worker's uid */
  char owner[MBD_BCALLER_ID_MAX];   /* caller id of the opener */
  char model[MBD_BW_NAME_MAX];
  char digest[MBD_BW_DIGEST_MAX];
  char route_id[65];                /* the route its state belongs to */
  mbd_msg *ckpt;                    /* the last checkpoint (F4: the session blob), or NULL */
  size_t ckpt_bytes;
  int64_t *log;                     /* tokens consumed since ckpt */
  size_t nlog, caplog;
  bool hole;                        /* consumed tokens the log lacks: not restorable */
  int64_t *gen;                     /* tokens of the GENERATE in flight its client received */
  size_t ngen, capgen;
  mbd_bdur_where where;             /* HOMED, MOVING or LOST */
  size_t replaying;                 /* MOVING: tokens its restore replays */
  char why[320];                    /* LOST: the reason given to its requests */
  int64_t lost_ms;
  struct drec *next_id, *next_wid;  /* hash chains */
  struct drec *prev, *next;         /* every record */
} drec;

struct mbd_bdurable {
  uint64_t budget;
  drec *by_id[BUCKETS], *by_wid[BUCKETS];
  drec *all;
  mbd_bdurable_stats st;
};

static size_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return (size_t)(h % BUCKETS);
}

static drec *find_id(mbd_bdurable *d, const char *id) {
  for (drec *r = d->by_id[hash_str(id)]; r; r = r->next_id)
    if (!strcmp(r->id, id)) return r;
  return NULL;
}

static drec *find_wid(mbd_bdurable *d, const char *wid) {
  for (drec *r = d->by_wid[hash_str(wid)]; r; r = r->next_wid)
    if (!strcmp(r->wid, wid)) return r;
  return NULL;
}

static void unhash_wid(mbd_bdurable *d, drec *r) {
  for (drec **pp = &d->by_wid[hash_str(r->wid)]; *pp; pp = &(*pp)->next_wid)
    if (*pp == r) {
      *pp = r->next_wid;
      return;
    }
}

static void hash_wid(mbd_bdurable *d, drec *r) {
  size_t b = hash_str(r->wid);
  r->next_wid = d->by_wid[b];
  d->by_wid[b] = r;
}

static void drop_ckpt(mbd_bdurable *d, drec *r) {
  d->st.bytes -= r->ckpt_bytes;
  r->ckpt_bytes = 0;
  mbd_msg_destroy(&r->ckpt);
}

static void rec_free(mbd_bdurable *d, drec *r) {
  for (drec **pp = &d->by_id[hash_str(r->id)]; *pp; pp = &(*pp)->next_id)
    if (*pp == r) {
      *pp = r->next_id;
      break;
    }
  unhash_wid(d, r);
  if (r->prev) r->prev->next = r->next;
  else d->all = r->next;
  if (r->next) r->next->prev = r->prev;
  drop_ckpt(d, r);
  d->st.bytes -= sizeof *r + (r->caplog + r->capgen) * sizeof(int64_t);
  free(r->log);
  free(r->gen);
  free(r);
  d->st.sessions--;
}

int mbd_bdurable_new(uint64_t budget_bytes, mbd_bdurable **out, mbd_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the session checkpoints");
  (*out)->budget = budget_bytes;
  return MBD_OK;
}

void mbd_bdurable_destroy(mbd_bdurable **pd) {
  if (!pd || !*pd) return;
  while ((*pd)->all) rec_free(*pd, (*pd)->all);
  free(*pd);
  *pd = NULL;
}

const mbd_bdurable_stats *mbd_bdurable_get_stats(const mbd_bdurable *d) { return &d->st; }

/* Appends k tokens to a list of at most max, its growth counted in the
 * budget; false when it does not fit (the caller marks a hole). */
static bool list_add(mbd_bdurable *d, int64_t **v, size_t *n, size_t *cap, const int64_t *t,
                     size_t k, size_t max) {
  if (*n + k > max) return false;
  if (*n + k > *cap) {
    size_t nc = *cap ? *cap : 64;
    while (nc < *n + k) nc *= 2;
    uint64_t grow = (nc - *cap) * sizeof(int64_t);
    if (d->st.bytes + grow > d->budget) return false;
    int64_t *p = realloc(*v, nc * sizeof *p);
    if (!p) return false;
    d->st.bytes += grow;
    *v = p;
    *cap = nc;
  }
  memcpy(*v + *n, t, k * sizeof *t);
  *n += k;
  return true;
}

void mbd_bdurable_checkpoint(mbd_bdurable *d, mbd_msg **pm, const char *uid, const char *route_id) {
  static const char *const keys[] = {"session", "owner", "model", "model_digest", "closed", NULL};
  mbd_msg *m = *pm;
  *pm = NULL;
  mbd_body *body = NULL;
  size_t blen = 0, ulen = strlen(uid);
  const void *b = mbd_msg_body(m, &blen);
  char sid[ID_MAX] = "", owner[MBD_BCALLER_ID_MAX] = "", model[MBD_BW_NAME_MAX] = "",
       digest[MBD_BW_DIGEST_MAX] = "";
  bool closed = false;
  if (mbd_body_parse_keys(b, blen, keys, 4096, &body, NULL)) goto done;
  const msgpack_object *root = mbd_body_root(body);
  if (mbd_obj_str(root, "session", true, sid, sizeof sid, NULL) ||
      mbd_obj_str(root, "owner", false, owner, sizeof owner, NULL) ||
      mbd_obj_str(root, "model", true, model, sizeof model, NULL) ||
      mbd_obj_str(root, "model_digest", true, digest, sizeof digest, NULL) ||
      mbd_obj_bool(root, "closed", false, &closed, NULL))
    goto done;
  drec *r = find_wid(d, sid);
  if (r && (strcmp(r->uid, uid) || r->where != MBD_BDUR_HOMED)) goto done; /* not its home */
  if (closed) {
    if (r) rec_free(d, r);
    goto done;
  }
  size_t bytes = 0;
  if (mbd_msg_npayloads(m) != 1 || !mbd_msg_payload(m, 0, &bytes) || !bytes) goto done;
  uint64_t held = d->st.bytes - (r ? r->ckpt_bytes : 0) + (r ? 0 : sizeof *r);
  if (held + bytes > d->budget) {
    d->st.dropped++;
    MBD_LOGD(LOG, "checkpoint of session %s refused: %" PRIu64 " of %" PRIu64 " bytes held", sid,
             d->st.bytes, d->budget);
    goto done; /* an older checkpoint and its log stay usable */
  }
  if (!r) { /* a new durable session: its id is the worker's (not one re-homed away from it,
             * whose worker came back after it was given up for dead) */
    if (strncmp(sid, uid, ulen) || sid[ulen] != '/' || find_id(d, sid) ||
        !(r = calloc(1, sizeof *r)))
      goto done;
    snprintf(r->id, sizeof r->id, "%s", sid);
    snprintf(r->wid, sizeof r->wid, "%s", sid);
    snprintf(r->uid, sizeof r->uid, "%s", uid);
    snprintf(r->owner, sizeof r->owner, "%s", owner);
    snprintf(r->model, sizeof r->model, "%s", model);
    snprintf(r->digest, sizeof r->digest, "%s", digest);
    r->where = MBD_BDUR_HOMED;
    d->st.bytes += sizeof *r;
    size_t h = hash_str(r->id);
    r->next_id = d->by_id[h];
    d->by_id[h] = r;
    hash_wid(d, r);
    r->next = d->all;
    if (d->all) d->all->prev = r;
    d->all = r;
    d->st.sessions++;
  }
  snprintf(r->route_id, sizeof r->route_id, "%s", route_id);
  drop_ckpt(d, r);
  r->ckpt = m;
  m = NULL;
  r->ckpt_bytes = bytes;
  d->st.bytes += bytes;
  d->st.checkpoints++;
  r->nlog = 0;
  r->hole = false;
done:
  mbd_body_destroy(&body);
  mbd_msg_destroy(&m);
}

mbd_bdur_where mbd_bdurable_locate(mbd_bdurable *d, const char *id, const char *caller,
                                   const char **uid, const char **wid, const char **why) {
  drec *r = find_id(d, id);
  if (!r || (caller && strcmp(r->owner, caller))) return MBD_BDUR_NONE;
  *uid = r->uid;
  *wid = r->wid;
  *why = r->why;
  return r->where;
}

/* An encoded msgpack int array. */
static void pack_tokens(msgpack_packer *pk, const int64_t *t, size_t n) {
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_int64(pk, t[i]);
}

int mbd_bdurable_rewrite(mbd_bdurable *d, const char *id, const char *caller, uint8_t cmd,
                         bool resend, const void *body, size_t blen, msgpack_sbuffer *out,
                         mbd_error *err) {
  drec *r = find_id(d, id);
  if (!r || r->where != MBD_BDUR_HOMED || strcmp(r->owner, caller)) return 0;
  if (cmd == MBD_CMD_GENERATE && !resend) r->ngen = 0; /* a new loop */
  bool resume = cmd == MBD_CMD_GENERATE && resend && r->ngen > 0;
  if (!strcmp(r->wid, r->id) && !resume) return 0;
  msgpack_sbuffer v, tmp;
  msgpack_sbuffer_init(&v);
  msgpack_sbuffer_init(&tmp);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &v, msgpack_sbuffer_write);
  mbd_pack_str(&pk, r->wid);
  int rc = mbd_body_replace_raw(body, blen, "session", v.data, v.size, resume ? &tmp : out, err);
  if (!rc && resume) {
    v.size = 0;
    pack_tokens(&pk, r->gen, r->ngen);
    rc = mbd_body_replace_raw(tmp.data, tmp.size, "resume", v.data, v.size, out, err);
    if (!rc) {
      d->st.resumed++;
      MBD_LOGD(LOG, "session %s: GENERATE continues on %s after %zu token(s) the client has",
               r->id, r->uid, r->ngen);
    }
  }
  msgpack_sbuffer_destroy(&v);
  msgpack_sbuffer_destroy(&tmp);
  return rc ? rc : 1;
}

/* The `tokens` array of a GENERATE reply into *t (malloc'ed), or -1. */
static ssize_t reply_tokens(const mbd_msg *m, int64_t **t) {
  static const char *const keys[] = {"tokens", NULL};
  *t = NULL;
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  mbd_body *body = NULL;
  ssize_t n = -1;
  if (mbd_body_parse_keys(b, blen, keys, TOKENS_MAX_BYTES, &body, NULL)) return -1;
  const msgpack_object *a = mbd_obj_get(mbd_body_root(body), "tokens");
  if (a && a->type == MSGPACK_OBJECT_ARRAY &&
      (*t = malloc((a->via.array.size ? a->via.array.size : 1) * sizeof **t))) {
    n = (ssize_t)a->via.array.size;
    for (uint32_t i = 0; i < a->via.array.size; i++) {
      const msgpack_object *o = &a->via.array.ptr[i];
      if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) n = -1;
      else (*t)[i] = (int64_t)o->via.u64;
    }
  }
  mbd_body_destroy(&body);
  if (n < 0) {
    free(*t);
    *t = NULL;
  }
  return n;
}

/* Whether an ERROR says the request never touched the session's state. */
static bool error_untouched(const mbd_msg *m) {
  static const char *const keys[] = {"code", NULL};
  size_t blen = 0;
  const void *b = mbd_msg_body(m, &blen);
  mbd_body *body = NULL;
  int64_t code = 0;
  if (!mbd_body_parse_keys(b, blen, keys, 64, &body, NULL))
    mbd_obj_i64(mbd_body_root(body), "code", false, &code, NULL);
  mbd_body_destroy(&body);
  return code == MBD_E_BUSY || code == MBD_E_NOT_FOUND || code == MBD_E_INVALID ||
         code == MBD_E_SHAPE || code == MBD_E_UNSUPPORTED;
}

static void log_add(mbd_bdurable *d, drec *r, const int64_t *t, size_t n) {
  if (!r->hole && !list_add(d, &r->log, &r->nlog, &r->caplog, t, n, MBD_DURABLE_LOG_MAX)) {
    r->hole = true; /* until the next checkpoint */
    r->nlog = 0;
  }
}

void mbd_bdurable_reply(mbd_bdurable *d, const char *id, uint8_t cmd, int64_t token,
                        const mbd_msg *reply) {
  drec *r = find_id(d, id);
  if (!r || r->where != MBD_BDUR_HOMED) return;
  uint8_t rc = mbd_msg_cmd(reply);
  if (cmd == MBD_CMD_CLOSE) {
    if (rc == MBD_CMD_FINAL) rec_free(d, r);
    return;
  }
  if (rc == MBD_CMD_ERROR) {
    if (cmd == MBD_CMD_GENERATE) r->ngen = 0;
    if ((cmd == MBD_CMD_STEP || cmd == MBD_CMD_PREFILL || cmd == MBD_CMD_GENERATE) &&
        !error_untouched(reply))
      r->hole = true; /* it may have consumed tokens nobody reported: the worker's next
                         checkpoint (sent when such a request ends) closes the hole */
    return;
  }
  switch (cmd) {
  case MBD_CMD_STEP:
    if (rc == MBD_CMD_FINAL) log_add(d, r, &token, 1);
    break;
  case MBD_CMD_PREFILL: /* its tokens travel in a payload the broker does not read */
    if (rc == MBD_CMD_FINAL) r->hole = true; /* the checkpoint after it closes the hole */
    break;
  case MBD_CMD_GENERATE: {
    int64_t *t = NULL;
    ssize_t n = reply_tokens(reply, &t);
    if (n < 0) {
      r->hole = true;
    } else if (rc == MBD_CMD_PARTIAL) {
      log_add(d, r, t, (size_t)n);
      if (!list_add(d, &r->gen, &r->ngen, &r->capgen, t, (size_t)n, (size_t)1 << 20))
        r->hole = true;
    } else if ((size_t)n >= r->ngen) { /* FINAL: every token, those streamed before included */
      log_add(d, r, t + r->ngen, (size_t)n - r->ngen);
      r->ngen = 0;
    } else {
      r->hole = true;
    }
    free(t);
    break;
  }
  default: break; /* EXPORT reads the state, OPEN/IMPORT made it */
  }
}

/* The IMPORT that restores r: its checkpoint blob (the frame shared, not
 * copied) with `replay` = its log, bound to its owner, pinned to its route. */
static int restore_msg(const drec *r, mbd_msg **out, mbd_error *err) {
  mbd_msg *m = NULL;
  int rc = mbd_msg_clone(r->ckpt, &m, err);
  if (rc) return rc;
  mbd_msg_set_cmd(m, MBD_CMD_IMPORT);
  mbd_msg_set_tag(m, 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  mbd_pack_kv_str(&pk, "model", r->model);
  mbd_pack_str(&pk, "caller");
  msgpack_pack_map(&pk, 1);
  mbd_pack_kv_str(&pk, "id", r->owner);
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", r->route_id);
  mbd_pack_str(&pk, "route");
  mbd_pack_route_want(&pk, &want);
  mbd_pack_str(&pk, "replay");
  pack_tokens(&pk, r->log, r->nlog);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_tensor_ref t;
  memset(&t, 0, sizeof t);
  snprintf(t.name, sizeof t.name, "state");
  int64_t sh[1] = {(int64_t)(r->ckpt_bytes / 8)};
  mbd_tensor_desc_make(&t.desc, MBD_DTYPE_I64, 1, sh, NULL);
  t.kind = MBD_TREF_INLINE;
  t.frame = 0;
  mbd_pack_tensor_ref(&pk, &t);
  rc = mbd_msg_take_body(m, &sb, err);
  msgpack_sbuffer_destroy(&sb);
  if (rc) {
    mbd_msg_destroy(&m);
    return rc;
  }
  *out = m;
  return MBD_OK;
}

static void set_lost(mbd_bdurable *d, drec *r, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_lost(mbd_bdurable *d, drec *r, int64_t now, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
  r->where = MBD_BDUR_LOST;
  r->lost_ms = now;
  drop_ckpt(d, r);
  r->nlog = r->ngen = 0;
  d->st.lost++;
  MBD_LOGD(LOG, "session %s lost: %s", r->id, r->why);
}

size_t mbd_bdurable_rehome(mbd_bdurable *d, const char *uid, const char *wname,
                           mbd_bdurable_restore_fn fn, void *ctx, int64_t now) {
  size_t n = 0, replay = 0;
  uint64_t lost0 = d->st.lost;
  const drec *first_lost = NULL;
  for (drec *r = d->all; r; r = r->next) {
    if (r->where != MBD_BDUR_HOMED || strcmp(r->uid, uid)) continue;
    mbd_msg *m = NULL;
    mbd_error e = {0};
    if (!r->ckpt) {
      set_lost(d, r, now, "worker %s is gone and this session had no checkpoint to restore", wname);
    } else if (r->hole) {
      set_lost(d, r, now,
               "worker %s is gone and this session had consumed tokens that its last checkpoint "
               "does not cover and the broker did not see (a PREFILL, or over %d tokens since)",
               wname, MBD_DURABLE_LOG_MAX);
    } else if (restore_msg(r, &m, &e)) {
      set_lost(d, r, now, "worker %s is gone and the broker could not build the restore: %s", wname,
               e.msg);
    } else {
      r->where = MBD_BDUR_MOVING;
      r->replaying = r->nlog;
      MBD_LOGD(LOG, "session %s: worker %s is gone; restoring it from its checkpoint + %zu "
               "token(s)", r->id, wname, r->nlog);
      fn(ctx, r->id, r->model, r->digest, r->route_id, &m); /* may fail it at once */
      mbd_msg_destroy(&m);
      if (r->where == MBD_BDUR_MOVING) {
        n++;
        replay += r->nlog;
      }
    }
    if (r->where == MBD_BDUR_LOST && !first_lost) first_lost = r;
  }
  uint64_t lost = d->st.lost - lost0;
  if (n)
    MBD_LOGI(LOG, "worker %s is gone: re-homing %zu durable session(s) (%zu token(s) to replay)",
             wname, n, replay);
  if (lost)
    MBD_LOGW(LOG, "worker %s is gone: %" PRIu64 " durable session(s) lost (the first: %s)", wname,
             lost, first_lost ? first_lost->why : "");
  return n;
}

void mbd_bdurable_restored(mbd_bdurable *d, const char *id, const char *uid, const char *wid) {
  drec *r = find_id(d, id);
  if (!r || r->where != MBD_BDUR_MOVING) return;
  unhash_wid(d, r);
  snprintf(r->wid, sizeof r->wid, "%s", wid);
  snprintf(r->uid, sizeof r->uid, "%s", uid);
  hash_wid(d, r);
  r->where = MBD_BDUR_HOMED;
  d->st.rehomed++;
  d->st.replayed_tokens += r->replaying;
  MBD_LOGD(LOG, "session %s re-homed on worker uid %s (replayed %zu token(s))", r->id, uid,
           r->replaying);
}

void mbd_bdurable_failed(mbd_bdurable *d, const char *id, const char *why, int64_t now) {
  drec *r = find_id(d, id);
  if (r && r->where == MBD_BDUR_MOVING)
    set_lost(d, r, now, "its worker is gone and re-homing it failed: %s", why);
}

void mbd_bdurable_forget(mbd_bdurable *d, const char *id) {
  drec *r = find_id(d, id);
  if (r) rec_free(d, r);
}

void mbd_bdurable_sweep(mbd_bdurable *d, int64_t now) {
  for (drec *r = d->all; r;) {
    drec *next = r->next;
    if (r->where == MBD_BDUR_LOST && now - r->lost_ms > LOST_KEEP_MS) rec_free(d, r);
    r = next;
  }
}
