/* The batching scheduler: STEP queue, GENERATE loops, one batched backend
 * step per model per tick, deadlines and idle expiry; no sockets, the
 * caller's clock. See scheduler.h. */
#include "worker/scheduler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/model/sampler.h"
#include "worker/checkpoint.h"
#include "worker/prefix_job.h"
#include "worker/reply.h"

#define LOGC MBD_WSTATE_LOG
#define REPORT_MIN_BATCHES 100 /* busy periods shorter than this are not logged */

int mbd_wsched_step(mbd_wstate *st, mbd_wsession *s, uint64_t tag, int64_t token,
                    const mbd_tensor_ref *out, mbd_error *err) {
  return mbd_wsched_step_until(st, s, tag, token, out, 0, err);
}

int mbd_wsched_step_until(mbd_wstate *st, mbd_wsession *s, uint64_t tag, int64_t token,
                          const mbd_tensor_ref *out, double deadline, mbd_error *err) {
  mbd_wstep *j = calloc(1, sizeof *j);
  if (!j) return mbd_error_set(err, MBD_E_NOMEM, "out of memory queueing a step");
  j->tag = tag;
  j->deadline = deadline;
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

static const char *gen_end_reason(const mbd_wgen *g, int64_t tok);

int mbd_wsched_generate(mbd_wstate *st, mbd_wsession *s, uint64_t tag, const mbd_wreq *q,
                        mbd_error *err) {
  return mbd_wsched_generate_resume(st, s, tag, q, NULL, 0, err);
}

int mbd_wsched_generate_resume(mbd_wstate *st, mbd_wsession *s, uint64_t tag, const mbd_wreq *q,
                               const int64_t *done, int64_t ndone, mbd_error *err) {
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
  if ((g->has_out = q->noutputs > 0)) g->out = q->outputs[0];
  g->deadline = q->deadline_ms > 0 ? mbd_wstate_now(st) + (double)q->deadline_ms / 1000.0 : 0;
  if (ndone > 0) {
    memcpy(g->tokens, done, (size_t)ndone * sizeof *done);
    g->n = g->sent = ndone;
    if (gen_end_reason(g, done[ndone - 1])) { /* it ended before its FINAL was lost */
      mbd_wreply_gen_final(st, tag, g->tokens, g->n, gen_end_reason(g, done[ndone - 1]), 1,
                           g->has_out ? &g->out : NULL);
      mbd_wgen_free(g);
      return MBD_OK;
    }
  }
  /* The first token comes from the session's logits, which are current
   * now: picked here, the batch that takes it need not wait for it. A
   * failing pick is left to that batch, which answers the error. */
  int32_t tok = 0;
  if (!mbd_sampler_pick(st->models[s->model].sampler, &g->sampling, (uint64_t)g->n, ws->logits,
                        &tok, NULL)) {
    g->next = tok;
    g->has_next = true;
  }
  ws->gen = g;
  s->busy = true;
  st->ngen++;
  return MBD_OK;
}

bool mbd_wsched_pending(const mbd_wstate *st) {
  return st->q_head != NULL || st->ngen > 0 || st->j_head != NULL || st->fly != NULL;
}

uint64_t mbd_wsched_load(const mbd_wstate *st) {
  return (uint64_t)st->ngen + (uint64_t)st->njobs + (st->q_head ? 1u : 0u);
}

size_t mbd_wsched_expire(mbd_wstate *st) {
  mbd_wsched_flush(st);
  mbd_wckpt_expiring(st, mbd_wstate_now(st), st->o.session_idle_s);
  return mbd_wsession_expire(st->sessions, mbd_wstate_now(st), st->o.session_idle_s);
}

/* Ends s's GENERATE: FINAL with `reason`, or ERROR `fail` when non-NULL. */
static void gen_finish(mbd_wstate *st, mbd_wsession *s, const char *reason,
                       const mbd_error *fail) {
  mbd_wsess_data *ws = s->user;
  mbd_wgen *g = ws->gen;
  if (fail) mbd_wreply_err(st, g->tag, fail);
  else mbd_wreply_gen_final(st, g->tag, g->tokens, g->n, reason, g->peak_batch,
                            g->has_out ? &g->out : NULL);
  mbd_wgen_free(g);
  ws->gen = NULL;
  if (ws->logits_stale) { /* ended early (deadline, error): last logits never came back */
    ws->has_logits = false;
    ws->logits_stale = false;
  }
  s->busy = false;
  s->last_used = mbd_wstate_now(st);
  st->ngen--;
  mbd_wckpt_settle(st, s);
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

/* Ends s's loop with ERROR e: now, or with the host work of the batch that
 * still holds its last row (its PARTIAL goes out first). */
static void gen_fail(mbd_wstate *st, mbd_wsession *s, const mbd_error *e) {
  mbd_wgen *g = ((mbd_wsess_data *)s->user)->gen;
  if (!g->posting) {
    gen_finish(st, s, NULL, e);
    return;
  }
  g->over = 2;
  g->fail = *e;
}

/* Whether row r's logits must reach its session after this step: always
 * unless its next token is picked on the device (dev_pick and a greedy
 * GENERATE row that goes on (r->end set) and is not due for a checkpoint),
 * so a session's logits are current whenever it is not generating. */
static bool row_needs_logits(const mbd_wstate *st, const mbd_wrow *r, bool dev_pick) {
  if (!dev_pick || r->step) return true;
  const mbd_wgen *g = ((const mbd_wsess_data *)r->s->user)->gen;
  return g->sampling.temperature > 0.0f || r->end != NULL ||
         mbd_wckpt_due_tokens(st, r->s, 1); /* a checkpoint after this step needs them */
}

/* Takes model mi's next batch into b: running GENERATE loops first (session
 * slots in round-robin order), then queued STEPs in arrival order, one per
 * session. It may run while the launched batch computes: a loop whose row
 * there ends it is left out, and loops get their tokens afterwards
 * (batch_tokens), from that batch's picks. Returns the rows taken. */
static size_t batch_build(mbd_wstate *st, mbd_wbatch *b, int mi, double now) {
  size_t maxb = (size_t)st->o.max_batch, n = 0, cap = mbd_wsession_capacity(st->sessions);
  b->model = mi;
  for (size_t k = 0, slot = st->rr % (cap ? cap : 1); k < cap && n < maxb && st->ngen;
       k++, slot = slot + 1 == cap ? 0 : slot + 1) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, slot);
    if (!s || s->model != mi || !((mbd_wsess_data *)s->user)->gen) continue;
    mbd_wsess_data *ws = s->user;
    mbd_wgen *g = ws->gen;
    if (g->over) continue; /* answered with its last batch's host work */
    if (g->posting && gen_end_reason(g, g->tokens[g->n - 1])) continue; /* ends with it */
    if (g->deadline > 0 && now > g->deadline) {
      mbd_error e;
      mbd_error_set(&e, MBD_E_TIMEOUT,
                    "generate passed its deadline after %lld of %lld tokens (raise deadline_ms)",
                    (long long)g->n, (long long)g->max_tokens);
      gen_fail(st, s, &e);
      continue;
    }
    b->rows[n++] = (mbd_wrow){.s = s, .token = -1, .step = NULL};
  }
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
    if (j->deadline > 0 && now > j->deadline) { /* nobody waits for this answer any more */
      *pp = j->next;
      if (st->q_tail == j) st->q_tail = prev;
      mbd_wreply_error(st, j->tag, MBD_E_TIMEOUT,
                       "step passed its deadline while queued behind other work (raise deadline_ms)");
      free(j);
      continue;
    }
    if (s->model != mi || in_batch(b->rows, n, s)) {
      prev = j;
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    if (st->q_tail == j) st->q_tail = prev;
    j->next = NULL;
    b->rows[n++] = (mbd_wrow){.s = s, .token = j->token, .step = j};
  }
  b->n = n;
  return n;
}

