/* bench_gateway: what the HTTP gateway costs over libmambad, in one run
 * against one deployment (`mambad up` with an http: section):
 *   - the same request (prompt of 8 token ids, 1 greedy token) through
 *     libmambad (open, prefill, generate, close) and through HTTP
 *     (POST /v1/completions on a kept-alive connection): p50/p99 of each and
 *     the difference;
 *   - streaming: time to the first `data:` event and to `[DONE]` (16 tokens);
 *   - completions/s with C concurrent HTTP clients (8 tokens each).
 * usage: bench_gateway --connect EP --http HOST:PORT --model NAME [--requests N]
 *        [--concurrency C] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/mambad.h"
#include "support/quantile.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct target {
  char host[64];
  int port;
  const char *model;
} target;

static int http_connect(const target *t) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)t->port);
  inet_pton(AF_INET, t->host, &sa.sin_addr);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* POSTs body; reads the answer until its Content-Length (keep-alive) or, for
 * streams, until "[DONE]". *first: seconds to the first "data: {" (streams).
 * Returns the HTTP status, -1 on a socket error. */
static int http_post(int fd, const char *body, int stream, double t0, double *first) {
  char req[2048], buf[65536];
  int n = snprintf(req, sizeof req,
                   "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\n\r\n%s",
                   strlen(body), body);
  if (write(fd, req, (size_t)n) != n) return -1;
  size_t len = 0;
  long want = -1;
  int status = -1;
  for (;;) {
    ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
    if (r <= 0) return -1;
    len += (size_t)r;
    buf[len] = '\0';
    if (status < 0 && len > 12) status = atoi(buf + 9);
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (!hdr_end) continue;
    if (stream) {
      if (first && *first < 0 && strstr(hdr_end, "data: {")) *first = now_s() - t0;
      if (strstr(hdr_end, "[DONE]")) return status;
      if (len > sizeof buf / 2) { /* keep the tail only */
        memmove(buf, buf + len - 64, 64);
        len = 64;
        buf[len] = '\0';
        memcpy(buf, "\r\n\r\n", 4);
      }
      continue;
    }
    if (want < 0) {
      const char *cl = strcasestr(buf, "Content-Length:");
      if (!cl || cl > hdr_end) return -1;
      want = atol(cl + 15);
    }
    if ((long)(len - (size_t)(hdr_end + 4 - buf)) >= want) return status;
  }
}

/* The request body: 8 prompt ids, `max_tokens` greedy tokens, streamed or not. */
static void make_body(char *dst, size_t cap, const char *model, int max_tokens, int stream) {
  snprintf(dst, cap,
           "{\"model\": \"%s\", \"prompt\": [11, 12, 13, 14, 15, 16, 17, 18], \"max_tokens\": %d, "
           "\"temperature\": 0%s}",
           model, max_tokens, stream ? ", \"stream\": true" : "");
}

typedef struct load_arg {
  const target *t;
  int n;
  int ok;
} load_arg;

static void *load_main(void *p) {
  load_arg *a = p;
  int fd = http_connect(a->t);
  char body[512];
  make_body(body, sizeof body, a->t->model, 8, 0);
  for (int i = 0; i < a->n && fd >= 0; i++)
    if (http_post(fd, body, 0, 0, NULL) == 200) a->ok++;
  if (fd >= 0) close(fd);
  return NULL;
}

