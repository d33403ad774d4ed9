/* Loading tokenizer.json (jansson) into the immutable mbd_tokenizer: the BPE
 * model (vocab, merges as "a b" strings or [a, b] pairs), added tokens, and
 * the normalizer, pre-tokenizer and decoder steps (the post-processor is read
 * by tok_post.c). Every malformed or unsupported field is an MBD_E_FORMAT
 * naming it; nothing the file says can make the loader crash or allocate more
 * than its size suggests (ids are capped at TOK_MAX_IDS). */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/sha256.h"
#include "common/tokenizer/tok_internal.h"

typedef struct loader {
  mbd_tokenizer *t;
  const char *what; /* source name for messages */
  mbd_error *err;
  tok_added *added; /* [n_added] as read, before they are split in two sets */
  size_t n_added;
} loader;

__attribute__((format(printf, 3, 4))) static int ferr(loader *L, const char *field, const char *fmt, ...) {
  char msg[MBD_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mbd_error_set(L->err, MBD_E_FORMAT, "%s: %s: %s", L->what, field, msg);
}

static int nomem(loader *L) { return mbd_error_set(L->err, MBD_E_NOMEM, "%s: out of memory", L->what); }

/* Optional boolean field: absent or null gives def. */
static int get_bool(loader *L, const json_t *o, const char *key, const char *field, bool def, bool *out) {
  const json_t *v = json_object_get(o, key);
  *out = def;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return ferr(L, field, "\"%s\" is not a boolean", key);
  *out = json_is_true(v);
  return 0;
}

static const char *get_type(loader *L, const json_t *o, const char *field, int *rc) {
  char f[256];
  snprintf(f, sizeof f, "%s.type", field);
  *rc = 0;
  if (!json_is_object(o)) {
    *rc = ferr(L, field, "not an object or null");
    return NULL;
  }
  const char *type = json_string_value(json_object_get(o, "type"));
  if (!type) *rc = ferr(L, f, "missing or not a string");
  return type;
}

/* Loads one step (normalizer, pre-tokenizer, decoder) at nesting depth. */
typedef int (*step_loader)(loader *L, const json_t *o, const char *field, int depth);

/* The "type" of step o at nesting depth, or NULL with *rc = 0 when o is absent
 * or null (nothing to load), else NULL with *rc the error. */
static const char *step_type(loader *L, const json_t *o, const char *field, int depth, int *rc) {
  *rc = 0;
  if (!o || json_is_null(o)) return NULL;
  if (depth > TOK_MAX_DEPTH) {
    *rc = ferr(L, field, "Sequence nested too deeply");
    return NULL;
  }
  return get_type(L, o, field, rc);
}

/* A "Sequence" step: every entry of the array o[key], loaded one level deeper. */
static int load_sequence(loader *L, const json_t *o, const char *field, const char *key, int depth,
                         step_loader load) {
  char f[256];
  const json_t *list = json_object_get(o, key);
  snprintf(f, sizeof f, "%s.%s", field, key);
  if (!json_is_array(list)) return ferr(L, f, "missing or not an array");
  for (size_t i = 0; i < json_array_size(list); i++) {
    snprintf(f, sizeof f, "%s.%s[%zu]", field, key, i);
    int rc = load(L, json_array_get(list, i), f, depth + 1);
    if (rc) return rc;
  }
  return 0;
}

/* ---- model ------------------------------------------------------------- */

static int load_vocab(loader *L, const json_t *vocab) {
  mbd_tokenizer *t = L->t;
  if (!json_is_object(vocab)) return ferr(L, "model.vocab", "missing or not an object");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)vocab, key, v) {
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    if (!json_is_integer(v) || id < 0 || id >= TOK_MAX_IDS) {
      char f[128];
      snprintf(f, sizeof f, "model.vocab[\"%.40s\"]", key);
      if (!json_is_integer(v)) return ferr(L, f, "the id is not an integer");
      return ferr(L, f, "id %lld is %s", (long long)id, id < 0 ? "negative" : "too large");
    }
    if (tok_strmap_put(&t->vocab, key, strlen(key), (int32_t)id) < 0) return nomem(L);
  }
  return 0;
}