/* Puts b's STEPs back at the head of the queue, in their order, and empties
 * b (built before a launched batch failed: its loops are over now). */
static void batch_unbuild(mbd_wstate *st, mbd_wbatch *b) {
  for (size_t i = b->n; i-- > 0;) {
    mbd_wstep *j = b->rows[i].step;
    if (!j) continue;
    j->next = st->q_head;
    st->q_head = j;
    if (!st->q_tail) st->q_tail = j;
  }
  b->n = 0;
}

/* Gives each GENERATE row of b its token: the one already picked (by the
 * device in the last step, or at attach), or one sampled from its session's
 * logits; a failing pick ends its loop and drops the row. Returns the rows. */
static size_t batch_tokens(mbd_wstate *st, mbd_wbatch *b) {
  mbd_wmodel *m = &st->models[b->model];
  size_t n = 0;
  for (size_t i = 0; i < b->n; i++) {
    mbd_wrow r = b->rows[i];
    if (!r.step) {
      mbd_wsess_data *ws = r.s->user;
      mbd_wgen *g = ws->gen;
      int32_t tok = 0;
      mbd_error e = {0};
      if (g->has_next) {
        tok = (int32_t)g->next;
        g->has_next = false;
      } else if (mbd_sampler_pick(m->sampler, &g->sampling, (uint64_t)g->n, ws->logits, &tok,
                                  &e)) {
        gen_fail(st, r.s, &e);
        continue;
      }
      g->tokens[g->n++] = tok;
      r.token = tok;
    }
    b->rows[n++] = r;
  }
  b->n = n;
  return n;
}

