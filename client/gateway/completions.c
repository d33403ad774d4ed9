/* Completion jobs: prompts -> sessions on the broker -> text (JSON or SSE). */
#include "client/gateway/completions.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/gateway/stop.h"

#define MAX_WORKER_STOP 64 /* the worker's GENERATE accepts at most this many stop ids */
#define LOGPROB_MAX_BYTES ((size_t)512 << 20) /* logits of one logprobs FORWARD */

struct gw_job {
  gw_ctx *g;
  gw_model *m;
  int mi;
  gw_request req;
  size_t n_prompts;
  int64_t **ids; /* [n_prompts] tokenized prompts */
  size_t *n_ids;
  char **echo;      /* [n_prompts] prompt text for echo (owned) */
  double t0;        /* arrival, gw_now_s */
  int64_t deadline; /* absolute, gw_now_ms */
  bool slot;
  mbd_client *c0; /* the first choice's client and session, opened in prepare */
  mbd_session *s0;
  char route[65]; /* the first choice's route id: later choices are pinned to it */
  char *stops[GW_MAX_STOP + 1];
  size_t n_stops;
  int64_t stop_ids[MAX_WORKER_STOP];
  size_t n_stop_ids;
  char id[48];
  int64_t created;
  int64_t prompt_tokens, completion_tokens;
  int fd; /* the client's socket for a buffered job, -1 = not watched */
};

/* One generation: a prompt's choice. */
typedef struct choice {
  gw_job *j;
  size_t index, prompt;
  gw_sse *sse; /* stream target, NULL when buffering */
  mbd_detok *dt;
  gw_stop st;
  char *text; /* released text (buffered mode) */
  size_t len;
  int64_t *toks; /* tokens counted as completion tokens */
  size_t n_toks, cap_toks;
  const char *finish; /* "stop" | "length" once ended */
  bool cancelled;     /* the client went away, or the gateway is stopping */
  bool shutdown;      /* cancelled because the gateway is stopping */
  bool failed;        /* detokenizer or memory failure (err) */
  mbd_error err;
  double last_s; /* time of the previous token, 0 before the first */
  size_t seen;   /* tokens of the current chunk the callback saw */
  /* Streamed logprobs: tokens are held for a chunk, then scored by a shadow
   * session that prefills what the generating session consumed. */
  bool lp_stream;
  mbd_client *lcl; /* the shadow session's client and session */
  mbd_session *ls;
  float *prev; /* [V] logits that predict the next token */
  int64_t V;
  int64_t *pend; /* tokens of the chunk in flight */
  size_t n_pend, cap_pend;
  json_t *lp;    /* logprobs not yet sent ({tokens, token_logprobs, ...}) */
  size_t lp_off; /* text_offset of the next token */
} choice;

int gw_job_model(const gw_job *j) { return j ? j->mi : -1; }

void gw_job_watch(gw_job *j, int fd) { j->fd = fd; }