static int merge_lookup(loader *L, size_t i, const char *s, size_t n, int32_t *id) {
  *id = tok_strmap_get(&L->t->vocab, s, n);
  if (*id >= 0) return 0;
  char f[64];
  snprintf(f, sizeof f, "model.merges[%zu]", i);
  return ferr(L, f, "token \"%.*s\" is not in model.vocab", (int)(n > 60 ? 60 : n), s);
}

static int load_merges(loader *L, const json_t *merges) {
  if (!json_is_array(merges)) return ferr(L, "model.merges", "missing or not an array");
  size_t n = json_array_size(merges);
  if (n >= TOK_MAX_IDS) return ferr(L, "model.merges", "%zu merges is too many", n);
  char *cat = NULL;
  size_t cat_cap = 0;
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    const json_t *m = json_array_get(merges, i);
    const char *a, *b;
    size_t na, nb;
    char f[64];
    snprintf(f, sizeof f, "model.merges[%zu]", i);
    if (json_is_string(m)) {
      a = json_string_value(m);
      size_t len = json_string_length(m);
      const char *sp = memchr(a, ' ', len);
      if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - a))) {
        rc = ferr(L, f, "a merge string must be two tokens separated by one space");
        break;
      }
      na = (size_t)(sp - a);
      b = sp + 1;
      nb = len - na - 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0));
      na = json_string_length(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1));
      nb = json_string_length(json_array_get(m, 1));
    } else {
      rc = ferr(L, f, "neither \"a b\" nor [\"a\", \"b\"]");
      break;
    }
    int32_t ia, ib, im;
    if ((rc = merge_lookup(L, i, a, na, &ia)) || (rc = merge_lookup(L, i, b, nb, &ib))) break;
    if (na + nb > cat_cap || !cat) {
      cat_cap = (na + nb) * 2 + 16;
      char *p = realloc(cat, cat_cap);
      if (!p) {
        rc = nomem(L);
        break;
      }
      cat = p;
    }
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    if ((rc = merge_lookup(L, i, cat, na + nb, &im))) break;
    if (tok_merges_put(&L->t->merges, ia, ib, (int32_t)i, im)) rc = nomem(L);
  }
  free(cat);
  return rc;
}

static int load_model(loader *L, const json_t *model) {
  mbd_tokenizer *t = L->t;
  if (!json_is_object(model)) return ferr(L, "model", "missing or not an object");
  const json_t *type = json_object_get(model, "type");
  if (type && !json_is_null(type)) {
    if (!json_is_string(type)) return ferr(L, "model.type", "not a string");
    if (strcmp(json_string_value(type), "BPE"))
      return ferr(L, "model.type", "\"%.64s\" is not supported (BPE only)", json_string_value(type));
  }
  const json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout) && (!json_is_number(dropout) || json_number_value(dropout) != 0))
    return ferr(L, "model.dropout", "BPE dropout is not supported (it makes encoding random)");
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (size_t i = 0; i < 2; i++) {
    const json_t *v = json_object_get(model, affixes[i]);
    if (v && !json_is_null(v) && (!json_is_string(v) || json_string_length(v)))
      return ferr(L, affixes[i], "only null or \"\" is supported");
  }
  int rc;
  if ((rc = get_bool(L, model, "fuse_unk", "model.fuse_unk", false, &t->fuse_unk)) ||
      (rc = get_bool(L, model, "byte_fallback", "model.byte_fallback", false, &t->byte_fallback)) ||
      (rc = get_bool(L, model, "ignore_merges", "model.ignore_merges", false, &t->ignore_merges)))
    return rc;
  if ((rc = load_vocab(L, json_object_get(model, "vocab")))) return rc;
  if ((rc = load_merges(L, json_object_get(model, "merges")))) return rc;
  const json_t *unk = json_object_get(model, "unk_token");
  if (unk && !json_is_null(unk)) {
    if (!json_is_string(unk)) return ferr(L, "model.unk_token", "not a string or null");
    t->unk_id = tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
    if (t->unk_id < 0) return ferr(L, "model.unk_token", "\"%.64s\" is not in model.vocab", json_string_value(unk));
  }
  return 0;
}