/* Launches b on the backend. Greedy GENERATE rows may take their next token
 * from the device; logits then come to the host only for the rows that need
 * them (STEP replies, sampled rows, rows finishing this step), which go
 * first in the backend's batch so that only their rows are copied. */
static void batch_launch(mbd_wstate *st, mbd_wbatch *b) {
  mbd_wmodel *m = &st->models[b->model];
  bool dev_pick = false;
  if (mbd_backend_picks(st->be))
    for (size_t i = 0; i < b->n && !dev_pick; i++) {
      const mbd_wrow *r = &b->rows[i];
      dev_pick = !r->step && ((mbd_wsess_data *)r->s->user)->gen->sampling.temperature <= 0.0f;
    }
  size_t nl = 0;
  for (size_t i = 0; i < b->n; i++) {
    mbd_wrow *r = &b->rows[i];
    if (!r->step) {
      const mbd_wgen *g = ((const mbd_wsess_data *)r->s->user)->gen;
      r->end = gen_end_reason(g, r->token);
      r->upto = g->n;
    }
    r->need_logits = row_needs_logits(st, r, dev_pick);
    r->copied = false;
    nl += r->need_logits;
  }
  size_t lo = 0, hi = nl;
  for (size_t i = 0; i < b->n; i++) {
    mbd_wrow *r = &b->rows[i];
    mbd_wsess_data *ws = r->s->user;
    r->pos = r->need_logits ? lo++ : hi++;
    b->states[r->pos] = (mbd_bstate *)r->s->state;
    b->tokens[r->pos] = r->token;
    ws->fresh = false;
    ws->inflight = true;
    if (!r->step) ws->gen->posting++;
  }
  b->dev_pick = dev_pick;
  b->nlogits = nl;
  memset(&b->err, 0, sizeof b->err);
  b->rc = mbd_backend_step_launch(st->be, m->bm, b->states, b->tokens, (int64_t)b->n,
                                  dev_pick ? b->next : NULL, b->logits, (int64_t)nl, &b->err);
  b->in_flight = b->rc == MBD_OK;
  st->fly = b;
}

/* Row r's logits (batch b) into its session: the flags, and the bytes
 * unless `late` (the caller copies them afterwards). */
static void row_logits(const mbd_wstate *st, const mbd_wbatch *b, mbd_wrow *r, bool late) {
  mbd_wsess_data *ws = r->s->user;
  int64_t V = st->models[b->model].vocab;
  if (!late) memcpy(ws->logits, b->logits + r->pos * (size_t)V, (size_t)V * sizeof(float));
  ws->has_logits = true;
  ws->logits_stale = false;
  r->copied = !late;
}

/* Waits for the launched batch b and takes from it what the next batch
 * needs: each loop's next token (or the logits a sampled one picks from),
 * whether it goes on, and whether a PARTIAL is due. Sends nothing. */
