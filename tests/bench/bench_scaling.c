/* bench_scaling: load generator for the per-device worker scaling run.
 *
 * Talks to a running deployment (`mambad up`, N workers already started):
 *  1. STATUS through libmambad until N workers are alive; "routes same" = all
 *     N report one route id.
 *  2. Bits: rounds of identical FORWARDs pipelined on one DEALER (the broker
 *     picks the least loaded worker, so they spread), every reply's logits
 *     memcmp'd with the first and its route id checked; "bits same" needs
 *     every reply identical AND replies from all N workers (the reply names
 *     the worker; the broker has no per-worker pin, so coverage is checked).
 *  3. Load: P forked client processes, each with its own DEALER driving S
 *     sessions at once (OPEN, PREFILL of its prompt, one warm GENERATE), then
 *     on a common start signal R rounds of GENERATE of G greedy tokens for all
 *     S sessions at once. Aggregate tokens/s = all tokens / (last child's end
 *     - start). Session k uses prompt k mod 8; greedy token histories of
 *     sessions with the same prompt must be equal on whichever worker served
 *     them (checked across processes by hash; this also feeds "bits same").
 *  4. Meanwhile this process times brokered STATUS round trips (p50/p99,
 *     one every --status-gap-us) and reads the broker's CPU time from
 *     /proc/<pid>/stat before and after; children report their own CPU.
 * The last line is machine-readable (`RESULT key=value ...`) for
 * tests/bench/scale_workers.sh. Exit 0 when the run completed and both checks
 * passed, 1 otherwise, 2 on usage errors.
 *
 * Reuses the wire helpers of tests/integration/worker_harness.h (wh_*); the
 * deployment itself is started by the script, not here. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "client/mambad.h"
#include "common/mamba_config.h"
#include "support/quantile.h"
#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define MAX_WORKERS 64 /* worker masks are uint64_t */
#define N_CLASSES 8    /* distinct prompts */
#define PROMPT_T 8     /* prompt tokens */
#define MAX_PROCS 256

typedef struct opts {
  char endpoint[320];
  char model[64];
  char model_dir[512];
  int workers;         /* N expected */
  int procs;           /* P client processes */
  int sessions;        /* S sessions per process */
  int gen;             /* G tokens per GENERATE */
  int warm;            /* tokens of the warm-up GENERATE */
  int reps;            /* R timed rounds */
  int partial_every;   /* tokens per PARTIAL */
  int forwards;        /* identical FORWARDs per bits round */
  int status_gap_us;   /* pause between timed STATUS calls */
  int wait_s;          /* for the workers to register */
  int64_t deadline_ms; /* per request */
  long broker_pid;     /* 0 = no broker CPU figure */
  int vocab;
} opts;

/* What a child reports through its pipe when done. */
typedef struct child_result {
  int ok;                          /* 1 = every request succeeded */
  int64_t tokens;                  /* generated in the timed rounds */
  double t_end;                    /* CLOCK_MONOTONIC seconds */
  double cpu_s;                    /* own user+sys CPU in the timed rounds */
  uint64_t class_hash[N_CLASSES];  /* token-history hash of the first session of each class */
  uint64_t class_mask[N_CLASSES];  /* workers that served sessions of the class */
  int class_seen[N_CLASSES];       /* sessions of the class */
  int class_mismatch;              /* sessions whose history differs from their class */
  char msg[160];                   /* first failure */
} child_result;

static char g_names[MAX_WORKERS][64]; /* worker names from STATUS, before fork */
static char g_route[65];              /* the shared route id ("" when not shared) */