static uint64_t mix64(uint64_t x) { /* SplitMix64's finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int oom(gw_err *e) {
  return gw_err_set(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
}

static int tokenize(gw_job *j, size_t p, const char *text, size_t len, gw_err *e) {
  mbd_error err = {0};
  int32_t *ids = NULL;
  size_t n = 0;
  if (mbd_tokenizer_encode(j->m->tok, text, len, true, &ids, &n, &err))
    return gw_err_bad(e, j->req.chat ? "messages" : "prompt", "prompt %zu: %s", p, err.msg);
  j->ids[p] = malloc((n ? n : 1) * sizeof **j->ids);
  if (!j->ids[p]) {
    free(ids);
    return oom(e);
  }
  for (size_t i = 0; i < n; i++) j->ids[p][i] = ids[i];
  j->n_ids[p] = n;
  free(ids);
  return 0;
}

/* Opens a session for prompt p (its tokens route the OPEN to the worker
 * holding its longest cached prefix, docs/architecture.md). */
static int open_session(gw_job *j, size_t p, mbd_client **c, mbd_session **s, gw_err *e) {
  mbd_error err = {0};
  if (!(*c = gw_client_get(j->g, &err)))
    return gw_err_from_service(e, &err, "connecting to the broker");
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  if (j->route[0])
    snprintf(want.route_id, sizeof want.route_id, "%s", j->route);
  else if (j->req.has_route)
    want = j->req.route;
  int64_t left = j->deadline - gw_now_ms();
  if (left <= 0)
    return gw_err_set(e, 504, "timeout", "deadline_exceeded", NULL,
                      "the request's deadline passed");
  mbd_call_opts co = {.route = &want, .deadline_ms = left};
  if (mbd_session_open_prompt(*c, &co, j->m->name, j->ids[p], (int64_t)j->n_ids[p], 0, NULL, 0, s,
                              &err))
    return gw_err_from_service(e, &err, "opening a session");
  if (!j->route[0]) {
    snprintf(j->route, sizeof j->route, "%s", mbd_client_last_reply(*c)->route_id);
    gw_metrics_observe(j->g->metrics, j->mi, GW_H_QUEUE, gw_now_s() - j->t0);
  }
  return 0;
}

int gw_job_prepare(gw_ctx *g, gw_request *req, double t0, gw_job **out, gw_err *e) {
  *out = NULL;
  gw_job *j = calloc(1, sizeof *j);
  if (!j) return oom(e);
  j->g = g;
  j->req = *req;
  memset(req, 0, sizeof *req);
  j->t0 = t0;
  j->fd = -1;
  j->deadline = gw_now_ms() + g->opt.deadline_ms;
  j->mi = -1;
  j->created = (int64_t)time(NULL);
  static const char hex[] = "0123456789abcdef";
  uint64_t r = mix64((uint64_t)(t0 * 1e9) ^ (uint64_t)(uintptr_t)j);
  snprintf(j->id, sizeof j->id, "%s-", j->req.chat ? "chatcmpl" : "cmpl");
  for (size_t k = strlen(j->id), d = 0; k < 36; k++, d++, r >>= 4) {
    if (d == 16) r = mix64(r ^ (uint64_t)k);
    j->id[k] = hex[r & 15];
  }
  *out = j;
  const gw_request *q = &j->req;
  if (!(j->m = gw_find_model(g, q->model)))
    return gw_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                      "the model '%s' does not exist (GET /v1/models lists the models served)",
                      q->model);
  j->mi = gw_model_index(g, j->m);
  if (q->chat && j->m->chat.kind == GW_CHAT_NONE)
    return gw_err_bad(e, "messages",
                      "model '%s' has no chat template the gateway can render: %s; "
                      "use /v1/completions with a prompt",
                      q->model, j->m->chat.why);
  if (gw_model_check(g, j->m, e)) return -1;
  for (size_t i = 0; i < q->n_stop; i++) j->stops[j->n_stops++] = q->stop[i];
  for (size_t i = 0; i < q->n_stop_ids; i++) j->stop_ids[j->n_stop_ids++] = q->stop_ids[i];
  if (j->m->eos >= 0 && !q->ignore_eos) j->stop_ids[j->n_stop_ids++] = j->m->eos;
  int64_t vocab = mbd_tokenizer_vocab_size(j->m->tok);
  for (size_t i = 0; i < j->n_stop_ids; i++)
    if (j->stop_ids[i] >= vocab)
      return gw_err_bad(e, "stop", "stop token id %lld is outside the vocabulary (%lld ids)",
                        (long long)j->stop_ids[i], (long long)vocab);
  j->n_prompts = q->chat ? 1 : q->n_prompts;
  j->ids = calloc(j->n_prompts, sizeof *j->ids);
  j->n_ids = calloc(j->n_prompts, sizeof *j->n_ids);
  j->echo = calloc(j->n_prompts, sizeof *j->echo);
  if (!j->ids || !j->n_ids || !j->echo) return oom(e);
  if (q->chat) {
    const char *eot = NULL;
    char *text = gw_chat_render(&j->m->chat, q->msgs, q->n_msgs, &eot);
    if (!text) return oom(e);
    int rc = tokenize(j, 0, text, strlen(text), e);
    free(text);
    if (rc) return rc;
    if (eot) {
      j->stops[j->n_stops++] = (char *)eot;
      int32_t id = mbd_tokenizer_token_id(j->m->tok, eot);
      if (id >= 0 && j->n_stop_ids < MAX_WORKER_STOP) j->stop_ids[j->n_stop_ids++] = id;
    }
  } else {
    for (size_t p = 0; p < j->n_prompts; p++) {
      const gw_prompt *pr = &q->prompts[p];
      if (pr->text) {
        if (tokenize(j, p, pr->text, pr->len, e)) return -1;
        if (q->echo && !(j->echo[p] = strdup(pr->text))) return oom(e);
        continue;
      }
      for (size_t i = 0; i < pr->n_ids; i++)
        if (pr->ids[i] >= vocab)
          return gw_err_bad(e, "prompt",
                            "prompt %zu: token id %lld is outside the vocabulary "
                            "(%lld ids)",
                            p, (long long)pr->ids[i], (long long)vocab);
      if (!(j->ids[p] = malloc(pr->n_ids * sizeof **j->ids))) return oom(e);
      memcpy(j->ids[p], pr->ids, pr->n_ids * sizeof **j->ids);
      j->n_ids[p] = pr->n_ids;
      if (q->echo) {
        mbd_error err = {0};
        int32_t *t32 = malloc(pr->n_ids * sizeof *t32);
        size_t tl;
        if (!t32) return oom(e);
        for (size_t i = 0; i < pr->n_ids; i++) t32[i] = (int32_t)pr->ids[i];
        int rc = mbd_tokenizer_decode(j->m->tok, t32, pr->n_ids, false, &j->echo[p], &tl, &err);
        free(t32);
        if (rc) return gw_err_bad(e, "prompt", "prompt %zu: %s", p, err.msg);
      }
    }
  }
  for (size_t p = 0; p < j->n_prompts; p++) {
    if (j->n_ids[p] == 0)
      return gw_err_bad(e, q->chat ? "messages" : "prompt",
                        "prompt %zu is empty after tokenization: give at least one token", p);
    j->prompt_tokens += (int64_t)j->n_ids[p];
  }
  if (gw_slot_acquire(g, j->deadline, e)) return -1;
  j->slot = true;
  return open_session(j, 0, &j->c0, &j->s0, e);
}

