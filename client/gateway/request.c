/* JSON request bodies (jansson) -> gw_request, with OpenAI's defaults. */
#include "client/gateway/request.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

static int oom(gw_err *e) {
  return gw_err_set(e, 500, "server_error", "out_of_memory", NULL,
                    "out of memory parsing the request");
}

/* An array of integers (token ids) -> ids; 0 when it is not one. */
static int id_array(const json_t *a, const char *param, int64_t **ids, size_t *n, gw_err *e) {
  size_t k = json_array_size(a), i;
  json_t *v;
  if (k == 0) return gw_err_bad(e, param, "'%s' must not be empty", param);
  if (k > (1u << 20))
    return gw_err_bad(e, param, "'%s' has %zu tokens (at most %u)", param, k, 1u << 20);
  *ids = malloc(k * sizeof **ids);
  if (!*ids) return oom(e);
  json_array_foreach(a, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
      return gw_err_bad(e, param, "'%s'[%zu] must be a token id (an integer >= 0)", param, i);
    (*ids)[i] = json_integer_value(v);
  }
  *n = k;
  return 0;
}

static int add_text_prompt(gw_request *r, const json_t *s, gw_err *e) {
  gw_prompt *p = &r->prompts[r->n_prompts++];
  p->len = json_string_length(s);
  if (!(p->text = dup_n(json_string_value(s), p->len))) return oom(e);
  return 0;
}

static int parse_prompt(const json_t *v, gw_request *r, gw_err *e) {
  if (!v) return gw_err_bad(e, "prompt", "'prompt' is required");
  size_t cap = 1;
  if (json_is_array(v)) cap = json_array_size(v);
  if (cap == 0) return gw_err_bad(e, "prompt", "'prompt' must not be an empty array");
  if (json_is_array(v) && json_is_integer(json_array_get(v, 0))) cap = 1; /* one token array */
  if (cap > GW_MAX_PROMPTS)
    return gw_err_bad(e, "prompt", "%zu prompts in one request (at most %d)", cap, GW_MAX_PROMPTS);
  if (!(r->prompts = calloc(cap, sizeof *r->prompts))) return oom(e);
  if (json_is_string(v)) return add_text_prompt(r, v, e);
  if (!json_is_array(v))
    return gw_err_bad(e, "prompt",
                      "'prompt' must be a string, an array of strings, or an array "
                      "of token ids (or of token-id arrays)");
  if (json_is_integer(json_array_get(v, 0))) {
    gw_prompt *p = &r->prompts[r->n_prompts++];
    return id_array(v, "prompt", &p->ids, &p->n_ids, e);
  }
  size_t i;
  json_t *x;
  json_array_foreach(v, i, x) {
    if (json_is_string(x)) {
      if (add_text_prompt(r, x, e)) return -1;
    } else if (json_is_array(x)) {
      gw_prompt *p = &r->prompts[r->n_prompts++];
      if (id_array(x, "prompt", &p->ids, &p->n_ids, e)) return -1;
    } else {
      return gw_err_bad(e, "prompt", "'prompt'[%zu] must be a string or an array of token ids", i);
    }
  }
  return 0;
}

/* Text of a chat message's content: a string, or an array of {type:"text", text}. */
static int content_text(const json_t *c, size_t idx, char **out, gw_err *e) {
  if (json_is_string(c)) {
    *out = dup_n(json_string_value(c), json_string_length(c));
    return *out ? 0 : oom(e);
  }
  if (json_is_null(c) || !c) {
    *out = dup_n("", 0);
    return *out ? 0 : oom(e);
  }
  if (!json_is_array(c))
    return gw_err_bad(e, "messages",
                      "messages[%zu].content must be a string or an array of "
                      "text parts",
                      idx);
  size_t len = 0, i;
  json_t *p;
  json_array_foreach(c, i, p) {
    const char *ty = json_string_value(json_object_get(p, "type"));
    json_t *t = json_object_get(p, "text");
    if (!ty || strcmp(ty, "text") || !json_is_string(t))
      return gw_err_bad(e, "messages",
                        "messages[%zu].content[%zu]: only {\"type\": \"text\", "
                        "\"text\": ...} parts are supported",
                        idx, i);
    len += json_string_length(t);
  }
  if (!(*out = malloc(len + 1))) return oom(e);
  len = 0;
  json_array_foreach(c, i, p) {
    json_t *t = json_object_get(p, "text");
    memcpy(*out + len, json_string_value(t), json_string_length(t));
    len += json_string_length(t);
  }
  (*out)[len] = '\0';
  return 0;
}

