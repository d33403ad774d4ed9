/* The BPE model on one pre-tokenized piece: the piece's characters become
 * symbols, then the pair of lowest merge rank (leftmost among equals) is merged
 * until none is left, with a binary min-heap of candidate pairs as the
 * library's Word::merge_all does (stale heap entries are skipped when popped),
 * so a piece of n symbols costs O(n log n), never a rescan per merge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

static inline size_t merge_hash(uint64_t key, size_t mask) {
  return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

void tok_merges_free(tok_merges *m) {
  free(m->slot);
  memset(m, 0, sizeof *m);
}

static int merges_grow(tok_merges *m) {
  size_t nc = m->cap ? m->cap * 2 : 1024;
  tok_merge_slot *ns = calloc(nc, sizeof *ns);
  if (!ns) return MBD_E_NOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slot[i].key) continue;
    size_t j = merge_hash(m->slot[i].key, nc - 1);
    while (ns[j].key) j = (j + 1) & (nc - 1);
    ns[j] = m->slot[i];
  }
  free(m->slot);
  m->slot = ns;
  m->cap = nc;
  return 0;
}

int tok_merges_put(tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((m->n + 1) * 2 > m->cap && merges_grow(m)) return MBD_E_NOMEM;
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  size_t j = merge_hash(key, m->cap - 1);
  while (m->slot[j].key && m->slot[j].key != key) j = (j + 1) & (m->cap - 1);
  if (!m->slot[j].key) m->n++;
  m->slot[j] = (tok_merge_slot){key, rank, merged};
  return 0;
}

static inline bool merges_get(const tok_merges *m, int32_t a, int32_t b, int32_t *rank,
                              int32_t *merged) {
  if (!m->cap) return false;
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  size_t j = merge_hash(key, m->cap - 1);
  for (;;) {
    const tok_merge_slot *e = &m->slot[j];
    if (!e->key) return false;
    if (e->key == key) {
      *rank = e->rank;
      *merged = e->merged;
      return true;
    }
    j = (j + 1) & (m->cap - 1);
  }
}

/* ---- per-call scratch -------------------------------------------------- */

typedef struct symbol {
  int32_t id;
  int32_t prev, next; /* neighbours, -1 at the ends */
  int32_t len;        /* bytes covered; 0 once merged into its left neighbour */
} symbol;

typedef struct cand {
  int32_t rank, pos, merged;
} cand;

/* Words already merged in this call: text repeats its words, and a piece's
 * ids depend on its bytes alone. */
#define CACHE_WORD_MAX 64     /* longer pieces are not cached */
#define CACHE_ENTRIES (1 << 15)
#define CACHE_SLOTS (1 << 16) /* power of two, twice the entries */
#define CACHE_AFTER 256       /* short texts do not pay for the cache's allocation */

typedef struct cache_entry {
  uint32_t key_off, ids_off; /* into key_blob / id_pool */
  uint16_t key_len, n_ids;
} cache_entry;

struct tok_bpe_scratch {
  symbol *sym;
  size_t sym_cap;
  cand *heap;
  size_t heap_cap;
  uint32_t *slot;          /* [CACHE_SLOTS] entry + 1, 0 = empty; NULL until first use */
  cache_entry *entry;      /* [CACHE_ENTRIES] */
  size_t n_entries;
  char *key_blob;          /* [CACHE_ENTRIES * CACHE_WORD_MAX] */
  int32_t *id_pool;        /* [CACHE_ENTRIES * CACHE_WORD_MAX] (a piece has at most n ids) */
  size_t key_used, ids_used;
  size_t words;            /* pieces seen; the cache starts after CACHE_AFTER */
};

tok_bpe_scratch *tok_bpe_scratch_new(void) { return calloc(1, sizeof(tok_bpe_scratch)); }

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
  if (!s) return;
  free(s->sym);
  free(s->heap);
  free(s->slot);
  free(s->entry);
  free(s->key_blob);
  free(s->id_pool);
  free(s);
}

static uint32_t word_hash(const char *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
  return h ^ (h >> 15);
}

/* The slot for word p[0..n): holding its entry, or empty. */
static uint32_t *cache_slot(tok_bpe_scratch *s, const char *p, size_t n) {
  size_t j = word_hash(p, n) & (CACHE_SLOTS - 1);
  for (;;) {
    uint32_t e = s->slot[j];
    if (!e) return &s->slot[j];
    const cache_entry *c = &s->entry[e - 1];
    if (c->key_len == n && !memcmp(s->key_blob + c->key_off, p, n)) return &s->slot[j];
    j = (j + 1) & (CACHE_SLOTS - 1);
  }
}

