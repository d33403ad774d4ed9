/* String -> id hash map (open addressing, linear probing, FNV-1a) for the
 * vocabulary and the added tokens; keys are byte strings that may hold NUL. */
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

void tok_strmap_free(tok_strmap *m) {
  free(m->slots);
  free(m->key_off);
  free(m->key_len);
  free(m->val);
  free(m->blob);
  memset(m, 0, sizeof *m);
}

static size_t find_slot(const tok_strmap *m, const char *key, size_t len, bool *found) {
  size_t mask = m->cap - 1;
  size_t i = (size_t)hash_bytes(key, len) & mask;
  for (;;) {
    uint32_t e = m->slots[i];
    if (!e) {
      *found = false;
      return i;
    }
    e--;
    if (m->key_len[e] == len && !memcmp(m->blob + m->key_off[e], key, len)) {
      *found = true;
      return i;
    }
    i = (i + 1) & mask;
  }
}

static int grow_slots(tok_strmap *m) {
  size_t nc = m->cap ? m->cap * 2 : 1024;
  uint32_t *ns = calloc(nc, sizeof *ns);
  if (!ns) return MBD_E_NOMEM;
  free(m->slots);
  m->slots = ns;
  m->cap = nc;
  for (size_t e = 0; e < m->n; e++) {
    bool found;
    size_t i = find_slot(m, m->blob + m->key_off[e], m->key_len[e], &found);
    m->slots[i] = (uint32_t)e + 1;
  }
  return 0;
}

int tok_strmap_put(tok_strmap *m, const char *key, size_t len, int32_t id) {
  if ((m->n + 1) * 2 > m->cap && grow_slots(m)) return MBD_E_NOMEM;
  bool found;
  size_t slot = find_slot(m, key, len, &found);
  if (found) return 1;
  if (m->n == m->n_cap) {
    size_t nc = m->n_cap ? m->n_cap * 2 : 256;
    uint32_t *o = realloc(m->key_off, nc * sizeof *o);
    if (!o) return MBD_E_NOMEM;
    m->key_off = o;
    uint32_t *l = realloc(m->key_len, nc * sizeof *l);
    if (!l) return MBD_E_NOMEM;
    m->key_len = l;
    int32_t *v = realloc(m->val, nc * sizeof *v);
    if (!v) return MBD_E_NOMEM;
    m->val = v;
    m->n_cap = nc;
  }
  if (m->blob_len + len > UINT32_MAX) return MBD_E_NOMEM;
  if (m->blob_len + len + 1 > m->blob_cap) {
    size_t nc = m->blob_cap ? m->blob_cap : 4096;
    while (nc < m->blob_len + len + 1) nc *= 2;
    char *b = realloc(m->blob, nc);
    if (!b) return MBD_E_NOMEM;
    m->blob = b;
    m->blob_cap = nc;
  }
  memcpy(m->blob + m->blob_len, key, len);
  m->key_off[m->n] = (uint32_t)m->blob_len;
  m->key_len[m->n] = (uint32_t)len;
  m->val[m->n] = id;
  m->blob_len += len;
  m->slots[slot] = (uint32_t)++m->n;
  return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *key, size_t len) {
  if (!m->cap) return -1;
  bool found;
  size_t i = find_slot(m, key, len, &found);
  return found ? m->val[m->slots[i] - 1] : -1;
}