void gw_job_destroy(gw_job **jp) {
  if (!jp || !*jp) return;
  gw_job *j = *jp;
  mbd_session_close(&j->s0, NULL);
  gw_client_put(j->g, j->c0);
  if (j->slot) gw_slot_release(j->g);
  for (size_t p = 0; p < j->n_prompts; p++) {
    if (j->ids) free(j->ids[p]);
    if (j->echo) free(j->echo[p]);
  }
  free(j->ids);
  free(j->n_ids);
  free(j->echo);
  gw_request_free(&j->req);
  free(j);
  *jp = NULL;
}

/* ---- logprobs entries --------------------------------------------------- */

static json_t *token_str(const gw_model *m, int64_t id) {
  int32_t t = (int32_t)id;
  char *s = NULL;
  size_t n = 0;
  if (mbd_tokenizer_decode(m->tok, &t, 1, false, &s, &n, NULL)) return json_string("");
  json_t *v = json_stringn(s, n);
  free(s);
  return v;
}

/* JSON has no -inf (jansson refuses it): an impossible token reads -9999, as in vLLM. */
static double finite_lp(double x) { return isfinite(x) ? x : -9999.0; }

/* OpenAI's legacy logprobs object, empty. */
static json_t *lp_new(void) {
  return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                   "text_offset");
}

/* Appends token tok, predicted by row[0..V) (NULL: nothing predicts it), with
 * its top-k, to lp; *off advances by the token's text. */
static void lp_append(const gw_model *m, json_t *lp, const float *row, int64_t V, int64_t tok,
                      int k, size_t *off) {
  json_t *ts = token_str(m, tok);
  json_array_append(json_object_get(lp, "tokens"), ts);
  json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*off));
  *off += json_string_length(ts);
  json_decref(ts);
  json_t *lps = json_object_get(lp, "token_logprobs"), *tops = json_object_get(lp, "top_logprobs");
  if (!row) {
    json_array_append_new(lps, json_null());
    json_array_append_new(tops, json_null());
    return;
  }
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  for (int64_t v = 0; v < V; v++) sum += exp(row[v] - mx);
  double lse = mx + log(sum);
  json_array_append_new(lps, json_real(finite_lp(tok < V ? row[tok] - lse : -INFINITY)));
  int64_t best[GW_MAX_LOGPROBS];
  int nb = 0;
  for (int64_t v = 0; v < V; v++) { /* top-k by insertion, k <= 5 */
    int pos = nb;
    while (pos > 0 && row[best[pos - 1]] < row[v]) pos--;
    if (pos >= k) continue;
    if (nb < k) nb++;
    for (int q = nb - 1; q > pos; q--) best[q] = best[q - 1];
    best[pos] = v;
  }
  json_t *top = json_object();
  for (int q = 0; q < nb; q++) {
    json_t *s = token_str(m, best[q]);
    json_object_set_new(top, json_string_value(s), json_real(finite_lp(row[best[q]] - lse)));
    json_decref(s);
  }
  json_array_append_new(tops, top);
}

/* The chat form of a legacy logprobs object: {content: [{token, logprob,
 * bytes, top_logprobs: [{token, logprob, bytes}]}]} (new reference). */
