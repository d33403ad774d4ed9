/* The worker reactor: registration, heartbeats, reconnects, request handlers,
 * the batched step scheduler, and state export/import. See worker.h. */
#include "worker/worker.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/host_id.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/sha256.h"
#include "common/wire.h"
#include "kernels/model/sampler.h"
#include "kernels/backend.h"
#include "worker/request.h"
#include "worker/session.h"
#include "worker/shm.h"
#include "worker/state_blob.h"

#define LOGC "worker"
#define SHM_CACHE_ENTRIES 64
#define DRAIN_MAX 256 /* messages handled per tick before computing */
#define MAX_FORWARD_ROWS 4096 /* sequences per FORWARD */
/* Page-lock the batch logits buffer only up to this size: locked memory is
 * real memory, unlike a calloc'ed buffer whose untouched pages cost nothing. */
#define PINNED_LOGITS_MAX ((size_t)1 << 30)

typedef struct wmodel {
  char name[MBD_WORKER_NAME_MAX]; /* registry name */
  char digest[65];                /* model identity (weights + config) */
  mbd_bmodel *bm;                 /* loaded on the backend */
  int64_t vocab;
  mbd_sampler *sampler;           /* scratch for GENERATE sampling */
} wmodel;

/* A GENERATE loop attached to its session. */
typedef struct gen_job {
  uint64_t tag;          /* broker ticket */
  mbd_sampling sampling; /* greedy or seeded */
  int64_t max_tokens;
  int64_t stop[MBD_WREQ_MAX_STOP];
  size_t nstop;
  int64_t partial_every;
  double deadline; /* monotonic seconds; 0 = none */
  int64_t *tokens; /* generated so far, max_tokens entries */
  int64_t n;       /* count */
  int64_t sent;    /* tokens already streamed in PARTIALs */
  int64_t next;    /* greedy: the next token, picked on the device by the last step */
  bool has_next;
  int64_t peak_batch; /* most rows of any batched step this loop ran in (FINAL reports it) */
} gen_job;

/* Worker-side session data (mbd_wsession.user). */
typedef struct wsess {
  float *logits;   /* [V]: logits after the last consumed token */
  bool has_logits; /* false until the first prefill/step/import */
  bool logits_stale; /* a device-picked step left `logits` behind the state */
  gen_job *gen;    /* active GENERATE or NULL */
} wsess;

/* A queued STEP request. */
typedef struct step_job {
  struct step_job *next;
  uint64_t tag;
  char session[MBD_SESSION_ID_MAX];
  int64_t token;
  mbd_tensor_ref out; /* shm output when has_out */
  bool has_out;
} step_job;

/* One row of a batched step. */
typedef struct batch_row {
  mbd_wsession *s;
  int64_t token;
  step_job *step; /* NULL for a GENERATE row */
} batch_row;

struct mbd_worker {
  mbd_worker_opts o;
  char uid[MBD_WORKER_UID_MAX];
  mbd_backend *be;
  mbd_route_identity route;
  char route_id[65];
  char route_enc[1024];
  wmodel models[MBD_WORKER_MAX_MODELS];
  int nmodels;
  int64_t max_vocab;
  mbd_wsession_table *sessions;
  mbd_shm_cache *shm;
  /* scheduler */
  step_job *q_head, *q_tail; /* queued STEPs, FIFO */
  size_t ngen;               /* active GENERATE loops */
  batch_row *rows;           /* max_batch */
  mbd_bstate **bstates;      /* max_batch */
  int64_t *btokens;          /* max_batch */
  int64_t *bnext;            /* max_batch: device-picked greedy tokens */
  float *blogits;            /* max_batch * max_vocab */
  bool blogits_host;         /* blogits came from be->ops->host_alloc (page-locked) */
  size_t rr;                 /* round-robin start over session slots */
  /* connection */
  void *zctx, *sock;
  double last_heard, next_hb;
  uint64_t served;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- options ---------------------------------------------------------- */

const char *mbd_worker_usage(void) {
  return "usage: mambad-worker --connect EP --name NAME [--device cpu|cuda:N] [--dtype f32|bf16|f16]\n"
         "         [--gemm-mode deterministic] [--model NAME=DIR]... [--threads N]\n"
         "         [--capacity N] [--max-batch N] [--heartbeat-ms MS] [--liveness N]\n"
         "         [--session-idle-s S] [--host-id ID] [--max-message-mb N]\n";
}

static int parse_int(const char *flag, const char *v, long lo, long hi, long *out, mbd_error *err) {
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || !*v || *end || x < lo || x > hi)
    return mbd_error_set(err, MBD_E_INVALID, "%s expects an integer in %ld..%ld (got '%s')", flag,
                         lo, hi, v);
  *out = x;
  return MBD_OK;
}

static bool valid_name(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '-' || *s == '_' || *s == '.'))
      return false;
  return true;
}

int mbd_worker_opts_parse(int argc, char **argv, mbd_worker_opts *o, mbd_error *err) {
  memset(o, 0, sizeof *o);
  o->backend = MBD_BACKEND_CPU;
  o->device = -1;
  o->mode = MBD_GEMM_DETERMINISTIC;
  o->policy = MBD_POLICY_F32;
  o->capacity = 64;
  o->max_batch = 64;
  o->heartbeat_ms = 1000;
  o->liveness = 3;
  o->session_idle_s = 600;
  o->max_message_bytes = (size_t)256 << 20;
  int rc;
  long v = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h"))
      return mbd_error_set(err, MBD_E_INVALID, "%s", mbd_worker_usage());
    if (strncmp(a, "--", 2) || i + 1 >= argc)
      return mbd_error_set(err, MBD_E_INVALID, "unknown argument or missing value: '%s'\n%s", a,
                           mbd_worker_usage());
    const char *val = argv[++i];
    if (!strcmp(a, "--connect")) {
      if (strlen(val) >= sizeof o->connect)
        return mbd_error_set(err, MBD_E_INVALID, "--connect endpoint too long");
      snprintf(o->connect, sizeof o->connect, "%s", val);
    } else if (!strcmp(a, "--name")) {
      if (strlen(val) >= sizeof o->name || !valid_name(val))
        return mbd_error_set(err, MBD_E_INVALID,
                             "--name must be 1..%zu characters of [A-Za-z0-9._-] (got '%s')",
                             sizeof o->name - 1, val);
      snprintf(o->name, sizeof o->name, "%s", val);
    } else if (!strcmp(a, "--device")) {
      if (!strncmp(val, "cuda:", 5)) { /* cuda:N pins the worker to device N */
        if ((rc = parse_int(a, val + 5, 0, 1023, &v, err))) return rc;
        o->backend = MBD_BACKEND_CUDA;
        o->device = (int)v;
      } else if ((rc = mbd_backend_parse(val, &o->backend, err))) {
        return mbd_error_prefix(err, "--device (cpu or cuda:N)");
      } else {
        o->device = o->backend == MBD_BACKEND_CUDA ? 0 : -1;
      }
    } else if (!strcmp(a, "--dtype")) {
      if ((rc = mbd_dtype_policy_parse(val, &o->policy, err)))
        return mbd_error_prefix(err, "--dtype");
    } else if (!strcmp(a, "--gemm-mode")) {
      if ((rc = mbd_gemm_mode_parse(val, &o->mode, err)))
        return mbd_error_prefix(err, "--gemm-mode");
    } else if (!strcmp(a, "--model")) {
      const char *eq = strchr(val, '=');
      if (!eq || eq == val || !eq[1])
        return mbd_error_set(err, MBD_E_INVALID, "--model expects NAME=DIR (got '%s')", val);
      if (o->nmodels >= MBD_WORKER_MAX_MODELS)
        return mbd_error_set(err, MBD_E_INVALID, "at most %d --model flags",
                             MBD_WORKER_MAX_MODELS);
      mbd_worker_model_opt *m = &o->models[o->nmodels];
      size_t nl = (size_t)(eq - val);
      if (nl >= sizeof m->name || strlen(eq + 1) >= sizeof m->dir)
        return mbd_error_set(err, MBD_E_INVALID, "--model '%s': name or path too long", val);
      memcpy(m->name, val, nl);
      m->name[nl] = '\0';
      if (!valid_name(m->name))
        return mbd_error_set(err, MBD_E_INVALID,
                             "--model name '%s' must use only [A-Za-z0-9._-]", m->name);
      for (int j = 0; j < o->nmodels; j++)
        if (!strcmp(o->models[j].name, m->name))
          return mbd_error_set(err, MBD_E_INVALID, "--model name '%s' given twice", m->name);
      snprintf(m->dir, sizeof m->dir, "%s", eq + 1);
      o->nmodels++;
    } else if (!strcmp(a, "--threads")) {
      if ((rc = parse_int(a, val, 0, 1024, &v, err))) return rc;
      o->threads = (int)v;
    } else if (!strcmp(a, "--capacity")) {
      if ((rc = parse_int(a, val, 1, 1 << 20, &v, err))) return rc;
      o->capacity = (int)v;
    } else if (!strcmp(a, "--max-batch")) {
      if ((rc = parse_int(a, val, 1, 4096, &v, err))) return rc;
      o->max_batch = (int)v;
    } else if (!strcmp(a, "--heartbeat-ms")) {
      if ((rc = parse_int(a, val, 10, 600000, &v, err))) return rc;
      o->heartbeat_ms = (int)v;
    } else if (!strcmp(a, "--liveness")) {
      if ((rc = parse_int(a, val, 1, 1000, &v, err))) return rc;
      o->liveness = (int)v;
    } else if (!strcmp(a, "--session-idle-s")) {
      if ((rc = parse_int(a, val, 0, 100L * 86400, &v, err))) return rc;
      o->session_idle_s = (double)v;
    } else if (!strcmp(a, "--host-id")) {
      if (!*val || strlen(val) >= sizeof o->host_id)
        return mbd_error_set(err, MBD_E_INVALID, "--host-id must be 1..%zu characters",
                             sizeof o->host_id - 1);
      snprintf(o->host_id, sizeof o->host_id, "%s", val);
    } else if (!strcmp(a, "--max-message-mb")) {
      if ((rc = parse_int(a, val, 1, 1 << 16, &v, err))) return rc;
      o->max_message_bytes = (size_t)v << 20;
    } else {
      return mbd_error_set(err, MBD_E_INVALID, "unknown option '%s'\n%s", a, mbd_worker_usage());
    }
  }
  if (!o->connect[0])
    return mbd_error_set(err, MBD_E_INVALID, "--connect EP is required (the broker's workers "
                         "endpoint, e.g. ipc:///tmp/mambad/workers)");
  if (!o->name[0]) return mbd_error_set(err, MBD_E_INVALID, "--name NAME is required");
  if (!o->host_id[0]) mbd_host_id_get(o->host_id, sizeof o->host_id);
  return MBD_OK;
}