/* ---- added tokens ------------------------------------------------------ */

static int load_added(loader *L, const json_t *list) {
  if (!list || json_is_null(list)) return 0;
  if (!json_is_array(list)) return ferr(L, "added_tokens", "not an array");
  size_t n = json_array_size(list);
  if (!(L->added = calloc(n ? n : 1, sizeof *L->added))) return nomem(L);
  for (size_t i = 0; i < n; i++) {
    const json_t *o = json_array_get(list, i);
    char f[64];
    snprintf(f, sizeof f, "added_tokens[%zu]", i);
    if (!json_is_object(o)) return ferr(L, f, "not an object");
    const json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
    json_int_t v = json_is_integer(id) ? json_integer_value(id) : -1;
    if (!json_is_integer(id)) return ferr(L, f, "\"id\" is missing or not an integer");
    if (v < 0 || v >= TOK_MAX_IDS) return ferr(L, f, "id %lld is %s", (long long)v, v < 0 ? "negative" : "too large");
    if (!json_is_string(content) || !json_string_length(content))
      return ferr(L, f, "\"content\" is missing, empty or not a string");
    tok_added *a = &L->added[L->n_added++];
    a->id = (int32_t)v;
    a->len = json_string_length(content);
    if (!(a->pattern = malloc(a->len + 1))) return nomem(L);
    memcpy(a->pattern, json_string_value(content), a->len + 1);
    int rc;
    if ((rc = get_bool(L, o, "special", f, false, &a->special)) ||
        (rc = get_bool(L, o, "single_word", f, false, &a->single_word)) ||
        (rc = get_bool(L, o, "lstrip", f, false, &a->lstrip)) ||
        (rc = get_bool(L, o, "rstrip", f, false, &a->rstrip)) ||
        (rc = get_bool(L, o, "normalized", f, !a->special, &a->normalized)))
      return rc;
  }
  return 0;
}

/* ---- id tables --------------------------------------------------------- */

static int build_id_tables(loader *L) {
  mbd_tokenizer *t = L->t;
  const tok_strmap *v = &t->vocab;
  int64_t max_id = -1;
  for (size_t e = 0; e < v->n; e++)
    if (v->val[e] > max_id) max_id = v->val[e];
  for (size_t i = 0; i < L->n_added; i++)
    if (L->added[i].id > max_id) max_id = L->added[i].id;
  if (max_id < 0) return ferr(L, "model.vocab", "no tokens at all");
  /* ids may leave holes (o200k has some), but not so many that a short file
   * makes the per-id tables huge */
  size_t given = v->n + L->n_added;
  if ((uint64_t)max_id >= 2 * (uint64_t)given + 1024)
    return ferr(L, "model.vocab / added_tokens", "largest id %lld is far beyond the %zu tokens given",
                (long long)max_id, given);
  t->n_ids = max_id + 1;
  size_t n = (size_t)t->n_ids;
  int64_t *src = malloc(n * sizeof *src); /* >= 0: vocab entry, < 0: -(added index) - 1 */
  t->kind = calloc(n, 1);
  t->str_off = calloc(n + 1, sizeof *t->str_off);
  if (!src || !t->kind || !t->str_off) {
    free(src);
    return nomem(L);
  }
  int rc = 0;
  for (size_t e = 0; e < v->n; e++) {
    int32_t id = v->val[e];
    if (t->kind[id]) {
      rc = ferr(L, "model.vocab", "id %d is given to two tokens", (int)id);
      goto done;
    }
    t->kind[id] = TOK_ID_MODEL;
    src[id] = (int64_t)e;
  }
  for (size_t i = 0; i < L->n_added; i++) {
    const tok_added *a = &L->added[i];
    if (t->kind[a->id] >= TOK_ID_ADDED) {
      const tok_added *b = &L->added[-src[a->id] - 1];
      if (b->len != a->len || memcmp(b->pattern, a->pattern, a->len)) {
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        rc = ferr(L, f, "id %d is given to two added tokens", (int)a->id);
        goto done;
      }
    }
    t->kind[a->id] = a->special ? TOK_ID_SPECIAL : TOK_ID_ADDED;
    src[a->id] = -(int64_t)i - 1;
    if (tok_strmap_put(&t->added_by_content, a->pattern, a->len, a->id) < 0) {
      rc = nomem(L);
      goto done;
    }
  }
  /* the library skips a token by its string: a vocabulary entry equal to a
   * special token's content is special too */
  for (size_t i = 0; i < L->n_added; i++) {
    if (!L->added[i].special) continue;
    int32_t id = tok_strmap_get(v, L->added[i].pattern, L->added[i].len);
    if (id >= 0 && t->kind[id] == TOK_ID_MODEL) t->kind[id] = TOK_ID_SPECIAL;
  }
  size_t total = 0;
  for (size_t id = 0; id < n; id++) {
    t->str_off[id] = (uint32_t)total;
    if (!t->kind[id]) continue;
    total += src[id] >= 0 ? v->key_len[src[id]] : L->added[-src[id] - 1].len;
    if (total > UINT32_MAX) {
      rc = ferr(L, "model.vocab", "tokens too long in total");
      goto done;
    }
  }
  t->str_off[n] = (uint32_t)total;
  if (!(t->str_blob = malloc(total + 1))) {
    rc = nomem(L);
    goto done;
  }
  for (size_t id = 0; id < n; id++) {
    if (!t->kind[id]) continue;
    const char *s = src[id] >= 0 ? v->blob + v->key_off[src[id]] : L->added[-src[id] - 1].pattern;
    memcpy(t->str_blob + t->str_off[id], s, t->str_off[id + 1] - t->str_off[id]);
  }
done:
  free(src);
  return rc;
}