static json_t *bytes_of(const char *s) {
  json_t *a = json_array();
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    json_array_append_new(a, json_integer(*p));
  return a;
}

static json_t *lp_chat(const json_t *lp) {
  json_t *content = json_array();
  const json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs"),
               *tops = json_object_get(lp, "top_logprobs");
  for (size_t i = 0; i < json_array_size(toks); i++) {
    const char *t = json_string_value(json_array_get(toks, i));
    json_t *top = json_array(), *v;
    const char *k;
    json_object_foreach(json_array_get(tops, i), k, v) json_array_append_new(
        top, json_pack("{s:s,s:O,s:o}", "token", k, "logprob", v, "bytes", bytes_of(k)));
    json_t *x = json_array_get(lps, i);
    json_array_append_new(content, json_pack("{s:s,s:o,s:o,s:o}", "token", t ? t : "", "logprob",
                                             json_is_null(x) ? json_real(0) : json_incref(x),
                                             "bytes", bytes_of(t ? t : ""), "top_logprobs", top));
  }
  return json_pack("{s:o}", "content", content);
}

/* ---- streaming chunks ------------------------------------------------- */

static json_t *chunk_head(const gw_job *j) {
  return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", j->id, "object",
                   j->req.chat ? "chat.completion.chunk" : "text_completion", "created",
                   (json_int_t)j->created, "model", j->m->name, "system_fingerprint", j->route);
}

/* Sends one choice delta: text (may be NULL) and finish reason (may be NULL). */
static int send_delta(choice *c, const char *text, size_t len, const char *finish, bool role) {
  json_t *o = chunk_head(c->j), *ch = json_object();
  if (!o || !ch) {
    json_decref(o);
    json_decref(ch);
    return -1;
  }
  json_object_set_new(ch, "index", json_integer((json_int_t)c->index));
  if (c->j->req.chat) {
    json_t *d = json_object();
    if (role) json_object_set_new(d, "role", json_string("assistant"));
    if (text) json_object_set_new(d, "content", json_stringn(text, len));
    json_object_set_new(ch, "delta", d);
  } else {
    json_object_set_new(ch, "text", json_stringn(text ? text : "", text ? len : 0));
  }
  if (c->lp_stream && c->lp && json_array_size(json_object_get(c->lp, "tokens"))) {
    json_object_set_new(ch, "logprobs", c->j->req.chat ? lp_chat(c->lp) : json_incref(c->lp));
    json_decref(c->lp); /* sent: start a new one */
    c->lp = lp_new();
  } else {
    json_object_set_new(ch, "logprobs", json_null());
  }
  json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
  json_object_set_new(o, "choices", json_pack("[o]", ch));
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  int rc = s ? gw_sse_data(c->sse, s) : -1;
  free(s);
  return rc;
}

/* Released text goes to the stream or the buffer. */
static void emit(choice *c, const char *text, size_t len) {
  if (len == 0 || c->cancelled) return;
  if (c->sse) {
    if (send_delta(c, text, len, NULL, false)) c->cancelled = true;
    return;
  }
  char *q = realloc(c->text, c->len + len + 1);
  if (!q) {
    c->failed = true;
    mbd_error_set(&c->err, MBD_E_NOMEM, "out of memory for the completion text");
    return;
  }
  memcpy(q + c->len, text, len);
  c->len += len;
  q[c->len] = '\0';
  c->text = q;
}

/* Detokenized text through the stop matcher to emit. */
static void release(choice *c, const char *piece, size_t plen) {
  char *out = NULL;
  size_t olen = 0;
  int rc = gw_stop_push(&c->st, piece, plen, &out, &olen);
  if (rc < 0) {
    c->failed = true;
    mbd_error_set(&c->err, MBD_E_NOMEM, "out of memory matching stop strings");
  } else {
    emit(c, out, olen);
    if (rc == 1) c->finish = "stop";
  }
  free(out);
}

static bool is_stop_id(const gw_job *j, int64_t t) {
  for (size_t i = 0; i < j->n_stop_ids; i++)
    if (j->stop_ids[i] == t) return true;
  return false;
}