/* ---- model identity --------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !strcmp(s + n - m, suf);
}

int mbd_worker_model_digest(const char *dir, char out[65], mbd_error *err) {
  int rc = MBD_OK;
  char **names = NULL;
  size_t n = 0, cap = 0, nweights = 0;
  DIR *d = opendir(dir);
  if (!d)
    return mbd_error_set(err, MBD_E_NOT_FOUND, "model directory %s: %s", dir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    bool w = ends_with(e->d_name, ".safetensors");
    if (!w && strcmp(e->d_name, "config.json")) continue;
    nweights += w;
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      char **nn = realloc(names, nc * sizeof *nn);
      if (!nn) {
        rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory listing %s", dir);
        goto fail;
      }
      names = nn;
      cap = nc;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory listing %s", dir);
      goto fail;
    }
    n++;
  }
  if (nweights == 0) {
    rc = mbd_error_set(err, MBD_E_NOT_FOUND, "model directory %s has no *.safetensors file", dir);
    goto fail;
  }
  qsort(names, n, sizeof *names, cmp_str);
  mbd_sha256_ctx all;
  mbd_sha256_init(&all);
  for (size_t i = 0; i < n; i++) {
    char path[MBD_WORKER_PATH_MAX + 256], hex[65];
    uint8_t h[32];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if ((rc = mbd_sha256_file(path, h, err))) goto fail;
    mbd_sha256_hex(h, hex);
    mbd_sha256_update(&all, names[i], strlen(names[i]));
    mbd_sha256_update(&all, "\n", 1);
    mbd_sha256_update(&all, hex, 64);
    mbd_sha256_update(&all, "\n", 1);
  }
  uint8_t dg[32];
  mbd_sha256_final(&all, dg);
  mbd_sha256_hex(dg, out);
fail:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return rc;
}

/* ---- lifecycle ---------------------------------------------------------- */

static void free_job(gen_job *g) {
  if (!g) return;
  free(g->tokens);
  free(g);
}

/* Session table callback: releases the backend state and worker-side data. */
static void session_free(void *ctx, mbd_wsession *s) {
  mbd_worker *w = ctx;
  wsess *ws = s->user;
  if (ws) {
    if (ws->gen) w->ngen--;
    free_job(ws->gen);
    free(ws->logits);
    free(ws);
  }
  w->be->ops->state_free(w->be, (mbd_bstate *)s->state);
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

int mbd_worker_new(const mbd_worker_opts *o, mbd_worker **out, mbd_error *err) {
  *out = NULL;
  int rc;
#ifndef MBD_HAVE_CUDA
  if (o->backend != MBD_BACKEND_CPU)
    return mbd_error_set(err, MBD_E_UNSUPPORTED,
                         "--device %s: this build has no CUDA backend (rebuild with nvcc "
                         "present); use --device cpu",
                         mbd_backend_name(o->backend));
#endif
  if (o->nmodels == 0)
    MBD_LOGW(LOGC, "no --model given: this worker serves GEMM requests only");
  mbd_worker *w = calloc(1, sizeof *w);
  if (!w) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for the worker");
  w->o = *o;
  make_uid(w->uid, sizeof w->uid);
  mbd_backend_opts bo = {.mode = o->mode, .policy = o->policy, .threads = o->threads,
                         .state_capacity = o->capacity, .device = o->device,
                         .max_batch = o->max_batch};
#ifdef MBD_HAVE_CUDA
  if (o->backend == MBD_BACKEND_CUDA) rc = mbd_backend_cuda_new(&bo, &w->be, err);
  else
#endif
    rc = mbd_backend_cpu_new(&bo, &w->be, err);
  if (rc) goto fail;
  w->be->ops->route(w->be, &w->route);
  size_t len = 0;
  if ((rc = mbd_route_encode(&w->route, w->route_enc, sizeof w->route_enc, &len, err))) goto fail;
  mbd_route_id_hex(&w->route, w->route_id);
  for (int i = 0; i < o->nmodels; i++) {
    wmodel *m = &w->models[i];
    snprintf(m->name, sizeof m->name, "%s", o->models[i].name);
    rc = mbd_worker_model_digest(o->models[i].dir, m->digest, err);
    if (!rc) rc = w->be->ops->model_load(w->be, o->models[i].dir, &m->bm, err);
    if (rc) {
      mbd_error_prefix(err, "loading model '%s' from %s (check --model NAME=DIR)", m->name,
                       o->models[i].dir);
      goto fail;
    }
    w->nmodels++;
    m->vocab = w->be->ops->model_vocab(m->bm);
    if (m->vocab > w->max_vocab) w->max_vocab = m->vocab;
    if ((rc = mbd_sampler_new(m->vocab, &m->sampler, err))) goto fail;
    MBD_LOGI(LOGC, "model %s: vocab %" PRId64 ", digest %.16s", m->name, m->vocab, m->digest);
  }
  if ((rc = mbd_wsession_table_new(w->uid, (size_t)o->capacity, session_free, w, &w->sessions,
                                  err)))
    goto fail;
  if ((rc = mbd_shm_cache_new(SHM_CACHE_ENTRIES, &w->shm, err))) goto fail;
  size_t mb = (size_t)o->max_batch;
  w->rows = calloc(mb, sizeof *w->rows);
  w->bstates = calloc(mb, sizeof *w->bstates);
  w->btokens = calloc(mb, sizeof *w->btokens);
  w->bnext = calloc(mb, sizeof *w->bnext);
  size_t lbytes = mb * (size_t)(w->max_vocab ? w->max_vocab : 1) * sizeof(float);
  if (w->be->ops->host_alloc && lbytes <= PINNED_LOGITS_MAX &&
      (w->blogits = w->be->ops->host_alloc(w->be, lbytes)))
    w->blogits_host = true;
  else
    w->blogits = calloc(1, lbytes);
  if (!w->rows || !w->bstates || !w->btokens || !w->bnext || !w->blogits) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for batch buffers (--max-batch %d)",
                       o->max_batch);
    goto fail;
  }
  *out = w;
  return MBD_OK;