static int parse_messages(const json_t *v, gw_request *r, gw_err *e) {
  if (!json_is_array(v) || json_array_size(v) == 0)
    return gw_err_bad(e, "messages", "'messages' must be a non-empty array of {role, content}");
  if (json_array_size(v) > 4096)
    return gw_err_bad(e, "messages", "%zu messages (at most 4096)", json_array_size(v));
  if (!(r->msgs = calloc(json_array_size(v), sizeof *r->msgs))) return oom(e);
  size_t i;
  json_t *m;
  json_array_foreach(v, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || !role[0])
      return gw_err_bad(e, "messages", "messages[%zu] must be an object with a string 'role'", i);
    for (const char *c = role; *c; c++)
      if (!isalnum((unsigned char)*c) && *c != '_')
        return gw_err_bad(e, "messages", "messages[%zu].role '%.40s' is not a plain word", i, role);
    if (!(r->msgs[i].role = dup_n(role, strlen(role)))) return oom(e);
    r->n_msgs = i + 1;
    if (content_text(json_object_get(m, "content"), i, &r->msgs[i].content, e)) return -1;
  }
  return 0;
}

static int parse_stop(const json_t *v, gw_request *r, gw_err *e) {
  if (!v || json_is_null(v)) return 0;
  json_t *one = NULL;
  if (json_is_string(v) || json_is_integer(v)) {
    one = json_array();
    if (!one || json_array_append(one, (json_t *)v)) {
      json_decref(one);
      return oom(e);
    }
    v = one;
  }
  int rc = 0;
  if (!json_is_array(v)) {
    rc = gw_err_bad(e, "stop",
                    "'stop' must be a string or an array of strings (token ids as "
                    "integers are an extension)");
    goto done;
  }
  size_t i;
  json_t *x;
  json_array_foreach(v, i, x) {
    if (json_is_string(x)) {
      if (json_string_length(x) == 0) {
        rc = gw_err_bad(e, "stop", "'stop'[%zu] is an empty string", i);
        goto done;
      }
      if (r->n_stop == GW_MAX_STOP) {
        rc = gw_err_bad(e, "stop", "at most %d stop strings", GW_MAX_STOP);
        goto done;
      }
      if (!(r->stop[r->n_stop] = dup_n(json_string_value(x), json_string_length(x)))) {
        rc = oom(e);
        goto done;
      }
      r->n_stop++;
    } else if (json_is_integer(x) && json_integer_value(x) >= 0 &&
               json_integer_value(x) <= INT32_MAX) {
      if (r->n_stop_ids == GW_MAX_STOP_IDS) {
        rc = gw_err_bad(e, "stop", "at most %d stop token ids", GW_MAX_STOP_IDS);
        goto done;
      }
      r->stop_ids[r->n_stop_ids++] = json_integer_value(x);
    } else {
      rc = gw_err_bad(e, "stop", "'stop'[%zu] must be a string or a token id", i);
      goto done;
    }
  }
done:
  json_decref(one);
  return rc;
}

static bool is_hex(const char *s) {
  for (; *s; s++)
    if (!isxdigit((unsigned char)*s)) return false;
  return true;
}

static int want_field(mbd_route_want *w, const char *k, const char *v, gw_err *e) {
  struct {
    const char *key;
    char *dst;
    size_t cap;
  } f[] = {{"route_id", w->route_id, sizeof w->route_id},
           {"id", w->route_id, sizeof w->route_id},
           {"backend", w->backend, sizeof w->backend},
           {"gemm_mode", w->gemm_mode, sizeof w->gemm_mode},
           {"mode", w->gemm_mode, sizeof w->gemm_mode},
           {"dtype", w->dtype, sizeof w->dtype},
           {"state", w->state, sizeof w->state},
           {"family", w->family, sizeof w->family},
           {"device", w->device_name, sizeof w->device_name}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    if (strcmp(k, f[i].key)) continue;
    if (strlen(v) >= f[i].cap) return gw_err_bad(e, "route", "route %s '%.40s' is too long", k, v);
    if (f[i].dst == w->route_id && (strlen(v) < 8 || !is_hex(v)))
      return gw_err_bad(e, "route", "route id '%.70s' must be >= 8 hex digits", v);
    snprintf(f[i].dst, f[i].cap, "%s", v);
    return 0;
  }
  return gw_err_bad(e, "route",
                    "unknown route key '%.40s' (route_id, backend, gemm_mode, dtype, state, "
                    "family, device)",
                    k);
}