static void batch_settle(mbd_wstate *st, mbd_wbatch *b) {
  double t0 = mbd_wstate_now(st);
  if (b->in_flight) b->rc = mbd_backend_step_wait(st->be, &b->err);
  b->in_flight = false;
  st->fly = NULL;
  double t = mbd_wstate_now(st);
  st->prof.wait += t - t0;
  for (size_t i = 0; i < b->n; i++) {
    mbd_wrow *r = &b->rows[i];
    mbd_wsess_data *ws = r->s->user;
    ws->inflight = false;
    if (r->step) continue;
    mbd_wgen *g = ws->gen;
    if (b->rc) {
      g->over = 2;
      g->fail = b->err;
    } else if (r->end) {
      g->over = 1;
      g->end = r->end;
    } else {
      if (b->dev_pick && g->sampling.temperature <= 0.0f) {
        g->next = b->next[r->pos];
        g->has_next = true;
      }
      if (r->need_logits) row_logits(st, b, r, false); /* the next pick reads them */
    }
  }
  st->prof.settle += mbd_wstate_now(st) - t;
}

/* The host work after batch b (settled): STEP replies, PARTIALs, the FINAL
 * or ERROR of each loop that is over, and logits into the sessions: after
 * the replies (nothing reads them before this returns; a tick where many
 * loops end copies [n,V]), unless a checkpoint at a loop's end reads them. */
static void batch_post(mbd_wstate *st, mbd_wbatch *b) {
  double t0 = mbd_wstate_now(st);
  int64_t V = st->models[b->model].vocab;
  bool late = !mbd_wckpt_enabled(st);
  double t = mbd_wstate_now(st);
  for (size_t i = 0; i < b->n; i++) {
    mbd_wrow *r = &b->rows[i];
    mbd_wsess_data *ws = r->s->user;
    r->s->last_used = t;
    if (!b->rc) {
      mbd_wckpt_consumed(r->s, 1);
      if (!r->need_logits) ws->logits_stale = true;
      else if (!r->copied) row_logits(st, b, r, late);
    }
    if (r->step) {
      if (b->rc) mbd_wreply_err(st, r->step->tag, &b->err);
      else mbd_wreply_step_logits(st, r->step->tag, r->step->has_out ? &r->step->out : NULL,
                                  b->logits + r->pos * (size_t)V, V);
      free(r->step);
      continue;
    }
    mbd_wgen *g = ws->gen;
    g->posting--;
    if (!b->rc && (int64_t)b->n > g->peak_batch) g->peak_batch = (int64_t)b->n;
    if (!b->rc && !r->end && r->upto - g->sent >= g->partial_every) {
      mbd_wreply_gen_partial(st, g->tag, g->tokens + g->sent, r->upto - g->sent);
      g->sent = r->upto;
    }
    if (g->over == 1) gen_finish(st, r->s, g->end, NULL);
    else if (g->over == 2) gen_finish(st, r->s, NULL, &g->fail);
  }
  for (size_t i = 0; i < b->n && late && !b->rc; i++) {
    mbd_wrow *r = &b->rows[i];
    if (r->need_logits && !r->copied)
      memcpy(((mbd_wsess_data *)r->s->user)->logits, b->logits + r->pos * (size_t)V,
             (size_t)V * sizeof(float));
  }
  if (b->rc) MBD_LOGE(LOGC, "batched step of %zu rows failed: %s", b->n, b->err.msg);
  b->n = 0;
  st->prof.post += mbd_wstate_now(st) - t0;
}

void mbd_wsched_report(mbd_wstate *st) {
  mbd_wprof *p = &st->prof;
  if (p->batches >= REPORT_MIN_BATCHES) {
    double wall = mbd_wstate_now(st) - p->start;
    MBD_LOGI(LOGC,
             "%" PRIu64 " batched steps of %.1f rows on average in %.1f ms: choosing the next "
             "batch %.1f ms, waiting for the device %.1f ms, then results %.1f ms and tokens + "
             "launch %.1f ms, replies %.1f ms (overlap %s: choosing and replies while a batch "
             "computes)",
             p->batches, (double)p->rows / (double)p->batches, wall * 1e3, p->build * 1e3,
             p->wait * 1e3, p->settle * 1e3, p->launch * 1e3, p->post * 1e3,
             st->pipeline ? "on" : "off");
  }
  memset(p, 0, sizeof *p);
}

