/* Counters and fixed-bucket histograms behind one mutex, rendered in the
 * Prometheus text format (version 0.0.4). */
#include "client/gateway/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODELS 32
#define MAX_REQ_ROWS 256
#define N_REASONS 4

static const char *const k_reasons[N_REASONS] = {"stop", "length", "cancelled", "error"};

/* Bucket bounds in seconds, shared by all histograms (vLLM's TTFT-like range). */
static const double k_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                  0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
#define N_BOUNDS (sizeof k_bounds / sizeof k_bounds[0])
/* Batch rows: powers of two up to the largest batch a worker takes. */
static const double k_batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define N_BATCH_BOUNDS (sizeof k_batch_bounds / sizeof k_batch_bounds[0])

_Static_assert(N_BATCH_BOUNDS <= N_BOUNDS, "hist.buckets holds every kind's bounds");

static const double *bounds_of(int h, size_t *n) {
  *n = h == GW_H_BATCH ? N_BATCH_BOUNDS : N_BOUNDS;
  return h == GW_H_BATCH ? k_batch_bounds : k_bounds;
}

/* Counts per bound, not cumulative (N_BOUNDS >= every kind's); +Inf is count. */
typedef struct hist {
  uint64_t buckets[N_BOUNDS];
  uint64_t count;
  double sum;
} hist;

typedef struct req_row {
  int model;         /* -1 = none */
  char endpoint[40]; /* "/v1/completions" */
  int http;
  uint64_t n;
} req_row;

static const struct {
  const char *name, *help;
} k_hist[GW_H_COUNT] = {
    {"mambad_time_to_first_token_seconds",
     "Time from request arrival to the first generated token."},
    {"mambad_inter_token_latency_seconds", "Time between two generated tokens of one request."},
    {"mambad_e2e_request_latency_seconds", "Time from request arrival to its last byte."},
    {"mambad_request_queue_time_seconds",
     "Time from request arrival until its generation session is open on a worker."},
    {"mambad_batch_size", "Per GENERATE: the most rows of any batched model step it ran in."},
};

struct gw_metrics {
  pthread_mutex_t mu;
  size_t n_models;
  char names[MAX_MODELS][64];
  req_row rows[MAX_REQ_ROWS];
  size_t n_rows;
  uint64_t rows_dropped; /* distinct (model, endpoint, code) beyond MAX_REQ_ROWS */
  uint64_t prompt[MAX_MODELS], generated[MAX_MODELS];
  uint64_t finished[MAX_MODELS][N_REASONS];
  hist h[GW_H_COUNT][MAX_MODELS];
  int64_t running, waiting;
};

gw_metrics *gw_metrics_new(size_t n, const char *const *names) {
  gw_metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutex_init(&m->mu, NULL);
  m->n_models = n < MAX_MODELS ? n : MAX_MODELS;
  for (size_t i = 0; i < m->n_models; i++)
    snprintf(m->names[i], sizeof m->names[i], "%s", names[i]);
  return m;
}

void gw_metrics_destroy(gw_metrics **m) {
  if (!m || !*m) return;
  pthread_mutex_destroy(&(*m)->mu);
  free(*m);
  *m = NULL;
}

static bool valid(const gw_metrics *m, int model) {
  return model >= 0 && (size_t)model < m->n_models;
}

void gw_metrics_request(gw_metrics *m, int model, const char *endpoint, int http) {
  if (!valid(m, model)) model = -1;
  pthread_mutex_lock(&m->mu);
  size_t i = 0;
  for (; i < m->n_rows; i++)
    if (m->rows[i].model == model && m->rows[i].http == http &&
        !strcmp(m->rows[i].endpoint, endpoint))
      break;
  if (i == m->n_rows) {
    if (m->n_rows == MAX_REQ_ROWS) {
      m->rows_dropped++;
      pthread_mutex_unlock(&m->mu);
      return;
    }
    req_row *r = &m->rows[m->n_rows++];
    r->model = model;
    r->http = http;
    snprintf(r->endpoint, sizeof r->endpoint, "%s", endpoint);
    r->n = 0;
  }
  m->rows[i].n++;
  pthread_mutex_unlock(&m->mu);
}

void gw_metrics_tokens(gw_metrics *m, int model, int64_t prompt, int64_t generated) {
  if (!valid(m, model)) return;
  pthread_mutex_lock(&m->mu);
  m->prompt[model] += (uint64_t)(prompt > 0 ? prompt : 0);
  m->generated[model] += (uint64_t)(generated > 0 ? generated : 0);
  pthread_mutex_unlock(&m->mu);
}

void gw_metrics_observe(gw_metrics *m, int model, gw_hist h, double s) {
  if (!valid(m, model) || h < 0 || h >= GW_H_COUNT) return;
  size_t nb;
  const double *bd = bounds_of(h, &nb);
  pthread_mutex_lock(&m->mu);
  hist *x = &m->h[h][model];
  size_t b = 0;
  while (b < nb && s > bd[b]) b++;
  if (b < nb) x->buckets[b]++;
  x->count++;
  x->sum += s;
  pthread_mutex_unlock(&m->mu);
}