static void on_token(choice *c, int64_t t) {
  gw_job *j = c->j;
  if (c->finish || c->cancelled || c->failed) return;
  if (c->sse ? gw_sse_gone(c->sse) : gw_peer_gone(j->fd)) {
    c->cancelled = true;
    return;
  }
  if (atomic_load(&j->g->stopping)) {
    c->cancelled = c->shutdown = true;
    return;
  }
  double now = gw_now_s();
  if (c->last_s == 0) {
    if (c->index == 0) gw_metrics_observe(j->g->metrics, j->mi, GW_H_TTFT, now - j->t0);
  } else {
    gw_metrics_observe(j->g->metrics, j->mi, GW_H_ITL, now - c->last_s);
  }
  c->last_s = now;
  if (c->n_toks == c->cap_toks) {
    size_t cap = c->cap_toks ? c->cap_toks * 2 : 64;
    int64_t *q = realloc(c->toks, cap * sizeof *q);
    if (!q) {
      c->failed = true;
      mbd_error_set(&c->err, MBD_E_NOMEM, "out of memory for tokens");
      return;
    }
    c->toks = q;
    c->cap_toks = cap;
  }
  c->toks[c->n_toks++] = t;
  if (is_stop_id(j, t)) {
    c->finish = "stop";
    return;
  }
  char *piece = NULL;
  size_t plen = 0;
  if (mbd_detok_push(c->dt, (int32_t)t, &piece, &plen, &c->err)) {
    c->failed = true;
    free(piece);
    return;
  }
  release(c, piece, plen);
  free(piece);
}

/* Holds tok for the chunk's scoring (streamed logprobs). */
static void hold(choice *c, int64_t tok) {
  if (c->failed) return;
  if (c->n_pend == c->cap_pend) {
    size_t cap = c->cap_pend ? c->cap_pend * 2 : 32;
    int64_t *q = realloc(c->pend, cap * sizeof *q);
    if (!q) {
      c->failed = true;
      mbd_error_set(&c->err, MBD_E_NOMEM, "out of memory for tokens");
      return;
    }
    c->pend = q;
    c->cap_pend = cap;
  }
  c->pend[c->n_pend++] = tok;
}

static void token_cb(void *user, const int64_t *tokens, size_t n) {
  choice *c = user;
  for (size_t i = 0; i < n; i++) {
    if (c->lp_stream)
      hold(c, tokens[i]);
    else
      on_token(c, tokens[i]);
  }
  c->seen += n;
}

/* Streamed logprobs: the shadow session prefills rows (I64 [n]) and keeps
 * the last row as the next prediction; rows_out gets [n,V] when non-NULL. */
static int shadow_prefill(choice *c, const int64_t *ids, size_t n, bool last_only,
                          mbd_tensor_out *rows, gw_err *e) {
  gw_job *j = c->j;
  mbd_error err = {0};
  mbd_route_want pin;
  memset(&pin, 0, sizeof pin);
  snprintf(pin.route_id, sizeof pin.route_id, "%s", j->route);
  int64_t left = j->deadline - gw_now_ms();
  if (left <= 0)
    return gw_err_set(e, 504, "timeout", "deadline_exceeded", NULL,
                      "the request's deadline passed");
  mbd_call_opts co = {.route = &pin, .deadline_ms = left};
  mbd_tensor_desc d;
  int64_t shape[1] = {(int64_t)n};
  mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 1, shape, NULL);
  mbd_tensor_in in = {.desc = d, .data = ids};
  if (mbd_session_prefill(c->ls, &co, &in, last_only, rows, &err))
    return gw_err_from_service(e, &err, "scoring tokens for logprobs");
  int64_t V = rows->desc.shape[rows->desc.ndim - 1];
  if (!c->prev) {
    c->V = V;
    if (!(c->prev = malloc((size_t)V * sizeof *c->prev))) return oom(e);
  }
  if (V != c->V)
    return gw_err_set(e, 500, "server_error", "internal", NULL, "logits of %lld then %lld entries",
                      (long long)c->V, (long long)V);
  memcpy(c->prev, (const float *)rows->data + (rows->nbytes / sizeof(float) - (size_t)V),
         (size_t)V * sizeof(float));
  return 0;
}

/* End of a chunk with streamed logprobs: scores the held tokens, then feeds
 * them on (text, stop matching, events carrying their logprobs). */
static int score_chunk(choice *c, gw_err *e) {
  if (c->n_pend == 0) return 0;
  gw_job *j = c->j;
  mbd_tensor_out rows;
  memset(&rows, 0, sizeof rows);
  float *before = malloc((size_t)c->V * sizeof *before);
  if (!before) return oom(e);
  memcpy(before, c->prev, (size_t)c->V * sizeof *before);
  int rc = shadow_prefill(c, c->pend, c->n_pend, false, &rows, e);
  for (size_t i = 0; rc == 0 && i < c->n_pend; i++) {
    if (!c->finish && !c->cancelled && !c->failed)
      lp_append(j->m, c->lp, i == 0 ? before : (const float *)rows.data + (i - 1) * (size_t)c->V,
                c->V, c->pend[i], j->req.logprobs, &c->lp_off);
    on_token(c, c->pend[i]);
  }
  c->n_pend = 0;
  free(before);
  mbd_tensor_out_release(&rows);
  return rc;
}

