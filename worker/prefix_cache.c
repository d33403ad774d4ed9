/* The prefix state cache of one model: a hash table of entries by key and,
 * per tier (host, device), a least-recently-used list within a byte budget.
 * See prefix_cache.h. */
#include "worker/prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/prefix_hash.h"
#include "common/sha256.h"

enum { TIER_HOST, TIER_DEVICE };

typedef struct pentry {
  uint8_t key[32];
  uint64_t route;             /* routing hash of the prefix */
  int64_t ntok;               /* prefix length */
  int64_t *ids;               /* [ntok] the prefix, compared on every hit */
  void *state;                /* [state_bytes] host state image (host tier), else NULL */
  void *stash;                /* the device stash holding the state (device tier), else NULL */
  size_t state_bytes;
  float *logits;              /* [vocab] after the prefix's last token */
  size_t bytes;               /* the host allocation, what the host budget counts */
  int tier;                   /* TIER_HOST or TIER_DEVICE */
  uint64_t hits;              /* hits since it entered its tier */
  uint64_t used;              /* clock of its last insert or hit (adverts' order) */
  struct pentry *prev, *next; /* its tier's LRU list: head = most recently used */
  struct pentry *hnext;       /* hash chain */
} pentry;

typedef struct lru {
  pentry *head, *tail;
} lru;

struct mbd_pcache {
  size_t budget;
  size_t vocab;
  char model[64];
  uint8_t ident[32];  /* SHA-256 of route id and weights digest: mixed into every key */
  pentry **buckets;   /* nbuckets chains, a power of two */
  size_t nbuckets;
  lru tiers[2];       /* by TIER_* */
  bool has_dev;
  mbd_pcache_dev dev;
  size_t dev_cap;     /* stashes at most (device budget / stash bytes; lowered on no room) */
  size_t nstash;      /* stashes allocated */
  void **spare;       /* [spare_cap >= nstash] allocated stashes no entry holds */
  size_t nspare, spare_cap;
  uint64_t clock;
  mbd_pcache_stats st;
  uint64_t version;
};

#define BUCKETS_MIN 64
#define LOGC "prefix-cache"

static size_t bucket_of(const mbd_pcache *c, const uint8_t key[32]) {
  uint64_t v;
  memcpy(&v, key, sizeof v);
  return (size_t)(v & (c->nbuckets - 1));
}

int mbd_pcache_new(size_t budget, const char *model, const char *digest, const char *route_id,
                   size_t vocab, mbd_pcache **out, mbd_error *err) {
  *out = NULL;
  mbd_pcache *c = calloc(1, sizeof *c);
  if (!c || !(c->buckets = calloc(BUCKETS_MIN, sizeof *c->buckets))) {
    free(c);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the prefix cache");
  }
  c->nbuckets = BUCKETS_MIN;
  c->budget = budget;
  c->vocab = vocab;
  snprintf(c->model, sizeof c->model, "%s", model);
  mbd_sha256_ctx h;
  static const uint8_t nul = 0;
  mbd_sha256_init(&h);
  mbd_sha256_update(&h, route_id, strlen(route_id));
  mbd_sha256_update(&h, &nul, 1);
  mbd_sha256_update(&h, digest, strlen(digest));
  mbd_sha256_final(&h, c->ident);
  *out = c;
  return MBD_OK;
}

void mbd_pcache_set_device(mbd_pcache *c, const mbd_pcache_dev *dev) {
  if (!dev || !dev->stash_bytes || dev->budget < dev->stash_bytes) return;
  c->dev = *dev;
  c->has_dev = true;
  c->dev_cap = dev->budget / dev->stash_bytes;
}

void mbd_pcache_destroy(mbd_pcache **pc) {
  if (!pc || !*pc) return;
  mbd_pcache *c = *pc;
  for (int t = 0; t < 2; t++)
    for (pentry *e = c->tiers[t].head, *n; e; e = n) {
      n = e->next;
      if (e->stash) c->dev.free(c->dev.ctx, e->stash);
      free(e);
    }
  for (size_t i = 0; i < c->nspare; i++) c->dev.free(c->dev.ctx, c->spare[i]);
  free(c->spare);
  free(c->buckets);
  free(c);
  *pc = NULL;
}