void mbd_wsched_flush(mbd_wstate *st) {
  mbd_wbatch *b = st->fly;
  if (!b) return;
  batch_settle(st, b);
  batch_post(st, b);
}

/* One batched step for model mi: mi's next batch is chosen while the
 * launched one (of any model) computes, then that one is waited for, the
 * new one gets its tokens and is launched, and then the first one's host
 * work runs while the second computes. Without st->pipeline the new batch
 * is also finished here. Returns the number of rows launched. */
static size_t tick_model(mbd_wstate *st, int mi, double now) {
  mbd_wbatch *prev = st->fly;
  mbd_wbatch *b = prev == &st->batch[0] ? &st->batch[1] : &st->batch[0];
  double t0 = mbd_wstate_now(st);
  size_t n = batch_build(st, b, mi, now);
  st->prof.build += mbd_wstate_now(st) - t0;
  if (prev) {
    batch_settle(st, prev);
    if (prev->rc) { /* its loops are over: choose again */
      batch_unbuild(st, b);
      n = batch_build(st, b, mi, now);
    }
  }
  t0 = mbd_wstate_now(st);
  if (n) n = batch_tokens(st, b);
  if (n) {
    batch_launch(st, b);
    if (!st->prof.batches++) st->prof.start = t0;
    st->prof.rows += n;
  }
  st->prof.launch += mbd_wstate_now(st) - t0;
  if (prev) batch_post(st, prev);
  if (n && !st->pipeline) mbd_wsched_flush(st);
  return n;
}

/* ---- sliced jobs (FORWARD, PREFILL) ------------------------------------- */

void mbd_wsched_job(mbd_wstate *st, mbd_wjob *j) {
  j->next = NULL;
  if (st->j_tail) st->j_tail->next = j;
  else st->j_head = j;
  st->j_tail = j;
  st->njobs++;
}

/* Unlinks j (prev is its predecessor or NULL). */
static void job_unlink(mbd_wstate *st, mbd_wjob *j, mbd_wjob *prev) {
  if (prev) prev->next = j->next;
  else st->j_head = j->next;
  if (st->j_tail == j) st->j_tail = prev;
  j->next = NULL;
  st->njobs--;
}

/* The session of a PREFILL job, or NULL when it is gone. */
static mbd_wsession *job_session(mbd_wstate *st, const mbd_wjob *j) {
  mbd_wsession *s = NULL;
  if (j->cmd != MBD_CMD_PREFILL || mbd_wsession_find(st->sessions, j->session, &s, NULL)) return NULL;
  return s;
}

/* Ends j (unlinked): its FINAL when fail is NULL, else ERROR fail. A PREFILL's
 * session becomes free again; it keeps the tokens consumed so far. */
static void job_finish(mbd_wstate *st, mbd_wjob *j, const mbd_error *fail) {
  mbd_wsession *s = job_session(st, j);
  if (s) {
    s->busy = false;
    s->last_used = mbd_wstate_now(st);
  }
  if (fail) {
    mbd_wreply_err(st, j->tag, fail);
  } else if (!j->out) { /* written in place into the client's device memory */
    mbd_wreply_tensor(st, j->q, j->tag, "logits", &j->ld, NULL);
  } else if (j->q->noutputs && j->q->outputs[0].kind == MBD_TREF_SHM) {
    /* The mapping is resolved again now: the cache may have dropped it between slices. */
    void *dst = NULL;
    mbd_error e = {0};
    size_t nb = 0;
    mbd_tensor_desc_nbytes(&j->ld, &nb, NULL);
    if (mbd_wreq_output(&j->q->outputs[0], &j->ld, st->shm, &dst, &e)) {
      mbd_wreply_err(st, j->tag, &e);
    } else {
      memcpy(dst, j->out, nb);
      mbd_wreply_tensor(st, j->q, j->tag, "logits", &j->ld, NULL);
    }
  } else {
    mbd_wreply_tensor(st, j->q, j->tag, "logits", &j->ld, j->out);
    j->out = NULL;
  }
  if (s) mbd_wckpt_settle(st, s); /* after the reply: the broker has heard of the prefill */
  mbd_wjob_free(j);
}

