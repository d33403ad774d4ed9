/* Pre-tokenizers: Split (a regex or a literal string, every `behavior`,
 * `invert`) and ByteLevel (optional prefix space, optional GPT-2 regex split,
 * then bytes stand for model characters). Regexes run on PCRE2 with UTF + UCP,
 * JIT-compiled when the platform allows; matches are enumerated as Oniguruma's
 * find_iter does for the library (an empty match right after the previous
 * match is skipped by one character). The steps run depth-first on each piece,
 * which gives the same pieces in the same order as running each step over all
 * pieces in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) also takes
 * U+180E, which stopped being a space in Unicode 6.3. So \s is spelled out,
 * and \S outside a class too (inside one it is left as PCRE2 has it). */
#define TOK_SPACE_CLASS "\\t\\n\\x0b\\f\\r\\x{85}\\p{Z}"

static char *spell_spaces(const char *p, size_t n, size_t *out_len) {
  size_t cap = n * 24 + 1, o = 0;
  char *out = malloc(cap);
  if (!out) return NULL;
  bool in_class = false;
  for (size_t i = 0; i < n; i++) {
    const char *add = NULL;
    if (p[i] == '\\' && i + 1 < n) {
      char c = p[i + 1];
      if (c == 's') add = in_class ? TOK_SPACE_CLASS : "[" TOK_SPACE_CLASS "]";
      else if (c == 'S' && !in_class) add = "[^" TOK_SPACE_CLASS "]";
      if (add) {
        size_t k = strlen(add);
        memcpy(out + o, add, k);
        o += k;
        i++;
        continue;
      }
      if (c == 'Q') { /* \Q...\E is literal: copied as it is */
        const char *e = NULL;
        for (size_t j = i + 2; j + 1 < n && !e; j++)
          if (p[j] == '\\' && p[j + 1] == 'E') e = p + j + 2;
        size_t k = e ? (size_t)(e - (p + i)) : n - i;
        memcpy(out + o, p + i, k);
        o += k;
        i += k - 1;
        continue;
      }
      out[o++] = p[i++];
      out[o++] = p[i];
      continue;
    }
    if (p[i] == '[' && !in_class) {
      in_class = true;
      out[o++] = p[i];
      if (i + 1 < n && p[i + 1] == '^') out[o++] = p[++i];
      if (i + 1 < n && p[i + 1] == ']') out[o++] = p[++i]; /* a leading ] is literal */
      continue;
    }
    if (p[i] == '[' && in_class && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
      const char *e = strstr(p + i, ":]");
      size_t k = e && (size_t)(e + 2 - p) <= n ? (size_t)(e + 2 - (p + i)) : 1;
      memcpy(out + o, p + i, k);
      o += k;
      i += k - 1;
      continue;
    }
    if (p[i] == ']' && in_class) in_class = false;
    out[o++] = p[i];
  }
  out[o] = '\0';
  *out_len = o;
  return out;
}

pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, char *why, size_t why_cap) {
  if (!pattern) {
    pattern = k_gpt2_regex;
    len = sizeof k_gpt2_regex - 1;
  }
  char *spelled = NULL;
  if (!literal) {
    if (!(spelled = spell_spaces(pattern, len, &len))) {
      snprintf(why, why_cap, "out of memory");
      return NULL;
    }
    pattern = spelled;
  }
  int ec = 0;
  PCRE2_SIZE eo = 0;
  /* the library's regexes are Oniguruma's Ruby syntax, where ^ and $ anchor
   * at every line */
  uint32_t opt = literal ? PCRE2_UTF | PCRE2_LITERAL
                         : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opt, &ec, &eo, NULL);
  free(spelled);
  if (!re) {
    PCRE2_UCHAR msg[200];
    pcre2_get_error_message(ec, msg, sizeof msg);
    snprintf(why, why_cap, "%s at offset %zu", (const char *)msg, (size_t)eo);
    return NULL;
  }
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter serves when JIT is absent */
  return re;
}

typedef struct span {
  size_t start, end;
  bool flag; /* is a match (while collecting), to remove (after the behavior) */
} span;

typedef struct span_vec {
  span *p;
  size_t n, cap;
} span_vec;

struct tok_pre_scratch {
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *jit;
  span_vec spans[TOK_MAX_STEPS];
};

tok_pre_scratch *tok_pre_scratch_new(const mbd_tokenizer *t) {
  (void)t;
  tok_pre_scratch *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->md = pcre2_match_data_create(1, NULL);
  s->mctx = pcre2_match_context_create(NULL);
  if (!s->md || !s->mctx) {
    tok_pre_scratch_free(s);
    return NULL;
  }
  return s;
}

void tok_pre_scratch_free(tok_pre_scratch *s) {
  if (!s) return;
  pcre2_match_data_free(s->md);
  pcre2_match_context_free(s->mctx);
  pcre2_jit_stack_free(s->jit);
  for (size_t i = 0; i < TOK_MAX_STEPS; i++) free(s->spans[i].p);
  free(s);
}

static int span_push(span_vec *v, size_t a, size_t b, bool flag) {
  if (v->n == v->cap) {
    size_t nc = v->cap ? v->cap * 2 : 64;
    span *p = realloc(v->p, nc * sizeof *p);
    if (!p) return MBD_E_NOMEM;
    v->p = p;
    v->cap = nc;
  }
  v->p[v->n++] = (span){a, b, flag};
  return 0;
}