fail:
  mbd_worker_destroy(&w);
  return rc;
}

void mbd_worker_destroy(mbd_worker **pw) {
  if (!pw || !*pw) return;
  mbd_worker *w = *pw;
  mbd_wsession_table_destroy(&w->sessions);
  while (w->q_head) {
    step_job *j = w->q_head;
    w->q_head = j->next;
    free(j);
  }
  for (int i = 0; i < w->nmodels; i++) {
    mbd_sampler_destroy(&w->models[i].sampler);
    if (w->models[i].bm) w->be->ops->model_destroy(w->be, w->models[i].bm);
  }
  mbd_shm_cache_destroy(&w->shm);
  if (w->blogits_host) w->be->ops->host_free(w->be, w->blogits); /* before the backend goes */
  else free(w->blogits);
  mbd_backend_destroy(&w->be);
  free(w->rows);
  free(w->bstates);
  free(w->btokens);
  free(w->bnext);
  if (w->sock) zmq_close(w->sock);
  if (w->zctx) zmq_ctx_term(w->zctx);
  free(w);
  *pw = NULL;
}

const mbd_route_identity *mbd_worker_route(const mbd_worker *w) { return &w->route; }
const char *mbd_worker_route_id(const mbd_worker *w) { return w->route_id; }
const char *mbd_worker_uid(const mbd_worker *w) { return w->uid; }

/* ---- sending ------------------------------------------------------------ */

/* Never blocks the reactor: with the broker gone or stalled past the (large)
 * send high-water mark, the message is dropped and logged; the broker answers
 * the client (WORKER_LOST / TIMEOUT) in that case. */
static void send_msg(mbd_worker *w, mbd_msg **m) {
  mbd_error e = {0};
  if (mbd_msg_send(m, w->sock, ZMQ_DONTWAIT, &e))
    MBD_LOGW(LOGC, "send to broker failed (message dropped): %s", e.msg);
}

static void reply_error(mbd_worker *w, uint64_t tag, int code, const char *msg) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new_error(tag, code, msg, &m, &e)) {
    MBD_LOGE(LOGC, "cannot build an ERROR reply: %s", e.msg);
    return;
  }
  MBD_LOGD(LOGC, "ticket %" PRIu64 ": %s %s", tag, mbd_status_name(code), msg);
  send_msg(w, &m);
}

static void reply_err(mbd_worker *w, uint64_t tag, const mbd_error *e) {
  reply_error(w, tag, e->code ? e->code : MBD_E_INTERNAL, e->msg);
}

/* Starts a FINAL/PARTIAL body: a map of 2 + nextra entries whose first two are
 * route_id and worker (every worker reply carries them). */
static void pack_head(mbd_worker *w, msgpack_packer *pk, uint32_t nextra) {
  msgpack_pack_map(pk, 2 + nextra);
  mbd_pack_kv_str(pk, "route_id", w->route_id);
  mbd_pack_kv_str(pk, "worker", w->o.name);
}

/* ZeroMQ frees zero-copy payloads through this (possibly from its I/O thread). */
static void free_payload(void *data, void *hint) {
  (void)hint;
  free(data);
}

/* Sends a message whose body is in sb (consumed). `payload` (malloc'ed, owned
 * here) becomes frame F4 without a copy when non-NULL. */
static void send_body(mbd_worker *w, uint8_t cmd, uint64_t tag, msgpack_sbuffer *sb, void *payload,
                      size_t plen) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(cmd, tag, &m, &e) || mbd_msg_take_body(m, sb, &e)) goto fail;
  if (payload) {
    int rc = plen ? mbd_msg_add_payload_ref(m, payload, plen, free_payload, NULL, &e)
                  : mbd_msg_add_payload_copy(m, "", 0, &e);
    if (!plen || rc) free(payload);
    payload = NULL;
    if (rc) goto fail;
  }
  send_msg(w, &m);
  msgpack_sbuffer_destroy(sb);
  return;
fail:
  free(payload);
  msgpack_sbuffer_destroy(sb);
  MBD_LOGE(LOGC, "cannot build a reply: %s", e.msg);
  mbd_msg_destroy(&m);
  reply_error(w, tag, e.code ? e.code : MBD_E_INTERNAL, e.msg);
}

/* ---- request helpers ---------------------------------------------------- */

static int find_model(mbd_worker *w, const char *name, mbd_error *err) {
  for (int i = 0; i < w->nmodels; i++)
    if (!strcmp(w->models[i].name, name)) return i;
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < w->nmodels && used < sizeof list; i++) {
    int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", w->models[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
  return mbd_error_set(err, MBD_E_NOT_FOUND, "model '%s' is not loaded on worker %s (loaded: %s)",
                       name, w->o.name, w->nmodels ? list : "none");
}

/* Input bytes, copied to an aligned buffer (*own) only when the frame is not
 * aligned for the element type. */
static int get_input(mbd_worker *w, const mbd_msg *msg, const mbd_tensor_ref *r, const void **data,
                     size_t *nbytes, void **own, mbd_error *err) {
  *own = NULL;
  int rc;
  if (r->kind == MBD_TREF_CUDA_IPC && w->be->ops->ipc_read) { /* staged through host */
    if ((rc = mbd_tensor_desc_nbytes(&r->desc, nbytes, err))) return rc;
    if (!(*own = malloc(*nbytes ? *nbytes : 1)))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory for IPC tensor '%s'", r->name);
    if ((rc = w->be->ops->ipc_read(w->be, r, *own, *nbytes, err))) {
      free(*own);
      *own = NULL;
      return rc;
    }
    *data = *own;
    return MBD_OK;
  }
  rc = mbd_wreq_input(r, msg, w->shm, data, nbytes, err);
  if (rc) return rc;
  size_t es = mbd_dtype_size(r->desc.dtype);
  if (es > 1 && ((uintptr_t)*data % es)) {
    if (!(*own = malloc(*nbytes ? *nbytes : 1)))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory copying tensor '%s'", r->name);
    memcpy(*own, *data, *nbytes);
    *data = *own;
  }
  return MBD_OK;
}

/* Destination for a result `want`: the request's shm output when given, else
 * a malloc'ed buffer (*own) that becomes the reply's payload frame. */
