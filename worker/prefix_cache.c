/* The prefix state cache of one model: a hash table of entries by key and a
 * least-recently-used list within a byte budget. See prefix_cache.h. */
#include "worker/prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/prefix_hash.h"
#include "common/sha256.h"

typedef struct pentry {
  uint8_t key[32];
  uint64_t route;             /* routing hash of the prefix */
  int64_t ntok;               /* prefix length */
  int64_t *ids;               /* [ntok] the prefix, compared on every hit */
  void *state;                /* [state_bytes] state image after the prefix */
  size_t state_bytes;
  float *logits;              /* [vocab] after the prefix's last token */
  size_t bytes;               /* the whole allocation, what the budget counts */
  struct pentry *prev, *next; /* LRU list: head = most recently used */
  struct pentry *hnext;       /* hash chain */
} pentry;

struct mbd_pcache {
  size_t budget;
  size_t vocab;
  char model[64];
  uint8_t ident[32];  /* SHA-256 of route id and weights digest: mixed into every key */
  pentry **buckets;   /* nbuckets chains, a power of two */
  size_t nbuckets;
  pentry *head, *tail;
  mbd_pcache_stats st;
  uint64_t version;
};

#define BUCKETS_MIN 64

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

void mbd_pcache_destroy(mbd_pcache **pc) {
  if (!pc || !*pc) return;
  mbd_pcache *c = *pc;
  for (pentry *e = c->head, *n; e; e = n) {
    n = e->next;
    free(e);
  }
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
  if (e->prev) e->prev->next = e->next;
  else c->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else c->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push(mbd_pcache *c, pentry *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head) c->head->prev = e;
  c->head = e;
  if (!c->tail) c->tail = e;
}

bool mbd_pcache_lookup(mbd_pcache *c, mbd_pcache_plan *p, const int64_t *ids, mbd_pcache_hit *hit) {
  c->st.lookups++;
  c->version++;
  for (size_t i = p->n; i-- > 0;) {
    pentry *e = find(c, p->key[i], p->pos[i], ids);
    if (!e) continue;
    lru_unlink(c, e);
    lru_push(c, e);
    c->st.hits++;
    c->st.hit_tokens += (uint64_t)e->ntok;
    hit->pos = e->ntok;
    hit->state = e->state;
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

/* Doubles the table once entries outnumber buckets (chains stay short). */
static void grow(mbd_pcache *c) {
  if (c->st.entries < c->nbuckets) return;
  size_t nb = c->nbuckets * 2;
  pentry **b = calloc(nb, sizeof *b);
  if (!b) return; /* longer chains, still correct */
  free(c->buckets);
  c->buckets = b;
  c->nbuckets = nb;
  for (pentry *e = c->head; e; e = e->next) {
    size_t k = bucket_of(c, e->key);
    e->hnext = b[k];
    b[k] = e;
  }
}

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

int mbd_pcache_insert(mbd_pcache *c, const mbd_pcache_plan *p, size_t i, const int64_t *ids,
                      size_t state_bytes, mbd_pcache_fill_fn fill, void *ctx, mbd_error *err) {
  int64_t k = p->pos[i];
  if (find(c, p->key[i], k, ids)) return MBD_OK;
  /* One allocation: entry, logits, tokens, state image. */
  size_t o_log = round8(sizeof(pentry)), o_ids = o_log + round8(c->vocab * sizeof(float));
  size_t o_state = o_ids + (size_t)k * sizeof *ids, bytes = o_state + state_bytes;
  if (bytes > c->budget) return MBD_OK;
  uint8_t *mem = malloc(bytes);
  if (!mem) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a prefix cache entry");
  pentry *e = (pentry *)mem;
  memset(e, 0, sizeof *e);
  memcpy(e->key, p->key[i], 32);
  e->route = p->route[i];
  e->ntok = k;
  e->logits = (float *)(mem + o_log);
  e->ids = (int64_t *)(mem + o_ids);
  e->state = mem + o_state;
  e->state_bytes = state_bytes;
  e->bytes = bytes;
  memcpy(e->ids, ids, (size_t)k * sizeof *ids);
  int rc = fill(ctx, e->state, state_bytes, e->logits, err);
  if (rc) {
    free(mem);
    return rc;
  }
  while (c->tail && c->st.bytes + bytes > c->budget) {
    pentry *old = c->tail;
    lru_unlink(c, old);
    unhash(c, old);
    c->st.bytes -= old->bytes;
    c->st.entries--;
    c->st.evictions++;
    free(old);
  }
  lru_push(c, e);
  size_t b = bucket_of(c, e->key);
  e->hnext = c->buckets[b];
  c->buckets[b] = e;
  c->st.bytes += bytes;
  c->st.entries++;
  c->st.inserts++;
  c->version++;
  grow(c);
  return MBD_OK;
}

void mbd_pcache_stats_get(const mbd_pcache *c, mbd_pcache_stats *out) { *out = c->st; }

size_t mbd_pcache_adverts(const mbd_pcache *c, uint64_t *out, size_t cap) {
  size_t n = 0;
  for (const pentry *e = c->head; e && n < cap; e = e->next) out[n++] = e->route;
  return n;
}

uint64_t mbd_pcache_version(const mbd_pcache *c) { return c->version; }