void gw_metrics_finished(gw_metrics *m, int model, const char *reason) {
  if (!valid(m, model)) return;
  int r = N_REASONS - 1;
  for (int k = 0; k < N_REASONS; k++)
    if (!strcmp(reason, k_reasons[k])) r = k;
  pthread_mutex_lock(&m->mu);
  m->finished[model][r]++;
  pthread_mutex_unlock(&m->mu);
}

void gw_metrics_running(gw_metrics *m, int delta) {
  pthread_mutex_lock(&m->mu);
  m->running += delta;
  pthread_mutex_unlock(&m->mu);
}

void gw_metrics_waiting(gw_metrics *m, int delta) {
  pthread_mutex_lock(&m->mu);
  m->waiting += delta;
  pthread_mutex_unlock(&m->mu);
}

int64_t gw_metrics_waiting_now(gw_metrics *m) {
  pthread_mutex_lock(&m->mu);
  int64_t w = m->waiting;
  pthread_mutex_unlock(&m->mu);
  return w;
}

/* A growing text buffer; on allocation failure it stops growing and `bad` is set. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool bad;
} sbuf;

static void out(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(sbuf *b, const char *fmt, ...) {
  if (b->bad) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->bad = true;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 16384;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->bad = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
}

/* A label value with \, " and newline escaped, into dst. */
static const char *esc(const char *s, char *dst, size_t cap) {
  size_t j = 0;
  for (; *s && j + 2 < cap; s++) {
    if (*s == '\\' || *s == '"')
      dst[j++] = '\\', dst[j++] = *s;
    else if (*s == '\n')
      dst[j++] = '\\', dst[j++] = 'n';
    else
      dst[j++] = *s;
  }
  dst[j] = '\0';
  return dst;
}

/* value of "key=" in a canonical route encoding (one key=value a line). */
static void route_field(const char *enc, const char *key, char *dst, size_t cap) {
  dst[0] = '\0';
  size_t kl = strlen(key);
  for (const char *p = enc; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (len > kl && !strncmp(p, key, kl) && p[kl] == '=') {
      size_t n = len - kl - 1 < cap - 1 ? len - kl - 1 : cap - 1;
      memcpy(dst, p + kl + 1, n);
      dst[n] = '\0';
      return;
    }
    p = nl ? nl + 1 : p + len;
  }
}

static void render_workers(sbuf *b, const mbd_status_report *r) {
  static const struct {
    const char *name, *help, *type;
  } k[] = {
      {"mambad_worker_up", "1 when the broker heard from the worker within its liveness window.",
       "gauge"},
      {"mambad_worker_capacity", "Requests the worker accepts at once.", "gauge"},
      {"mambad_worker_requests_inflight", "Requests in flight on the worker now.", "gauge"},
      {"mambad_worker_sessions", "Open sessions on the worker (-1: not reported).", "gauge"},
      {"mambad_worker_heartbeat_age_seconds", "Since the broker last heard from the worker.",
       "gauge"},
      {"mambad_worker_uptime_seconds", "Since the worker registered.", "gauge"},
  };
  char wn[160], rt[40], dev[200], mn[160], dg[160], td[160];
  for (size_t m = 0; m < sizeof k / sizeof k[0]; m++) {
    out(b, "# HELP %s %s\n# TYPE %s %s\n", k[m].name, k[m].help, k[m].name, k[m].type);
    for (size_t i = 0; i < r->n_workers; i++) {
      const mbd_worker_info *w = &r->workers[i];
      char d[96];
      route_field(w->route, "device", d, sizeof d);
      if (!d[0]) route_field(w->route, "backend", d, sizeof d);
      char rshort[13];
      snprintf(rshort, sizeof rshort, "%.12s", w->route_id);
      double v = 0;
      switch (m) {
      case 0: v = w->alive ? 1 : 0; break;
      case 1: v = (double)w->capacity; break;
      case 2: v = (double)w->load; break;
      case 3: v = (double)w->sessions; break;
      case 4: v = w->heartbeat_age_ms < 0 ? -1 : w->heartbeat_age_ms / 1000.0; break;
      default: v = w->uptime_ms < 0 ? -1 : w->uptime_ms / 1000.0; break;
      }
      out(b, "%s{worker=\"%s\",route=\"%s\",device=\"%s\"} %.17g\n", k[m].name,
          esc(w->name, wn, sizeof wn), esc(rshort, rt, sizeof rt), esc(d, dev, sizeof dev), v);
    }
  }
  out(b, "# HELP mambad_worker_model_info A model a worker serves, with its digests (value 1).\n"
         "# TYPE mambad_worker_model_info gauge\n");
  for (size_t i = 0; i < r->n_workers; i++) {
    const mbd_worker_info *w = &r->workers[i];
    char rshort[13];
    snprintf(rshort, sizeof rshort, "%.12s", w->route_id);
    for (size_t j = 0; j < w->n_models; j++)
      out(b,
          "mambad_worker_model_info{worker=\"%s\",route=\"%s\",model=\"%s\",digest=\"%s\","
          "tokenizer_digest=\"%s\"} 1\n",
          esc(w->name, wn, sizeof wn), esc(rshort, rt, sizeof rt),
          esc(w->models[j].name, mn, sizeof mn), esc(w->models[j].digest, dg, sizeof dg),
          esc(w->models[j].tokenizer_digest, td, sizeof td));
  }
  out(b,
      "# HELP mambad_broker_queue_length Requests waiting in the broker for a worker.\n"
      "# TYPE mambad_broker_queue_length gauge\nmambad_broker_queue_length %lld\n",
      (long long)r->queue);
}