int main(int argc, char **argv) {
  const char *ep = NULL, *http = NULL;
  target t = {"127.0.0.1", 0, NULL};
  int n = 200, conc = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--connect")) ep = argv[i + 1];
    else if (!strcmp(argv[i], "--http")) http = argv[i + 1];
    else if (!strcmp(argv[i], "--model")) t.model = argv[i + 1];
    else if (!strcmp(argv[i], "--requests")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--concurrency")) conc = atoi(argv[i + 1]);
  }
  const char *colon = http ? strrchr(http, ':') : NULL;
  if (!ep || !colon || !t.model || n < 2 || conc < 1) {
    fprintf(stderr, "usage: bench_gateway --connect EP --http HOST:PORT --model NAME "
                    "[--requests N] [--concurrency C]\n");
    return 2;
  }
  snprintf(t.host, sizeof t.host, "%.*s", (int)(colon - http), http);
  t.port = atoi(colon + 1);
  double *lib = calloc((size_t)n, sizeof *lib), *web = calloc((size_t)n, sizeof *web);
  double *ttft = calloc((size_t)n, sizeof *ttft), *tot = calloc((size_t)n, sizeof *tot);
  mbd_client *c = NULL;
  mbd_error err = {0};
  if (!lib || !web || !ttft || !tot || mbd_client_new(ep, NULL, &c, &err)) {
    fprintf(stderr, "bench_gateway: %s\n", err.msg[0] ? err.msg : "out of memory");
    return 1;
  }
  int64_t ids[8] = {11, 12, 13, 14, 15, 16, 17, 18};
  mbd_tensor_desc d;
  int64_t shape[1] = {8};
  mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 1, shape, NULL);
  mbd_tensor_in in = {.desc = d, .data = ids};
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = 1;
  int fd = http_connect(&t);
  char body[512];
  make_body(body, sizeof body, t.model, 1, 0);
  if (fd < 0) {
    fprintf(stderr, "bench_gateway: cannot connect to %s\n", http);
    return 1;
  }
  for (int i = 0; i < n; i++) { /* interleaved, so both see the same machine */
    double t0 = now_s();
    mbd_session *s = NULL;
    mbd_tensor_out lg;
    memset(&lg, 0, sizeof lg);
    int64_t *toks = NULL;
    size_t nt = 0;
    char reason[16];
    if (mbd_session_open(c, NULL, t.model, &s, &err) ||
        mbd_session_prefill(s, NULL, &in, true, &lg, &err) ||
        mbd_session_generate(s, NULL, &gp, NULL, NULL, &toks, &nt, reason, &err)) {
      fprintf(stderr, "bench_gateway: libmambad: %s\n", err.msg);
      return 1;
    }
    mbd_tensor_out_release(&lg);
    free(toks);
    mbd_session_close(&s, NULL);
    lib[i] = now_s() - t0;
    t0 = now_s();
    if (http_post(fd, body, 0, 0, NULL) != 200) {
      fprintf(stderr, "bench_gateway: HTTP request %d failed\n", i);
      return 1;
    }
    web[i] = now_s() - t0;
  }
  close(fd);
  double l50 = quantile_of(lib, (size_t)n, 0.5), l99 = quantile_of(lib, (size_t)n, 0.99);
  double w50 = quantile_of(web, (size_t)n, 0.5), w99 = quantile_of(web, (size_t)n, 0.99);
  printf("one token, %d requests each   p50 ms   p99 ms\n", n);
  printf("  libmambad                  %7.3f  %7.3f\n", l50 * 1e3, l99 * 1e3);
  printf("  HTTP gateway               %7.3f  %7.3f\n", w50 * 1e3, w99 * 1e3);
  printf("  gateway overhead           %7.3f  %7.3f\n", (w50 - l50) * 1e3, (w99 - l99) * 1e3);
  make_body(body, sizeof body, t.model, 16, 1);
  int ns = n < 50 ? n : 50;
  for (int i = 0; i < ns; i++) {
    int sfd = http_connect(&t);
    double t0 = now_s(), first = -1;
    if (sfd < 0 || http_post(sfd, body, 1, t0, &first) != 200) {
      fprintf(stderr, "bench_gateway: stream %d failed\n", i);
      return 1;
    }
    tot[i] = now_s() - t0;
    ttft[i] = first;
    close(sfd);
  }
  printf("stream, 16 tokens, %d streams  p50 ms   p99 ms\n", ns);
  printf("  time to first token        %7.3f  %7.3f\n",
         quantile_of(ttft, (size_t)ns, 0.5) * 1e3, quantile_of(ttft, (size_t)ns, 0.99) * 1e3);
  printf("  time to [DONE]             %7.3f  %7.3f\n", quantile_of(tot, (size_t)ns, 0.5) * 1e3,
         quantile_of(tot, (size_t)ns, 0.99) * 1e3);
  pthread_t th[256];
  load_arg la[256];
  if (conc > 256) conc = 256;
  double t0 = now_s();
  for (int i = 0; i < conc; i++) {
    la[i] = (load_arg){&t, n / conc > 0 ? n / conc : 1, 0};
    pthread_create(&th[i], NULL, load_main, &la[i]);
  }
  int ok = 0;
  for (int i = 0; i < conc; i++) {
    pthread_join(th[i], NULL);
    ok += la[i].ok;
  }
  double dt = now_s() - t0;
  printf("completions/s, %d clients, 8 tokens each: %.1f (%d in %.2f s)\n", conc, ok / dt, ok, dt);
  mbd_client_destroy(&c);
  free(lib);
  free(web);
  free(ttft);
  free(tot);
  return 0;
}
