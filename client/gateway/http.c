/* libmicrohttpd glue. Each request's body is gathered up to opt.max_body
 * bytes (a larger Content-Length is refused before reading); the rest of a
 * too-large body is drained and dropped. Idle connections are closed after
 * opt.conn_timeout_s, and at most opt.max_conns are open at once, so a slow
 * or hostile client holds at most one thread and its capped buffers. */
#include "client/gateway/http.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "client/gateway/completions.h"
#include "client/gateway/handlers.h"
#include "client/gateway/request.h"
#include "client/gateway/sse.h"

struct gw_http {
  gw_ctx *g;
  struct MHD_Daemon *d;
  int port;
};

/* Per-request state (con_cls). */
typedef struct hreq {
  double t0;
  char *body;
  size_t len, cap;
  bool too_large;
} hreq;

typedef struct stream_arg {
  gw_ctx *g;
  gw_job *job;
  gw_sse *sse;
} stream_arg;

static enum MHD_Result send_body(struct MHD_Connection *c, int http, char *body, const char *type) {
  if (!body) {
    body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                  "\"param\":null,\"code\":null}}");
    http = 500;
    if (!body) return MHD_NO;
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result rc = MHD_queue_response(c, (unsigned)http, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int http, char *body) {
  return send_body(c, http, body, "application/json");
}

static enum MHD_Result send_err(gw_ctx *g, struct MHD_Connection *c, const char *ep, int model,
                                const gw_err *e) {
  gw_metrics_request(g->metrics, model, ep, e->http);
  return send_json(c, e->http, gw_err_json(e));
}

static void *stream_main(void *p) {
  stream_arg *a = p;
  gw_ctx *g = a->g;
  gw_job_stream(a->job, a->sse);
  gw_job_destroy(&a->job);
  gw_sse_unref(&a->sse);
  free(a);
  pthread_mutex_lock(&g->mu);
  g->streams--;
  pthread_cond_broadcast(&g->streams_cv);
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static enum MHD_Result completions(gw_ctx *g, struct MHD_Connection *c, const char *ep, hreq *q,
                                   bool chat) {
  gw_err e;
  memset(&e, 0, sizeof e);
  gw_request req;
  if (q->too_large) {
    gw_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
               "the request body is over the gateway's limit of %zu bytes", g->opt.max_body);
    return send_err(g, c, ep, -1, &e);
  }
  if (gw_request_parse(q->body ? q->body : "", q->len, chat, &req, &e)) {
    int mi = gw_model_index(g, gw_find_model(g, req.model));
    gw_request_free(&req);
    return send_err(g, c, ep, mi, &e);
  }
  gw_job *job = NULL;
  bool stream = req.stream;
  if (gw_job_prepare(g, &req, q->t0, &job, &e)) {
    int mi = gw_job_model(job);
    gw_job_destroy(&job);
    gw_request_free(&req);
    return send_err(g, c, ep, mi, &e);
  }
  int mi = gw_job_model(job);
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!stream) {
    char *body = NULL;
    gw_job_watch(job, ci ? (int)ci->connect_fd : -1);
    int rc = gw_job_run(job, &body, &e);
    gw_job_destroy(&job);
    if (rc) return send_err(g, c, ep, mi, &e);
    gw_metrics_request(g->metrics, mi, ep, 200);
    return send_json(c, 200, body);
  }
  gw_sse *s = gw_sse_new(ci ? (int)ci->connect_fd : -1, g->opt.conn_timeout_s);
  stream_arg *a = s ? calloc(1, sizeof *a) : NULL;
  struct MHD_Response *r = a ? gw_sse_response(s) : NULL;
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (r) {
    a->g = g;
    a->job = job;
    a->sse = s;
  }
  pthread_mutex_lock(&g->mu);
  g->streams++;
  pthread_mutex_unlock(&g->mu);
  if (!r || pthread_create(&th, &at, stream_main, a)) {
    pthread_mutex_lock(&g->mu);
    g->streams--;
    pthread_mutex_unlock(&g->mu);
    pthread_attr_destroy(&at);
    if (r) MHD_destroy_response(r);
    gw_job_destroy(&job);
    gw_sse_unref(&s);
    free(a);
    gw_err_set(&e, 500, "server_error", "internal", NULL, "cannot start a stream");
    return send_err(g, c, ep, mi, &e);
  }
  pthread_attr_destroy(&at);
  gw_metrics_request(g->metrics, mi, ep, 200);
  enum MHD_Result rc = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result route(gw_ctx *g, struct MHD_Connection *c, const char *url,
                             const char *method, hreq *q) {
  bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
  char *body = NULL;
  int http;
  gw_err e;
  if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
    if (post) return completions(g, c, url, q, !strcmp(url, "/v1/chat/completions"));
    gw_err_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s wants POST", url);
    return send_err(g, c, url, -1, &e);
  }
  const char *kind = "application/json";
  if (!get) {
    gw_err_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s %s is not served",
               method, url);
    return send_err(g, c, url, -1, &e);
  }
  if (!strcmp(url, "/v1/models"))
    http = gw_models(g, NULL, &body);
  else if (!strncmp(url, "/v1/models/", 11) && url[11])
    http = gw_models(g, url + 11, &body);
  else if (!strcmp(url, "/health/live") || !strcmp(url, "/health"))
    http = gw_health_live(g, &body);
  else if (!strcmp(url, "/health/ready"))
    http = gw_health_ready(g, &body);
  else if (!strcmp(url, "/metrics")) {
    http = gw_metrics_page(g, &body);
    kind = "text/plain; version=0.0.4; charset=utf-8";
  } else {
    gw_err_set(&e, 404, "invalid_request_error", "not_found", NULL,
               "no such endpoint: %.200s (POST /v1/completions, /v1/chat/completions; GET "
               "/v1/models, /health/live, /health/ready, /metrics)",
               url);
    return send_err(g, c, "other", -1, &e);
  }
  gw_metrics_request(g->metrics, -1, !strncmp(url, "/v1/models/", 11) ? "/v1/models/{id}" : url,
                     http);
  return send_body(c, http, body, kind);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)version;
  gw_ctx *g = cls;
  hreq *q = *con_cls;
  if (!q) {
    if (!(q = calloc(1, sizeof *q))) return MHD_NO;
    q->t0 = gw_now_s();
    *con_cls = q;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > g->opt.max_body) {
      gw_err e;
      gw_err_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body (Content-Length %.30s) is over the gateway's limit of %zu bytes",
                 cl, g->opt.max_body);
      return send_err(g, c, url, -1, &e); /* answered before the body is read */
    }
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (q->too_large) return MHD_YES;
    if (q->len + n > g->opt.max_body) {
      q->too_large = true;
      free(q->body);
      q->body = NULL;
      q->len = q->cap = 0;
      return MHD_YES;
    }
    if (q->len + n + 1 > q->cap) {
      size_t cap = q->cap ? q->cap : 4096;
      while (cap < q->len + n + 1) cap *= 2;
      char *b = realloc(q->body, cap);
      if (!b) return MHD_NO;
      q->body = b;
      q->cap = cap;
    }
    memcpy(q->body + q->len, upload, n);
    q->len += n;
    q->body[q->len] = '\0';
    return MHD_YES;
  }
  return route(g, c, url, method, q);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  hreq *q = *con_cls;
  if (!q) return;
  free(q->body);
  free(q);
  *con_cls = NULL;
}