static int worker_index(const char *name) {
  for (int i = 0; i < MAX_WORKERS && g_names[i][0]; i++)
    if (!strcmp(g_names[i], name)) return i;
  return -1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static double cpu_self(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

/* utime + stime of pid in seconds, or -1 when /proc/<pid>/stat is unreadable. */
static double proc_cpu_s(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (!p) return -1;
  unsigned long long ut = 0, st = 0;
  /* after ')': state(3) ... utime(14) stime(15) */
  if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void prompt_of(int cls, int vocab, int64_t *ids) {
  for (int j = 0; j < PROMPT_T; j++) ids[j] = ((int64_t)cls * 7919 + j * 131 + 1) % vocab;
}

/* A DEALER to the broker in a fresh ZeroMQ context (one per process). */
static int wh_connect(wh *h, const char *ep) {
  memset(h, 0, sizeof *h);
  h->zctx = zmq_ctx_new();
  h->sock = h->zctx ? zmq_socket(h->zctx, ZMQ_DEALER) : NULL;
  if (!h->sock) return -1;
  int linger = 0;
  zmq_setsockopt(h->sock, ZMQ_LINGER, &linger, sizeof linger);
  h->next_tag = 1;
  return zmq_connect(h->sock, ep);
}

static void wh_disconnect(wh *h) {
  if (h->sock) zmq_close(h->sock);
  if (h->zctx) zmq_ctx_term(h->zctx);
  h->sock = h->zctx = NULL;
}

/* Collects the FINAL/ERROR of tags [t0, t0+n) into out[] (PARTIALs dropped).
 * Returns how many are missing or ERROR (ERRORs are printed). */
static size_t collect(wh *h, uint64_t t0, size_t n, mbd_msg **out, int timeout_ms) {
  size_t bad = wh_collect(h, t0, n, out, timeout_ms);
  for (size_t i = 0; i < n; i++)
    if (out[i] && wh_code(out[i])) bad++;
  return bad;
}

/* Starts a map with the fields every routed request carries. */
static void pack_head(msgpack_packer *pk, size_t extra, int64_t deadline_ms) {
  msgpack_pack_map(pk, extra + 2);
  mbd_pack_kv_i64(pk, "deadline_ms", deadline_ms);
  mbd_pack_str(pk, "route");
  mbd_route_want w;
  memset(&w, 0, sizeof w);
  snprintf(w.route_id, sizeof w.route_id, "%s", g_route);
  mbd_pack_route_want(pk, &w);
}

/* ---- the client processes ----------------------------------------------- */

/* One session of the load, opened by this process before the fork. */
typedef struct sess {
  char id[64]; /* "<worker-uid>/<n>" */
  int worker;  /* index into g_names */
  int cls;     /* prompt class */
} sess;

static int child_run(const opts *o, int idx, const sess *ss, int ready_fd, int go_fd,
                     child_result *r) {
  wh h;
  memset(&h, 0, sizeof h);
  int S = o->sessions;
  uint64_t *hist = calloc((size_t)S, sizeof *hist);
  mbd_msg **m = calloc((size_t)S, sizeof *m);
  int opened = S; /* closed at the end by this client */
  bool ready_sent = false;
  memset(r, 0, sizeof *r);
  if (!hist || !m || wh_connect(&h, o->endpoint)) {
    snprintf(r->msg, sizeof r->msg, "client %d: setup failed", idx);
    goto fail;
  }
  for (int i = 0; i < S; i++) hist[i] = 0xcbf29ce484222325ull;
  size_t bad = 0;
  uint64_t t0;
  int64_t ids[PROMPT_T];
  t0 = h.next_tag;
  for (int i = 0; i < S; i++) {
    prompt_of(ss[i].cls, o->vocab, ids);
    wh_send_prefill(&h, ss[i].id, ids, PROMPT_T, true);
  }
  bad = collect(&h, t0, (size_t)S, m, (int)o->deadline_ms);
  wh_free_all(m, (size_t)S);
  if (bad) {
    snprintf(r->msg, sizeof r->msg, "client %d: %zu PREFILLs failed", idx, bad);
    goto fail;
  }
  /* One round outside the timing warms every batch path, then the histories
   * continue from here: hashing starts with the timed rounds. */
  for (int rep = -1; rep < o->reps; rep++) {
    if (rep == 0) {
      char c = 'R';
      ready_sent = true;
      if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1) {
        snprintf(r->msg, sizeof r->msg, "client %d: start signal lost", idx);
        goto fail;
      }
      r->cpu_s = cpu_self();
    }
    int64_t G = rep < 0 ? o->warm : o->gen;
    t0 = h.next_tag;
    for (int i = 0; i < S; i++) {
      wh_pack p;
      wh_pack_init(&p);
      msgpack_pack_map(&p.pk, 4);
      mbd_pack_kv_str(&p.pk, "session", ss[i].id);
      mbd_pack_kv_i64(&p.pk, "max_tokens", G);
      mbd_pack_kv_i64(&p.pk, "partial_every", o->partial_every);
      mbd_pack_kv_i64(&p.pk, "deadline_ms", o->deadline_ms);
      wh_send(&h, MBD_CMD_GENERATE, &p.sb, 0, NULL, NULL);
    }
    bad = collect(&h, t0, (size_t)S, m, (int)o->deadline_ms + 5000);
    int64_t tok[4096];
    for (int i = 0; i < S && !bad; i++) {
      int n = wh_tokens(m[i], tok, sizeof tok / sizeof tok[0]);
      if (n != G) {
        snprintf(r->msg, sizeof r->msg, "client %d: GENERATE returned %d tokens, asked %" PRId64,
                 idx, n, G);
        bad = 1;
        break;
      }
      if (rep >= 0) {
        hist[i] = fnv(hist[i], tok, (size_t)n * sizeof tok[0]);
        r->tokens += n;
      }
    }
    wh_free_all(m, (size_t)S);
    if (bad) {
      if (!r->msg[0]) snprintf(r->msg, sizeof r->msg, "client %d: %zu GENERATEs failed", idx, bad);
      goto fail;
    }
  }
  r->t_end = wh_now();
  r->cpu_s = cpu_self() - r->cpu_s;
  for (int i = 0; i < S; i++) {
    int c = ss[i].cls;
    if (!r->class_seen[c]) r->class_hash[c] = hist[i];
    else if (r->class_hash[c] != hist[i]) r->class_mismatch++;
    r->class_seen[c]++;
    r->class_mask[c] |= 1ull << ss[i].worker;
  }
  r->ok = 1;
fail:
  if (!ready_sent) { /* tell the parent now rather than let it wait for a start that never comes */
    char c = 'F';
    if (write(ready_fd, &c, 1) != 1) r->ok = 0;
  }
  if (opened) { /* close what was opened; not timed, failures ignored */
    t0 = h.next_tag;
    int n = 0;
    for (int i = 0; i < S; i++) {
      wh_pack k;
      wh_pack_init(&k);
      msgpack_pack_map(&k.pk, 1);
      mbd_pack_kv_str(&k.pk, "session", ss[i].id);
      wh_send(&h, MBD_CMD_CLOSE, &k.sb, 0, NULL, NULL);
      n++;
    }
    if (S > 0) memset(m, 0, (size_t)S * sizeof *m); /* gcc 13 cannot see S > 0 here */
    collect(&h, t0, (size_t)n, m, 10000);
    wh_free_all(m, (size_t)n);
  }
  wh_disconnect(&h);
  free(hist);
  free(m);
  return r->ok ? 0 : 1;
}

/* Opens procs x sessions sessions spread evenly over the workers: the broker
 * places an OPEN on the least loaded worker at that instant, and OPENs finish
 * fast, so a burst lands unevenly; surplus sessions on a full worker are closed
 * and the shortfall opened again. The result is dealt round-robin by worker so
 * that every client drives every worker and every prompt class lives on every
 * worker. Returns the array (caller frees) or NULL with a message. */
static sess *open_balanced(const opts *o, int per_worker[MAX_WORKERS]) {
  int total = o->procs * o->sessions, N = o->workers;
  int target[MAX_WORKERS];
  for (int w = 0; w < N; w++) target[w] = total / N + (w < total % N), per_worker[w] = 0;
  sess *kept = calloc((size_t)total, sizeof *kept), *out = calloc((size_t)total, sizeof *out);
  mbd_msg **m = calloc((size_t)total, sizeof *m);
  char (*extra)[64] = calloc((size_t)total, 64);
  int have = 0, rounds = 0;
  wh h;
  memset(&h, 0, sizeof h);
  if (!kept || !out || !m || !extra || wh_connect(&h, o->endpoint)) goto fail;
  for (; have < total && rounds < 64; rounds++) {
    int need = total - have, n_extra = 0;
    uint64_t t0 = h.next_tag;
    for (int i = 0; i < need; i++) {
      wh_pack p;
      wh_pack_init(&p);
      pack_head(&p.pk, 1, o->deadline_ms);
      mbd_pack_kv_str(&p.pk, "model", o->model);
      wh_send(&h, MBD_CMD_OPEN, &p.sb, 0, NULL, NULL);
    }
    memset(m, 0, (size_t)need * sizeof *m);
    collect(&h, t0, (size_t)need, m, (int)o->deadline_ms);
    for (int i = 0; i < need; i++) {
      char id[64] = "", wname[64] = "";
      if (!m[i] || mbd_msg_cmd(m[i]) != MBD_CMD_FINAL || wh_str(m[i], "session", id, sizeof id))
        continue; /* a worker may be full while it holds surplus: retried next round */
      wh_str(m[i], "worker", wname, sizeof wname);
      int wi = worker_index(wname);
      if (wi >= 0 && wi < N && per_worker[wi] < target[wi]) {
        snprintf(kept[have].id, sizeof kept[have].id, "%s", id);
        kept[have++].worker = wi;
        per_worker[wi]++;
      } else {
        snprintf(extra[n_extra++], 64, "%s", id);
      }
    }
    wh_free_all(m, (size_t)need);
    t0 = h.next_tag;
    for (int i = 0; i < n_extra; i++) {
      wh_pack k;
      wh_pack_init(&k);
      msgpack_pack_map(&k.pk, 1);
      mbd_pack_kv_str(&k.pk, "session", extra[i]);
      wh_send(&h, MBD_CMD_CLOSE, &k.sb, 0, NULL, NULL);
    }
    if (collect(&h, t0, (size_t)n_extra, m, (int)o->deadline_ms)) {
      wh_free_all(m, (size_t)n_extra);
      fprintf(stderr, "bench_scaling: closing surplus sessions failed\n");
      goto fail;
    }
    wh_free_all(m, (size_t)n_extra);
  }
  if (have < total) {
    fprintf(stderr, "bench_scaling: %d of %d sessions placed evenly after %d rounds\n", have, total,
            rounds);
    goto fail;
  }
  /* Deal: the k-th session of worker w goes to position k*N + w; class = k mod classes. */
  int seen[MAX_WORKERS] = {0};
  for (int i = 0; i < total; i++) {
    int w = kept[i].worker, k = seen[w]++;
    int pos = k * N + w;
    if (pos >= total) { /* uneven tail: next free slot */
      pos = 0;
      while (out[pos].id[0]) pos++;
    }
    out[pos] = kept[i];
    out[pos].cls = k % N_CLASSES;
  }
  printf("sessions: %d opened in %d round%s\n", total, rounds, rounds == 1 ? "" : "s");
  wh_disconnect(&h);
  free(kept);
  free(m);
  free(extra);
  return out;
fail:
  wh_disconnect(&h);
  free(kept);
  free(out);
  free(m);
  free(extra);
  return NULL;
}

/* ---- this process: checks, start signal, STATUS latency ---------------- */

/* Waits for exactly n alive workers; fills g_names/g_route. 0, or -1 with a message. */
static int wait_workers(mbd_client *c, const opts *o, bool *routes_same) {
  double end = wh_now() + o->wait_s;
  int alive = 0;
  while (wh_now() < end) {
    mbd_status_report *r = NULL;
    mbd_error err = {0};
    if (mbd_client_status(c, &r, &err) == 0) {
      alive = 0;
      *routes_same = true;
      memset(g_names, 0, sizeof g_names);
      g_route[0] = '\0';
      for (size_t i = 0; i < r->n_workers && alive < MAX_WORKERS; i++) {
        const mbd_worker_info *w = &r->workers[i];
        if (!w->alive) continue;
        snprintf(g_names[alive], sizeof g_names[0], "%s", w->name);
        if (!alive) snprintf(g_route, sizeof g_route, "%s", w->route_id);
        else if (strcmp(g_route, w->route_id)) *routes_same = false;
        alive++;
      }
      mbd_status_report_free(&r);
      if (alive == o->workers) {
        if (!*routes_same) g_route[0] = '\0'; /* route requests by constraints only */
        return 0;
      }
    }
    usleep(200000);
  }
  fprintf(stderr, "bench_scaling: %d alive workers after %d s, expected %d\n", alive, o->wait_s,
          o->workers);
  return -1;
}

/* Identical FORWARDs until every worker has answered (at most 8 rounds).
 * Returns true when all replies were byte-identical, under the shared route,
 * and came from all workers; *seen gets the number of workers that answered. */
static bool bits_check(const opts *o, int *seen, int *replies) {
  wh h;
  bool same = true;
  uint64_t mask = 0, all = o->workers >= 64 ? ~0ull : (1ull << o->workers) - 1;
  uint8_t *ref = NULL;
  size_t ref_n = 0;
  int F = o->forwards;
  mbd_msg **m = calloc((size_t)F, sizeof *m);
  int64_t ids[2 * PROMPT_T];
  prompt_of(3, o->vocab, ids);
  prompt_of(5, o->vocab, ids + PROMPT_T);
  *replies = 0;
  if (!m || wh_connect(&h, o->endpoint)) {
    free(m);
    return false;
  }
  for (int round = 0; round < 8 && same && (mask & all) != all; round++) {
    uint64_t t0 = h.next_tag;
    for (int i = 0; i < F; i++) {
      wh_pack p;
      wh_pack_init(&p);
      pack_head(&p.pk, 3, o->deadline_ms);
      mbd_pack_kv_str(&p.pk, "model", o->model);
      mbd_pack_kv_bool(&p.pk, "last_only", false);
      mbd_pack_str(&p.pk, "tensors");
      msgpack_pack_array(&p.pk, 1);
      int64_t shape[2] = {2, PROMPT_T};
      wh_ref(&p.pk, "input_ids", "i64", 2, shape, 0);
      const void *pl[1] = {ids};
      size_t lens[1] = {sizeof ids};
      wh_send(&h, MBD_CMD_FORWARD, &p.sb, 1, pl, lens);
    }
    if (collect(&h, t0, (size_t)F, m, (int)o->deadline_ms)) same = false;
    for (int i = 0; i < F && same; i++) {
      char wname[64] = "", rid[65] = "";
      wh_str(m[i], "worker", wname, sizeof wname);
      wh_str(m[i], "route_id", rid, sizeof rid);
      int wi = worker_index(wname);
      if (wi >= 0) mask |= 1ull << wi;
      size_t n = 0;
      const void *d = wh_tensor(m[i], &n);
      if (!ref) {
        ref = malloc(n ? n : 1);
        if (ref) memcpy(ref, d, n);
        ref_n = n;
      }
      if (!ref || n == 0 || n != ref_n || memcmp(ref, d, n) || (g_route[0] && strcmp(rid, g_route))) {
        fprintf(stderr, "bench_scaling: FORWARD reply from %s (route %.12s) differs from the first\n",
                wname, rid);
        same = false;
      }
      (*replies)++;
    }
    wh_free_all(m, (size_t)F);
  }
  wh_disconnect(&h);
  free(ref);
  free(m);
  *seen = __builtin_popcountll(mask);
  return same && (mask & all) == all;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_scaling --connect EP --model NAME --model-dir DIR --workers N\n"
          "       [--procs P] [--sessions S] [--gen G] [--warm W] [--reps R] [--partial-every K]\n"
          "       [--forwards F] [--broker-pid PID] [--status-gap-us U] [--wait-s T]\n"
          "       [--deadline-ms D]\n"
          "Drives a running deployment of N workers with P client processes x S sessions\n"
          "generating G greedy tokens R times; prints aggregate tokens/s, broker CPU, brokered\n"
          "STATUS p50/p99 and the route/bits checks, then one `RESULT k=v ...` line.\n");
}

static int parse_args(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"connect", 1, 0, 'c'},   {"model", 1, 0, 'm'},     {"model-dir", 1, 0, 'd'},
      {"workers", 1, 0, 'n'},   {"procs", 1, 0, 'p'},     {"sessions", 1, 0, 's'},
      {"gen", 1, 0, 'g'},       {"warm", 1, 0, 'w'},      {"reps", 1, 0, 'r'},
      {"partial-every", 1, 0, 'k'}, {"forwards", 1, 0, 'f'}, {"broker-pid", 1, 0, 'b'},
      {"status-gap-us", 1, 0, 'u'}, {"wait-s", 1, 0, 't'}, {"deadline-ms", 1, 0, 'D'},
      {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->procs = 1, o->sessions = 8, o->gen = 32, o->warm = 4, o->reps = 3, o->partial_every = 16;
  o->forwards = 0, o->status_gap_us = 2000, o->wait_s = 300, o->deadline_ms = 600000;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    long long v = 0;
    if (c != 'c' && c != 'm' && c != 'd' && c != 'h' && c != '?') {
      char *end = NULL;
      v = strtoll(optarg, &end, 10);
      if (!*optarg || *end || v < 0 || v > 100000000) {
        fprintf(stderr, "bench_scaling: %s wants a number >= 0, got '%s'\n", argv[optind - 1], optarg);
        return -1;
      }
    }
    switch (c) {
    case 'c': snprintf(o->endpoint, sizeof o->endpoint, "%s", optarg); break;
    case 'm': snprintf(o->model, sizeof o->model, "%s", optarg); break;
    case 'd': snprintf(o->model_dir, sizeof o->model_dir, "%s", optarg); break;
    case 'n': o->workers = (int)v; break;
    case 'p': o->procs = (int)v; break;
    case 's': o->sessions = (int)v; break;
    case 'g': o->gen = (int)v; break;
    case 'w': o->warm = (int)v; break;
    case 'r': o->reps = (int)v; break;
    case 'k': o->partial_every = (int)v; break;
    case 'f': o->forwards = (int)v; break;
    case 'b': o->broker_pid = (long)v; break;
    case 'u': o->status_gap_us = (int)v; break;
    case 't': o->wait_s = (int)v; break;
    case 'D': o->deadline_ms = v; break;
    case 'h': usage(stdout); exit(0);
    default:
      fprintf(stderr, "bench_scaling: unknown option or missing value: %s\n", argv[optind - 1]);
      return -1;
    }
  }
  if (!o->endpoint[0] || !o->model[0] || !o->model_dir[0] || optind < argc) {
    usage(stderr);
    return -1;
  }
  if (o->workers < 1 || o->workers > MAX_WORKERS || o->procs < 1 || o->procs > MAX_PROCS ||
      o->sessions < 1 || o->gen < 1 || o->gen > 4096 || o->warm < 1 || o->warm > 4096 ||
      o->reps < 1 || o->partial_every < 1) {
    fprintf(stderr, "bench_scaling: need 1 <= workers <= %d, 1 <= procs <= %d, sessions, reps, "
                    "partial-every >= 1, 1 <= gen, warm <= 4096\n", MAX_WORKERS, MAX_PROCS);
    return -1;
  }
  if (!o->forwards) o->forwards = 4 * o->workers;
  char cp[600];
  snprintf(cp, sizeof cp, "%s/config.json", o->model_dir);
  mbd_mamba_config cfg;
  mbd_error err = {0};
  if (mbd_mamba_config_load(cp, &cfg, &err)) {
    fprintf(stderr, "bench_scaling: %s\n", err.msg);
    return -1;
  }
  o->vocab = cfg.vocab_size;
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse_args(argc, argv, &o)) return 2;
  signal(SIGPIPE, SIG_IGN);
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 5000;
  mbd_client *cl = NULL;
  mbd_error err = {0};
  if (mbd_client_new(o.endpoint, &co, &cl, &err)) {
    fprintf(stderr, "bench_scaling: %s\n", err.msg);
    return 1;
  }
  bool routes_same = false;
  if (wait_workers(cl, &o, &routes_same)) {
    mbd_client_destroy(&cl);
    return 1;
  }
  int seen = 0, replies = 0;
  bool bits_same = bits_check(&o, &seen, &replies);
  printf("workers %d, route %s: %s; FORWARD bits: %d replies from %d/%d workers, %s\n", o.workers,
         routes_same ? g_route : "(differs)", routes_same ? "one route id" : "ROUTE IDS DIFFER",
         replies, seen, o.workers, bits_same ? "identical" : "NOT identical or not all workers");
  fflush(stdout);
  int per_worker[MAX_WORKERS] = {0};
  sess *ss = open_balanced(&o, per_worker);
  fflush(stdout);
  /* No ZeroMQ context may live across fork(): children make their own. */
  mbd_client_destroy(&cl);

  int ready[2], go[2];
  int (*res)[2] = calloc((size_t)o.procs, sizeof *res);
  pid_t *pids = calloc((size_t)o.procs, sizeof *pids);
  child_result *cr = calloc((size_t)o.procs, sizeof *cr);
  double *lat = NULL;
  size_t nlat = 0, cap_lat = 0;
  int rc = 1, started = 0;
  if (!ss || !res || !pids || !cr || pipe(ready) || pipe(go)) goto done;
  for (int i = 0; i < o.procs; i++) {
    if (pipe(res[i])) goto done;
    pids[i] = fork();
    if (pids[i] < 0) goto done;
    if (pids[i] == 0) {
      close(ready[0]);
      close(go[1]);
      close(res[i][0]);
      child_result r;
      int crc = child_run(&o, i, ss + (size_t)i * (size_t)o.sessions, ready[1], go[0], &r);
      if (write(res[i][1], &r, sizeof r) != (ssize_t)sizeof r) crc = 1;
      _exit(crc);
    }
    close(res[i][1]);
    started++;
  }
  close(ready[1]);
  close(go[0]);
  for (int i = 0; i < o.procs; i++) { /* every client has its sessions open and warm */
    char c = 0;
    struct pollfd pf = {.fd = ready[0], .events = POLLIN};
    if (poll(&pf, 1, (int)o.deadline_ms) <= 0 || read(ready[0], &c, 1) != 1 || c != 'R') {
      fprintf(stderr, "bench_scaling: client setup failed (%d of %d ready)\n", i, o.procs);
      close(go[1]);
      for (int k = 0; k < o.procs; k++) /* each client reports why */
        if (read(res[k][0], &cr[k], sizeof cr[k]) == (ssize_t)sizeof cr[k] && cr[k].msg[0])
          fprintf(stderr, "bench_scaling: %s\n", cr[k].msg);
      goto reap;
    }
  }
  if (mbd_client_new(o.endpoint, &co, &cl, &err)) goto reap;
  double b0 = o.broker_pid ? proc_cpu_s(o.broker_pid) : -1;
  double t0 = wh_now();
  {
    char *gos = malloc((size_t)o.procs);
    memset(gos, 'G', (size_t)o.procs);
    if (write(go[1], gos, (size_t)o.procs) != (ssize_t)o.procs) fprintf(stderr, "start: short write\n");
    free(gos);
  }
  close(go[1]);
  int done_n = 0;
  struct pollfd *pf = calloc((size_t)o.procs, sizeof *pf);
  for (int i = 0; i < o.procs; i++) pf[i] = (struct pollfd){.fd = res[i][0], .events = POLLIN};
  double b1 = -1;
  while (done_n < o.procs && wh_now() - t0 < o.deadline_ms / 1000.0 * (o.reps + 1)) {
    double s0 = wh_now();
    mbd_status_report *r = NULL;
    if (mbd_client_status(cl, &r, NULL) == 0) {
      if (nlat == cap_lat) {
        cap_lat = cap_lat ? 2 * cap_lat : 4096;
        double *nl = realloc(lat, cap_lat * sizeof *lat);
        if (!nl) break;
        lat = nl;
      }
      lat[nlat++] = (wh_now() - s0) * 1e6;
    }
    mbd_status_report_free(&r);
    int gap_ms = o.status_gap_us / 1000;
    if (poll(pf, (nfds_t)o.procs, gap_ms) > 0) {
      for (int i = 0; i < o.procs; i++) {
        if (!(pf[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = read(pf[i].fd, &cr[i], sizeof cr[i]);
        if (n != (ssize_t)sizeof cr[i]) cr[i].ok = 0;
        pf[i].fd = -1; /* poll ignores it from now on */
        done_n++;
        if (done_n == o.procs && o.broker_pid) b1 = proc_cpu_s(o.broker_pid);
      }
    } else if (o.status_gap_us % 1000) {
      usleep((useconds_t)(o.status_gap_us % 1000));
    }
  }
  free(pf);
  {
    int64_t tokens = 0;
    double t_end = t0, ccpu = 0;
    int ok = done_n == o.procs;
    int mismatch = 0;
    uint64_t chash[N_CLASSES] = {0}, cmask[N_CLASSES] = {0};
    int cseen[N_CLASSES] = {0};
    for (int i = 0; i < o.procs; i++) {
      if (!cr[i].ok) {
        ok = 0;
        fprintf(stderr, "bench_scaling: %s\n", cr[i].msg[0] ? cr[i].msg : "a client died");
        continue;
      }
      tokens += cr[i].tokens;
      ccpu += cr[i].cpu_s;
      if (cr[i].t_end > t_end) t_end = cr[i].t_end;
      mismatch += cr[i].class_mismatch;
      for (int c = 0; c < N_CLASSES; c++) {
        if (!cr[i].class_seen[c]) continue;
        if (!cseen[c]) chash[c] = cr[i].class_hash[c];
        else if (chash[c] != cr[i].class_hash[c]) mismatch++;
        cseen[c] += cr[i].class_seen[c];
        cmask[c] |= cr[i].class_mask[c];
      }
    }
    /* Token histories are a cross-worker check only for prompts whose sessions
     * landed on more than one worker; count how many did. */
    int spanning = 0;
    for (int c = 0; c < N_CLASSES; c++) spanning += __builtin_popcountll(cmask[c]) > 1;
    bool gen_same = ok && mismatch == 0;
    double wall = t_end - t0;
    double tps = ok && wall > 0 ? (double)tokens / wall : 0;
    double bcpu = b0 >= 0 && b1 >= 0 && wall > 0 ? 100.0 * (b1 - b0) / wall : -1;
    double p50 = 0, p99 = 0;
    if (nlat) {
      p50 = quantile_of(lat, nlat, 0.5);
      p99 = quantile_of(lat, nlat, 0.99);
    }
    printf("load: %d procs x %d sessions, %d rounds of %d tokens: %" PRId64 " tokens in %.3f s = "
           "%.0f tok/s\n",
           o.procs, o.sessions, o.reps, o.gen, tokens, wall, tps);
    printf("broker CPU %.1f%% of one core; clients CPU %.1f%% (all processes); STATUS p50 %.0f us "
           "p99 %.0f us over %zu calls\n",
           bcpu, wall > 0 ? 100 * ccpu / wall : 0, p50, p99, nlat);
    char placed[512] = "";
    int minw = per_worker[0], maxw = per_worker[0];
    for (int w = 0; w < o.workers; w++) {
      size_t len = strlen(placed);
      snprintf(placed + len, sizeof placed - len, "%s%d", w ? "/" : "", per_worker[w]);
      if (per_worker[w] < minw) minw = per_worker[w];
      if (per_worker[w] > maxw) maxw = per_worker[w];
    }
    printf("sessions per worker: %s\n", placed);
    printf("GENERATE histories: %s (%d prompts, %d served by >1 worker)\n",
           gen_same ? "identical per prompt" : "DIFFER", N_CLASSES, spanning);
    bool all_bits = bits_same && gen_same;
    printf("RESULT workers=%d procs=%d sessions=%d gen=%d reps=%d tokens=%" PRId64
           " wall_s=%.4f tok_s=%.1f broker_cpu_pct=%.1f client_cpu_pct=%.1f status_p50_us=%.0f "
           "status_p99_us=%.0f status_n=%zu routes_same=%s bits_same=%s fwd_workers=%d "
           "gen_spanning=%d sessions_min=%d sessions_max=%d ok=%s\n",
           o.workers, o.procs, o.sessions, o.gen, o.reps, tokens, wall, tps, bcpu,
           wall > 0 ? 100 * ccpu / wall : 0, p50, p99, nlat, routes_same ? "yes" : "no",
           all_bits ? "yes" : "no", seen, spanning, minw, maxw, ok ? "yes" : "no");
    fflush(stdout);
    rc = ok && routes_same && all_bits ? 0 : 1;
  }
reap:
  for (int i = 0; i < started; i++) {
    int st = 0;
    waitpid(pids[i], &st, 0);
    close(res[i][0]);
  }
done:
  mbd_client_destroy(&cl);
  free(ss);
  free(lat);
  free(res);
  free(pids);
  free(cr);
  return rc;
}
