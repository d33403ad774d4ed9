/* Worker registry and routing decisions: see registry.h. A flat array of
 * records: deployments have a handful to a few hundred workers, and a linear
 * scan of them is cheaper than any index at that size. */
#include "broker/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGISTRY_MAX 1024

typedef struct model_default {
  char name[MBD_BW_NAME_MAX];
  char digest[MBD_BW_DIGEST_MAX]; /* lower-case hex prefix */
} model_default;

struct mbd_registry {
  mbd_bworker *w; /* w[0..n) */
  size_t n, cap;
  uint64_t seq;   /* dispatch sequence for round-robin tie breaks */
  model_default defaults[MBD_BW_DEFAULTS_MAX]; /* the deployment's default digest per name */
  size_t ndefaults;
};

int mbd_registry_new(mbd_registry **out, mbd_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out) return mbd_error_set(err, MBD_E_NOMEM, "out of memory creating the worker registry");
  return MBD_OK;
}

void mbd_registry_destroy(mbd_registry **r) {
  if (!r || !*r) return;
  free((*r)->w);
  free(*r);
  *r = NULL;
}

int mbd_registry_parse_ready(const msgpack_object *body, mbd_bworker *w, mbd_error *err) {
  memset(w->name, 0, sizeof w->name);
  int rc;
  if ((rc = mbd_obj_str(body, "name", true, w->name, sizeof w->name, err)) ||
      (rc = mbd_obj_str(body, "uid", true, w->uid, sizeof w->uid, err)) ||
      (rc = mbd_obj_str(body, "route", true, w->route_enc, sizeof w->route_enc, err)))
    return mbd_error_prefix(err, "READY");
  w->host_id[0] = '\0';
  if ((rc = mbd_obj_str(body, "host_id", false, w->host_id, sizeof w->host_id, err)))
    return mbd_error_prefix(err, "READY");
  if (!w->uid[0] || strchr(w->uid, '/'))
    return mbd_error_set(err, MBD_E_INVALID, "READY: uid '%s' must be non-empty without '/'", w->uid);
  rc = mbd_route_decode(w->route_enc, strlen(w->route_enc), &w->route, err);
  if (rc) return mbd_error_prefix(err, "READY from '%s'", w->name);
  mbd_route_id_hex(&w->route, w->route_id);
  char claimed[80] = "";
  if ((rc = mbd_obj_str(body, "route_id", true, claimed, sizeof claimed, err)))
    return mbd_error_prefix(err, "READY");
  if (strcmp(claimed, w->route_id))
    return mbd_error_set(err, MBD_E_INVALID,
                         "READY from '%s': route_id %.16s... does not match its route encoding "
                         "(SHA-256 gives %.16s...); the worker must send the id of the encoding it sends",
                         w->name, claimed, w->route_id);
  uint64_t cap = 1;
  if ((rc = mbd_obj_u64(body, "capacity", false, &cap, err))) return mbd_error_prefix(err, "READY");
  if (cap < 1 || cap > MBD_BW_CAPACITY_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "READY: capacity %llu out of range 1..%d",
                         (unsigned long long)cap, MBD_BW_CAPACITY_MAX);
  w->capacity = (int)cap;
  w->pid = 0;
  if ((rc = mbd_obj_i64(body, "pid", false, &w->pid, err))) return mbd_error_prefix(err, "READY");
  int64_t dev = -1; /* optional: GPU workers report their CUDA ordinal */
  if ((rc = mbd_obj_i64(body, "device", false, &dev, err))) return mbd_error_prefix(err, "READY");
  w->device = dev >= 0 && dev <= 1023 ? (int)dev : -1;
  w->nmodels = 0;
  const msgpack_object *ms = mbd_obj_get(body, "models");
  if (ms && ms->type != MSGPACK_OBJECT_NIL) {
    if (ms->type != MSGPACK_OBJECT_ARRAY)
      return mbd_error_set(err, MBD_E_INVALID, "READY: 'models' must be an array of {name, digest}");
    if (ms->via.array.size > MBD_BW_MODELS_MAX)
      return mbd_error_set(err, MBD_E_INVALID, "READY: %u models (at most %d)", ms->via.array.size,
                           MBD_BW_MODELS_MAX);
    for (uint32_t i = 0; i < ms->via.array.size; i++) {
      mbd_bmodel *m = &w->models[i];
      const msgpack_object *o = &ms->via.array.ptr[i];
      m->digest[0] = m->tokenizer_digest[0] = '\0';
      if (o->type != MSGPACK_OBJECT_MAP)
        return mbd_error_set(err, MBD_E_INVALID, "READY: models[%u] must be a map {name, digest}", i);
      if ((rc = mbd_obj_str(o, "name", true, m->name, sizeof m->name, err)) ||
          (rc = mbd_obj_str(o, "digest", false, m->digest, sizeof m->digest, err)) ||
          (rc = mbd_obj_str(o, "tokenizer_digest", false, m->tokenizer_digest,
                            sizeof m->tokenizer_digest, err)))
        return mbd_error_prefix(err, "READY: models[%u]", i);
    }
    w->nmodels = (int)ms->via.array.size;
  }
  return MBD_OK;
}