void mbd_pcache_plan_free(mbd_pcache_plan **pp) {
  if (!pp || !*pp) return;
  free((*pp)->pos);
  free((*pp)->key);
  free((*pp)->route);
  free(*pp);
  *pp = NULL;
}

int mbd_pcache_plan_new(const mbd_pcache *c, const int64_t *ids, int64_t T, int64_t block,
                        const int64_t *points, size_t np, mbd_pcache_plan **out, mbd_error *err) {
  *out = NULL;
  size_t n = mbd_prefix_boundaries(T, block, points, np, NULL, 0);
  if (!n) return MBD_OK;
  mbd_pcache_plan *p = calloc(1, sizeof *p);
  if (!p || !(p->pos = malloc(n * sizeof *p->pos)) || !(p->key = malloc(n * sizeof *p->key)) ||
      !(p->route = malloc(n * sizeof *p->route))) {
    mbd_pcache_plan_free(&p);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory planning %zu prefix boundaries", n);
  }
  p->n = n;
  mbd_prefix_boundaries(T, block, points, np, p->pos, n);
  mbd_prefix_hasher h;
  mbd_prefix_hasher_init(&h, c->model);
  for (size_t i = 0; i < n; i++) {
    uint8_t d[32];
    mbd_prefix_hasher_add(&h, ids + h.n, p->pos[i] - h.n);
    mbd_prefix_hasher_digest(&h, d);
    p->route[i] = mbd_prefix_route_hash(d);
    mbd_sha256_ctx k;
    mbd_sha256_init(&k);
    mbd_sha256_update(&k, c->ident, sizeof c->ident);
    mbd_sha256_update(&k, d, sizeof d);
    mbd_sha256_final(&k, p->key[i]);
  }
  *out = p;
  return MBD_OK;
}

static pentry *find(const mbd_pcache *c, const uint8_t key[32], int64_t ntok, const int64_t *ids) {
  for (pentry *e = c->buckets[bucket_of(c, key)]; e; e = e->hnext)
    if (!memcmp(e->key, key, 32) && e->ntok == ntok &&
        !memcmp(e->ids, ids, (size_t)ntok * sizeof *ids))
      return e;
  return NULL;
}