char *gw_metrics_render(gw_metrics *m, const mbd_status_report *r) {
  sbuf b = {0};
  char mn[160], ep[100];
  pthread_mutex_lock(&m->mu);
  out(&b, "# HELP mambad_http_requests_total HTTP requests answered, by endpoint, model and status "
          "code.\n# TYPE mambad_http_requests_total counter\n");
  for (size_t i = 0; i < m->n_rows; i++) {
    const req_row *q = &m->rows[i];
    out(&b, "mambad_http_requests_total{endpoint=\"%s\",model=\"%s\",code=\"%d\"} %llu\n",
        esc(q->endpoint, ep, sizeof ep),
        q->model >= 0 ? esc(m->names[q->model], mn, sizeof mn) : "", q->http,
        (unsigned long long)q->n);
  }
  out(&b, "# HELP mambad_prompt_tokens_total Prompt tokens prefilled.\n"
          "# TYPE mambad_prompt_tokens_total counter\n");
  for (size_t i = 0; i < m->n_models; i++)
    out(&b, "mambad_prompt_tokens_total{model=\"%s\"} %llu\n", esc(m->names[i], mn, sizeof mn),
        (unsigned long long)m->prompt[i]);
  out(&b, "# HELP mambad_generation_tokens_total Tokens generated.\n"
          "# TYPE mambad_generation_tokens_total counter\n");
  for (size_t i = 0; i < m->n_models; i++)
    out(&b, "mambad_generation_tokens_total{model=\"%s\"} %llu\n", esc(m->names[i], mn, sizeof mn),
        (unsigned long long)m->generated[i]);
  out(&b, "# HELP mambad_request_finished_total Generations (one per choice) by why they ended.\n"
          "# TYPE mambad_request_finished_total counter\n");
  for (size_t i = 0; i < m->n_models; i++)
    for (int k = 0; k < N_REASONS; k++)
      out(&b, "mambad_request_finished_total{model=\"%s\",finished_reason=\"%s\"} %llu\n",
          esc(m->names[i], mn, sizeof mn), k_reasons[k], (unsigned long long)m->finished[i][k]);
  for (int h = 0; h < GW_H_COUNT; h++) {
    out(&b, "# HELP %s %s\n# TYPE %s histogram\n", k_hist[h].name, k_hist[h].help, k_hist[h].name);
    size_t nb;
    const double *bd = bounds_of(h, &nb);
    for (size_t i = 0; i < m->n_models; i++) {
      const hist *x = &m->h[h][i];
      uint64_t cum = 0;
      esc(m->names[i], mn, sizeof mn);
      for (size_t k = 0; k < nb; k++) {
        cum += x->buckets[k];
        out(&b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", k_hist[h].name, mn, bd[k],
            (unsigned long long)cum);
      }
      out(&b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", k_hist[h].name, mn,
          (unsigned long long)x->count);
      out(&b, "%s_sum{model=\"%s\"} %.9g\n%s_count{model=\"%s\"} %llu\n", k_hist[h].name, mn,
          x->sum, k_hist[h].name, mn, (unsigned long long)x->count);
    }
  }
  out(&b,
      "# HELP mambad_num_requests_running Requests generating now.\n"
      "# TYPE mambad_num_requests_running gauge\nmambad_num_requests_running %lld\n"
      "# HELP mambad_num_requests_waiting Requests waiting for a generation slot.\n"
      "# TYPE mambad_num_requests_waiting gauge\nmambad_num_requests_waiting %lld\n",
      (long long)m->running, (long long)m->waiting);
  pthread_mutex_unlock(&m->mu);
  out(&b,
      "# HELP mambad_gateway_broker_up 1 when the broker answered STATUS for this scrape.\n"
      "# TYPE mambad_gateway_broker_up gauge\nmambad_gateway_broker_up %d\n",
      r ? 1 : 0);
  if (r) render_workers(&b, r);
  if (b.bad) {
    free(b.p);
    return NULL;
  }
  return b.p;
}