static mbd_bworker *find_uid(mbd_registry *r, const char *uid) {
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->w[i].uid, uid)) return &r->w[i];
  return NULL;
}

mbd_bworker *mbd_registry_find_ident(mbd_registry *r, const void *ident, size_t len) {
  for (size_t i = 0; i < r->n; i++)
    if (r->w[i].ident_len == len && !memcmp(r->w[i].ident, ident, len)) return &r->w[i];
  return NULL;
}

mbd_bworker *mbd_registry_find_uid(mbd_registry *r, const char *uid) { return find_uid(r, uid); }

mbd_bworker *mbd_registry_find_gen(mbd_registry *r, uint64_t gen) {
  for (size_t i = 0; i < r->n; i++)
    if (r->w[i].gen == gen) return &r->w[i];
  return NULL;
}

int mbd_registry_add(mbd_registry *r, const mbd_bworker *w, mbd_bworker *replaced,
                     bool *was_replaced, mbd_error *err) {
  *was_replaced = false;
  mbd_bworker *old = mbd_registry_find_ident(r, w->ident, w->ident_len);
  if (!old) old = find_uid(r, w->uid);
  if (old) {
    if (replaced) *replaced = *old;
    *was_replaced = true;
    *old = *w;
    old->inflight = 0;
    /* Another record may hold the other key (same uid elsewhere): drop it too. */
    mbd_bworker *dup = find_uid(r, w->uid);
    if (dup && dup != old) {
      size_t i = (size_t)(dup - r->w);
      r->w[i] = r->w[--r->n];
    }
    return MBD_OK;
  }
  if (r->n == REGISTRY_MAX)
    return mbd_error_set(err, MBD_E_BUSY, "worker registry full (%d workers)", REGISTRY_MAX);
  if (r->n == r->cap) {
    size_t nc = r->cap ? 2 * r->cap : 8;
    mbd_bworker *nw = realloc(r->w, nc * sizeof *nw);
    if (!nw) return mbd_error_set(err, MBD_E_NOMEM, "out of memory registering a worker");
    r->w = nw;
    r->cap = nc;
  }
  r->w[r->n] = *w;
  r->w[r->n].inflight = 0;
  r->n++;
  return MBD_OK;
}

int mbd_registry_remove(mbd_registry *r, const void *ident, size_t len) {
  mbd_bworker *w = mbd_registry_find_ident(r, ident, len);
  if (!w) return MBD_E_NOT_FOUND;
  size_t i = (size_t)(w - r->w);
  r->w[i] = r->w[--r->n];
  return MBD_OK;
}

size_t mbd_registry_count(const mbd_registry *r) { return r->n; }
mbd_bworker *mbd_registry_at(mbd_registry *r, size_t i) { return i < r->n ? &r->w[i] : NULL; }

static bool has_prefix(const char *s, const char *prefix) {
  return !prefix || !prefix[0] || !strncmp(s, prefix, strlen(prefix));
}

