/* The prefix state cache applied to PREFILL jobs. See prefix_job.h. */
#include "worker/prefix_job.h"

#include <string.h>

#include "common/log.h"
#include "common/prefix_hash.h"
#include "common/protocol.h"

#define LOGC MBD_WSTATE_LOG

int mbd_wpfx_begin(mbd_wstate *st, mbd_wjob *j, mbd_wsession *s, mbd_error *err) {
  mbd_wsess_data *ws = s->user;
  bool fresh = ws->fresh;
  ws->fresh = false;
  j->pfx_begun = true;
  mbd_wmodel *m = &st->models[j->model];
  if (!fresh || !m->pcache) return MBD_OK;
  mbd_error e = {0};
  if (mbd_pcache_plan_new(m->pcache, j->ids, j->T, st->o.prefix_block, j->q->cache_points,
                          j->q->ncache_points, &j->pfx, &e)) {
    MBD_LOGW(LOGC, "prefix cache: %s (prefill goes on uncached)", e.msg);
    return MBD_OK;
  }
  if (!j->pfx || !j->last_only) return MBD_OK;
  mbd_pcache_hit hit;
  if (!mbd_pcache_lookup(m->pcache, j->pfx, j->ids, &hit)) return MBD_OK;
  int rc = hit.stash ? st->be->ops->stash_load(st->be, (mbd_bstate *)s->state,
                                               (const mbd_bstash *)hit.stash, err)
                     : st->be->ops->state_load((mbd_bstate *)s->state, hit.state,
                                               hit.state_bytes, err);
  if (rc) return mbd_error_prefix(err, "restoring a cached prefix of %lld tokens",
                                  (long long)hit.pos);
  size_t vb = (size_t)m->vocab * sizeof(float);
  memcpy(ws->logits, hit.logits, vb);
  if (j->out) memcpy(j->out, hit.logits, vb); /* last_only: the result is [1,V] */
  else if ((rc = mbd_wreq_output_put(st->be, st->shm, &j->q->outputs[0], 0, hit.logits, vb, err)))
    return rc; /* a CUDA IPC output: written in place */
  ws->has_logits = true;
  ws->logits_stale = false;
  j->done = hit.pos;
  return MBD_OK;
}

int64_t mbd_wpfx_chunk(const mbd_wjob *j, int64_t c) {
  const mbd_pcache_plan *p = j->pfx;
  if (!p || p->next >= p->n) return c;
  int64_t to = p->pos[p->next] - j->done;
  return to > 0 && to < c ? to : c;
}

typedef struct fill_ctx {
  mbd_wstate *st;
  const mbd_wsession *s;
  const float *logits;
  size_t vocab;
} fill_ctx;

static int fill(void *ctx, void *state, void *stash, size_t state_bytes, float *logits,
                mbd_error *err) {
  fill_ctx *f = ctx;
  const mbd_backend *be = f->st->be;
  const mbd_bstate *bs = (const mbd_bstate *)f->s->state;
  int rc = state ? be->ops->state_save(bs, state, state_bytes, err)
                 : be->ops->stash_save(f->st->be, (mbd_bstash *)stash, bs, err);
  if (!rc) memcpy(logits, f->logits, f->vocab * sizeof(float));
  return rc;
}

void mbd_wpfx_after(mbd_wstate *st, mbd_wjob *j, mbd_wsession *s, const float *logits) {
  mbd_pcache_plan *p = j->pfx;
  if (!p) return;
  mbd_wmodel *m = &st->models[j->model];
  while (p->next < p->n && p->pos[p->next] <= j->done) {
    size_t i = p->next++;
    if (p->pos[i] != j->done || mbd_pcache_contains(m->pcache, p, i, j->ids)) continue;
    fill_ctx f = {.st = st, .s = s, .logits = logits, .vocab = (size_t)m->vocab};
    mbd_error e = {0};
    size_t sb = st->be->ops->state_bytes((const mbd_bstate *)s->state);
    if (mbd_pcache_insert(m->pcache, p, i, j->ids, sb, fill, &f, &e))
      MBD_LOGW(LOGC, "prefix cache: not storing %lld tokens of %s: %s", (long long)p->pos[i],
               m->name, e.msg);
  }
}