int gw_http_start(gw_ctx *g, gw_http **out, char *msg, size_t cap) {
  *out = NULL;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)g->opt.port);
  if (inet_pton(AF_INET, g->opt.host, &sa.sin_addr) != 1) {
    snprintf(msg, cap, "listen address '%s' is not an IPv4 address", g->opt.host);
    return -1;
  }
  gw_http *h = calloc(1, sizeof *h);
  if (!h) {
    snprintf(msg, cap, "out of memory");
    return -1;
  }
  h->g = g;
  h->d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
          MHD_USE_ERROR_LOG,
      (uint16_t)g->opt.port, NULL, NULL, on_request, g, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)g->opt.conn_timeout_s,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)g->opt.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned)g->opt.max_conns, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
      MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_END);
  if (!h->d) {
    snprintf(msg, cap, "cannot listen on %s:%d (in use, or not permitted)", g->opt.host,
             g->opt.port);
    free(h);
    return -1;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : g->opt.port;
  *out = h;
  return 0;
}

int gw_http_port(const gw_http *h) { return h->port; }

void gw_http_stop(gw_http **hp) {
  if (!hp || !*hp) return;
  gw_ctx *g = (*hp)->g;
  /* New connections are refused; generations in flight end at their next
   * chunk; stream threads are waited for (they use the context), then the
   * connection threads. */
  MHD_quiesce_daemon((*hp)->d);
  atomic_store(&g->stopping, true);
  pthread_mutex_lock(&g->mu);
  while (g->streams > 0) pthread_cond_wait(&g->streams_cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  for (int i = 0; i < 100; i++) { /* up to 2 s for answers still being written */
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info((*hp)->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    if (!di || di->num_connections == 0) break;
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  MHD_stop_daemon((*hp)->d);
  free(*hp);
  *hp = NULL;
}
