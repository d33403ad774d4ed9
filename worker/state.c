/* The worker's shared state: allocation, models, sessions. See state.h. */
#include "worker/state.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/prefix_job.h"

#define LOGC MBD_WSTATE_LOG
#define SHM_CACHE_ENTRIES 64
/* Page-lock the batch logits buffer only up to this size: locked memory is
 * real memory, unlike a calloc'ed buffer whose untouched pages cost nothing. */
#define PINNED_LOGITS_MAX ((size_t)1 << 30)

void mbd_wgen_free(mbd_wgen *g) {
  if (!g) return;
  free(g->tokens);
  free(g);
}

void mbd_wjob_free(mbd_wjob *j) {
  if (!j) return;
  free(j->ids);
  free(j->out);
  free(j->q);
  mbd_pcache_plan_free(&j->pfx);
  free(j);
}

/* Session table callback: releases the backend state and worker-side data. */
static void session_free(void *ctx, mbd_wsession *s) {
  mbd_wstate *st = ctx;
  mbd_wsess_data *ws = s->user;
  if (ws) {
    if (ws->gen) st->ngen--;
    mbd_wgen_free(ws->gen);
    free(ws->logits);
    free(ws);
  }
  st->be->ops->state_free(st->be, (mbd_bstate *)s->state);
}

static void make_uid(char *out, size_t cap) {
  uint8_t r[8];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    uint64_t x = (uint64_t)getpid() ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)(uintptr_t)out;
    memcpy(r, &x, sizeof r);
  }
  snprintf(out, cap, "%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5], r[6],
           r[7]);
}

static void free_logits(mbd_wstate *st) {
  for (int i = 0; i < 2; i++) {
    mbd_wbatch *b = &st->batch[i];
    if (b->logits_host) st->be->ops->host_free(st->be, b->logits); /* before the backend goes */
    else free(b->logits);
    b->logits = NULL;
    b->logits_host = false;
  }
}

/* (Re)allocates both batches' logits buffers for max_batch rows of `vocab`. */
static int alloc_logits(mbd_wstate *st, int64_t vocab, mbd_error *err) {
  free_logits(st);
  size_t lbytes = (size_t)st->o.max_batch * (size_t)(vocab > 0 ? vocab : 1) * sizeof(float);
  for (int i = 0; i < 2; i++) {
    mbd_wbatch *b = &st->batch[i];
    if (st->be->ops->host_alloc && lbytes <= PINNED_LOGITS_MAX &&
        (b->logits = st->be->ops->host_alloc(st->be, lbytes)))
      b->logits_host = true;
    else
      b->logits = calloc(1, lbytes);
    if (!b->logits)
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory for batch logits (--max-batch %d)",
                           st->o.max_batch);
  }
  return MBD_OK;
}

int mbd_wstate_new(const mbd_worker_opts *o, mbd_backend **be, mbd_wclock_fn now, void *now_ctx,
                   mbd_wsend_fn send, void *send_ctx, mbd_wstate **out, mbd_error *err) {
  *out = NULL;
  int rc;
  mbd_wstate *st = calloc(1, sizeof *st);
  if (!st) {
    mbd_backend_destroy(be);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the worker");
  }
  st->o = *o;
  st->be = *be;
  *be = NULL;
  st->now = now;
  st->now_ctx = now_ctx;
  st->send = send;
  st->send_ctx = send_ctx;
  make_uid(st->uid, sizeof st->uid);
  st->be->ops->route(st->be, &st->route);
  size_t len = 0;
  if ((rc = mbd_route_encode(&st->route, st->route_enc, sizeof st->route_enc, &len, err)))
    goto fail;
  mbd_route_id_hex(&st->route, st->route_id);
  if ((rc = mbd_wsession_table_new(st->uid, (size_t)o->sessions, session_free, st, &st->sessions,
                                  err)))
    goto fail;
  if ((rc = mbd_shm_cache_new(SHM_CACHE_ENTRIES, &st->shm, err))) goto fail;
  size_t mb = (size_t)o->max_batch;
  for (int i = 0; i < 2; i++) {
    mbd_wbatch *b = &st->batch[i];
    b->rows = calloc(mb, sizeof *b->rows);
    b->states = calloc(mb, sizeof *b->states);
    b->tokens = calloc(mb, sizeof *b->tokens);
    b->next = calloc(mb, sizeof *b->next);
    if (!b->rows || !b->states || !b->tokens || !b->next) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for batch buffers (--max-batch %d)",
                         o->max_batch);
      goto fail;
    }
  }
  if ((rc = alloc_logits(st, 1, err))) goto fail;
  *out = st;
  return MBD_OK;