bool mbd_bworker_serves(const mbd_bworker *w, const char *model, const char *digest,
                        const char *tokenizer) {
  if (!model || !model[0]) return true;
  for (int i = 0; i < w->nmodels; i++)
    if (!strcmp(w->models[i].name, model) && has_prefix(w->models[i].digest, digest) &&
        (!tokenizer || !strcmp(w->models[i].tokenizer_digest, tokenizer)))
      return true;
  return false;
}

bool mbd_bworker_matches(const mbd_bworker *w, const mbd_route_want *want, const char *model,
                         const char *digest, const char *tokenizer) {
  return mbd_route_matches(want, &w->route, w->route_id) &&
         mbd_bworker_serves(w, model, digest, tokenizer);
}

int mbd_registry_set_default(mbd_registry *r, const char *name, const char *digest,
                             mbd_error *err) {
  if (!name[0] || strlen(name) >= MBD_BW_NAME_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "default digest: model name '%s' is empty or too long",
                         name);
  if (!mbd_digest_prefix_ok(digest))
    return mbd_error_set(err, MBD_E_INVALID,
                         "default digest of model '%s': '%s' is not a hex digest prefix of 8 to 64 "
                         "lower-case characters",
                         name, digest);
  model_default *d = NULL;
  for (size_t i = 0; i < r->ndefaults; i++)
    if (!strcmp(r->defaults[i].name, name)) d = &r->defaults[i];
  if (!d) {
    if (r->ndefaults == MBD_BW_DEFAULTS_MAX)
      return mbd_error_set(err, MBD_E_BUSY, "more than %d model defaults", MBD_BW_DEFAULTS_MAX);
    d = &r->defaults[r->ndefaults++];
  }
  snprintf(d->name, sizeof d->name, "%s", name);
  snprintf(d->digest, sizeof d->digest, "%s", digest);
  return MBD_OK;
}

const char *mbd_registry_default(const mbd_registry *r, const char *name) {
  for (size_t i = 0; i < r->ndefaults; i++)
    if (!strcmp(r->defaults[i].name, name)) return r->defaults[i].digest;
  return NULL;
}

/* The model `model` on w whose digest starts with prefix, or NULL. */
static const mbd_bmodel *served_model(const mbd_bworker *w, const char *model, const char *prefix) {
  for (int i = 0; i < w->nmodels; i++)
    if (!strcmp(w->models[i].name, model) && has_prefix(w->models[i].digest, prefix))
      return &w->models[i];
  return NULL;
}

int mbd_registry_resolve_digest(mbd_registry *r, const mbd_route_want *want, const char *model,
                                const char *pin, char out[MBD_BW_DIGEST_MAX],
                                char tokenizer_out[MBD_BW_DIGEST_MAX], mbd_error *err) {
  const char *prefix = pin ? pin : "";
  tokenizer_out[0] = '\0';
  if (!model || !model[0]) {
    snprintf(out, MBD_BW_DIGEST_MAX, "%s", prefix);
    return MBD_OK;
  }
  const char *dflt = prefix[0] ? NULL : mbd_registry_default(r, model);
  if (dflt) prefix = dflt;
  const mbd_bmodel *found[MBD_BW_MODELS_MAX];
  size_t nfound = 0, total = 0;
  bool same_weights = true; /* every pair found has the first one's weights */
  for (size_t i = 0; i < r->n; i++) {
    const mbd_bworker *w = &r->w[i];
    const mbd_bmodel *m;
    if (w->dead || !mbd_route_matches(want, &w->route, w->route_id) ||
        !(m = served_model(w, model, prefix)))
      continue;
    size_t k = 0;
    while (k < nfound &&
           (strcmp(found[k]->digest, m->digest) ||
            strcmp(found[k]->tokenizer_digest, m->tokenizer_digest)))
      k++;
    if (k == nfound) {
      total++;
      if (nfound && strcmp(found[0]->digest, m->digest)) same_weights = false;
      if (nfound < MBD_BW_MODELS_MAX) found[nfound++] = m;
    }
  }
  if (total <= 1) {
    snprintf(out, MBD_BW_DIGEST_MAX, "%s", total ? found[0]->digest : prefix);
    if (total) snprintf(tokenizer_out, MBD_BW_DIGEST_MAX, "%s", found[0]->tokenizer_digest);
    return MBD_OK;
  }
  char list[MBD_ERROR_MSG_MAX];
  size_t n = 0;
  for (size_t k = 0; k < nfound && n < sizeof list; k++) {
    int x = same_weights ? snprintf(list + n, sizeof list - n, "%stokenizer %.16s", k ? ", " : "",
                                    found[k]->tokenizer_digest[0] ? found[k]->tokenizer_digest
                                                                  : "(none)")
                         : snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "",
                                    found[k]->digest);
    if (x > 0) n += (size_t)x;
  }
  if (same_weights)
    return mbd_error_set(err, MBD_E_INVALID,
                         "model '%s' (weights %.16s) is served with %zu different tokenizers: %s; "
                         "a name must mean one tokenizer: serve the same tokenizer.json on every "
                         "worker of this name, or give the variants different names",
                         model, found[0]->digest, total, list);
  return mbd_error_set(err, MBD_E_INVALID,
                       "model '%s'%s%s is served with %zu different weights digests: %s; pin one "
                       "(request field model_digest, or mambad --model %s@DIGEST) or mark a "
                       "default in the deployment",
                       model, pin && pin[0] ? " pinned to " : "", pin ? pin : "", total, list,
                       model);
}