/* Bytes of s under the GPT-2 table; false when a character is outside it. */
static bool to_bytes(const char *s, size_t n, char *out, size_t *out_n) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    size_t adv;
    int b = tok_char_byte(tok_utf8_cp(s + i, n - i, &adv));
    if (b < 0) return false;
    out[k++] = (char)b;
    i += adv;
  }
  *out_n = k;
  return true;
}

static int build_byte_tables(loader *L) {
  mbd_tokenizer *t = L->t;
  size_t n = (size_t)t->n_ids;
  if (t->byte_level) {
    int32_t cps[256];
    tok_byte_chars(cps);
    for (int b = 0; b < 256; b++) {
      char c[4];
      size_t cl = tok_utf8_put(cps[b], c);
      t->byte_id[b] = tok_strmap_get(&t->vocab, c, cl);
    }
  }
  bool want_vocab_bytes = t->byte_level && t->ignore_merges;
  bool want_blob = t->has_decoder && t->n_dec_byte_level;
  if (!want_vocab_bytes && !want_blob) return 0;
  size_t total = t->str_off[n];
  char *tmp = malloc(total + 1);
  if (want_blob) {
    t->byte_blob = malloc(total + 1);
    t->byte_off = calloc(n + 1, sizeof *t->byte_off);
  }
  if (!tmp || (want_blob && (!t->byte_blob || !t->byte_off))) {
    free(tmp);
    return nomem(L);
  }
  size_t at = 0;
  for (size_t id = 0; id < n; id++) {
    const char *s = t->str_blob + t->str_off[id];
    size_t len = t->str_off[id + 1] - t->str_off[id], bn = 0;
    bool mapped = to_bytes(s, len, tmp, &bn);
    if (want_vocab_bytes && mapped && t->kind[id] != TOK_ID_HOLE &&
        tok_strmap_get(&t->vocab, s, len) == (int32_t)id &&
        tok_strmap_put(&t->vocab_bytes, tmp, bn, (int32_t)id) < 0) {
      free(tmp);
      return nomem(L);
    }
    if (want_blob) {
      t->byte_off[id] = (uint32_t)at;
      memcpy(t->byte_blob + at, mapped ? tmp : s, mapped ? bn : len);
      at += mapped ? bn : len;
    }
  }
  if (want_blob) t->byte_off[n] = (uint32_t)at;
  free(tmp);
  return 0;
}