fail:
  mbd_wstate_destroy(&st);
  return rc;
}

void mbd_wstate_destroy(mbd_wstate **pst) {
  if (!pst || !*pst) return;
  mbd_wstate *st = *pst;
  /* A batch still launched or unanswered (a worker stopped by an error):
   * the device finishes with it before its sessions go. */
  if (st->fly && st->fly->in_flight) mbd_backend_step_wait(st->be, NULL);
  for (int i = 0; i < 2; i++)
    for (size_t r = 0; r < st->batch[i].n; r++) free(st->batch[i].rows[r].step);
  mbd_wsession_table_destroy(&st->sessions);
  while (st->j_head) {
    mbd_wjob *j = st->j_head;
    st->j_head = j->next;
    mbd_wjob_free(j);
  }
  while (st->q_head) {
    mbd_wstep *j = st->q_head;
    st->q_head = j->next;
    free(j);
  }
  for (int i = 0; i < st->nmodels; i++) {
    mbd_sampler_destroy(&st->models[i].sampler);
    mbd_pcache_destroy(&st->models[i].pcache);
    if (st->models[i].bm) st->be->ops->model_destroy(st->be, st->models[i].bm);
  }
  mbd_shm_cache_destroy(&st->shm);
  if (st->be) free_logits(st);
  mbd_backend_destroy(&st->be);
  for (int i = 0; i < 2; i++) {
    free(st->batch[i].rows);
    free(st->batch[i].states);
    free(st->batch[i].tokens);
    free(st->batch[i].next);
  }
  free(st);
  *pst = NULL;
}

int mbd_wstate_add_model(mbd_wstate *st, const char *name, const char *digest,
                         const char *tokenizer_digest, mbd_bmodel *bm, mbd_error *err) {
  if (st->nmodels >= MBD_WORKER_MAX_MODELS) {
    st->be->ops->model_destroy(st->be, bm);
    return mbd_error_set(err, MBD_E_INVALID, "at most %d models", MBD_WORKER_MAX_MODELS);
  }
  mbd_wmodel *m = &st->models[st->nmodels++];
  memset(m, 0, sizeof *m);
  snprintf(m->name, sizeof m->name, "%s", name);
  snprintf(m->digest, sizeof m->digest, "%s", digest);
  snprintf(m->tokenizer_digest, sizeof m->tokenizer_digest, "%s",
           tokenizer_digest ? tokenizer_digest : "");
  m->bm = bm;
  m->vocab = st->be->ops->model_vocab(bm);
  int rc = mbd_sampler_new(m->vocab, &m->sampler, err);
  if (rc) return rc;
  if ((rc = mbd_wpfx_model_init(st, m, err))) return rc;
  if (m->vocab > st->max_vocab) {
    st->max_vocab = m->vocab;
    if ((rc = alloc_logits(st, st->max_vocab, err))) return rc;
  }
  MBD_LOGI(LOGC, "model %s: vocab %" PRId64 ", digest %.16s", m->name, m->vocab, m->digest);
  return MBD_OK;
}

double mbd_wstate_now(const mbd_wstate *st) { return st->now(st->now_ctx); }

int mbd_wstate_session_new(mbd_wstate *st, int mi, mbd_wsession **out, mbd_error *err) {
  mbd_bstate *bs = NULL;
  mbd_wsess_data *ws = calloc(1, sizeof *ws);
  int rc;
  if (!ws || !(ws->logits = calloc((size_t)st->models[mi].vocab, sizeof(float)))) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for a session");
    goto fail;
  }
  if ((rc = st->be->ops->state_new(st->be, st->models[mi].bm, &bs, err))) goto fail;
  if ((rc = mbd_wsession_open(st->sessions, mi, bs, mbd_wstate_now(st), out, err))) goto fail;
  (*out)->user = ws;
  return MBD_OK;
fail:
  if (bs) st->be->ops->state_free(st->be, bs);
  if (ws) free(ws->logits);
  free(ws);
  return rc;
}
