/* The broker's STATUS reply body (see status.h). */
#include "broker/status.h"

#include <string.h>
#include <unistd.h>

#include "broker/caller.h"
#include "common/protocol.h"

/* STATUS "models": one entry per distinct (name, weights, tokenizer) among the
 * live workers, with how many serve it and whether it is the name's default,
 * so two digests under one name show as two models. */
static void pack_models(mbd_registry *reg, msgpack_packer *pk) {
  enum { MAXM = 256 };
  const mbd_bmodel *seen[MAXM];
  int nserve[MAXM];
  size_t n = 0;
  for (size_t i = 0; i < mbd_registry_count(reg); i++) {
    const mbd_bworker *w = mbd_registry_at(reg, i);
    for (int k = 0; k < w->nmodels; k++) {
      const mbd_bmodel *m = &w->models[k];
      size_t j = 0;
      while (j < n && (strcmp(seen[j]->name, m->name) || strcmp(seen[j]->digest, m->digest) ||
                       strcmp(seen[j]->tokenizer_digest, m->tokenizer_digest)))
        j++;
      if (j < n) nserve[j]++;
      else if (n < MAXM) seen[n] = m, nserve[n++] = 1;
    }
  }
  mbd_pack_str(pk, "models");
  msgpack_pack_array(pk, n);
  for (size_t j = 0; j < n; j++) {
    const char *d = mbd_registry_default(reg, seen[j]->name);
    msgpack_pack_map(pk, 5);
    mbd_pack_kv_str(pk, "name", seen[j]->name);
    mbd_pack_kv_str(pk, "digest", seen[j]->digest);
    mbd_pack_kv_str(pk, "tokenizer_digest", seen[j]->tokenizer_digest);
    mbd_pack_kv_i64(pk, "workers", nserve[j]);
    mbd_pack_kv_bool(pk, "default", d && !strncmp(seen[j]->digest, d, strlen(d)));
  }
}

bool mbd_bstatus_privileged(const mbd_msg *req) {
  size_t blen = 0;
  const void *b = mbd_msg_body(req, &blen);
  mbd_body *body = NULL;
  if (mbd_body_parse(b, blen, &body, NULL)) return false;
  mbd_bcaller who;
  mbd_bcaller_read(mbd_body_root(body), &who);
  mbd_body_destroy(&body);
  if (!strncmp(who.id, "op:", 3)) return true;
  return who.has_uid && (who.uid == (uint32_t)geteuid() || who.uid == 0);
}

