/* The batching scheduler: STEP queue, GENERATE loops, one batched backend
 * step per model per tick, deadlines and idle expiry; no sockets, the
 * caller's clock. See scheduler.h. */
#include "worker/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/model/sampler.h"
#include "worker/reply.h"

#define LOGC MBD_WSTATE_LOG

int mbd_wsched_step(mbd_wstate *st, mbd_wsession *s, uint64_t tag, int64_t token,
                    const mbd_tensor_ref *out, mbd_error *err) {
  mbd_wstep *j = calloc(1, sizeof *j);
  if (!j) return mbd_error_set(err, MBD_E_NOMEM, "out of memory queueing a step");
  j->tag = tag;
  snprintf(j->session, sizeof j->session, "%s", s->id);
  j->token = token;
  j->has_out = out != NULL;
  if (out) j->out = *out;
  if (st->q_tail) st->q_tail->next = j;
  else st->q_head = j;
  st->q_tail = j;
  return MBD_OK;
}

int mbd_wsched_check_no_step(const mbd_wstate *st, const mbd_wsession *s, mbd_error *err) {
  for (const mbd_wstep *j = st->q_head; j; j = j->next)
    if (!strcmp(j->session, s->id))
      return mbd_error_set(err, MBD_E_BUSY, "session '%s' has a STEP queued: wait for its reply",
                           s->id);
  return MBD_OK;
}

int mbd_wsched_generate(mbd_wstate *st, mbd_wsession *s, uint64_t tag, const mbd_wreq *q,
                        mbd_error *err) {
  mbd_wsess_data *ws = s->user;
  int rc;
  if (!ws->has_logits)
    return mbd_error_set(err, MBD_E_STATE,
                         "session '%s' has consumed no token yet: PREFILL the prompt first", s->id);
  if ((rc = mbd_wsched_check_no_step(st, s, err))) return rc;
  mbd_wgen *g = calloc(1, sizeof *g);
  if (!g || !(g->tokens = malloc((size_t)q->max_tokens * sizeof *g->tokens))) {
    mbd_wgen_free(g);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld tokens",
                         (long long)q->max_tokens);
  }
  g->tag = tag;
  g->sampling.temperature = (float)q->temperature;
  g->sampling.top_k = q->top_k > INT32_MAX ? INT32_MAX : (int)q->top_k;
  g->sampling.top_p = (float)q->top_p;
  g->sampling.seed = q->seed;
  if ((rc = mbd_sampling_check(&g->sampling, err))) {
    mbd_wgen_free(g);
    return rc;
  }
  g->max_tokens = q->max_tokens;
  memcpy(g->stop, q->stop, q->nstop * sizeof *q->stop);
  g->nstop = q->nstop;
  g->partial_every = q->partial_every;
  g->deadline = q->deadline_ms > 0 ? mbd_wstate_now(st) + (double)q->deadline_ms / 1000.0 : 0;
  ws->gen = g;
  s->busy = true;
  st->ngen++;
  return MBD_OK;
}

bool mbd_wsched_pending(const mbd_wstate *st) { return st->q_head != NULL || st->ngen > 0; }

uint64_t mbd_wsched_load(const mbd_wstate *st) {
  return (uint64_t)st->ngen + (st->q_head ? 1u : 0u);
}

size_t mbd_wsched_expire(mbd_wstate *st) {
  return mbd_wsession_expire(st->sessions, mbd_wstate_now(st), st->o.session_idle_s);
}

/* Ends s's GENERATE: FINAL with `reason`, or ERROR `fail` when non-NULL. */
static void gen_finish(mbd_wstate *st, mbd_wsession *s, const char *reason,
                       const mbd_error *fail) {
  mbd_wsess_data *ws = s->user;
  mbd_wgen *g = ws->gen;
  if (fail) mbd_wreply_err(st, g->tag, fail);
  else mbd_wreply_gen_final(st, g->tag, g->tokens, g->n, reason, g->peak_batch);
  mbd_wgen_free(g);
  ws->gen = NULL;
  if (ws->logits_stale) { /* ended early (deadline, error): last logits never came back */
    ws->has_logits = false;
    ws->logits_stale = false;
  }
  s->busy = false;
  s->last_used = mbd_wstate_now(st);
  st->ngen--;
}