/* Prefill + chunked generate on an open session. Service failures go to e. */
static int generate(choice *c, mbd_client *cl, mbd_session *s, gw_err *e) {
  gw_job *j = c->j;
  const gw_request *q = &j->req;
  mbd_error err = {0};
  mbd_route_want pin;
  memset(&pin, 0, sizeof pin);
  snprintf(pin.route_id, sizeof pin.route_id, "%s", j->route);
  mbd_tensor_desc d;
  int64_t shape[1] = {(int64_t)j->n_ids[c->prompt]};
  mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 1, shape, NULL);
  mbd_tensor_in in = {.desc = d, .data = j->ids[c->prompt]};
  mbd_tensor_out lg;
  memset(&lg, 0, sizeof lg);
  int64_t left = j->deadline - gw_now_ms();
  mbd_call_opts co = {.route = &pin, .deadline_ms = left > 0 ? left : 1};
  if (mbd_session_prefill(s, &co, &in, true, &lg, &err))
    return gw_err_from_service(e, &err, "prefilling the prompt");
  mbd_tensor_out_release(&lg);
  gw_metrics_tokens(j->g->metrics, j->mi, (int64_t)j->n_ids[c->prompt], 0);
  if (c->lp_stream) { /* the shadow session: same route, same prompt */
    if (!(c->lcl = gw_client_get(j->g, &err)))
      return gw_err_from_service(e, &err, "connecting to the broker");
    co.deadline_ms = j->deadline - gw_now_ms() > 0 ? j->deadline - gw_now_ms() : 1;
    if (mbd_session_open(c->lcl, &co, j->m->name, &c->ls, &err))
      return gw_err_from_service(e, &err, "opening a session for logprobs");
    if (!(c->lp = lp_new())) return oom(e);
    c->lp_off = j->echo[c->prompt] ? strlen(j->echo[c->prompt]) : 0;
    memset(&lg, 0, sizeof lg);
    int rc = shadow_prefill(c, j->ids[c->prompt], j->n_ids[c->prompt], true, &lg, e);
    mbd_tensor_out_release(&lg);
    if (rc) return rc;
  }
  uint64_t seed = q->seed + (uint64_t)(c->index % (size_t)q->n);
  int64_t remaining = q->max_tokens;
  for (uint64_t k = 0; remaining > 0 && !c->finish && !c->cancelled && !c->failed; k++) {
    mbd_generate_params p;
    mbd_generate_params_init(&p);
    p.max_tokens = remaining < j->g->opt.chunk_tokens ? remaining : j->g->opt.chunk_tokens;
    p.stop = j->stop_ids;
    p.n_stop = j->n_stop_ids;
    p.temperature = q->temperature;
    p.top_p = q->top_p;
    p.seed = k == 0 ? seed : mix64(seed ^ mix64(k));
    left = j->deadline - gw_now_ms();
    if (left <= 0)
      return gw_err_set(e, 504, "timeout", "deadline_exceeded", NULL,
                        "the request's deadline passed after %zu tokens", c->n_toks);
    co.deadline_ms = left;
    int64_t *toks = NULL;
    size_t nt = 0;
    char reason[16];
    c->seen = 0;
    if (mbd_session_generate(s, &co, &p, token_cb, c, &toks, &nt, reason, &err))
      return gw_err_from_service(e, &err, "generating");
    int64_t pb = mbd_client_last_reply(cl)->peak_batch;
    if (pb > 0) gw_metrics_observe(j->g->metrics, j->mi, GW_H_BATCH, (double)pb);
    for (size_t i = c->seen; i < nt; i++) { /* the FINAL's tail */
      if (c->lp_stream)
        hold(c, toks[i]);
      else
        on_token(c, toks[i]);
    }
    free(toks);
    if (c->lp_stream && score_chunk(c, e)) return -1;
    remaining -= (int64_t)nt;
    if (!strcmp(reason, "stop") && !c->finish) c->finish = "stop";
  }
  if (c->failed) return gw_err_set(e, 500, "server_error", "internal", NULL, "%s", c->err.msg);
  if (c->shutdown)
    return gw_err_set(e, 503, "service_unavailable", "shutting_down", NULL,
                      "the gateway is shutting down; the generation stopped after %zu tokens",
                      c->n_toks);
  if (c->cancelled) return 0;
  if (!c->finish) {
    c->finish = "length";
    char *tail = NULL;
    size_t tl = 0;
    if (mbd_detok_flush(c->dt, &tail, &tl, &c->err) == 0) release(c, tail, tl);
    free(tail);
  }
  char *rest = NULL;
  size_t rl = 0;
  if (gw_stop_flush(&c->st, &rest, &rl) == 0) emit(c, rest, rl);
  free(rest);
  return 0;
}