void mbd_bstatus_pack(const mbd_bstatus_view *v, bool full, int64_t now, msgpack_packer *pk) {
  size_t n = mbd_registry_count(v->reg);
  msgpack_pack_map(pk, 8);
  pack_models(v->reg, pk);
  mbd_pack_str(pk, "failed");
  msgpack_pack_array(pk, v->nfailed);
  for (size_t i = 0; i < v->nfailed; i++) {
    msgpack_pack_map(pk, 4);
    mbd_pack_kv_str(pk, "name", v->failed[i].name);
    mbd_pack_kv_str(pk, "error", v->failed[i].error);
    mbd_pack_kv_str(pk, "models", v->failed[i].models);
    mbd_pack_kv_i64(pk, "age_ms", now - v->failed[i].at_ms);
  }
  mbd_pack_str(pk, "workers");
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) {
    const mbd_bworker *w = mbd_registry_at(v->reg, i);
    msgpack_pack_map(pk, (full ? 13 : 9) + w->prefix.known);
    mbd_pack_kv_str(pk, "name", w->name);
    if (w->prefix.known) {
      const mbd_bprefix *x = &w->prefix;
      mbd_pack_str(pk, "prefix_cache");
      msgpack_pack_map(pk, 11);
      mbd_pack_kv_u64(pk, "lookups", x->lookups);
      mbd_pack_kv_u64(pk, "hits", x->hits);
      mbd_pack_kv_u64(pk, "hit_tokens", x->hit_tokens);
      mbd_pack_kv_u64(pk, "inserts", x->inserts);
      mbd_pack_kv_u64(pk, "evictions", x->evictions);
      mbd_pack_kv_u64(pk, "bytes", x->bytes);
      mbd_pack_kv_u64(pk, "entries", x->entries);
      mbd_pack_kv_u64(pk, "device_hits", x->device_hits);
      mbd_pack_kv_u64(pk, "demotions", x->demotions);
      mbd_pack_kv_u64(pk, "device_bytes", x->device_bytes);
      mbd_pack_kv_u64(pk, "device_entries", x->device_entries);
    }
    mbd_pack_kv_i64(pk, "sessions", w->sessions);
    if (full) mbd_pack_kv_str(pk, "uid", w->uid);
    mbd_pack_kv_str(pk, "route_id", w->route_id);
    if (full) mbd_pack_kv_str(pk, "route", w->route_enc);
    mbd_pack_kv_str(pk, "backend", mbd_backend_name(w->route.backend));
    if (full) mbd_pack_kv_str(pk, "host_id", w->host_id);
    mbd_pack_kv_i64(pk, "capacity", w->capacity);
    mbd_pack_kv_i64(pk, "inflight", w->inflight);
    mbd_pack_kv_i64(pk, "heartbeat_age_ms", now - w->last_seen_ms);
    if (full) mbd_pack_kv_i64(pk, "pid", w->pid);
    mbd_pack_kv_i64(pk, "uptime_ms", now - w->registered_ms);
    mbd_pack_str(pk, "models");
    msgpack_pack_array(pk, (size_t)w->nmodels);
    for (int k = 0; k < w->nmodels; k++) {
      msgpack_pack_map(pk, 3);
      mbd_pack_kv_str(pk, "name", w->models[k].name);
      mbd_pack_kv_str(pk, "digest", w->models[k].digest);
      mbd_pack_kv_str(pk, "tokenizer_digest", w->models[k].tokenizer_digest);
    }
  }
  mbd_pack_kv_u64(pk, "queue", v->qlen);
  mbd_pack_kv_u64(pk, "queue_bytes", v->qbytes);
  mbd_pack_kv_u64(pk, "pending", v->pending);
  mbd_pack_str(pk, "counters");
  const mbd_bcore_stats *s = v->stats;
  msgpack_pack_map(pk, 27);
  mbd_pack_kv_u64(pk, "requests", s->requests);
  mbd_pack_kv_u64(pk, "ambiguous", s->ambiguous);
  mbd_pack_kv_u64(pk, "busy_count", s->busy_count);
  mbd_pack_kv_u64(pk, "busy_bytes", s->busy_bytes);
  mbd_pack_kv_u64(pk, "forwarded", s->forwarded);
  mbd_pack_kv_u64(pk, "replies", s->replies);
  mbd_pack_kv_u64(pk, "errors", s->errors);
  mbd_pack_kv_u64(pk, "no_route", s->no_route);
  mbd_pack_kv_u64(pk, "busy", s->busy);
  mbd_pack_kv_u64(pk, "timeouts", s->timeouts);
  mbd_pack_kv_u64(pk, "worker_lost", s->worker_lost);
  mbd_pack_kv_u64(pk, "failovers", s->failovers);
  mbd_pack_kv_u64(pk, "late_dropped", s->late_dropped);
  mbd_pack_kv_u64(pk, "malformed", s->malformed);
  mbd_pack_kv_u64(pk, "workers_joined", s->workers_joined);
  mbd_pack_kv_u64(pk, "workers_lost", s->workers_lost);
  mbd_pack_kv_u64(pk, "cancelled", s->cancelled);
  mbd_pack_kv_u64(pk, "clients_gone", s->clients_gone);
  mbd_pack_kv_u64(pk, "poisoned", s->poisoned);
  const mbd_bdurable_stats *ds = v->durable;
  mbd_pack_kv_u64(pk, "durable_sessions", ds->sessions);
  mbd_pack_kv_u64(pk, "checkpoints", ds->checkpoints);
  mbd_pack_kv_u64(pk, "checkpoints_dropped", ds->dropped);
  mbd_pack_kv_u64(pk, "checkpoint_bytes", ds->bytes);
  mbd_pack_kv_u64(pk, "sessions_rehomed", ds->rehomed);
  mbd_pack_kv_u64(pk, "replayed_tokens", ds->replayed_tokens);
  mbd_pack_kv_u64(pk, "generates_resumed", ds->resumed);
  mbd_pack_kv_u64(pk, "sessions_lost", ds->lost);
  mbd_pack_str(pk, "config");
  msgpack_pack_map(pk, 7);
  mbd_pack_kv_i64(pk, "client_inflight", v->cfg->client_inflight);
  mbd_pack_kv_i64(pk, "durable_mb", v->cfg->durable_mb);
  mbd_pack_kv_i64(pk, "heartbeat_ms", v->cfg->heartbeat_ms);
  mbd_pack_kv_i64(pk, "liveness", v->cfg->liveness);
  mbd_pack_kv_i64(pk, "queue_limit", v->cfg->queue_limit);
  mbd_pack_kv_i64(pk, "queue_mb", v->cfg->queue_mb);
  mbd_pack_kv_i64(pk, "default_deadline_ms", v->cfg->default_deadline_ms);
}
