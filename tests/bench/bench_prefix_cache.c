/* bench_prefix_cache: time to first token and prefill tokens saved by the
 * prefix state cache, through the real processes.
 *
 * Starts a broker and one worker (--device, cpu by default) serving a
 * synthetic Mamba-1 model (--d-model, --layers, --vocab), first with
 * --prefix-cache-mb 0, then with the defaults (256 MiB, 256-token blocks);
 * on a GPU worker the defaults keep states in the device tier, and a third
 * run turns it off (--prefix-cache-device-mb 0: host memory only), or sets
 * it to --device-mb MiB when given. Each run sends the same --requests
 * sessions each time: OPEN (with the prompt's routing hashes), PREFILL
 * last_only of a shared --prefix plus a --suffix of the request's own, a
 * GENERATE of one greedy token, CLOSE. TTFT is OPEN sent to the generated
 * token received. Every request's logits and token must equal the cache-off
 * run's (memcmp), else exit 1. Prints one table row per mode.
 *
 * Needs MBD_BIN_DIR (and MBD_FIXTURES_DIR for the harness), as ctest sets:
 *   MBD_BIN_DIR=build/bin MBD_FIXTURES_DIR=../shared/fixtures \
 *     build/bin/bench_prefix_cache [--requests 200] [--prefix 512] [--suffix 16]
 *       [--d-model 256 --layers 4 --vocab 4096] [--threads 2] [--device cpu|cuda:N]
 *       [--unique]   (every prompt its own prefix: what storing costs when nothing hits)
 *       [--device-mb N] (GPU: the third run's --prefix-cache-device-mb; default 0) */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/mambad.h"
#include "common/defaults.h"
#include "kernels/model/synth.h"
#include "support/events.h"
#include "support/quantile.h"
#include "support/worker_harness.h"

typedef struct opts {
  int requests, prefix, suffix, d_model, layers, vocab, threads;
  const char *device; /* the worker's --device (cpu, cuda:N) */
  int unique;         /* every prompt its own prefix: the cost of storing, with no hits */
  const char *device_mb; /* GPU: the third run's --prefix-cache-device-mb */
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t make_prompt(const opts *o, int i, int64_t *ids) {
  for (int j = 0; j < o->prefix; j++) ids[j] = (j * 131 + 7 + (o->unique ? i * 7919 : 0)) % o->vocab;
  for (int j = 0; j < o->suffix; j++) ids[o->prefix + j] = (i * 977 + j * 31 + 1) % o->vocab;
  return o->prefix + o->suffix;
}

/* One request; returns its TTFT in ms, logits into lg[V], the token into *tok. */
static double one(mbd_client *c, const opts *o, int i, int64_t *ids, float *lg, int64_t *tok) {
  int64_t n = make_prompt(o, i, ids);
  mbd_error err = {0};
  mbd_session *s = NULL;
  double t0 = now_s();
  if (mbd_session_open_prompt(c, NULL, "big", ids, n, 0, NULL, 0, &s, &err)) {
    fprintf(stderr, "open: %s\n", err.msg);
    exit(1);
  }
  mbd_tensor_in in = {.data = ids};
  int64_t sh[1] = {n};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 1, sh, NULL);
  mbd_tensor_out out;
  if (mbd_session_prefill(s, NULL, &in, true, &out, &err)) {
    fprintf(stderr, "prefill: %s\n", err.msg);
    exit(1);
  }
  memcpy(lg, out.data, out.nbytes);
  mbd_tensor_out_release(&out);
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = 1;
  int64_t *t = NULL;
  size_t nt = 0;
  char reason[16];
  if (mbd_session_generate(s, NULL, &gp, NULL, NULL, &t, &nt, reason, &err) || nt != 1) {
    fprintf(stderr, "generate: %s\n", err.msg);
    exit(1);
  }
  double ms = (now_s() - t0) * 1e3;
  *tok = t[0];
  free(t);
  mbd_session_close(&s, &err);
  return ms;
}

static bool stats(mbd_client *c, mbd_prefix_cache_info *x) {
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  bool ok = false;
  memset(x, 0, sizeof *x);
  if (!mbd_client_status(c, &r, &err) && r->n_workers == 1 && r->workers[0].has_prefix_cache) {
    *x = r->workers[0].prefix_cache;
    ok = true;
  }
  mbd_status_report_free(&r);
  return ok;
}

static size_t count_workers(mbd_client *c) {
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  size_t n = 0;
  if (!mbd_client_status(c, &r, &err)) n = r->n_workers;
  mbd_status_report_free(&r);
  return n;
}