static int run_choice(choice *c, gw_err *e) {
  gw_job *j = c->j;
  mbd_error err = {0};
  if (mbd_detok_new(j->m->tok, false, &c->dt, &err))
    return gw_err_set(e, 500, "server_error", "internal", NULL, "detokenizer: %s", err.msg);
  gw_stop_init(&c->st, j->stops, j->n_stops);
  mbd_client *cl = NULL;
  mbd_session *s = NULL;
  int rc;
  if (j->s0) { /* the session prepare opened */
    cl = j->c0;
    s = j->s0;
    j->c0 = NULL;
    j->s0 = NULL;
    rc = 0;
  } else {
    rc = open_session(j, c->prompt, &cl, &s, e);
  }
  if (rc == 0) {
    if (c->sse && j->echo[c->prompt])
      emit(c, j->echo[c->prompt], strlen(j->echo[c->prompt]));
    else if (!c->sse && j->echo[c->prompt])
      emit(c, j->echo[c->prompt], strlen(j->echo[c->prompt]));
    rc = generate(c, cl, s, e);
  }
  mbd_session_close(&s, NULL);
  gw_client_put(j->g, cl);
  mbd_session_close(&c->ls, NULL);
  gw_client_put(j->g, c->lcl);
  c->lcl = NULL;
  j->completion_tokens += (int64_t)c->n_toks;
  gw_metrics_tokens(j->g->metrics, j->mi, 0, (int64_t)c->n_toks);
  gw_metrics_finished(j->g->metrics, j->mi, rc ? "error" : c->cancelled ? "cancelled" : c->finish);
  return rc;
}

static void choice_free(choice *c) {
  json_decref(c->lp);
  free(c->prev);
  free(c->pend);
  mbd_detok_destroy(&c->dt);
  gw_stop_free(&c->st);
  free(c->text);
  free(c->toks);
}

/* ---- logprobs (completions, buffered) ---------------------------------- */

/* OpenAI's legacy logprobs object for choice c from one FORWARD over prompt +
 * completion: token t's log-probability is read from the row before it. */
static int logprobs(choice *c, json_t **out, gw_err *e) {
  gw_job *j = c->j;
  const gw_model *m = j->m;
  size_t P = j->n_ids[c->prompt], G = c->n_toks, T = P + G;
  int64_t V = mbd_tokenizer_vocab_size(m->tok);
  if (T > 0 && (size_t)V > LOGPROB_MAX_BYTES / 4 / T)
    return gw_err_bad(e, "logprobs",
                      "logprobs over %zu tokens need %zu MiB of logits (limit %zu "
                      "MiB): ask for fewer tokens",
                      T, T * (size_t)V * 4 >> 20, LOGPROB_MAX_BYTES >> 20);
  int64_t *ids = malloc(T * sizeof *ids);
  if (!ids) return oom(e);
  memcpy(ids, j->ids[c->prompt], P * sizeof *ids);
  memcpy(ids + P, c->toks, G * sizeof *ids);
  mbd_error err = {0};
  mbd_client *cl = gw_client_get(j->g, &err);
  if (!cl) {
    free(ids);
    return gw_err_from_service(e, &err, "connecting to the broker");
  }
  mbd_route_want pin;
  memset(&pin, 0, sizeof pin);
  snprintf(pin.route_id, sizeof pin.route_id, "%s", j->route);
  int64_t left = j->deadline - gw_now_ms();
  mbd_call_opts co = {.route = &pin, .deadline_ms = left > 0 ? left : 1};
  mbd_tensor_desc d;
  int64_t shape[2] = {1, (int64_t)T};
  mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 2, shape, NULL);
  mbd_tensor_in in = {.desc = d, .data = ids};
  mbd_tensor_out lg;
  memset(&lg, 0, sizeof lg);
  int rc = mbd_client_forward(cl, &co, m->name, &in, false, NULL, &lg, &err);
  gw_client_put(j->g, cl);
  if (rc) {
    free(ids);
    return gw_err_from_service(e, &err, "computing logprobs");
  }
  int64_t Vl = lg.desc.shape[lg.desc.ndim - 1];
  const float *L = lg.data;
  json_t *lp = lp_new();
  size_t off = 0;
  for (size_t t = j->req.echo ? 0 : P; t < T && lp; t++)
    lp_append(m, lp, t == 0 ? NULL : L + (t - 1) * (size_t)Vl, Vl, ids[t], j->req.logprobs, &off);
  mbd_tensor_out_release(&lg);
  free(ids);
  *out = lp;
  return lp ? 0 : oom(e);
}