/* The device tier over the backend's state stashes (ctx: the model). */
static int dev_alloc(void *ctx, void **stash, mbd_error *err) {
  mbd_wmodel *m = ctx;
  return m->be->ops->stash_new(m->be, m->bm, (mbd_bstash **)stash, err);
}
static void dev_free(void *ctx, void *stash) {
  mbd_wmodel *m = ctx;
  m->be->ops->stash_free(m->be, stash);
}
static int dev_export(void *ctx, const void *stash, void *dst, size_t state_bytes,
                      mbd_error *err) {
  mbd_wmodel *m = ctx;
  return m->be->ops->stash_export(m->be, stash, dst, state_bytes, err);
}

int mbd_wpfx_model_init(mbd_wstate *st, mbd_wmodel *m, mbd_error *err) {
  const mbd_worker_opts *o = &st->o;
  if (!o->prefix_cache_mb || o->prefix_block <= 0) return MBD_OK;
  int rc = mbd_pcache_new(o->prefix_cache_mb << 20, m->name, m->digest, st->route_id,
                          (size_t)m->vocab, &m->pcache, err);
  if (rc) return rc;
  const mbd_backend_ops *ops = st->be->ops;
  size_t sb = ops->stash_bytes && o->prefix_cache_device_mb ? ops->stash_bytes(st->be, m->bm) : 0;
  if (!sb) return MBD_OK;
  m->be = st->be;
  mbd_pcache_dev d = {.ctx = m,
                      .stash_bytes = sb,
                      .budget = o->prefix_cache_device_mb << 20,
                      .alloc = dev_alloc,
                      .free = dev_free,
                      .export = dev_export};
  mbd_pcache_set_device(m->pcache, &d);
  MBD_LOGI(LOGC, "model %s: prefix cache device tier of %zu MiB (%zu states of %zu bytes)",
           m->name, o->prefix_cache_device_mb, d.budget / sb, sb);
  return MBD_OK;
}

uint64_t mbd_wpfx_version(const mbd_wstate *st) {
  uint64_t v = 0;
  for (int i = 0; i < st->nmodels; i++)
    if (st->models[i].pcache) v += mbd_pcache_version(st->models[i].pcache);
  return v;
}

bool mbd_wpfx_pack(const mbd_wstate *st, msgpack_packer *pk) {
  mbd_pcache_stats sum = {0};
  uint64_t hashes[MBD_PREFIX_HASHES_MAX];
  size_t nh = 0;
  bool any = false;
  for (int i = 0; i < st->nmodels; i++) {
    const mbd_pcache *c = st->models[i].pcache;
    if (!c) continue;
    any = true;
    mbd_pcache_stats s;
    mbd_pcache_stats_get(c, &s);
    sum.lookups += s.lookups;
    sum.hits += s.hits;
    sum.hit_tokens += s.hit_tokens;
    sum.inserts += s.inserts;
    sum.evictions += s.evictions;
    sum.bytes += s.bytes;
    sum.entries += s.entries;
    sum.device_hits += s.device_hits;
    sum.demotions += s.demotions;
    sum.device_bytes += s.device_bytes;
    sum.device_entries += s.device_entries;
    nh += mbd_pcache_adverts(c, hashes + nh, MBD_PREFIX_HASHES_MAX - nh);
  }
  if (!any) return false;
  msgpack_pack_map(pk, 12);
  mbd_pack_kv_u64(pk, "lookups", sum.lookups);
  mbd_pack_kv_u64(pk, "hits", sum.hits);
  mbd_pack_kv_u64(pk, "hit_tokens", sum.hit_tokens);
  mbd_pack_kv_u64(pk, "inserts", sum.inserts);
  mbd_pack_kv_u64(pk, "evictions", sum.evictions);
  mbd_pack_kv_u64(pk, "bytes", sum.bytes);
  mbd_pack_kv_u64(pk, "entries", sum.entries);
  mbd_pack_kv_u64(pk, "device_hits", sum.device_hits);
  mbd_pack_kv_u64(pk, "demotions", sum.demotions);
  mbd_pack_kv_u64(pk, "device_bytes", sum.device_bytes);
  mbd_pack_kv_u64(pk, "device_entries", sum.device_entries);
  mbd_pack_str(pk, "hashes");
  msgpack_pack_array(pk, nh);
  for (size_t k = 0; k < nh; k++) msgpack_pack_uint64(pk, hashes[k]);
  return true;
}