static int get_output(mbd_worker *w, const mbd_wreq *q, const mbd_tensor_desc *want, void **dst,
                      void **own, mbd_error *err) {
  *own = NULL;
  size_t nbytes;
  int rc = mbd_tensor_desc_nbytes(want, &nbytes, err);
  if (rc) return rc;
  if (q->noutputs && q->outputs[0].kind == MBD_TREF_CUDA_IPC && w->be->ops->ipc_read) {
    /* Computed on the host, then copied into the IPC range by reply_tensor. */
    const mbd_tensor_desc *d = &q->outputs[0].desc;
    bool same = d->dtype == want->dtype && d->ndim == want->ndim;
    for (int i = 0; same && i < want->ndim; i++) same = d->shape[i] == want->shape[i];
    if (!same)
      return mbd_error_set(err, MBD_E_SHAPE, "IPC output '%s' does not have the result's shape",
                           q->outputs[0].name);
    if (!(*own = malloc(nbytes ? nbytes : 1)))
      return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte result", nbytes);
    *dst = *own;
    return MBD_OK;
  }
  if (q->noutputs) return mbd_wreq_output(&q->outputs[0], want, w->shm, dst, err);
  if (nbytes > w->o.max_message_bytes) {
    char d[96];
    mbd_tensor_desc_format(want, d, sizeof d);
    return mbd_error_set(err, MBD_E_TOO_LARGE,
                         "result %s is %zu bytes, over the %zu-byte message cap: ask for "
                         "last_only, split the batch, or pass a shm output",
                         d, nbytes, w->o.max_message_bytes);
  }
  if (!(*own = malloc(nbytes ? nbytes : 1)))
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte result", nbytes);
  *dst = *own;
  return MBD_OK;
}

/* FINAL {route_id, worker, tensors: [ref]} for a result in `own` (payload) or
 * in the request's shm output. */
static void reply_tensor(mbd_worker *w, const mbd_wreq *q, uint64_t tag, const char *name,
                         const mbd_tensor_desc *desc, void *own) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  pack_head(w, &pk, 1);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_tensor_ref r;
  size_t nbytes = 0;
  mbd_tensor_desc_nbytes(desc, &nbytes, NULL);
  if (own && q->noutputs && q->outputs[0].kind == MBD_TREF_CUDA_IPC && w->be->ops->ipc_write) {
    mbd_error e = {0};
    int rc = w->be->ops->ipc_write(w->be, &q->outputs[0], own, nbytes, &e);
    free(own);
    own = NULL;
    if (rc) {
      msgpack_sbuffer_destroy(&sb);
      reply_err(w, tag, &e);
      return;
    }
  }
  if (own) {
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", name);
    r.desc = *desc;
    r.kind = MBD_TREF_INLINE;
    r.frame = 0;
  } else {
    r = q->outputs[0];
  }
  mbd_pack_tensor_ref(&pk, &r);
  send_body(w, MBD_CMD_FINAL, tag, &sb, own, nbytes);
}

static void reply_fields_str(mbd_worker *w, uint64_t tag, const char *k, const char *v) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  pack_head(w, &pk, k ? 1 : 0);
  if (k) mbd_pack_kv_str(&pk, k, v);
  send_body(w, MBD_CMD_FINAL, tag, &sb, NULL, 0);
}

static int check_desc(const mbd_tensor_ref *r, mbd_dtype dt, int ndim_lo, int ndim_hi,
                      const char *what, mbd_error *err) {
  if (r->desc.dtype != dt || r->desc.ndim < ndim_lo || r->desc.ndim > ndim_hi) {
    char d[96];
    mbd_tensor_desc_format(&r->desc, d, sizeof d);
    return mbd_error_set(err, MBD_E_SHAPE, "%s must be %s with %d..%d dims (got '%s' %s)", what,
                         mbd_dtype_name(dt), ndim_lo, ndim_hi, r->name, d);
  }
  return MBD_OK;
}

/* Session lookup for session commands (wsess in *ws): MBD_E_BUSY while the
 * session is generating, since a GENERATE owns its session until its FINAL. */
static int get_session(mbd_worker *w, const char *id, mbd_wsession **s, wsess **ws, mbd_error *err) {
  int rc = mbd_wsession_find(w->sessions, id, s, err);
  if (rc) return rc;
  *ws = (*s)->user;
  (*s)->last_used = now_s();
  if ((*s)->busy)
    return mbd_error_set(err, MBD_E_BUSY,
                         "session '%s' is generating: wait for its FINAL before sending more "
                         "requests to it",
                         (*s)->id);
  return MBD_OK;
}

/* For requests that replace or read the whole state (GENERATE, EXPORT,
 * CLOSE): a queued STEP must run first. */
static int check_no_step_queued(const mbd_worker *w, const mbd_wsession *s, mbd_error *err) {
  for (const step_job *j = w->q_head; j; j = j->next)
    if (!strcmp(j->session, s->id))
      return mbd_error_set(err, MBD_E_BUSY, "session '%s' has a STEP queued: wait for its reply",
                           s->id);
  return MBD_OK;
}

/* ---- handlers ----------------------------------------------------------- */

static int h_gemm(mbd_worker *w, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                  mbd_error *err) {
  const void *a = NULL, *b = NULL, *bias = NULL;
  void *own[3] = {NULL, NULL, NULL}, *outown = NULL, *c = NULL;
  size_t na, nb, nbias;
  int rc;
  const mbd_tensor_ref *ra = &q->tensors[0], *rb = &q->tensors[1];
  if ((rc = check_desc(ra, q->dtype, 2, 2, "gemm a", err))) return rc;
  if ((rc = check_desc(rb, q->dtype, 2, 2, "gemm b (weights layout [N,K])", err))) return rc;
  int64_t M = ra->desc.shape[0], K = ra->desc.shape[1], N = rb->desc.shape[0];
  if (rb->desc.shape[1] != K)
    return mbd_error_set(err, MBD_E_SHAPE, "gemm: a is [%lld,%lld] but b is [%lld,%lld]: b must "
                         "be [N,K] with the same K",
                         (long long)M, (long long)K, (long long)N, (long long)rb->desc.shape[1]);
  if (q->ntensors == 3) {
    const mbd_tensor_ref *rc3 = &q->tensors[2];
    if ((rc = check_desc(rc3, MBD_DTYPE_F32, 1, 1, "gemm bias", err))) return rc;
    if (rc3->desc.shape[0] != N)
      return mbd_error_set(err, MBD_E_SHAPE, "gemm: bias has %lld entries, N is %lld",
                           (long long)rc3->desc.shape[0], (long long)N);
  }
  mbd_tensor_desc cd;
  int64_t cs[2] = {M, N};
  if ((rc = mbd_tensor_desc_make(&cd, MBD_DTYPE_F32, 2, cs, err))) return rc;
  if ((rc = get_input(w, msg, ra, &a, &na, &own[0], err))) goto fail;
  if ((rc = get_input(w, msg, rb, &b, &nb, &own[1], err))) goto fail;
  if (q->ntensors == 3 && (rc = get_input(w, msg, &q->tensors[2], &bias, &nbias, &own[2], err)))
    goto fail;
  if ((rc = get_output(w, q, &cd, &c, &outown, err))) goto fail;
  rc = w->be->ops->gemm(w->be, M, N, K, ra->desc.dtype, a, rb->desc.dtype, b, bias, c, err);
  if (rc) goto fail;
  reply_tensor(w, q, tag, "c", &cd, outown);
  outown = NULL;
fail:
  for (int i = 0; i < 3; i++) free(own[i]);
  free(outown);
  return rc;
}

static int h_forward(mbd_worker *w, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                     mbd_error *err) {
  int mi = find_model(w, q->model, err);
  if (mi < 0) return mi;
  wmodel *m = &w->models[mi];
  const mbd_tensor_ref *r = &q->tensors[0];
  int rc = check_desc(r, MBD_DTYPE_I64, 2, 2, "forward input_ids", err);
  if (rc) return rc;
  int64_t B = r->desc.shape[0], T = r->desc.shape[1];
  if (B < 1 || T < 1)
    return mbd_error_set(err, MBD_E_SHAPE, "forward input_ids must be [B,T] with B, T >= 1");
  if (B > MAX_FORWARD_ROWS) /* each row holds a recurrent state while it runs */
    return mbd_error_set(err, MBD_E_TOO_LARGE,
                         "forward batch of %lld sequences is over the limit of %d: split it",
                         (long long)B, MAX_FORWARD_ROWS);
  mbd_tensor_desc ld;
  int64_t s3[3] = {B, T, m->vocab}, s2[2] = {B, m->vocab};
  if ((rc = q->last_only ? mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 2, s2, err)
                         : mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 3, s3, err)))
    return rc;
  const void *ids = NULL;
  void *own = NULL, *outown = NULL, *dst = NULL;
  size_t n;
  if ((rc = get_input(w, msg, r, &ids, &n, &own, err))) goto fail;
  if ((rc = get_output(w, q, &ld, &dst, &outown, err))) goto fail;
  if ((rc = w->be->ops->forward(w->be, m->bm, ids, B, T, q->last_only, dst, err))) goto fail;
  reply_tensor(w, q, tag, "logits", &ld, outown);
  outown = NULL;