/* ---- the two ways to run ------------------------------------------------ */

static json_t *usage(const gw_job *j) {
  return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)j->prompt_tokens,
                   "completion_tokens", (json_int_t)j->completion_tokens, "total_tokens",
                   (json_int_t)(j->prompt_tokens + j->completion_tokens));
}

int gw_job_run(gw_job *j, char **body, gw_err *e) {
  *body = NULL;
  const gw_request *q = &j->req;
  size_t nc = j->n_prompts * (size_t)q->n;
  json_t *choices = json_array();
  int rc = 0;
  for (size_t i = 0; i < nc && rc == 0; i++) {
    choice c;
    memset(&c, 0, sizeof c);
    c.j = j;
    c.index = i;
    c.prompt = i / (size_t)q->n;
    rc = run_choice(&c, e);
    if (rc == 0 && c.cancelled) /* nobody to answer: 499 is for the metrics and the log */
      rc = gw_err_set(e, 499, "client_closed", "client_closed", NULL,
                      "the client closed the connection; generation stopped after %zu tokens",
                      c.n_toks);
    json_t *lp = json_null();
    if (rc == 0 && q->logprobs >= 0) {
      json_decref(lp);
      rc = logprobs(&c, &lp, e);
    }
    if (rc == 0 && q->chat && q->logprobs >= 0) {
      json_t *cl = lp_chat(lp);
      json_decref(lp);
      lp = cl;
    }
    if (rc == 0) {
      json_t *ch;
      json_t *txt = json_stringn(c.text ? c.text : "", c.len);
      if (q->chat)
        ch = json_pack("{s:I,s:{s:s,s:o},s:o,s:s}", "index", (json_int_t)i, "message", "role",
                       "assistant", "content", txt, "logprobs", lp, "finish_reason", c.finish);
      else
        ch = json_pack("{s:I,s:o,s:o,s:s}", "index", (json_int_t)i, "text", txt, "logprobs", lp,
                       "finish_reason", c.finish);
      json_array_append_new(choices, ch);
    } else if (lp) {
      json_decref(lp);
    }
    choice_free(&c);
  }
  if (rc == 0) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", j->id, "object",
                          q->chat ? "chat.completion" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->m->name, "system_fingerprint",
                          j->route, "choices", choices, "usage", usage(j));
    choices = NULL;
    *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!*body) rc = oom(e);
  }
  json_decref(choices);
  if (rc == 0) gw_metrics_observe(j->g->metrics, j->mi, GW_H_E2E, gw_now_s() - j->t0);
  return rc;
}

void gw_job_stream(gw_job *j, gw_sse *s) {
  const gw_request *q = &j->req;
  size_t nc = j->n_prompts * (size_t)q->n;
  gw_err e;
  memset(&e, 0, sizeof e);
  int rc = 0;
  bool gone = false;
  for (size_t i = 0; i < nc && rc == 0 && !gone; i++) {
    choice c;
    memset(&c, 0, sizeof c);
    c.j = j;
    c.index = i;
    c.prompt = i / (size_t)q->n;
    c.sse = s;
    c.lp_stream = q->logprobs >= 0;
    if (q->chat && send_delta(&c, "", 0, NULL, true)) c.cancelled = true;
    if (!c.cancelled) rc = run_choice(&c, &e);
    gone = c.cancelled && !c.shutdown; /* the client left; on shutdown it gets the error */
    if (rc == 0 && !gone && send_delta(&c, NULL, 0, c.finish, false)) gone = true;
    choice_free(&c);
  }
  if (rc) {
    char *js = gw_err_json(&e);
    if (js) gw_sse_data(s, js);
    free(js);
  } else if (!gone && q->include_usage) {
    json_t *o = chunk_head(j);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage(j));
    char *js = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (js) gw_sse_data(s, js);
    free(js);
  }
  if (!gone) gw_sse_data(s, "[DONE]");
  gw_sse_end(s);
  if (rc == 0 && !gone) gw_metrics_observe(j->g->metrics, j->mi, GW_H_E2E, gw_now_s() - j->t0);
}