/* Runs one slice of j: FORWARD rows [done, done + r) with r * T <= slice
 * tokens (at least one row), or the next PREFILL chunk of <= slice tokens.
 * Returns 1 when j is complete, 0 when more remains, or a status. */
static int job_slice(mbd_wstate *st, mbd_wjob *j, mbd_error *err) {
  mbd_wmodel *m = &st->models[j->model];
  int64_t budget = st->o.slice_tokens > 0 ? st->o.slice_tokens : 512;
  size_t V = (size_t)m->vocab;
  float *out = j->out;
  int rc;
  /* A CUDA IPC output is resolved again for every slice: other requests may
   * have turned the backend's handle cache over since the last one. */
  if (!out) {
    bool on_device;
    if ((rc = mbd_wreq_output_at(st->be, st->shm, &j->q->outputs[0], &j->ld, (void **)&out,
                                 &on_device, err)))
      return rc;
  }
  if (j->cmd == MBD_CMD_FORWARD) {
    int64_t r = budget / j->T;
    if (r < 1) r = 1;
    if (r > j->B - j->done) r = j->B - j->done;
    size_t per_row = j->last_only ? V : (size_t)j->T * V;
    rc = st->be->ops->forward(st->be, m->bm, j->ids + j->done * j->T, r, j->T, j->last_only,
                              out + (size_t)j->done * per_row, err);
    if (rc) return rc;
    j->done += r;
    return j->done >= j->B;
  }
  mbd_wsession *s = job_session(st, j);
  if (!s) return mbd_error_set(err, MBD_E_NOT_FOUND, "session '%s' closed during its prefill", j->session);
  mbd_wsess_data *ws = s->user;
  if (!j->pfx_begun && (rc = mbd_wpfx_begin(st, j, s, err))) return rc;
  if (j->done >= j->T) return 1; /* the whole prompt was a cached prefix */
  int64_t c = mbd_wpfx_chunk(j, j->T - j->done < budget ? j->T - j->done : budget);
  /* last_only: every chunk writes its [1,V] to out; the final chunk's stays. */
  float *dst = j->last_only ? out : out + (size_t)j->done * V;
  rc = st->be->ops->prefill(st->be, m->bm, (mbd_bstate *)s->state, j->ids + j->done, c,
                            j->last_only, dst, err);
  if (rc) return rc;
  j->done += c;
  mbd_wckpt_consumed(s, c);
  /* The session's logits follow every chunk, so a prefill stopped between
   * chunks leaves a session that continues from the tokens it consumed. */
  const float *last = j->last_only ? dst : dst + (size_t)(c - 1) * V;
  if (j->out) memcpy(ws->logits, last, V * sizeof(float));
  else if ((rc = mbd_wreq_output_get(st->be, &j->q->outputs[0], (uint64_t)(last - out) * 4,
                                     ws->logits, V * sizeof(float), err))) {
    ws->has_logits = false; /* the state moved on without them: GENERATE must not use old ones */
    return rc;
  }
  ws->has_logits = true;
  ws->logits_stale = false;
  mbd_wpfx_after(st, j, s, ws->logits);
  return j->done >= j->T;
}

/* One slice of the job at the head, which then goes to the tail (jobs take
 * turns). A job past its deadline ends with TIMEOUT before its next slice. */