static bool cache_ready(tok_bpe_scratch *s) {
  if (s->slot) return true;
  s->slot = calloc(CACHE_SLOTS, sizeof *s->slot);
  s->entry = malloc(CACHE_ENTRIES * sizeof *s->entry);
  s->key_blob = malloc((size_t)CACHE_ENTRIES * CACHE_WORD_MAX);
  s->id_pool = malloc((size_t)CACHE_ENTRIES * CACHE_WORD_MAX * sizeof *s->id_pool);
  if (s->slot && s->entry && s->key_blob && s->id_pool) return true;
  free(s->slot);
  free(s->entry);
  free(s->key_blob);
  free(s->id_pool);
  s->slot = NULL;
  return false; /* no cache: merge every piece */
}

static inline bool cand_less(const cand *a, const cand *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(cand *h, size_t *n, cand c) {
  size_t i = (*n)++;
  while (i) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
  cand top = h[0];
  cand last = h[--*n];
  size_t i = 0, m = *n;
  for (;;) {
    size_t l = 2 * i + 1;
    if (l >= m) break;
    size_t c = l + 1 < m && cand_less(&h[l + 1], &h[l]) ? l + 1 : l;
    if (!cand_less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (m) h[i] = last;
  return top;
}

static int reserve(tok_bpe_scratch *s, size_t n) {
  if (n > s->sym_cap) {
    size_t nc = s->sym_cap ? s->sym_cap : 64;
    while (nc < n) nc *= 2;
    symbol *p = realloc(s->sym, nc * sizeof *p);
    if (!p) return MBD_E_NOMEM;
    s->sym = p;
    s->sym_cap = nc;
  }
  /* each merge pushes at most two candidates; the initial pairs n - 1 */
  if (3 * n + 4 > s->heap_cap) {
    size_t nc = s->heap_cap ? s->heap_cap : 256;
    while (nc < 3 * n + 4) nc *= 2;
    cand *p = realloc(s->heap, nc * sizeof *p);
    if (!p) return MBD_E_NOMEM;
    s->heap = p;
    s->heap_cap = nc;
  }
  return 0;
}

/* ---- word construction ------------------------------------------------- */

typedef struct word {
  symbol *sym;
  size_t n;
  int32_t unk_id, unk_len; /* pending unknown run, unk_id -1 when none */
} word;

static void word_add(word *w, int32_t id, int32_t len) {
  symbol *s = &w->sym[w->n];
  s->id = id;
  s->len = len;
  s->prev = (int32_t)w->n - 1;
  s->next = -1;
  if (w->n) w->sym[w->n - 1].next = (int32_t)w->n;
  w->n++;
}

/* One character of the piece, in model space (`c`, its UTF-8) covering
 * `byte_len` input bytes; id its vocabulary id or -1. */
static void word_char(const mbd_tokenizer *t, word *w, const char *c, size_t clen, int32_t id,
                      int32_t byte_len) {
  if (id >= 0) {
    if (w->unk_id >= 0) {
      word_add(w, w->unk_id, w->unk_len);
      w->unk_id = -1;
    }
    word_add(w, id, byte_len);
    return;
  }
  if (t->byte_fallback) {
    int32_t ids[4];
    size_t k = 0;
    for (; k < clen; k++) {
      char name[8];
      snprintf(name, sizeof name, "<0x%02X>", (unsigned)(uint8_t)c[k]);
      if ((ids[k] = tok_strmap_get(&t->vocab, name, 6)) < 0) break;
    }
    if (k == clen) {
      for (size_t j = 0; j < clen; j++) word_add(w, ids[j], 1);
      return;
    }
  }
  if (t->unk_id < 0) return; /* no unk token: the character is dropped, as in the library */
  if (w->unk_id >= 0 && t->fuse_unk) {
    w->unk_len += byte_len;
    return;
  }
  if (w->unk_id >= 0) word_add(w, w->unk_id, w->unk_len);
  w->unk_id = t->unk_id;
  w->unk_len = byte_len;
}

int tok_bpe_word(const mbd_tokenizer *t, tok_bpe_scratch *s, const char *p, size_t n, tok_ids *out) {
  if (!n) return 0;
  if (t->ignore_merges) {
    int32_t id = t->byte_level ? tok_strmap_get(&t->vocab_bytes, p, n) : tok_strmap_get(&t->vocab, p, n);
    if (id >= 0) return tok_ids_push(out, id);
  }
  uint32_t *slot = NULL;
  size_t first_out = out->n;
  if (n <= CACHE_WORD_MAX && ++s->words > CACHE_AFTER && cache_ready(s)) {
    slot = cache_slot(s, p, n);
    if (*slot) {
      const cache_entry *c = &s->entry[*slot - 1];
      for (size_t i = 0; i < c->n_ids; i++)
        if (tok_ids_push(out, s->id_pool[c->ids_off + i])) return MBD_E_NOMEM;
      return 0;
    }
    if (s->n_entries == CACHE_ENTRIES) slot = NULL; /* full: stop caching */
  }
  /* byte_fallback may turn one character into 4 symbols */
  if (reserve(s, 4 * n + 1)) return MBD_E_NOMEM;
  word w = {.sym = s->sym, .n = 0, .unk_id = -1};
  if (t->byte_level) {
    for (size_t i = 0; i < n; i++) {
      uint8_t b = (uint8_t)p[i];
      int32_t id = t->byte_id[b];
      if (id >= 0) {
        word_char(t, &w, NULL, 0, id, 1);
      } else {
        int32_t cps[256];
        tok_byte_chars(cps);
        char c[4];
        size_t cl = tok_utf8_put(cps[b], c);
        word_char(t, &w, c, cl, -1, 1);
      }
    }
  } else {
    for (size_t i = 0; i < n;) {
      size_t adv;
      tok_utf8_cp(p + i, n - i, &adv);
      word_char(t, &w, p + i, adv, tok_strmap_get(&t->vocab, p + i, adv), (int32_t)adv);
      i += adv;
    }
  }
  if (w.unk_id >= 0) word_add(&w, w.unk_id, w.unk_len);

  symbol *sym = w.sym;
  cand *heap = s->heap;
  size_t nh = 0;
  for (size_t i = 0; i + 1 < w.n; i++) {
    int32_t rank, merged;
    if (merges_get(&t->merges, sym[i].id, sym[i + 1].id, &rank, &merged))
      heap_push(heap, &nh, (cand){rank, (int32_t)i, merged});
  }
  while (nh) {
    cand top = heap_pop(heap, &nh);
    symbol *cur = &sym[top.pos];
    if (cur->len == 0 || cur->next < 0) continue;
    symbol right = sym[cur->next];
    int32_t rank, merged;
    if (!merges_get(&t->merges, cur->id, right.id, &rank, &merged) || merged != top.merged) continue;
    int32_t right_pos = cur->next;
    cur->id = top.merged;
    cur->len += right.len;
    cur->next = right.next;
    sym[right_pos].len = 0;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (nh + 2 > s->heap_cap) continue; /* cannot happen: see reserve() */
    if (cur->prev >= 0 && merges_get(&t->merges, sym[cur->prev].id, cur->id, &rank, &merged))
      heap_push(heap, &nh, (cand){rank, cur->prev, merged});
    if (cur->next >= 0 && merges_get(&t->merges, cur->id, sym[cur->next].id, &rank, &merged))
      heap_push(heap, &nh, (cand){rank, top.pos, merged});
  }
  for (size_t i = 0; i < w.n; i++)
    if (sym[i].len && tok_ids_push(out, sym[i].id)) return MBD_E_NOMEM;
  size_t k = out->n - first_out;
  if (slot && k <= CACHE_WORD_MAX) { /* k <= n without byte_fallback */
    cache_entry *c = &s->entry[s->n_entries];
    *c = (cache_entry){(uint32_t)s->key_used, (uint32_t)s->ids_used, (uint16_t)n, (uint16_t)k};
    memcpy(s->key_blob + s->key_used, p, n);
    memcpy(s->id_pool + s->ids_used, out->p + first_out, k * sizeof *out->p);
    s->key_used += n;
    s->ids_used += k;
    *slot = (uint32_t)++s->n_entries;
  }
  return 0;
}

int tok_ids_push(tok_ids *v, int32_t id) {
  if (v->n == v->cap) {
    size_t nc = v->cap ? v->cap * 2 : 256;
    int32_t *p = realloc(v->p, nc * sizeof *p);
    if (!p) return MBD_E_NOMEM;
    v->p = p;
    v->cap = nc;
  }
  v->p[v->n++] = id;
  return 0;
}