int gw_route_parse(const char *s, mbd_route_want *w, gw_err *e) {
  memset(w, 0, sizeof *w);
  if (!strchr(s, '=')) return want_field(w, "route_id", s, e);
  char buf[512];
  if (strlen(s) >= sizeof buf) return gw_err_bad(e, "route", "'route' is too long");
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ') t++;
    char *eq = strchr(t, '=');
    if (!eq) return gw_err_bad(e, "route", "route constraint '%.40s' must be key=value", t);
    *eq = '\0';
    if (want_field(w, t, eq + 1, e)) return -1;
  }
  return 0;
}

static int parse_route(const json_t *v, gw_request *r, gw_err *e) {
  if (!v || json_is_null(v)) return 0;
  r->has_route = true;
  if (json_is_string(v)) return gw_route_parse(json_string_value(v), &r->route, e);
  if (!json_is_object(v))
    return gw_err_bad(e, "route",
                      "'route' must be a route id, \"key=value,...\" constraints or "
                      "an object of them");
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)v, k, x) {
    if (!json_is_string(x)) return gw_err_bad(e, "route", "route.%.40s must be a string", k);
    if (want_field(&r->route, k, json_string_value(x), e)) return -1;
  }
  return 0;
}

/* Optional number field in [lo, hi]; absent/null keeps *out. */
static int num_field(const json_t *o, const char *k, double lo, double hi, double *out, gw_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return gw_err_bad(e, k, "'%s' must be a number", k);
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi))
    return gw_err_bad(e, k, "'%s' must be in [%g, %g] (got %g)", k, lo, hi, d);
  *out = d;
  return 0;
}

static int bool_field(const json_t *o, const char *k, bool *out, gw_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return gw_err_bad(e, k, "'%s' must be true or false", k);
  *out = json_is_true(v);
  return 0;
}

static int int_field(const json_t *o, const char *k, json_int_t lo, json_int_t hi, json_int_t *out,
                     gw_err *e) {
  json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v)) return gw_err_bad(e, k, "'%s' must be an integer", k);
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return gw_err_bad(e, k, "'%s' must be in %lld..%lld (got %lld)", k, (long long)lo,
                      (long long)hi, (long long)x);
  *out = x;
  return 0;
}

/* Fields we do not implement: accepted only at their neutral values. */
static int unsupported(const json_t *o, gw_err *e) {
  const char *zero[] = {"presence_penalty", "frequency_penalty"};
  for (size_t i = 0; i < 2; i++) {
    json_t *v = json_object_get(o, zero[i]);
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
      return gw_err_bad(e, zero[i], "'%s' is not supported (only 0)", zero[i]);
  }
  json_t *v = json_object_get(o, "logit_bias");
  if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0))
    return gw_err_bad(e, "logit_bias", "'logit_bias' is not supported");
  v = json_object_get(o, "suffix");
  if (v && !json_is_null(v)) return gw_err_bad(e, "suffix", "'suffix' is not supported");
  v = json_object_get(o, "best_of");
  if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
    return gw_err_bad(e, "best_of", "'best_of' is not supported (only 1)");
  v = json_object_get(o, "tools");
  if (v && !json_is_null(v) && json_array_size(v) > 0)
    return gw_err_bad(e, "tools", "'tools' is not supported");
  return 0;
}