fail:
  free(own);
  free(outown);
  return rc;
}

/* New session with a fresh state for model mi. */
static int new_session(mbd_worker *w, int mi, mbd_wsession **out, mbd_error *err) {
  mbd_bstate *st = NULL;
  wsess *ws = calloc(1, sizeof *ws);
  int rc;
  if (!ws || !(ws->logits = calloc((size_t)w->models[mi].vocab, sizeof(float)))) {
    rc = mbd_error_set(err, MBD_E_NOMEM, "out of memory for a session");
    goto fail;
  }
  if ((rc = w->be->ops->state_new(w->be, w->models[mi].bm, &st, err))) goto fail;
  if ((rc = mbd_wsession_open(w->sessions, mi, st, now_s(), out, err))) goto fail;
  (*out)->user = ws;
  return MBD_OK;
fail:
  if (st) w->be->ops->state_free(w->be, st);
  if (ws) free(ws->logits);
  free(ws);
  return rc;
}

static int h_open(mbd_worker *w, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  int mi = find_model(w, q->model, err);
  if (mi < 0) return mi;
  mbd_wsession *s = NULL;
  int rc = new_session(w, mi, &s, err);
  if (rc) return rc;
  MBD_LOGD(LOGC, "opened session %s (%s)", s->id, q->model);
  reply_fields_str(w, tag, "session", s->id);
  return MBD_OK;
}

static int h_prefill(mbd_worker *w, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                     mbd_error *err) {
  mbd_wsession *s;
  wsess *ws;
  int rc = get_session(w, q->session, &s, &ws, err);
  if (rc) return rc;
  wmodel *m = &w->models[s->model];
  const mbd_tensor_ref *r = &q->tensors[0];
  if ((rc = check_desc(r, MBD_DTYPE_I64, 1, 2, "prefill input_ids", err))) return rc;
  if (r->desc.ndim == 2 && r->desc.shape[0] != 1)
    return mbd_error_set(err, MBD_E_SHAPE, "prefill input_ids must be [T] or [1,T] (one session "
                         "is one sequence; use FORWARD for batches)");
  int64_t T = r->desc.shape[r->desc.ndim - 1];
  if (T < 1) return mbd_error_set(err, MBD_E_SHAPE, "prefill needs at least one token");
  mbd_tensor_desc ld;
  int64_t sh[2] = {q->last_only ? 1 : T, m->vocab};
  if ((rc = mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 2, sh, err))) return rc;
  const void *ids = NULL;
  void *own = NULL, *outown = NULL, *dst = NULL;
  size_t n;
  if ((rc = get_input(w, msg, r, &ids, &n, &own, err))) goto fail;
  if ((rc = get_output(w, q, &ld, &dst, &outown, err))) goto fail;
  rc = w->be->ops->prefill(w->be, m->bm, (mbd_bstate *)s->state, ids, T, q->last_only, dst, err);
  if (rc) goto fail;
  memcpy(ws->logits, (float *)dst + (size_t)(sh[0] - 1) * (size_t)m->vocab,
         (size_t)m->vocab * sizeof(float));
  ws->has_logits = true;
  reply_tensor(w, q, tag, "logits", &ld, outown);
  outown = NULL;
fail:
  free(own);
  free(outown);
  return rc;
}

static int h_step(mbd_worker *w, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  wsess *ws;
  int rc = get_session(w, q->session, &s, &ws, err);
  if (rc) return rc;
  int64_t V = w->models[s->model].vocab;
  if (q->token < 0 || q->token >= V)
    return mbd_error_set(err, MBD_E_INVALID, "token %lld is outside the vocabulary [0, %lld)",
                         (long long)q->token, (long long)V);
  if (q->noutputs) { /* check the output now so the error comes before queueing */
    mbd_tensor_desc ld;
    int64_t sh[1] = {V};
    void *dst;
    if ((rc = mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 1, sh, err))) return rc;
    if ((rc = mbd_wreq_output(&q->outputs[0], &ld, w->shm, &dst, err))) return rc;
  }
  step_job *j = calloc(1, sizeof *j);
  if (!j) return mbd_error_set(err, MBD_E_NOMEM, "out of memory queueing a step");
  j->tag = tag;
  snprintf(j->session, sizeof j->session, "%s", s->id);
  j->token = q->token;
  j->has_out = q->noutputs > 0;
  if (j->has_out) j->out = q->outputs[0];
  if (w->q_tail) w->q_tail->next = j;
  else w->q_head = j;
  w->q_tail = j;
  return MBD_OK;
}

static int h_generate(mbd_worker *w, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  wsess *ws;
  int rc = get_session(w, q->session, &s, &ws, err);
  if (rc) return rc;
  if (!ws->has_logits)
    return mbd_error_set(err, MBD_E_STATE,
                         "session '%s' has consumed no token yet: PREFILL the prompt first", s->id);
  if ((rc = check_no_step_queued(w, s, err))) return rc;
  gen_job *g = calloc(1, sizeof *g);
  if (!g || !(g->tokens = malloc((size_t)q->max_tokens * sizeof *g->tokens))) {
    free_job(g);
    return mbd_error_set(err, MBD_E_NOMEM, "out of memory for %lld tokens",
                         (long long)q->max_tokens);
  }
  g->tag = tag;
  g->sampling.temperature = (float)q->temperature;
  g->sampling.top_k = q->top_k > INT32_MAX ? INT32_MAX : (int)q->top_k;
  g->sampling.top_p = (float)q->top_p;
  g->sampling.seed = q->seed;
  if ((rc = mbd_sampling_check(&g->sampling, err))) {
    free_job(g);
    return rc;
  }
  g->max_tokens = q->max_tokens;
  memcpy(g->stop, q->stop, q->nstop * sizeof *q->stop);
  g->nstop = q->nstop;
  g->partial_every = q->partial_every;
  g->deadline = q->deadline_ms > 0 ? now_s() + (double)q->deadline_ms / 1000.0 : 0;
  ws->gen = g;
  s->busy = true;
  w->ngen++;
  return MBD_OK;
}

static int h_export(mbd_worker *w, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  wsess *ws;
  int rc = get_session(w, q->session, &s, &ws, err);
  if (rc) return rc;
  if ((rc = check_no_step_queued(w, s, err))) return rc;
  wmodel *m = &w->models[s->model];
  mbd_state_blob_info info;
  memset(&info, 0, sizeof info);
  snprintf(info.model, sizeof info.model, "%s", m->name);
  memcpy(info.model_digest, m->digest, sizeof info.model_digest);
  memcpy(info.route_id, w->route_id, sizeof info.route_id);
  info.state_bytes = w->be->ops->state_bytes((const mbd_bstate *)s->state);
  info.vocab = (uint64_t)m->vocab;
  info.has_logits = ws->has_logits;
  size_t size = mbd_state_blob_size(info.state_bytes, info.vocab, info.has_logits);
  void *blob = size ? malloc(size) : NULL;
  if (!blob) return mbd_error_set(err, MBD_E_NOMEM, "out of memory for a %zu-byte export", size);
  void *sdst, *ldst;
  mbd_state_blob_write_header(blob, size, &info, &sdst, &ldst);
  if ((rc = w->be->ops->state_save((const mbd_bstate *)s->state, sdst, info.state_bytes, err))) {
    free(blob);
    return rc;
  }
  if (ldst) memcpy(ldst, ws->logits, (size_t)m->vocab * sizeof(float));
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  pack_head(w, &pk, 3);
  mbd_pack_kv_str(&pk, "model", m->name);
  mbd_pack_kv_str(&pk, "model_digest", m->digest);
  mbd_pack_str(&pk, "tensors");
  msgpack_pack_array(&pk, 1);
  mbd_tensor_ref r;
  memset(&r, 0, sizeof r);
  snprintf(r.name, sizeof r.name, "state");
  int64_t sh[1] = {(int64_t)(size / 8)};
  mbd_tensor_desc_make(&r.desc, MBD_DTYPE_I64, 1, sh, NULL);
  r.kind = MBD_TREF_INLINE;
  mbd_pack_tensor_ref(&pk, &r);
  send_body(w, MBD_CMD_FINAL, tag, &sb, blob, size);
  return MBD_OK;
}