static void tick_job(mbd_wstate *st, double now) {
  mbd_wjob *j = st->j_head;
  if (!j) return;
  job_unlink(st, j, NULL);
  mbd_error e = {0};
  if (j->deadline > 0 && now > j->deadline) {
    if (j->cmd == MBD_CMD_PREFILL)
      mbd_error_set(&e, MBD_E_TIMEOUT,
                    "prefill passed its deadline after %lld of %lld tokens (the session holds "
                    "those; raise deadline_ms or send shorter prefills)",
                    (long long)j->done, (long long)j->T);
    else
      mbd_error_set(&e, MBD_E_TIMEOUT,
                    "forward passed its deadline after %lld of %lld rows (raise deadline_ms or "
                    "split the batch)",
                    (long long)j->done, (long long)j->B);
    job_finish(st, j, &e);
    return;
  }
  int rc = job_slice(st, j, &e);
  if (rc < 0) {
    MBD_LOGW(LOGC, "%s failed: %s", mbd_cmd_name(j->cmd), e.msg);
    job_finish(st, j, &e);
  } else if (rc == 1) {
    job_finish(st, j, NULL);
  } else {
    mbd_wsched_job(st, j);
  }
}

bool mbd_wsched_tick(mbd_wstate *st) {
  double now = mbd_wstate_now(st);
  for (int mi = 0; mi < st->nmodels; mi++) tick_model(st, mi, now);
  st->rr++;
  tick_job(st, mbd_wstate_now(st));
  mbd_wckpt_tick(st);
  return mbd_wsched_pending(st);
}

bool mbd_wsched_cancel(mbd_wstate *st, uint64_t tag, int code, const char *why) {
  mbd_wsched_flush(st);
  mbd_error e;
  mbd_error_set(&e, code, "%s", why);
  for (mbd_wjob *j = st->j_head, *prev = NULL; j; prev = j, j = j->next) {
    if (j->tag != tag) continue;
    job_unlink(st, j, prev);
    job_finish(st, j, &e);
    return true;
  }
  for (mbd_wstep **pp = &st->q_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
    mbd_wstep *j = *pp;
    if (j->tag != tag) continue;
    *pp = j->next;
    if (st->q_tail == j) st->q_tail = prev;
    mbd_wreply_err(st, tag, &e);
    free(j);
    return true;
  }
  for (size_t i = 0; i < mbd_wsession_capacity(st->sessions) && st->ngen; i++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, i);
    mbd_wgen *g = s ? ((mbd_wsess_data *)s->user)->gen : NULL;
    if (g && g->tag == tag) {
      gen_finish(st, s, NULL, &e);
      return true;
    }
  }
  return false;
}

/* Leaves s's GENERATE to the broker, which re-homes durable sessions when
 * this worker disconnects and continues the loop elsewhere: the unsent
 * tokens go out as a PARTIAL, then a checkpoint; the loop gets no reply. */
static void gen_hand_over(mbd_wstate *st, mbd_wsession *s) {
  mbd_wsess_data *ws = s->user;
  mbd_wgen *g = ws->gen;
  if (g->sent < g->n) gen_partial(st, g);
  mbd_wgen_free(g);
  ws->gen = NULL;
  s->busy = false;
  s->last_used = mbd_wstate_now(st);
  st->ngen--;
  mbd_wckpt_emit(st, s);
}

void mbd_wsched_stop_generates(mbd_wstate *st, const char *why) {
  mbd_wsched_flush(st);
  for (size_t i = 0; i < mbd_wsession_capacity(st->sessions) && st->ngen; i++) {
    mbd_wsession *s = mbd_wsession_at(st->sessions, i);
    mbd_wgen *g = s ? ((mbd_wsess_data *)s->user)->gen : NULL;
    if (!g) continue;
    if (mbd_wckpt_enabled(st) && !((mbd_wsess_data *)s->user)->logits_stale) {
      gen_hand_over(st, s);
      continue;
    }
    mbd_error e;
    mbd_error_set(&e, MBD_E_STATE, "%s (after %lld generated tokens, which the session consumed)",
                  why, (long long)g->n);
    gen_finish(st, s, NULL, &e);
  }
}

void mbd_wsched_fail_pending(mbd_wstate *st, const char *why) {
  mbd_wsched_flush(st);
  while (st->j_head) {
    mbd_wjob *j = st->j_head;
    job_unlink(st, j, NULL);
    mbd_error e;
    mbd_error_set(&e, MBD_E_STATE, "%s", why);
    job_finish(st, j, &e);
  }
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