static int cmp_added_len(const void *a, const void *b) {
  size_t la = ((const tok_added *)a)->len, lb = ((const tok_added *)b)->len;
  return la < lb ? 1 : la > lb ? -1 : 0;
}

static int build_added_sets(loader *L) {
  mbd_tokenizer *t = L->t;
  tok_added_set *sets[2] = {&t->added_raw, &t->added_norm};
  for (int s = 0; s < 2; s++)
    if (!(sets[s]->tok = calloc(L->n_added ? L->n_added : 1, sizeof(tok_added)))) return nomem(L);
  for (size_t i = 0; i < L->n_added; i++) {
    tok_added a = L->added[i];
    tok_added_set *set = a.normalized ? &t->added_norm : &t->added_raw;
    char *norm = NULL;
    size_t nlen = 0;
    bool owned = false;
    if (a.normalized) {
      if (tok_normalize(t, a.pattern, a.len, &norm, &nlen, &owned, L->err)) return L->err ? L->err->code : MBD_E_NOMEM;
      if (!nlen) {
        if (owned) free(norm);
        continue; /* normalizes to nothing: can never match */
      }
    }
    char *copy = malloc((a.normalized ? nlen : a.len) + 1);
    if (!copy) {
      if (owned) free(norm);
      return nomem(L);
    }
    if (a.normalized) {
      memcpy(copy, norm, nlen);
      a.len = nlen;
      if (owned) free(norm);
    } else {
      memcpy(copy, a.pattern, a.len);
    }
    copy[a.len] = '\0';
    a.pattern = copy;
    set->tok[set->n++] = a;
    set->first[(uint8_t)copy[0]] = 1;
  }
  for (int s = 0; s < 2; s++) qsort(sets[s]->tok, sets[s]->n, sizeof(tok_added), cmp_added_len);
  return 0;
}

/* ---- normalizer, pre-tokenizer, decoder -------------------------------- */

static int load_normalizer(loader *L, const json_t *o, const char *field, int depth) {
  mbd_tokenizer *t = L->t;
  int rc;
  const char *type = step_type(L, o, field, depth, &rc);
  if (!type) return rc;
  static const struct { const char *name; tok_norm_kind kind; } k[] = {
      {"NFC", TOK_NORM_NFC}, {"NFKC", TOK_NORM_NFKC}, {"NFD", TOK_NORM_NFD}, {"NFKD", TOK_NORM_NFKD}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    if (strcmp(type, k[i].name)) continue;
    if (t->n_norm == TOK_MAX_STEPS) return ferr(L, field, "more than %d normalizers", TOK_MAX_STEPS);
    t->norm[t->n_norm++] = k[i].kind;
    return 0;
  }
  char f[256];
  if (!strcmp(type, "Sequence")) return load_sequence(L, o, field, "normalizers", depth, load_normalizer);
  snprintf(f, sizeof f, "%s.type", field);
  return ferr(L, f, "\"%.64s\" is not supported (NFC, NFKC, NFD, NFKD, Sequence)", type);
}