static int h_import(mbd_worker *w, const mbd_msg *msg, const mbd_wreq *q, uint64_t tag,
                    mbd_error *err) {
  const void *blob = NULL;
  void *own = NULL;
  size_t n;
  mbd_wsession *s = NULL;
  int rc = get_input(w, msg, &q->tensors[0], &blob, &n, &own, err);
  if (rc) return rc;
  mbd_state_blob_info info;
  if ((rc = mbd_state_blob_parse(blob, n, &info, err))) goto fail;
  if (q->model[0] && strcmp(q->model, info.model)) {
    rc = mbd_error_set(err, MBD_E_INVALID, "import names model '%s' but the state is of '%s'",
                       q->model, info.model);
    goto fail;
  }
  int mi = find_model(w, info.model, err);
  if (mi < 0) {
    rc = mi;
    goto fail;
  }
  wmodel *m = &w->models[mi];
  if (strcmp(info.model_digest, m->digest)) {
    rc = mbd_error_set(err, MBD_E_STATE,
                       "state of model '%s' was exported from weights %.16s… but this worker "
                       "loaded %.16s…: import it on a worker serving the same checkpoint",
                       info.model, info.model_digest, m->digest);
    goto fail;
  }
  if (strcmp(info.route_id, w->route_id)) {
    rc = mbd_error_set(err, MBD_E_STATE,
                       "state was exported on route %.16s… but this worker is route %.16s…: "
                       "bit-exact continuation needs the same route (send IMPORT with "
                       "route.route_id=%s)",
                       info.route_id, w->route_id, info.route_id);
    goto fail;
  }
  if (info.vocab != (uint64_t)m->vocab) {
    rc = mbd_error_set(err, MBD_E_FORMAT, "state blob vocab %llu != model vocab %lld",
                       (unsigned long long)info.vocab, (long long)m->vocab);
    goto fail;
  }
  if ((rc = new_session(w, mi, &s, err))) goto fail;
  /* The state image may sit at any offset in the frame: the backend's import
   * reads it with memcpy-safe code, and logits are copied bytewise. */
  if ((rc = w->be->ops->state_load((mbd_bstate *)s->state, info.state, info.state_bytes, err)))
    goto fail;
  wsess *ws = s->user;
  ws->has_logits = info.has_logits;
  if (info.has_logits) memcpy(ws->logits, info.logits, (size_t)m->vocab * sizeof(float));
  MBD_LOGD(LOGC, "imported session %s (%s)", s->id, m->name);
  reply_fields_str(w, tag, "session", s->id);
  s = NULL;
fail:
  if (s) mbd_wsession_close(w->sessions, s);
  free(own);
  return rc;
}

static int h_close(mbd_worker *w, const mbd_wreq *q, uint64_t tag, mbd_error *err) {
  mbd_wsession *s;
  wsess *ws;
  int rc = get_session(w, q->session, &s, &ws, err);
  if (rc) return rc;
  if ((rc = check_no_step_queued(w, s, err))) return rc;
  mbd_wsession_close(w->sessions, s);
  reply_fields_str(w, tag, NULL, NULL);
  return MBD_OK;
}

/* Checks the request's route constraint against this worker (the broker
 * already matched it; this catches misrouting). */
static int check_route(mbd_worker *w, const msgpack_object *root, mbd_error *err) {
  if (!mbd_obj_get(root, "route")) return MBD_OK;
  mbd_route_want want;
  int rc = mbd_obj_route_want(root, "route", &want, err);
  if (rc) return rc;
  if (!mbd_route_matches(&want, &w->route, w->route_id)) {
    char d[256];
    mbd_route_want_format(&want, d, sizeof d);
    return mbd_error_set(err, MBD_E_NO_ROUTE, "worker %s (route %.16s…) does not match %s",
                         w->o.name, w->route_id, d);
  }
  return MBD_OK;
}

static void handle_request(mbd_worker *w, mbd_msg *msg) {
  uint8_t cmd = mbd_msg_cmd(msg);
  uint64_t tag = mbd_msg_tag(msg);
  mbd_error err = {0};
  mbd_body *body = NULL;
  size_t blen = 0;
  const void *b = mbd_msg_body(msg, &blen);
  int rc = mbd_body_parse(b, blen, &body, &err);
  mbd_wreq *q = NULL;
  if (rc) goto done;
  const msgpack_object *root = mbd_body_root(body);
  if ((rc = check_route(w, root, &err))) goto done;
  if (!(q = malloc(sizeof *q))) {
    rc = mbd_error_set(&err, MBD_E_NOMEM, "out of memory decoding a request");
    goto done;
  }
  if ((rc = mbd_wreq_decode(cmd, root, q, &err))) goto done;
  switch (cmd) {
  case MBD_CMD_GEMM: rc = h_gemm(w, msg, q, tag, &err); break;
  case MBD_CMD_FORWARD: rc = h_forward(w, msg, q, tag, &err); break;
  case MBD_CMD_OPEN: rc = h_open(w, q, tag, &err); break;
  case MBD_CMD_PREFILL: rc = h_prefill(w, msg, q, tag, &err); break;
  case MBD_CMD_STEP: rc = h_step(w, q, tag, &err); break;
  case MBD_CMD_GENERATE: rc = h_generate(w, q, tag, &err); break;
  case MBD_CMD_EXPORT: rc = h_export(w, q, tag, &err); break;
  case MBD_CMD_IMPORT: rc = h_import(w, msg, q, tag, &err); break;
  case MBD_CMD_CLOSE: rc = h_close(w, q, tag, &err); break;
  default:
    rc = mbd_error_set(&err, MBD_E_UNSUPPORTED, "command %s is not served by workers",
                       mbd_cmd_name(cmd));
  }
done:
  if (rc) {
    if (!err.code) err.code = rc;
    reply_err(w, tag, &err);
  }
  w->served++;
  free(q);
  mbd_body_destroy(&body);
}

/* ---- scheduler ---------------------------------------------------------- */

static void gen_finish(mbd_worker *w, mbd_wsession *s, const char *reason, const mbd_error *fail) {
  wsess *ws = s->user;
  gen_job *g = ws->gen;
  if (fail) {
    reply_err(w, g->tag, fail);
  } else {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(w, &pk, 3);
    mbd_pack_str(&pk, "tokens");
    msgpack_pack_array(&pk, (uint32_t)g->n);
    for (int64_t i = 0; i < g->n; i++) msgpack_pack_int64(&pk, g->tokens[i]);
    mbd_pack_kv_str(&pk, "reason", reason);
    /* Observable proof of batching (tests): timing-free, unlike reply order. */
    mbd_pack_kv_i64(&pk, "peak_batch", g->peak_batch);
    send_body(w, MBD_CMD_FINAL, g->tag, &sb, NULL, 0);
  }
  free_job(g);
  ws->gen = NULL;
  if (ws->logits_stale) { /* ended early (deadline, error): last logits never came back */
    ws->has_logits = false;
    ws->logits_stale = false;
  }
  s->busy = false;
  s->last_used = now_s();
  w->ngen--;
}