/* a less loaded than b? inflight/capacity compared by cross-multiplying. */
static bool less_loaded(const mbd_bworker *a, const mbd_bworker *b) {
  int64_t la = (int64_t)a->inflight * b->capacity, lb = (int64_t)b->inflight * a->capacity;
  if (la != lb) return la < lb;
  if (a->inflight != b->inflight) return a->inflight < b->inflight;
  return a->dispatch_seq < b->dispatch_seq;
}

mbd_bworker *mbd_registry_select(mbd_registry *r, const mbd_route_want *want, const char *model,
                                 const char *digest, const char *tokenizer,
                                 const mbd_bworker *exclude, size_t *n_match) {
  mbd_bworker *best = NULL;
  size_t m = 0;
  for (size_t i = 0; i < r->n; i++) {
    mbd_bworker *w = &r->w[i];
    if (w == exclude || w->dead || !mbd_bworker_matches(w, want, model, digest, tokenizer))
      continue;
    m++;
    if (w->inflight >= w->capacity) continue;
    if (!best || less_loaded(w, best)) best = w;
  }
  if (n_match) *n_match = m;
  if (best) best->dispatch_seq = ++r->seq;
  return best;
}

bool mbd_bworker_read_prefix(mbd_bworker *w, const msgpack_object *v) {
  if (!v || v->type != MSGPACK_OBJECT_MAP) return false;
  mbd_bprefix p;
  memset(&p, 0, sizeof p);
  static const char *const keys[] = {"lookups",     "hits",         "hit_tokens",
                                     "inserts",     "evictions",    "bytes",
                                     "entries",     "device_hits",  "demotions",
                                     "device_bytes", "device_entries"};
  uint64_t *dst[] = {&p.lookups,   &p.hits,        &p.hit_tokens,   &p.inserts,
                     &p.evictions, &p.bytes,       &p.entries,      &p.device_hits,
                     &p.demotions, &p.device_bytes, &p.device_entries};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (mbd_obj_u64(v, keys[i], false, dst[i], NULL)) return false;
  const msgpack_object *h = mbd_obj_get(v, "hashes");
  if (h) {
    if (h->type != MSGPACK_OBJECT_ARRAY || h->via.array.size > MBD_PREFIX_HASHES_MAX) return false;
    for (uint32_t i = 0; i < h->via.array.size; i++) {
      if (h->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
      p.hashes[p.nhashes++] = h->via.array.ptr[i].via.u64;
    }
  }
  p.known = true;
  w->prefix = p;
  return true;
}

size_t mbd_bworker_prefix_match(const mbd_bworker *w, const uint64_t *h, size_t n) {
  for (size_t i = n; i-- > 0;)
    for (size_t k = 0; k < w->prefix.nhashes; k++)
      if (w->prefix.hashes[k] == h[i]) return i + 1;
  return 0;
}

mbd_bworker *mbd_registry_select_prefix(mbd_registry *r, const mbd_route_want *want,
                                        const char *model, const char *digest,
                                        const char *tokenizer, const uint64_t *h, size_t n,
                                        const mbd_bworker *exclude, size_t *n_match) {
  mbd_bworker *best = NULL;
  size_t best_len = 0;
  for (size_t i = 0; i < r->n && n; i++) {
    mbd_bworker *w = &r->w[i];
    if (w == exclude || w->dead || !mbd_bworker_matches(w, want, model, digest, tokenizer))
      continue;
    if ((int64_t)w->inflight * 100 >= (int64_t)w->capacity * MBD_PREFIX_ROUTE_LOAD_PCT) continue;
    size_t len = mbd_bworker_prefix_match(w, h, n);
    if (len && (len > best_len || (len == best_len && less_loaded(w, best)))) {
      best = w;
      best_len = len;
    }
  }
  if (!best) return mbd_registry_select(r, want, model, digest, tokenizer, exclude, n_match);
  if (n_match) { /* matching workers regardless of load, as mbd_registry_select counts them */
    size_t m = 0;
    for (size_t i = 0; i < r->n; i++) {
      const mbd_bworker *w = &r->w[i];
      m += w != exclude && !w->dead && mbd_bworker_matches(w, want, model, digest, tokenizer);
    }
    *n_match = m;
  }
  best->dispatch_seq = ++r->seq;
  return best;
}

mbd_bworker *mbd_registry_select_ipc(mbd_registry *r, const mbd_route_want *want,
                                     const char *model, const char *digest,
                                     const char *tokenizer, const char *host_id, int device,
                                     const mbd_bworker *exclude, size_t *n_match) {
  mbd_bworker *best = NULL;
  size_t m = 0;
  for (size_t i = 0; i < r->n; i++) {
    mbd_bworker *w = &r->w[i];
    if (w == exclude || w->dead || w->device < 0 || strcmp(w->host_id, host_id) ||
        !mbd_bworker_matches(w, want, model, digest, tokenizer))
      continue;
    m++;
    if (w->inflight >= w->capacity) continue;
    bool wa = w->device == device, ba = best && best->device == device;
    if (!best || (wa && !ba) || (wa == ba && less_loaded(w, best))) best = w;
  }
  if (n_match) *n_match = m;
  if (best) best->dispatch_seq = ++r->seq;
  return best;
}

void mbd_registry_no_route_message(mbd_registry *r, const mbd_route_want *want, const char *model,
                                   const char *digest, char *buf, size_t cap) {
  char wtxt[256];
  mbd_route_want_format(want, wtxt, sizeof wtxt);
  size_t n = 0;
#define PUT(...)                                                   \
  do {                                                             \
    if (n < cap) {                                                 \
      int x_ = snprintf(buf + n, cap - n, __VA_ARGS__);            \
      if (x_ > 0) n += (size_t)x_;                                 \
    }                                                              \
  } while (0)
  PUT("no live worker matches route %s model=%s%s%.16s; ", wtxt, model && model[0] ? model : "any",
      digest && digest[0] ? "@" : "", digest ? digest : "");
  if (!r->n) PUT("no workers are registered");
  else PUT("available:");
  for (size_t i = 0; i < r->n; i++) {
    const mbd_bworker *w = &r->w[i];
    PUT(" %.8s %s/%s/%s", w->route_id, mbd_backend_name(w->route.backend),
        mbd_dtype_policy_name(w->route.policy), mbd_gemm_mode_name(w->route.mode));
    if (w->route.state != MBD_STATE_F32) PUT(" state=%s", mbd_state_dtype_name(w->route.state));
    PUT(" models=[");
    for (int k = 0; k < w->nmodels; k++)
      PUT("%s%s%s%.8s", k ? "," : "", w->models[k].name, w->models[k].digest[0] ? "@" : "",
          w->models[k].digest);
    PUT("]%s", i + 1 < r->n ? ";" : "");
  }
#undef PUT
  if (n >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}