static void gen_partial(mbd_wstate *st, mbd_wgen *g) {
  mbd_wreply_gen_partial(st, g->tag, g->tokens + g->sent, g->n - g->sent);
  g->sent = g->n;
}

static bool in_batch(const mbd_wrow *rows, size_t n, const mbd_wsession *s) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].s == s) return true;
  return false;
}

/* Why the GENERATE loop ends after the step that consumes `tok`: "stop",
 * "length", or NULL while it goes on. */
static const char *gen_end_reason(const mbd_wgen *g, int64_t tok) {
  for (size_t k = 0; k < g->nstop; k++)
    if (g->stop[k] == tok) return "stop";
  return g->n >= g->max_tokens ? "length" : NULL;
}

/* Whether row r's logits must reach its session after this step: always
 * unless its next token is picked on the device (dev_pick and a greedy
 * GENERATE row that goes on), so a session's logits are current whenever it
 * is not generating. */
static bool row_needs_logits(const mbd_wrow *r, bool dev_pick) {
  if (!dev_pick || r->step) return true;
  const mbd_wgen *g = ((const mbd_wsess_data *)r->s->user)->gen;
  return g->sampling.temperature > 0.0f || gen_end_reason(g, r->token) != NULL;
}

/* One batched step for model mi over queued STEPs and active GENERATE loops.
 * Returns the number of rows run. */