static void gen_partial(mbd_worker *w, gen_job *g) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  pack_head(w, &pk, 1);
  mbd_pack_str(&pk, "tokens");
  msgpack_pack_array(&pk, (uint32_t)(g->n - g->sent));
  for (int64_t i = g->sent; i < g->n; i++) msgpack_pack_int64(&pk, g->tokens[i]);
  send_body(w, MBD_CMD_PARTIAL, g->tag, &sb, NULL, 0);
  g->sent = g->n;
}

static bool in_batch(const batch_row *rows, size_t n, const mbd_wsession *s) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].s == s) return true;
  return false;
}

/* Replies to a finished STEP row with its logits row. */
static void step_reply(mbd_worker *w, step_job *j, const float *row, int64_t V) {
  mbd_tensor_desc ld;
  int64_t sh[1] = {V};
  mbd_tensor_desc_make(&ld, MBD_DTYPE_F32, 1, sh, NULL);
  mbd_wreq q;
  memset(&q, 0, sizeof q);
  if (j->has_out) {
    mbd_error err = {0};
    void *dst = NULL;
    q.outputs[0] = j->out;
    q.noutputs = 1;
    if (mbd_wreq_output(&j->out, &ld, w->shm, &dst, &err)) {
      reply_err(w, j->tag, &err);
      return;
    }
    memcpy(dst, row, (size_t)V * sizeof(float));
    reply_tensor(w, &q, j->tag, "logits", &ld, NULL);
    return;
  }
  float *own = malloc((size_t)V * sizeof(float));
  if (!own) {
    reply_error(w, j->tag, MBD_E_NOMEM, "out of memory for step logits");
    return;
  }
  memcpy(own, row, (size_t)V * sizeof(float));
  reply_tensor(w, &q, j->tag, "logits", &ld, own);
}

/* Why the GENERATE loop ends after the step that consumes `tok`: "stop",
 * "length", or NULL while it goes on. */
static const char *gen_end_reason(const gen_job *g, int64_t tok) {
  for (size_t k = 0; k < g->nstop; k++)
    if (g->stop[k] == tok) return "stop";
  return g->n >= g->max_tokens ? "length" : NULL;
}

/* Whether row r's logits must reach its session after this step: always
 * unless its next token is picked on the device (dev_pick and a greedy
 * GENERATE row that goes on), so a session's logits are current whenever it
 * is not generating. */
static bool row_needs_logits(const batch_row *r, bool dev_pick) {
  if (!dev_pick || r->step) return true;
  const gen_job *g = ((const wsess *)r->s->user)->gen;
  return g->sampling.temperature > 0.0f || gen_end_reason(g, r->token) != NULL;
}

/* One batched step for model mi over queued STEPs and active GENERATE loops.
 * Returns the number of rows run. */
static size_t tick_model(mbd_worker *w, int mi, double now) {
  wmodel *m = &w->models[mi];
  size_t maxb = (size_t)w->o.max_batch, n = 0, cap = mbd_wsession_capacity(w->sessions);
  /* GENERATE loops first (round-robin start for fairness when over max-batch). */
  for (size_t k = 0; k < cap && n < maxb && w->ngen; k++) {
    mbd_wsession *s = mbd_wsession_at(w->sessions, (w->rr + k) % cap);
    if (!s || s->model != mi || !((wsess *)s->user)->gen) continue;
    wsess *ws = s->user;
    gen_job *g = ws->gen;
    if (g->deadline > 0 && now > g->deadline) {
      mbd_error e;
      mbd_error_set(&e, MBD_E_TIMEOUT,
                    "generate passed its deadline after %lld of %lld tokens (raise deadline_ms)",
                    (long long)g->n, (long long)g->max_tokens);
      gen_finish(w, s, NULL, &e);
      continue;
    }
    int32_t tok = 0;
    mbd_error e = {0};
    if (g->has_next) { /* greedy, picked on the device by the previous step */
      tok = (int32_t)g->next;
      g->has_next = false;
    } else if (mbd_sampler_pick(m->sampler, &g->sampling, (uint64_t)g->n, ws->logits, &tok, &e)) {
      gen_finish(w, s, NULL, &e);
      continue;
    }
    g->tokens[g->n++] = tok;
    w->rows[n++] = (batch_row){.s = s, .token = tok, .step = NULL};
  }
  /* Then queued STEPs in arrival order, one per session per tick. */
  step_job **pp = &w->q_head, *prev = NULL;
  while (*pp && n < maxb) {
    step_job *j = *pp;
    mbd_wsession *s = NULL;
    mbd_error e = {0};
    if (mbd_wsession_find(w->sessions, j->session, &s, &e)) { /* closed/expired meanwhile */
      *pp = j->next;
      if (w->q_tail == j) w->q_tail = prev;
      reply_err(w, j->tag, &e);
      free(j);
      continue;
    }
    if (s->model != mi || in_batch(w->rows, n, s)) {
      prev = j;
      pp = &j->next;
      continue;
    }
    *pp = j->next;
    if (w->q_tail == j) w->q_tail = prev;
    j->next = NULL;
    w->rows[n++] = (batch_row){.s = s, .token = j->token, .step = j};
  }
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    w->bstates[i] = (mbd_bstate *)w->rows[i].s->state;
    w->btokens[i] = w->rows[i].token;
  }
  /* Greedy GENERATE rows may take their next token from the device; logits
   * then come to the host only when a row needs them: STEP replies, sampled
   * rows, and rows finishing this tick (so a session's logits are current
   * whenever it is not generating). */
  bool dev_pick = false, need_logits = false;
  if (w->be->ops->step_greedy) {
    for (size_t i = 0; i < n; i++) {
      batch_row *r = &w->rows[i];
      if (!r->step && ((wsess *)r->s->user)->gen->sampling.temperature <= 0.0f) dev_pick = true;
    }
    for (size_t i = 0; i < n && dev_pick && !need_logits; i++)
      need_logits = row_needs_logits(&w->rows[i], true);
  }
  mbd_error e = {0};
  int rc = dev_pick ? w->be->ops->step_greedy(w->be, m->bm, w->bstates, w->btokens, (int64_t)n,
                                               w->bnext, need_logits ? w->blogits : NULL, &e)
                    : w->be->ops->step(w->be, m->bm, w->bstates, w->btokens, (int64_t)n,
                                       w->blogits, &e);
  bool have_logits = !dev_pick || need_logits;
  double t = now_s();
  for (size_t i = 0; i < n; i++) {
    batch_row *r = &w->rows[i];
    wsess *ws = r->s->user;
    const float *row = w->blogits + i * (size_t)m->vocab;
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
      if (rc) reply_err(w, r->step->tag, &e);
      else step_reply(w, r->step, row, m->vocab);
      free(r->step);
      continue;
    }
    gen_job *g = ws->gen;
    if (rc) {
      gen_finish(w, r->s, NULL, &e);
      continue;
    }
    if ((int64_t)n > g->peak_batch) g->peak_batch = (int64_t)n;
    if (dev_pick && g->sampling.temperature <= 0.0f) {
      g->next = w->bnext[i];
      g->has_next = true;
    }
    const char *end = gen_end_reason(g, r->token);
    if (end) gen_finish(w, r->s, end, NULL);
    else if (g->n - g->sent >= g->partial_every) gen_partial(w, g);
  }
  if (rc) MBD_LOGE(LOGC, "batched step of %zu rows failed: %s", n, e.msg);
  return n;
}

/* Runs one batched step per model; returns true when work remains queued. */
static bool tick(mbd_worker *w) {
  double now = now_s();
  for (int mi = 0; mi < w->nmodels; mi++) tick_model(w, mi, now);
  w->rr++;
  return w->q_head != NULL || w->ngen > 0;
}

/* ---- connection --------------------------------------------------------- */

