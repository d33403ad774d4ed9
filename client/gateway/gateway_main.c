/* mambad-gateway: the OpenAI-compatible HTTP gateway, a client of the broker
 * (docs/http.md). Loads each model's tokenizer (and chat template) from its
 * directory, then serves HTTP until SIGINT/SIGTERM. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/gateway/gateway.h"
#include "client/gateway/http.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: mambad-gateway --model NAME=DIR [--model ...] [--connect EP] [--listen HOST:PORT]\n"
      "       [--max-body-bytes N] [--conn-timeout-s N] [--max-conns N] [--max-running N]\n"
      "       [--max-waiting N] [--deadline-ms N] [--chunk-tokens N]\n"
      "Serves OpenAI's /v1/completions, /v1/chat/completions and /v1/models, plus\n"
      "/health/live, /health/ready and /metrics, for the models named (DIR holds the\n"
      "checkpoint's tokenizer.json). --connect: the broker's clients endpoint (default\n"
      "ipc:///tmp/mambad/clients.sock); --listen default 127.0.0.1:8000 (port 0 picks one).\n");
}

static int parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || errno || x < lo || x > hi) {
    fprintf(stderr, "mambad-gateway: %s wants an integer in %lld..%lld, got '%s'\n", opt, lo, hi,
            v);
    return -1;
  }
  *out = x;
  return 0;
}

static int add_model(gw_ctx *g, const char *spec) {
  const char *eq = strchr(spec, '=');
  if (!eq || eq == spec || !eq[1] || (size_t)(eq - spec) >= sizeof g->models[0].name) {
    fprintf(stderr, "mambad-gateway: --model wants NAME=DIR, got '%s'\n", spec);
    return -1;
  }
  if (g->n_models == GW_MAX_MODELS) {
    fprintf(stderr, "mambad-gateway: at most %d models\n", GW_MAX_MODELS);
    return -1;
  }
  gw_model *m = &g->models[g->n_models];
  memset(m, 0, sizeof *m);
  snprintf(m->name, sizeof m->name, "%.*s", (int)(eq - spec), spec);
  snprintf(m->dir, sizeof m->dir, "%s", eq + 1);
  mbd_error err = {0};
  if (mbd_tokenizer_load(m->dir, &m->tok, &err)) {
    fprintf(stderr,
            "mambad-gateway: model '%s': %s: %s (the model directory needs the "
            "checkpoint's tokenizer.json)\n",
            m->name, mbd_status_name(err.code), err.msg);
    return -1;
  }
  m->eos = -1;
  const char *eos[] = {"<|endoftext|>", "</s>", "<|end_of_text|>"};
  for (size_t i = 0; i < 3 && m->eos < 0; i++) m->eos = mbd_tokenizer_token_id(m->tok, eos[i]);
  gw_chat_detect(m->dir, &m->chat);
  printf("mambad-gateway: model %s: tokenizer %.16s... (%lld ids), chat template: %s\n", m->name,
         mbd_tokenizer_digest(m->tok), (long long)mbd_tokenizer_vocab_size(m->tok),
         m->chat.kind == GW_CHAT_CHATML ? "ChatML" : "none");
  g->n_models++;
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"connect", required_argument, 0, 'c'},
                                       {"listen", required_argument, 0, 'l'},
                                       {"model", required_argument, 0, 'm'},
                                       {"max-body-bytes", required_argument, 0, 'B'},
                                       {"conn-timeout-s", required_argument, 0, 'T'},
                                       {"max-conns", required_argument, 0, 'C'},
                                       {"max-running", required_argument, 0, 'R'},
                                       {"max-waiting", required_argument, 0, 'W'},
                                       {"deadline-ms", required_argument, 0, 'D'},
                                       {"chunk-tokens", required_argument, 0, 'K'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  static gw_ctx ctx; /* large (models); lives for the whole process */
  gw_ctx *g = &ctx;
  int rc = 1;
  gw_http *h = NULL;
  snprintf(g->opt.connect, sizeof g->opt.connect, "ipc:///tmp/mambad/clients.sock");
  snprintf(g->opt.host, sizeof g->opt.host, "127.0.0.1");
  g->opt.port = 8000;
  g->opt.max_body = 1u << 20;
  g->opt.conn_timeout_s = 30;
  g->opt.max_conns = 256;
  g->opt.max_running = 64;
  g->opt.max_waiting = 256;
  g->opt.deadline_ms = 120000;
  g->opt.chunk_tokens = 16;
  pthread_mutex_init(&g->mu, NULL);
  pthread_mutex_init(&g->status_mu, NULL);
  pthread_cond_init(&g->slot_cv, NULL);
  pthread_cond_init(&g->streams_cv, NULL);
  int o;
  long long x;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 'c': snprintf(g->opt.connect, sizeof g->opt.connect, "%s", optarg); break;
    case 'l': {
      const char *colon = strrchr(optarg, ':');
      if (!colon || colon == optarg || (size_t)(colon - optarg) >= sizeof g->opt.host ||
          parse_int("--listen port", colon + 1, 0, 65535, &x)) {
        fprintf(stderr, "mambad-gateway: --listen wants HOST:PORT, got '%s'\n", optarg);
        goto done;
      }
      snprintf(g->opt.host, sizeof g->opt.host, "%.*s", (int)(colon - optarg), optarg);
      g->opt.port = (int)x;
      break;
    }
    case 'm':
      if (add_model(g, optarg)) goto done;
      break;
    case 'B':
      if (parse_int("--max-body-bytes", optarg, 1024, 1ll << 30, &x)) goto done;
      g->opt.max_body = (size_t)x;
      break;
    case 'T':
      if (parse_int("--conn-timeout-s", optarg, 1, 3600, &x)) goto done;
      g->opt.conn_timeout_s = (int)x;
      break;
    case 'C':
      if (parse_int("--max-conns", optarg, 1, 65536, &x)) goto done;
      g->opt.max_conns = (int)x;
      break;
    case 'R':
      if (parse_int("--max-running", optarg, 1, 65536, &x)) goto done;
      g->opt.max_running = (int)x;
      break;
    case 'W':
      if (parse_int("--max-waiting", optarg, 0, 1 << 20, &x)) goto done;
      g->opt.max_waiting = (int)x;
      break;
    case 'D':
      if (parse_int("--deadline-ms", optarg, 1, 86400000, &x)) goto done;
      g->opt.deadline_ms = x;
      break;
    case 'K':
      if (parse_int("--chunk-tokens", optarg, 1, 1 << 20, &x)) goto done;
      g->opt.chunk_tokens = (int)x;
      break;
    case 'h': usage(stdout); return 0;
    default:
      fprintf(stderr, "mambad-gateway: unknown option or missing value: %s\n", argv[optind - 1]);
      usage(stderr);
      goto done;
    }
  }
  if (optind < argc || g->n_models == 0) {
    if (g->n_models == 0) fprintf(stderr, "mambad-gateway: name at least one --model NAME=DIR\n");
    usage(stderr);
    goto done;
  }
  const char *names[GW_MAX_MODELS];
  for (size_t i = 0; i < g->n_models; i++) names[i] = g->models[i].name;
  g->metrics = gw_metrics_new(g->n_models, names);
  g->pool = gw_client_pool_new();
  if (!g->metrics || !g->pool) {
    fprintf(stderr, "mambad-gateway: out of memory\n");
    goto done;
  }
  /* Signals are taken by sigwait below; every thread inherits the block. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  char msg[256];
  if (gw_http_start(g, &h, msg, sizeof msg)) {
    fprintf(stderr, "mambad-gateway: %s\n", msg);
    goto done;
  }
  printf("mambad-gateway: listening on http://%s:%d (broker %s)\n", g->opt.host, gw_http_port(h),
         g->opt.connect);
  fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  printf("mambad-gateway: signal %d: stopping\n", sig);
  fflush(stdout);
  rc = 0;
done:
  gw_http_stop(&h);
  gw_client_pool_destroy(&g->pool);
  gw_metrics_destroy(&g->metrics);
  mbd_status_report_free(&g->status);
  mbd_client_destroy(&g->status_client);
  for (size_t i = 0; i < g->n_models; i++) mbd_tokenizer_destroy(&g->models[i].tok);
  return rc;
}