static size_t tick_model(mbd_wstate *st, int mi, double now) {
  mbd_wmodel *m = &st->models[mi];
  size_t maxb = (size_t)st->o.max_batch, n = 0, cap = mbd_wsession_capacity(st->sessions);
  /* GENERATE loops first (round-robin start for fairness when over max-batch). */
  for (size_t k = 0; k < cap && n < maxb && st->ngen; k++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, (st->rr + k) % cap);
    if (!s || s->model != mi || !((mbd_wsess_data *)s->user)->gen) continue;
    mbd_wsess_data *ws = s->user;
    mbd_wgen *g = ws->gen;
    if (g->deadline > 0 && now > g->deadline) {
      mbd_error e;
      mbd_error_set(&e, MBD_E_TIMEOUT,
                    "generate passed its deadline after %lld of %lld tokens (raise deadline_ms)",
                    (long long)g->n, (long long)g->max_tokens);
      gen_finish(st, s, NULL, &e);
      continue;
    }
    int32_t tok = 0;
    mbd_error e = {0};
    if (g->has_next) { /* greedy, picked on the device by the previous step */
      tok = (int32_t)g->next;
      g->has_next = false;
    } else if (mbd_sampler_pick(m->sampler, &g->sampling, (uint64_t)g->n, ws->logits, &tok, &e)) {
      gen_finish(st, s, NULL, &e);
      continue;
    }
    g->tokens[g->n++] = tok;
    st->rows[n++] = (mbd_wrow){.s = s, .token = tok, .step = NULL};
  }
  /* Then queued STEPs in arrival order, one per session per tick. */
  mbd_wstep **pp = &st->q_head, *prev = NULL;
  while (*pp && n < maxb) {
    mbd_wstep *j = *pp;
    mbd_wsession *s = NULL;
    mbd_error e = {0};
    if (mbd_wsession_find(st->sessions, j->session, &s, &e)) { /* closed/expired meanwhile */
      *pp = j->next;
      if (st->q_tail == j) st->q_tail = prev;
      mbd_wreply_err(st, j->tag, &e);
      free(j);
      continue;
    }
    if (s->model != mi || in_batch(st->rows, n, s)) {
      prev = j;
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    if (st->q_tail == j) st->q_tail = prev;
    j->next = NULL;
    st->rows[n++] = (mbd_wrow){.s = s, .token = j->token, .step = j};
  }
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    st->bstates[i] = (mbd_bstate *)st->rows[i].s->state;
    st->btokens[i] = st->rows[i].token;
  }
  /* Greedy GENERATE rows may take their next token from the device; logits
   * then come to the host only when a row needs them: STEP replies, sampled
   * rows, and rows finishing this tick (so a session's logits are current
   * whenever it is not generating). */
  bool dev_pick = false, need_logits = false;
  if (st->be->ops->step_greedy) {
    for (size_t i = 0; i < n; i++) {
      mbd_wrow *r = &st->rows[i];
      const mbd_wsess_data *ws = r->s->user;
      if (!r->step && ws->gen->sampling.temperature <= 0.0f) dev_pick = true;
    }
    for (size_t i = 0; i < n && dev_pick && !need_logits; i++)
      need_logits = row_needs_logits(&st->rows[i], true);
  }
  mbd_error e = {0};
  int rc = dev_pick ? st->be->ops->step_greedy(st->be, m->bm, st->bstates, st->btokens,
                                                (int64_t)n, st->bnext,
                                                need_logits ? st->blogits : NULL, &e)
                    : st->be->ops->step(st->be, m->bm, st->bstates, st->btokens, (int64_t)n,
                                        st->blogits, &e);
  bool have_logits = !dev_pick || need_logits;
  double t = mbd_wstate_now(st);
  for (size_t i = 0; i < n; i++) {
    mbd_wrow *r = &st->rows[i];
    mbd_wsess_data *ws = r->s->user;
    const float *row = st->blogits + i * (size_t)m->vocab;
    r->s->last_used = t;
    /* Only rows that need them copy their logits out: a tick where a few
     * rows finish must not copy [n,V] into every session (V floats each). */
    if (!rc && have_logits && row_needs_logits(r, dev_pick)) {
      memcpy(ws->logits, row, (size_t)m->vocab * sizeof(float));
      ws->has_logits = true;
      ws->logits_stale = false;
    } else if (!rc) {
      ws->logits_stale = true;
    }
    if (r->step) {
      if (rc) mbd_wreply_err(st, r->step->tag, &e);
      else mbd_wreply_step_logits(st, r->step->tag, r->step->has_out ? &r->step->out : NULL, row,
                                  m->vocab);
      free(r->step);
      continue;
    }
    mbd_wgen *g = ws->gen;
    if (rc) {
      gen_finish(st, r->s, NULL, &e);
      continue;
    }
    if ((int64_t)n > g->peak_batch) g->peak_batch = (int64_t)n;
    if (dev_pick && g->sampling.temperature <= 0.0f) {
      g->next = st->bnext[i];
      g->has_next = true;
    }
    const char *end = gen_end_reason(g, r->token);
    if (end) gen_finish(st, r->s, end, NULL);
    else if (g->n - g->sent >= g->partial_every) gen_partial(st, g);
  }
  if (rc) MBD_LOGE(LOGC, "batched step of %zu rows failed: %s", n, e.msg);
  return n;
}

bool mbd_wsched_tick(mbd_wstate *st) {
  double now = mbd_wstate_now(st);
  for (int mi = 0; mi < st->nmodels; mi++) tick_model(st, mi, now);
  st->rr++;
  return mbd_wsched_pending(st);
}

void mbd_wsched_fail_pending(mbd_wstate *st, const char *why) {
  while (st->q_head) {
    mbd_wstep *j = st->q_head;
    st->q_head = j->next;
    mbd_wreply_error(st, j->tag, MBD_E_STATE, why);
    free(j);
  }
  st->q_tail = NULL;
  for (size_t i = 0; i < mbd_wsession_capacity(st->sessions) && st->ngen; i++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, i);
    if (s && ((mbd_wsess_data *)s->user)->gen) {
      mbd_error e;
      mbd_error_set(&e, MBD_E_STATE, "%s", why);
      gen_finish(st, s, NULL, &e);
    }
  }
}