int main(int argc, char **argv) {
  opts o = {.requests = 200, .prefix = 512, .suffix = 16, .d_model = 256, .layers = 4,
            .vocab = 4096, .threads = 2, .device = "cpu", .device_mb = "0"};
  static const struct option lo[] = {{"requests", 1, 0, 'r'}, {"prefix", 1, 0, 'p'},
                                     {"suffix", 1, 0, 's'},   {"d-model", 1, 0, 'd'},
                                     {"layers", 1, 0, 'l'},   {"vocab", 1, 0, 'v'},
                                     {"threads", 1, 0, 't'},  {"device", 1, 0, 'D'},
                                     {"unique", 0, 0, 'u'},   {"device-mb", 1, 0, 'M'},
                                     {0, 0, 0, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
    int v = ch == '?' || ch == 'u' ? 0 : atoi(optarg);
    switch (ch) {
    case 'r': o.requests = v; break;
    case 'p': o.prefix = v; break;
    case 's': o.suffix = v; break;
    case 'd': o.d_model = v; break;
    case 'l': o.layers = v; break;
    case 'v': o.vocab = v; break;
    case 't': o.threads = v; break;
    case 'D': o.device = optarg; break;
    case 'u': o.unique = 1; break;
    case 'M': o.device_mb = optarg; break;
    default: fprintf(stderr, "see the header of bench_prefix_cache.c for the options\n"); return 2;
    }
  }
  if (o.requests < 1 || o.prefix < 1 || o.suffix < 0 || o.d_model < 1 || o.layers < 1 ||
      o.vocab < 2 || o.threads < 1)
    return 2;
  wh h;
  memset(&h, 0, sizeof h);
  if (wh_init(&h)) return 2;
  char dir[600], model[700], cmd[700], thr[16];
  snprintf(dir, sizeof dir, "%s/big", h.dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  mbd_mamba_config cfg;
  mbd_synth_custom(o.d_model, o.layers, o.vocab, &cfg);
  mbd_error err = {0};
  if (system(cmd) || mbd_synth_write(&cfg, MBD_DTYPE_F32, 3, dir, &err)) {
    fprintf(stderr, "synth: %s\n", err.msg);
    return 1;
  }
  snprintf(model, sizeof model, "big=%s", dir);
  snprintf(thr, sizeof thr, "%d", o.threads);
  wh_start_broker(&h);
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 600000;
  mbd_client *c = NULL;
  if (mbd_client_new(h.clients, &co, &c, &err)) return 1;
  size_t V = (size_t)o.vocab, T = (size_t)(o.prefix + o.suffix);
  float *ref = malloc((size_t)o.requests * V * 4), *lg = malloc(V * 4);
  int64_t *rtok = malloc((size_t)o.requests * 8), *ids = malloc(T * 8), tok;
  double *ms = malloc((size_t)o.requests * sizeof *ms);
  printf("bench_prefix_cache: Mamba-1 synthetic d_model %d, %d layers, vocab %d, f32, worker "
         "--device %s --threads %d; %d requests, %d-token shared prefix + %d own tokens, TTFT = OPEN to the "
         "first generated token%s\n",
         o.d_model, o.layers, o.vocab, o.device, o.threads, o.requests, o.prefix, o.suffix,
         o.unique ? "; --unique: no two prompts share a prefix (the cost of storing)" : "");
  printf("%-12s %10s %10s %10s %16s %14s %8s %12s %10s %12s\n", "cache", "TTFT p50", "TTFT p99",
         "TTFT mean", "prefill tokens", "tokens saved", "hits", "device hits", "demotions",
         "device MiB");
  int bad = 0;
  /* off; on (the defaults: with the device tier on a GPU); GPU only: the
   * device tier at --device-mb (0: host memory only). */
  bool gpu = strncmp(o.device, "cuda", 4) == 0;
  static const char *const names[3] = {"off", "on", "device-mb"};
  for (int mode = 0; mode < (gpu ? 3 : 2); mode++) {
    char name[32], dmb[24];
    if (mode < 2) snprintf(name, sizeof name, "%s", names[mode]);
    else snprintf(name, sizeof name, "device-mb %s", o.device_mb);
    snprintf(dmb, sizeof dmb, "%d", MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB);
    pid_t w = wh_start_worker(&h, names[mode], "--model", model, "--threads", thr, "--device",
                              o.device, "--prefix-cache-mb", mode ? "256" : "0",
                              "--prefix-cache-device-mb", mode == 2 ? o.device_mb : dmb, NULL);
    while (count_workers(c) != 1) ev_nap_ms(50);
    double sum = 0;
    for (int i = 0; i < o.requests; i++) {
      ms[i] = one(c, &o, i, ids, mode ? lg : ref + (size_t)i * V, mode ? &tok : &rtok[i]);
      sum += ms[i];
      if (mode && (memcmp(lg, ref + (size_t)i * V, V * 4) || tok != rtok[i])) bad++;
    }
    mbd_prefix_cache_info x = {0};
    if (mode)
      for (int k = 0; k < 100 && (!stats(c, &x) || x.lookups < o.requests); k++) ev_nap_ms(50);
    double p50 = quantile_of(ms, (size_t)o.requests, 0.5),
           p99 = quantile_of(ms, (size_t)o.requests, 0.99);
    int64_t total = (int64_t)o.requests * (int64_t)T;
    printf("%-12s %8.2f ms %8.2f ms %8.2f ms %16" PRId64 " %14" PRId64 " %8" PRId64 " %12" PRId64
           " %10" PRId64 " %12.1f\n",
           name, p50, p99, sum / o.requests,
           total - x.hit_tokens, x.hit_tokens, x.hits, x.device_hits, x.demotions,
           (double)x.device_bytes / (1 << 20));
    wh_stop(w, SIGTERM);
    h.procs[h.nprocs - 1] = 0;
    while (count_workers(c) != 0) ev_nap_ms(50);
  }
  printf("bits: %s (%d of %d requests differ from the cache-off run)\n", bad ? "DIFFER" : "same",
         bad, o.requests);
  mbd_client_destroy(&c);
  free(ref);
  free(lg);
  free(rtok);
  free(ids);
  free(ms);
  wh_fini(&h);
  return bad ? 1 : 0;
}