static int load_split(loader *L, const json_t *o, const char *field, tok_pre *p) {
  char f[256];
  const json_t *pat = json_object_get(o, "pattern");
  const json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
  snprintf(f, sizeof f, "%s.pattern", field);
  if (!json_is_object(pat) || (!json_is_string(s) && !json_is_string(r)))
    return ferr(L, f, "wants {\"String\": ...} or {\"Regex\": ...}");
  const json_t *src = json_is_string(r) ? r : s;
  char why[256];
  p->kind = TOK_PRE_SPLIT;
  p->re = tok_regex_compile(json_string_value(src), json_string_length(src), src == s, why, sizeof why);
  if (!p->re) return ferr(L, f, "bad regex: %s", why);
  static const struct { const char *name; tok_split_behavior b; } k[] = {
      {"Removed", TOK_SPLIT_REMOVED},
      {"Isolated", TOK_SPLIT_ISOLATED},
      {"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
      {"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
      {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
  const char *b = json_string_value(json_object_get(o, "behavior"));
  snprintf(f, sizeof f, "%s.behavior", field);
  if (!b) return ferr(L, f, "missing or not a string");
  size_t i = 0;
  while (i < sizeof k / sizeof k[0] && strcmp(b, k[i].name)) i++;
  if (i == sizeof k / sizeof k[0]) return ferr(L, f, "\"%.64s\" is not a split behavior", b);
  p->behavior = k[i].b;
  return get_bool(L, o, "invert", field, false, &p->invert);
}

static int load_pre(loader *L, const json_t *o, const char *field, int depth) {
  mbd_tokenizer *t = L->t;
  int rc;
  const char *type = step_type(L, o, field, depth, &rc);
  if (!type) return rc;
  char f[256];
  if (!strcmp(type, "Sequence")) return load_sequence(L, o, field, "pretokenizers", depth, load_pre);
  bool is_bl = !strcmp(type, "ByteLevel"), is_split = !strcmp(type, "Split");
  snprintf(f, sizeof f, "%s.type", field);
  if (!is_bl && !is_split) return ferr(L, f, "\"%.64s\" is not supported (ByteLevel, Split, Sequence)", type);
  if (t->byte_level) return ferr(L, field, "nothing may follow the ByteLevel pre-tokenizer");
  if (t->n_pre == TOK_MAX_STEPS) return ferr(L, field, "more than %d pre-tokenizers", TOK_MAX_STEPS);
  tok_pre *p = &t->pre[t->n_pre++];
  memset(p, 0, sizeof *p);
  if (is_split) return load_split(L, o, field, p);
  bool use_regex;
  p->kind = TOK_PRE_BYTE_LEVEL;
  p->behavior = TOK_SPLIT_ISOLATED;
  if ((rc = get_bool(L, o, "add_prefix_space", field, true, &p->add_prefix_space)) ||
      (rc = get_bool(L, o, "use_regex", field, true, &use_regex)))
    return rc;
  if (use_regex) {
    char why[256];
    if (!(p->re = tok_regex_compile(NULL, 0, false, why, sizeof why)))
      return mbd_error_set(L->err, MBD_E_INTERNAL, "%s: the GPT-2 regex does not compile: %s", L->what, why);
  }
  t->byte_level = true;
  return 0;
}

static int load_decoder(loader *L, const json_t *o, const char *field, int depth) {
  mbd_tokenizer *t = L->t;
  int rc;
  const char *type = step_type(L, o, field, depth, &rc);
  if (!type) return rc;
  t->has_decoder = true;
  char f[256];
  if (!strcmp(type, "ByteLevel")) {
    t->n_dec_byte_level++;
    return 0;
  }
  if (!strcmp(type, "Sequence")) return load_sequence(L, o, field, "decoders", depth, load_decoder);
  snprintf(f, sizeof f, "%s.type", field);
  return ferr(L, f, "\"%.64s\" is not supported (ByteLevel, Sequence)", type);
}

/* ---- entry points ------------------------------------------------------ */

int mbd_tokenizer_load_bytes(const char *json, size_t len, const char *what, mbd_tokenizer **out,
                             mbd_error *err) {
  *out = NULL;
  if (!what) what = "tokenizer.json";
  mbd_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory", what);
  t->unk_id = -1;
  loader L = {.t = t, .what = what, .err = err};
  uint8_t d[32];
  mbd_sha256(json, len, d);
  mbd_sha256_hex(d, t->digest);
  int rc = 0;
  json_error_t je;
  json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  if (!root) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: bad JSON at line %d column %d: %s", what, je.line,
                       je.column, je.text);
    goto fail;
  }
  if (!json_is_object(root)) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "%s: the top level is not an object", what);
    goto fail;
  }
  if ((rc = load_model(&L, json_object_get(root, "model"))) ||
      (rc = load_added(&L, json_object_get(root, "added_tokens"))) || (rc = build_id_tables(&L)) ||
      (rc = load_normalizer(&L, json_object_get(root, "normalizer"), "normalizer", 0)) ||
      (rc = load_pre(&L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", 0)) ||
      (rc = load_decoder(&L, json_object_get(root, "decoder"), "decoder", 0)) ||
      (rc = tok_post_load(t, json_object_get(root, "post_processor"), "post_processor", 0, what, err)) ||
      (rc = build_byte_tables(&L)) || (rc = build_added_sets(&L)))
    goto fail;
  json_decref(root);
  for (size_t i = 0; i < L.n_added; i++) free(L.added[i].pattern);
  free(L.added);
  *out = t;
  return 0;
fail:
  json_decref(root);
  for (size_t i = 0; i < L.n_added; i++) free(L.added[i].pattern);
  free(L.added);
  mbd_tokenizer_destroy(&t);
  return rc;
}

int mbd_tokenizer_load(const char *path, mbd_tokenizer **out, mbd_error *err) {
  *out = NULL;
  char file[4096];
  struct stat sb;
  if (stat(path, &sb)) return mbd_error_set(err, MBD_E_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(sb.st_mode)) {
    if ((size_t)snprintf(file, sizeof file, "%s/tokenizer.json", path) >= sizeof file)
      return mbd_error_set(err, MBD_E_INVALID, "%s: path too long", path);
    if (stat(file, &sb))
      return mbd_error_set(err, MBD_E_IO, "%s: %s (the model directory has no tokenizer.json)", file,
                           strerror(errno));
  } else {
    snprintf(file, sizeof file, "%s", path);
  }
  FILE *f = fopen(file, "rb");
  if (!f) return mbd_error_set(err, MBD_E_IO, "%s: %s", file, strerror(errno));
  size_t cap = (size_t)sb.st_size;
  char *buf = malloc(cap + 1);
  if (!buf) {
    fclose(f);
    return mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory (%zu bytes)", file, cap);
  }
  size_t n = fread(buf, 1, cap, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  if (bad || n != cap) {
    free(buf);
    return mbd_error_set(err, MBD_E_IO, "%s: short read", file);
  }
  int rc = mbd_tokenizer_load_bytes(buf, n, file, out, err);
  free(buf);
  return rc;
}

void mbd_tokenizer_destroy(mbd_tokenizer **tp) {
  if (!tp || !*tp) return;
  mbd_tokenizer *t = *tp;
  free(t->kind);
  free(t->str_blob);
  free(t->str_off);
  free(t->byte_blob);
  free(t->byte_off);
  tok_strmap_free(&t->vocab);
  tok_strmap_free(&t->vocab_bytes);
  tok_strmap_free(&t->added_by_content);
  tok_merges_free(&t->merges);
  for (size_t i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
  tok_added_set *sets[2] = {&t->added_raw, &t->added_norm};
  for (int s = 0; s < 2; s++) {
    for (size_t i = 0; i < sets[s]->n; i++) free(sets[s]->tok[i].pattern);
    free(sets[s]->tok);
  }
  free(t->post_prefix);
  free(t->post_suffix);
  free(t);
  *tp = NULL;
}

const char *mbd_tokenizer_digest(const mbd_tokenizer *t) { return t->digest; }

int64_t mbd_tokenizer_vocab_size(const mbd_tokenizer *t) { return t->n_ids; }

int32_t mbd_tokenizer_token_id(const mbd_tokenizer *t, const char *token) {
  size_t n = strlen(token);
  int32_t id = tok_strmap_get(&t->added_by_content, token, n);
  return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

bool mbd_tokenizer_is_special(const mbd_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_ids && t->kind[id] == TOK_ID_SPECIAL;
}

const char *mbd_tokenizer_id_token(const mbd_tokenizer *t, int32_t id, size_t *len) {
  *len = 0;
  if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_ID_HOLE) return NULL;
  *len = t->str_off[id + 1] - t->str_off[id];
  return t->str_blob + t->str_off[id];
}

const char *mbd_tokenizer_id_bytes(const mbd_tokenizer *t, int32_t id, size_t *len) {
  *len = 0;
  if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_ID_HOLE || !t->byte_blob || t->n_dec_byte_level != 1)
    return NULL;
  *len = t->byte_off[id + 1] - t->byte_off[id];
  return t->byte_blob + t->byte_off[id];
}