static void lru_unlink(mbd_pcache *c, pentry *e) {
  lru *l = &c->tiers[e->tier];
  if (e->prev) e->prev->next = e->next;
  else l->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else l->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push(mbd_pcache *c, pentry *e) {
  lru *l = &c->tiers[e->tier];
  e->prev = NULL;
  e->next = l->head;
  if (l->head) l->head->prev = e;
  l->head = e;
  if (!l->tail) l->tail = e;
}

/* Puts e into its tier's list by its `used` clock (a demoted entry is older
 * than host entries used since), so each list stays in use order. */
static void lru_insert_used(mbd_pcache *c, pentry *e) {
  lru *l = &c->tiers[e->tier];
  pentry *after = l->tail;
  while (after && after->used < e->used) after = after->prev;
  if (!after) {
    lru_push(c, e);
    return;
  }
  e->prev = after;
  e->next = after->next;
  if (after->next) after->next->prev = e;
  else l->tail = e;
  after->next = e;
}

bool mbd_pcache_lookup(mbd_pcache *c, mbd_pcache_plan *p, const int64_t *ids, mbd_pcache_hit *hit) {
  c->st.lookups++;
  c->version++;
  for (size_t i = p->n; i-- > 0;) {
    pentry *e = find(c, p->key[i], p->pos[i], ids);
    if (!e) continue;
    lru_unlink(c, e);
    lru_push(c, e);
    e->hits++;
    e->used = ++c->clock;
    c->st.hits++;
    if (e->tier == TIER_DEVICE) c->st.device_hits++;
    c->st.hit_tokens += (uint64_t)e->ntok;
    hit->pos = e->ntok;
    hit->state = e->state;
    hit->stash = e->stash;
    hit->state_bytes = e->state_bytes;
    hit->logits = e->logits;
    p->next = i + 1;
    return true;
  }
  return false;
}

bool mbd_pcache_contains(const mbd_pcache *c, const mbd_pcache_plan *p, size_t i,
                         const int64_t *ids) {
  return find(c, p->key[i], p->pos[i], ids) != NULL;
}

static void unhash(mbd_pcache *c, pentry *e) {
  for (pentry **pp = &c->buckets[bucket_of(c, e->key)]; *pp; pp = &(*pp)->hnext)
    if (*pp == e) {
      *pp = e->hnext;
      return;
    }
}

static void rehash(mbd_pcache *c, pentry *e) {
  size_t b = bucket_of(c, e->key);
  e->hnext = c->buckets[b];
  c->buckets[b] = e;
}

/* Doubles the table once entries outnumber buckets (chains stay short). */
static void grow(mbd_pcache *c) {
  if (c->st.entries < c->nbuckets) return;
  size_t nb = c->nbuckets * 2;
  pentry **b = calloc(nb, sizeof *b);
  if (!b) return; /* longer chains, still correct */
  free(c->buckets);
  c->buckets = b;
  c->nbuckets = nb;
  for (int t = 0; t < 2; t++)
    for (pentry *e = c->tiers[t].head; e; e = e->next) rehash(c, e);
}

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Host bytes of an entry of k tokens: entry, logits, tokens, then the state
 * image when it is held in host memory. */
static size_t meta_bytes(const mbd_pcache *c, int64_t k) {
  return round8(sizeof(pentry)) + round8(c->vocab * sizeof(float)) + (size_t)k * sizeof(int64_t);
}

/* Lays out an entry in mem (meta_bytes(k) [+ state_bytes when host]). */
static pentry *layout(const mbd_pcache *c, uint8_t *mem, int64_t k, size_t state_bytes,
                      bool host_state) {
  pentry *e = (pentry *)mem;
  memset(e, 0, sizeof *e);
  size_t o_log = round8(sizeof(pentry)), o_ids = o_log + round8(c->vocab * sizeof(float));
  e->ntok = k;
  e->logits = (float *)(mem + o_log);
  e->ids = (int64_t *)(mem + o_ids);
  e->state = host_state ? mem + o_ids + (size_t)k * sizeof(int64_t) : NULL;
  e->state_bytes = state_bytes;
  e->bytes = meta_bytes(c, k) + (host_state ? state_bytes : 0);
  return e;
}

/* Takes e out of the cache (its stash, if any, back to the spares) and frees it. */
static void drop(mbd_pcache *c, pentry *e) {
  lru_unlink(c, e);
  unhash(c, e);
  c->st.bytes -= e->bytes;
  c->st.entries--;
  c->st.evictions++;
  if (e->stash) {
    c->spare[c->nspare++] = e->stash;
    c->st.device_bytes -= c->dev.stash_bytes;
    c->st.device_entries--;
  }
  free(e);
}

/* Frees host-tier entries, least recently used first, until `need` more
 * host bytes fit; false when the host tier runs out first. */
static bool host_room(mbd_pcache *c, size_t need) {
  while (c->st.bytes + need > c->budget) {
    if (!c->tiers[TIER_HOST].tail) return false;
    drop(c, c->tiers[TIER_HOST].tail);
  }
  return true;
}

/* Moves device entry e to the host tier: a new allocation with its state
 * image read from its stash; the stash goes back to the spares. False (e
 * unchanged) when it cannot. */
static bool demote(mbd_pcache *c, pentry *e) {
  size_t nb = e->bytes + e->state_bytes;
  if (nb > c->budget) return false;
  /* Room first, counting e's current allocation as freed once it moves. */
  if (!host_room(c, e->state_bytes)) return false;
  uint8_t *mem = malloc(nb);
  if (!mem) return false;
  pentry *n = layout(c, mem, e->ntok, e->state_bytes, true);
  mbd_error err = {0};
  if (c->dev.export(c->dev.ctx, e->stash, n->state, e->state_bytes, &err)) {
    MBD_LOGW(LOGC, "%s: demoting a %lld-token prefix: %s (dropped)", c->model, (long long)e->ntok,
             err.msg);
    free(mem);
    return false;
  }
  memcpy(n->key, e->key, 32);
  n->route = e->route;
  n->used = e->used;
  memcpy(n->logits, e->logits, c->vocab * sizeof(float));
  memcpy(n->ids, e->ids, (size_t)e->ntok * sizeof *e->ids);
  n->tier = TIER_HOST;
  lru_unlink(c, e);
  unhash(c, e);
  c->spare[c->nspare++] = e->stash;
  c->st.device_bytes -= c->dev.stash_bytes;
  c->st.device_entries--;
  c->st.bytes += nb - e->bytes;
  c->st.demotions++;
  free(e);
  lru_insert_used(c, n);
  rehash(c, n);
  return true;
}

/* A stash for a new device entry, or NULL (host tier only for it): a spare,
 * a new allocation within the cap, else the least recently used device
 * entry's, demoted when it was hit and the host tier can hold it. */
static void *take_stash(mbd_pcache *c) {
  if (c->nspare) return c->spare[--c->nspare];
  if (c->nstash < c->dev_cap) {
    void *s = NULL;
    mbd_error err = {0};
    if (c->nstash == c->spare_cap) { /* every stash must fit among the spares */
      size_t n = c->spare_cap ? 2 * c->spare_cap : 64;
      void **sp = realloc(c->spare, n * sizeof *sp);
      if (!sp) return NULL; /* host tier for this entry */
      c->spare = sp;
      c->spare_cap = n;
    }
    if (!c->dev.alloc(c->dev.ctx, &s, &err)) {
      c->nstash++;
      return s;
    }
    c->dev_cap = c->nstash;
    MBD_LOGW(LOGC,
             "%s: no device memory for another prefix state (%s): the device tier keeps "
             "%zu entries (%.1f MiB); lower --prefix-cache-device-mb to stop this message",
             c->model, err.msg, c->nstash, (double)(c->nstash * c->dev.stash_bytes) / (1 << 20));
  }
  pentry *v = c->tiers[TIER_DEVICE].tail;
  if (!v) return NULL;
  c->version++;
  if (!(v->hits && demote(c, v))) drop(c, v);
  return c->nspare ? c->spare[--c->nspare] : NULL;
}

int mbd_pcache_insert(mbd_pcache *c, const mbd_pcache_plan *p, size_t i, const int64_t *ids,
                      size_t state_bytes, mbd_pcache_fill_fn fill, void *ctx, mbd_error *err) {
  int64_t k = p->pos[i];
  if (find(c, p->key[i], k, ids)) return MBD_OK;
  size_t meta = meta_bytes(c, k);
  if (meta > c->budget) return MBD_OK;
  void *stash = c->has_dev ? take_stash(c) : NULL;
  size_t bytes = meta + (stash ? 0 : state_bytes);
  if (bytes > c->budget) return MBD_OK; /* no stash: a host image over the budget */
  uint8_t *mem = malloc(bytes);
  if (!mem) {
    if (stash) c->spare[c->nspare++] = stash;
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a prefix cache entry");
  }
  pentry *e = layout(c, mem, k, state_bytes, !stash);
  memcpy(e->key, p->key[i], 32);
  e->route = p->route[i];
  memcpy(e->ids, ids, (size_t)k * sizeof *ids);
  e->stash = stash;
  e->tier = stash ? TIER_DEVICE : TIER_HOST;
  int rc = fill(ctx, e->state, stash, state_bytes, e->logits, err);
  if (rc) {
    if (stash) c->spare[c->nspare++] = stash;
    free(mem);
    return rc;
  }
  /* Host room: host-tier entries first, then device entries (dropped). */
  while (c->st.bytes + bytes > c->budget) {
    pentry *v = c->tiers[TIER_HOST].tail ? c->tiers[TIER_HOST].tail : c->tiers[TIER_DEVICE].tail;
    if (!v) break;
    drop(c, v);
  }
  e->used = ++c->clock;
  lru_push(c, e);
  rehash(c, e);
  c->st.bytes += bytes;
  c->st.entries++;
  c->st.inserts++;
  if (stash) {
    c->st.device_bytes += c->dev.stash_bytes;
    c->st.device_entries++;
  }
  c->version++;
  grow(c);
  return MBD_OK;
}

void mbd_pcache_stats_get(const mbd_pcache *c, mbd_pcache_stats *out) { *out = c->st; }

size_t mbd_pcache_adverts(const mbd_pcache *c, uint64_t *out, size_t cap) {
  size_t n = 0;
  const pentry *h = c->tiers[TIER_HOST].head, *d = c->tiers[TIER_DEVICE].head;
  while ((h || d) && n < cap) { /* each list is in use order: merge them */
    const pentry **pick = !d || (h && h->used > d->used) ? &h : &d;
    out[n++] = (*pick)->route;
    *pick = (*pick)->next;
  }
  return n;
}

uint64_t mbd_pcache_version(const mbd_pcache *c) { return c->version; }
