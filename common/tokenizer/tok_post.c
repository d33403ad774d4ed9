/* Post-processors, read from tokenizer.json: ByteLevel (offsets only, no ids),
 * TemplateProcessing's `single` template (special tokens around $A) and
 * Sequence of them. The result is two id lists the encoder puts before and
 * after the text's ids when add_special is asked for. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer/tok_internal.h"

static int fmt_err(mbd_error *err, const char *what, const char *field, const char *msg) {
  return mbd_error_set(err, MBD_E_FORMAT, "%s: %s: %s", what, field, msg);
}

static int append_ids(int32_t **list, size_t *n, const int32_t *ids, size_t k, bool front) {
  if (!k) return 0;
  int32_t *p = realloc(*list, (*n + k + 1) * sizeof *p);
  if (!p) return MBD_E_NOMEM;
  if (front) {
    memmove(p + k, p, *n * sizeof *p);
    memcpy(p, ids, k * sizeof *p);
  } else {
    memcpy(p + *n, ids, k * sizeof *p);
  }
  *list = p;
  *n += k;
  return 0;
}

static int template_single(mbd_tokenizer *t, const json_t *pp, const char *field, const char *what,
                           mbd_error *err) {
  char f[256];
  const json_t *single = json_object_get(pp, "single");
  const json_t *specials = json_object_get(pp, "special_tokens");
  snprintf(f, sizeof f, "%s.single", field);
  if (!json_is_array(single)) return fmt_err(err, what, f, "missing or not an array (only the list form is read)");
  if (specials && !json_is_object(specials) && !json_is_null(specials))
    return fmt_err(err, what, field, "special_tokens is not an object");
  int32_t *pre = NULL, *post = NULL;
  size_t n_pre = 0, n_post = 0;
  bool seen_a = false;
  int rc = 0;
  size_t i;
  const json_t *item;
  json_array_foreach(single, i, item) {
    snprintf(f, sizeof f, "%s.single[%zu]", field, i);
    const json_t *seq = json_object_get(item, "Sequence");
    const json_t *sp = json_object_get(item, "SpecialToken");
    if (seq) {
      const char *id = json_string_value(json_object_get(seq, "id"));
      if (!id || strcmp(id, "A") || seen_a) {
        rc = fmt_err(err, what, f, "the single template takes one Sequence, with id \"A\"");
        goto fail;
      }
      seen_a = true;
      continue;
    }
    const char *name = sp ? json_string_value(json_object_get(sp, "id")) : NULL;
    if (!name) {
      rc = fmt_err(err, what, f, "neither {\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}");
      goto fail;
    }
    const json_t *st = specials ? json_object_get(specials, name) : NULL;
    const json_t *ids = json_object_get(st, "ids");
    if (!json_is_array(ids)) {
      snprintf(f, sizeof f, "%s.special_tokens[\"%.64s\"]", field, name);
      rc = fmt_err(err, what, f, "missing, or has no \"ids\" list");
      goto fail;
    }
    size_t k;
    const json_t *v;
    json_array_foreach(ids, k, v) {
      snprintf(f, sizeof f, "%s.special_tokens[\"%.64s\"].ids[%zu]", field, name, k);
      json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
      if (id < 0 || id >= t->n_ids || t->kind[id] == TOK_ID_HOLE) {
        rc = fmt_err(err, what, f, "not an id of the vocabulary");
        goto fail;
      }
      int32_t i32 = (int32_t)id;
      if (append_ids(seen_a ? &post : &pre, seen_a ? &n_post : &n_pre, &i32, 1, false)) {
        rc = mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory", what);
        goto fail;
      }
    }
  }
  if (!seen_a) {
    snprintf(f, sizeof f, "%s.single", field);
    rc = fmt_err(err, what, f, "has no {\"Sequence\": {\"id\": \"A\"}}");
    goto fail;
  }
  /* a later processor wraps what the earlier ones made */
  if (append_ids(&t->post_prefix, &t->n_post_prefix, pre, n_pre, true) ||
      append_ids(&t->post_suffix, &t->n_post_suffix, post, n_post, false))
    rc = mbd_error_set(err, MBD_E_NOMEM, "%s: out of memory", what);
fail:
  free(pre);
  free(post);
  return rc;
}

int tok_post_load(mbd_tokenizer *t, const json_t *pp, const char *field, int depth, const char *what,
                  mbd_error *err) {
  char f[256];
  if (!pp || json_is_null(pp)) return 0;
  if (depth > TOK_MAX_DEPTH) return fmt_err(err, what, field, "Sequence nested too deeply");
  if (!json_is_object(pp)) return fmt_err(err, what, field, "not an object or null");
  const char *type = json_string_value(json_object_get(pp, "type"));
  snprintf(f, sizeof f, "%s.type", field);
  if (!type) return fmt_err(err, what, f, "missing or not a string");
  if (!strcmp(type, "ByteLevel")) return 0;
  if (!strcmp(type, "TemplateProcessing")) return template_single(t, pp, field, what, err);
  if (!strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(pp, "processors");
    snprintf(f, sizeof f, "%s.processors", field);
    if (!json_is_array(list)) return fmt_err(err, what, f, "missing or not an array");
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
      snprintf(f, sizeof f, "%s.processors[%zu]", field, i);
      int rc = tok_post_load(t, item, f, depth + 1, what, err);
      if (rc) return rc;
    }
    return 0;
  }
  return mbd_error_set(err, MBD_E_FORMAT, "%s: %s: \"%.64s\" is not supported (ByteLevel, TemplateProcessing, Sequence)",
                       what, f, type);
}
