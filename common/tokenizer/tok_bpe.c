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
  free(m->keys);
  free(m->rank);
  free(m->merged);
  memset(m, 0, sizeof *m);
}

static int merges_grow(tok_merges *m) {
  size_t nc = m->cap ? m->cap * 2 : 1024;
  uint64_t *k = calloc(nc, sizeof *k);
  int32_t *r = malloc(nc * sizeof *r);
  int32_t *g = malloc(nc * sizeof *g);
  if (!k || !r || !g) {
    free(k);
    free(r);
    free(g);
    return MBD_E_NOMEM;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = merge_hash(m->keys[i], nc - 1);
    while (k[j]) j = (j + 1) & (nc - 1);
    k[j] = m->keys[i];
    r[j] = m->rank[i];
    g[j] = m->merged[i];
  }
  free(m->keys);
  free(m->rank);
  free(m->merged);
  m->keys = k;
  m->rank = r;
  m->merged = g;
  m->cap = nc;
  return 0;
}

int tok_merges_put(tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if ((m->n + 1) * 2 > m->cap && merges_grow(m)) return MBD_E_NOMEM;
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  size_t j = merge_hash(key, m->cap - 1);
  while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) m->n++;
  m->keys[j] = key;
  m->rank[j] = rank;
  m->merged[j] = merged;
  return 0;
}

static inline bool merges_get(const tok_merges *m, int32_t a, int32_t b, int32_t *rank,
                              int32_t *merged) {
  if (!m->cap) return false;
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  size_t j = merge_hash(key, m->cap - 1);
  for (;;) {
    uint64_t k = m->keys[j];
    if (!k) return false;
    if (k == key) {
      *rank = m->rank[j];
      *merged = m->merged[j];
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

struct tok_bpe_scratch {
  symbol *sym;
  size_t sym_cap;
  cand *heap;
  size_t heap_cap;
};

tok_bpe_scratch *tok_bpe_scratch_new(void) { return calloc(1, sizeof(tok_bpe_scratch)); }

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
  if (!s) return;
  free(s->sym);
  free(s->heap);
  free(s);
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