/* One search; retries once with a large JIT stack when the default is short. */
static int search(tok_pre_scratch *ps, const pcre2_code *re, const char *s, size_t n, size_t from,
                  size_t *ms, size_t *me, mbd_error *err) {
  for (;;) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, ps->md, ps->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 1;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !ps->jit) {
      ps->jit = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
      if (!ps->jit) return mbd_error_set(err, MBD_E_NOMEM, "pre-tokenizer: no memory for the regex stack");
      pcre2_jit_stack_assign(ps->mctx, NULL, ps->jit);
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[200];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return mbd_error_set(err, MBD_E_INVALID, "pre-tokenizer regex failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ps->md);
    *ms = ov[0];
    *me = ov[1] < ov[0] ? ov[0] : ov[1];
    return 0;
  }
}

/* s[0..n) -> spans (start, end, is_match) covering it, as Pattern::find_matches. */
static int find_matches(tok_pre_scratch *ps, const pcre2_code *re, const char *s, size_t n,
                        span_vec *v, mbd_error *err) {
  v->n = 0;
  size_t last_end = 0, last_match_end = 0, prev = 0;
  bool have_last = false;
  while (last_end <= n) {
    size_t ms = 0, me = 0;
    int rc = search(ps, re, s, n, last_end, &ms, &me, err);
    if (rc < 0) return rc;
    if (rc) break;
    if (ms == me && have_last && last_match_end == me) {
      size_t adv = 1;
      if (last_end < n) tok_utf8_cp(s + last_end, n - last_end, &adv);
      last_end += adv;
      continue;
    }
    last_end = me;
    last_match_end = me;
    have_last = true;
    if (prev != ms && span_push(v, prev, ms, false)) return MBD_E_NOMEM;
    if (span_push(v, ms, me, true)) return MBD_E_NOMEM;
    prev = me;
  }
  if (prev != n && span_push(v, prev, n, false)) return MBD_E_NOMEM;
  return 0;
}

/* Folds the spans by behavior; afterwards flag means "remove". */
static void apply_behavior(span_vec *v, tok_split_behavior b, bool invert) {
  if (invert)
    for (size_t i = 0; i < v->n; i++) v->p[i].flag = !v->p[i].flag;
  size_t w = 0;
  bool prev_match = false;
  switch (b) {
    case TOK_SPLIT_REMOVED:
      return;
    case TOK_SPLIT_ISOLATED:
      for (size_t i = 0; i < v->n; i++) v->p[i].flag = false;
      return;
    case TOK_SPLIT_CONTIGUOUS:
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
      for (size_t i = 0; i < v->n; i++) {
        span sp = v->p[i];
        bool join = b == TOK_SPLIT_CONTIGUOUS ? sp.flag == prev_match : (sp.flag && !prev_match);
        if (join && w) v->p[w - 1].end = sp.end;
        else v->p[w++] = (span){sp.start, sp.end, false};
        prev_match = sp.flag;
      }
      v->n = w;
      return;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
      size_t r = v->n; /* written from the end down */
      w = v->n;
      while (r > 0) {
        span sp = v->p[--r];
        if (sp.flag && !prev_match && w < v->n) v->p[w].start = sp.start;
        else v->p[--w] = (span){sp.start, sp.end, false};
        prev_match = sp.flag;
      }
      if (w) memmove(v->p, v->p + w, (v->n - w) * sizeof *v->p);
      v->n -= w;
      return;
    }
  }
}

static int run(const mbd_tokenizer *t, tok_pre_scratch *ps, tok_bpe_scratch *bs, size_t step,
               const char *s, size_t n, tok_ids *out, mbd_error *err);

static int split_and_run(const mbd_tokenizer *t, tok_pre_scratch *ps, tok_bpe_scratch *bs, size_t step,
                         const pcre2_code *re, tok_split_behavior b, bool invert, const char *s,
                         size_t n, tok_ids *out, mbd_error *err) {
  span_vec *v = &ps->spans[step];
  int rc = find_matches(ps, re, s, n, v, err);
  if (rc) return rc == MBD_E_NOMEM ? mbd_error_set(err, rc, "pre-tokenizer: out of memory") : rc;
  apply_behavior(v, b, invert);
  size_t count = v->n;
  for (size_t i = 0; i < count; i++) {
    span sp = v->p[i]; /* deeper steps use their own span vectors */
    if (sp.flag || sp.end <= sp.start) continue;
    if ((rc = run(t, ps, bs, step + 1, s + sp.start, sp.end - sp.start, out, err))) return rc;
  }
  return 0;
}

static int run(const mbd_tokenizer *t, tok_pre_scratch *ps, tok_bpe_scratch *bs, size_t step,
               const char *s, size_t n, tok_ids *out, mbd_error *err) {
  if (!n) return 0;
  if (step == t->n_pre) {
    if (tok_bpe_word(t, bs, s, n, out)) return mbd_error_set(err, MBD_E_NOMEM, "BPE: out of memory");
    return 0;
  }
  const tok_pre *p = &t->pre[step];
  if (p->kind == TOK_PRE_SPLIT)
    return split_and_run(t, ps, bs, step, p->re, p->behavior, p->invert, s, n, out, err);
  /* ByteLevel */
  char *tmp = NULL;
  if (p->add_prefix_space && s[0] != ' ') {
    if (!(tmp = malloc(n + 1))) return mbd_error_set(err, MBD_E_NOMEM, "pre-tokenizer: out of memory");
    tmp[0] = ' ';
    memcpy(tmp + 1, s, n);
    s = tmp;
    n++;
  }
  int rc = p->re ? split_and_run(t, ps, bs, step, p->re, TOK_SPLIT_ISOLATED, false, s, n, out, err)
                 : run(t, ps, bs, step + 1, s, n, out, err);
  free(tmp);
  return rc;
}

int tok_pretokenize(const mbd_tokenizer *t, tok_pre_scratch *ps, tok_bpe_scratch *bs, const char *s,
                    size_t n, tok_ids *out, mbd_error *err) {
  return run(t, ps, bs, 0, s, n, out, err);
}