int gw_request_parse(const char *body, size_t len, bool chat, gw_request *r, gw_err *e) {
  memset(r, 0, sizeof *r);
  r->chat = chat;
  r->temperature = 1.0;
  r->top_p = 1.0;
  r->n = 1;
  r->logprobs = -1;
  r->max_tokens = chat ? 256 : 16;
  json_error_t je;
  json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  int rc = -1;
  if (!o) {
    gw_err_set(e, 400, "invalid_request_error", "invalid_json", NULL,
               "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    return -1;
  }
  if (!json_is_object(o)) {
    gw_err_bad(e, NULL, "the body must be a JSON object");
    goto done;
  }
  json_t *m = json_object_get(o, "model");
  if (!json_is_string(m) || json_string_length(m) == 0) {
    gw_err_bad(e, "model", "'model' must be a non-empty string (GET /v1/models lists them)");
    goto done;
  }
  if (json_string_length(m) >= sizeof r->model) {
    gw_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
               "the model '%.60s...' does not exist", json_string_value(m));
    goto done;
  }
  snprintf(r->model, sizeof r->model, "%s", json_string_value(m));
  if (chat ? parse_messages(json_object_get(o, "messages"), r, e)
           : parse_prompt(json_object_get(o, "prompt"), r, e))
    goto done;
  json_int_t x = r->max_tokens;
  const char *mt =
      chat && json_object_get(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (int_field(o, mt, 1, GW_MAX_TOKENS_CAP, &x, e)) goto done;
  r->max_tokens = x;
  if (num_field(o, "temperature", 0, 2, &r->temperature, e)) goto done;
  if (num_field(o, "top_p", 0, 1, &r->top_p, e)) goto done;
  if (r->top_p <= 0) {
    gw_err_bad(e, "top_p", "'top_p' must be in (0, 1]");
    goto done;
  }
  json_t *sd = json_object_get(o, "seed");
  if (sd && !json_is_null(sd)) {
    if (!json_is_integer(sd)) {
      gw_err_bad(e, "seed", "'seed' must be an integer");
      goto done;
    }
    r->seed = (uint64_t)json_integer_value(sd);
  }
  x = 1;
  if (int_field(o, "n", 1, GW_MAX_N, &x, e)) goto done;
  r->n = (int)x;
  size_t np = chat ? 1 : r->n_prompts;
  if (np * (size_t)r->n > GW_MAX_CHOICES) {
    gw_err_bad(e, "n", "%zu prompts x n=%d is over %d choices", np, r->n, GW_MAX_CHOICES);
    goto done;
  }
  if (parse_stop(json_object_get(o, "stop"), r, e)) goto done;
  if (bool_field(o, "stream", &r->stream, e)) goto done;
  json_t *so = json_object_get(o, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) {
      gw_err_bad(e, "stream_options", "'stream_options' must be an object");
      goto done;
    }
    if (bool_field(so, "include_usage", &r->include_usage, e)) goto done;
  }
  if (chat) { /* logprobs: bool, top_logprobs: 0..5 */
    bool want = false;
    if (bool_field(o, "logprobs", &want, e)) goto done;
    x = 0;
    if (int_field(o, "top_logprobs", 0, GW_MAX_LOGPROBS, &x, e)) goto done;
    if (!want && json_object_get(o, "top_logprobs") &&
        !json_is_null(json_object_get(o, "top_logprobs"))) {
      gw_err_bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
      goto done;
    }
    r->logprobs = want ? (int)x : -1;
  } else {
    x = -1;
    if (int_field(o, "logprobs", 0, GW_MAX_LOGPROBS, &x, e)) goto done;
    r->logprobs = (int)x;
    if (bool_field(o, "echo", &r->echo, e)) goto done;
  }
  json_t *u = json_object_get(o, "user");
  if (u && !json_is_null(u) && !json_is_string(u)) {
    gw_err_bad(e, "user", "'user' must be a string");
    goto done;
  }
  if (bool_field(o, "ignore_eos", &r->ignore_eos, e)) goto done;
  if (parse_route(json_object_get(o, "route"), r, e)) goto done;
  if (unsupported(o, e)) goto done;
  rc = 0;
done:
  json_decref(o);
  return rc;
}

void gw_request_free(gw_request *r) {
  for (size_t i = 0; i < r->n_prompts; i++) {
    free(r->prompts[i].text);
    free(r->prompts[i].ids);
  }
  free(r->prompts);
  for (size_t i = 0; i < r->n_msgs; i++) {
    free(r->msgs[i].role);
    free(r->msgs[i].content);
  }
  free(r->msgs);
  for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
  memset(r, 0, sizeof *r);
}