/* Sends a control message (tag 0) whose body is in sb (consumed). */
static void send_ctl_body(mbd_worker *w, uint8_t cmd, msgpack_sbuffer *sb) {
  mbd_msg *m = NULL;
  mbd_error e = {0};
  if (mbd_msg_new(cmd, 0, &m, &e) || mbd_msg_take_body(m, sb, &e)) {
    MBD_LOGE(LOGC, "cannot build %s: %s", mbd_cmd_name(cmd), e.msg);
    mbd_msg_destroy(&m);
  } else {
    send_msg(w, &m);
  }
  msgpack_sbuffer_destroy(sb);
}

static void send_ready(mbd_worker *w) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 10);
  mbd_pack_kv_i64(&pk, "device", w->o.backend == MBD_BACKEND_CUDA ? w->o.device : -1);
  mbd_pack_kv_str(&pk, "name", w->o.name);
  mbd_pack_kv_str(&pk, "uid", w->uid);
  mbd_pack_kv_str(&pk, "route", w->route_enc);
  mbd_pack_kv_str(&pk, "route_id", w->route_id);
  mbd_pack_kv_str(&pk, "host_id", w->o.host_id);
  mbd_pack_kv_u64(&pk, "capacity", (uint64_t)w->o.capacity);
  mbd_pack_kv_u64(&pk, "max_batch", (uint64_t)w->o.max_batch);
  mbd_pack_str(&pk, "models");
  msgpack_pack_array(&pk, (uint32_t)w->nmodels);
  for (int i = 0; i < w->nmodels; i++) {
    msgpack_pack_map(&pk, 2);
    mbd_pack_kv_str(&pk, "name", w->models[i].name);
    mbd_pack_kv_str(&pk, "digest", w->models[i].digest);
  }
  mbd_pack_kv_u64(&pk, "pid", (uint64_t)getpid());
  send_ctl_body(w, MBD_CMD_READY, &sb);
}

static void send_control(mbd_worker *w, uint8_t cmd, const char *reason) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  if (cmd == MBD_CMD_HEARTBEAT) {
    msgpack_pack_map(&pk, 2);
    mbd_pack_kv_u64(&pk, "load", (uint64_t)w->ngen + (w->q_head ? 1u : 0u));
    mbd_pack_kv_u64(&pk, "sessions", (uint64_t)mbd_wsession_count(w->sessions));
  } else {
    msgpack_pack_map(&pk, 1);
    mbd_pack_kv_str(&pk, "reason", reason);
  }
  send_ctl_body(w, cmd, &sb);
}

/* (Re)creates the DEALER socket and registers. */
static int connect_broker(mbd_worker *w, mbd_error *err) {
  if (w->sock) zmq_close(w->sock);
  w->sock = zmq_socket(w->zctx, ZMQ_DEALER);
  if (!w->sock) return mbd_error_set(err, MBD_E_IO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
  int linger = 0, rcvtimeo = 0, sndhwm = 1000000;
  zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(w->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
  /* recv after poll only: never block the reactor. */
  zmq_setsockopt(w->sock, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
  if (zmq_connect(w->sock, w->o.connect))
    return mbd_error_set(err, MBD_E_IO, "cannot connect to broker at %s: %s (check --connect)",
                         w->o.connect, zmq_strerror(zmq_errno()));
  send_ready(w);
  double t = now_s();
  w->last_heard = t;
  w->next_hb = t + w->o.heartbeat_ms / 1000.0;
  MBD_LOGI(LOGC, "%s registered at %s: uid %s route %.16s…", w->o.name, w->o.connect, w->uid,
           w->route_id);
  return MBD_OK;
}

/* Drains waiting messages; returns false when the broker asked us to re-register. */
static bool drain(mbd_worker *w) {
  for (int k = 0; k < DRAIN_MAX; k++) {
    mbd_msg *m = NULL;
    mbd_error e = {0};
    int rc = mbd_msg_recv(w->sock, false, w->o.max_message_bytes, &m, &e);
    if (rc == MBD_E_IO || (rc && !m)) return true; /* nothing more */
    w->last_heard = now_s();
    if (rc) { /* malformed: answer with the tag when readable */
      uint64_t tag = mbd_msg_tag(m);
      MBD_LOGW(LOGC, "malformed message from broker: %s", e.msg);
      if (tag) reply_err(w, tag, &e);
      mbd_msg_destroy(&m);
      continue;
    }
    uint8_t cmd = mbd_msg_cmd(m);
    if (cmd == MBD_CMD_HEARTBEAT) {
      /* liveness only */
    } else if (cmd == MBD_CMD_DISCONNECT) {
      MBD_LOGI(LOGC, "broker sent DISCONNECT: re-registering");
      mbd_msg_destroy(&m);
      return false;
    } else if (mbd_cmd_is_request(cmd) && cmd != MBD_CMD_STATUS) {
      handle_request(w, m);
    } else {
      reply_error(w, mbd_msg_tag(m), MBD_E_PROTOCOL, "workers accept request commands only");
    }
    mbd_msg_destroy(&m);
  }
  return true;
}

/* Shutdown: every pending request gets an answer. */
static void fail_pending(mbd_worker *w, const char *why) {
  while (w->q_head) {
    step_job *j = w->q_head;
    w->q_head = j->next;
    reply_error(w, j->tag, MBD_E_STATE, why);
    free(j);
  }
  w->q_tail = NULL;
  for (size_t i = 0; i < mbd_wsession_capacity(w->sessions) && w->ngen; i++) {
    mbd_wsession *s = mbd_wsession_at(w->sessions, i);
    if (s && ((wsess *)s->user)->gen) {
      mbd_error e;
      mbd_error_set(&e, MBD_E_STATE, "%s", why);
      gen_finish(w, s, NULL, &e);
    }
  }
}

int mbd_worker_run(mbd_worker *w, volatile sig_atomic_t *stop, mbd_error *err) {
  if (!(w->zctx = zmq_ctx_new()))
    return mbd_error_set(err, MBD_E_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
  int rc = connect_broker(w, err);
  if (rc) return rc;
  double hb = w->o.heartbeat_ms / 1000.0, next_expire = now_s() + 1.0;
  bool busy = false;
  while (!*stop) {
    double t = now_s();
    long timeout = busy ? 0 : (long)((w->next_hb - t) * 1000.0) + 1;
    if (timeout < 0) timeout = 0;
    zmq_pollitem_t it = {.socket = w->sock, .events = ZMQ_POLLIN};
    int pr = zmq_poll(&it, 1, timeout);
    if (pr < 0 && zmq_errno() != EINTR) {
      rc = mbd_error_set(err, MBD_E_IO, "zmq_poll: %s", zmq_strerror(zmq_errno()));
      break;
    }
    if (*stop) break;
    bool ok = true;
    if (pr > 0 && (it.revents & ZMQ_POLLIN)) ok = drain(w);
    t = now_s();
    if (!ok || t - w->last_heard > hb * w->o.liveness) {
      if (ok)
        MBD_LOGW(LOGC, "broker silent for %.1f s: reconnecting", t - w->last_heard);
      if ((rc = connect_broker(w, err))) break;
    }
    busy = tick(w);
    t = now_s();
    if (t >= w->next_hb) {
      send_control(w, MBD_CMD_HEARTBEAT, NULL);
      w->next_hb = t + hb;
    }
    if (t >= next_expire) {
      size_t n = mbd_wsession_expire(w->sessions, t, w->o.session_idle_s);
      if (n) MBD_LOGI(LOGC, "closed %zu idle session(s)", n);
      next_expire = t + 1.0;
    }
  }
  if (!rc) {
    fail_pending(w, "worker shutting down (SIGTERM): resend the request");
    send_control(w, MBD_CMD_DISCONNECT, "shutdown");
    MBD_LOGI(LOGC, "%s: shut down after %" PRIu64 " requests", w->o.name, w->served);
    /* Let the last replies and DISCONNECT leave before the socket closes. */
    int linger = 2000;
    zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger);
  }
  zmq_close(w->sock);
  w->sock = NULL;
  return rc;
}
