/* `mambad`: the command-line front end.
 *
 * Git-style: `mambad run|model|up|broker|worker ...` execs the matching
 * `mambad-<cmd>` program (next to this binary, else on PATH); status, forward,
 * generate, gemm and bench are built in on libmambad. Tensor files use the
 * same safetensors interface as `mambad-run` (input_ids in, logits or tokens
 * out). Exit codes: 0 success, 1 the request or a file failed (the error's
 * code name and message are printed), 2 bad usage, 127 sub-program missing. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client/mambad.h"
#include "common/curve.h"
#include "common/half.h"
#include "common/progress.h"
#include "common/safetensors.h"
#include "common/tokenizer/text_stream.h"
#include "common/tokenizer/tokenizer.h"

#define DEFAULT_ENDPOINT "ipc://$XDG_RUNTIME_DIR/mambad/clients.sock, as root ipc:///run/mambad/clients.sock"

/* The default broker endpoint: under the user's runtime directory (private to
 * the user), or /run/mambad for root; never a world-writable /tmp path. */
static const char *default_endpoint(void) {
  static char ep[512];
  const char *rt = getenv("XDG_RUNTIME_DIR");
  if (geteuid() != 0 && rt && rt[0] == '/')
    snprintf(ep, sizeof ep, "ipc://%s/mambad/clients.sock", rt);
  else
    snprintf(ep, sizeof ep, "ipc:///run/mambad/clients.sock");
  return ep;
}
#define EXIT_FAIL 1
#define EXIT_USAGE 2

/* ---- shared option handling ------------------------------------------- */

typedef struct cli_opts {
  const char *connect;   /* broker client endpoint */
  const char *model;
  const char *input, *output;
  mbd_route_want route;  /* --route-id/--backend/--dtype/--state-dtype/--gemm-mode/--family/--device */
  int64_t deadline_ms;
  bool shm, last_only, full, quiet;
  bool verbose;          /* --verbose: each request's id (as the broker and worker log it) */
  mbd_generate_params gen;
  int64_t stop[64];
  /* gemm / bench */
  int64_t m, n, k, requests, batch, seq;
  const char *gemm_dtype;
  uint64_t seed;
  /* text: tokenize / detokenize / generate --prompt */
  const char *tokenizer, *prompt, *prompt_file;
  bool add_special, skip_special;
} cli_opts;

enum {
  O_CONNECT = 1000, O_MODEL, O_INPUT, O_OUTPUT, O_ROUTE_ID, O_BACKEND, O_DTYPE, O_GEMM_MODE,
  O_FAMILY, O_DEVICE, O_DEADLINE, O_SHM, O_LAST_ONLY, O_FULL, O_QUIET, O_GENERATE, O_TEMP,
  O_TOPK, O_TOPP, O_SEED, O_STOP, O_M, O_N, O_K, O_REQUESTS, O_BATCH, O_SEQ, O_HELP,
  O_TOKENIZER, O_ADD_SPECIAL, O_SKIP_SPECIAL, O_PROMPT, O_PROMPT_FILE, O_VERBOSE, O_STATE_DTYPE
};

static const struct option k_long[] = {
    {"connect", required_argument, 0, O_CONNECT}, {"model", required_argument, 0, O_MODEL},
    {"input", required_argument, 0, O_INPUT},      {"output", required_argument, 0, O_OUTPUT},
    {"route-id", required_argument, 0, O_ROUTE_ID}, {"backend", required_argument, 0, O_BACKEND},
    {"dtype", required_argument, 0, O_DTYPE},      {"gemm-mode", required_argument, 0, O_GEMM_MODE},
    {"state-dtype", required_argument, 0, O_STATE_DTYPE},
    {"family", required_argument, 0, O_FAMILY},    {"device", required_argument, 0, O_DEVICE},
    {"deadline-ms", required_argument, 0, O_DEADLINE}, {"shm", no_argument, 0, O_SHM},
    {"last-only", no_argument, 0, O_LAST_ONLY},    {"full", no_argument, 0, O_FULL},
    {"quiet", no_argument, 0, O_QUIET},            {"generate", required_argument, 0, O_GENERATE},
    {"verbose", no_argument, 0, O_VERBOSE},
    {"max-tokens", required_argument, 0, O_GENERATE}, {"temperature", required_argument, 0, O_TEMP},
    {"top-k", required_argument, 0, O_TOPK},       {"top-p", required_argument, 0, O_TOPP},
    {"seed", required_argument, 0, O_SEED},        {"stop", required_argument, 0, O_STOP},
    {"m", required_argument, 0, O_M},              {"n", required_argument, 0, O_N},
    {"k", required_argument, 0, O_K},              {"requests", required_argument, 0, O_REQUESTS},
    {"batch", required_argument, 0, O_BATCH},      {"seq", required_argument, 0, O_SEQ},
    {"help", no_argument, 0, O_HELP},
    {"tokenizer", required_argument, 0, O_TOKENIZER}, {"add-special-tokens", no_argument, 0, O_ADD_SPECIAL},
    {"skip-special-tokens", no_argument, 0, O_SKIP_SPECIAL}, {"prompt", required_argument, 0, O_PROMPT},
    {"prompt-file", required_argument, 0, O_PROMPT_FILE}, {0, 0, 0, 0}};

static const char *k_route_help =
    "  --connect EP        broker client endpoint (default $MAMBAD_CONNECT or " DEFAULT_ENDPOINT ")\n"
    "                      tcp with CURVE: $MAMBAD_CURVE_KEY (own .key) and $MAMBAD_SERVER_KEY\n"
    "  --route-id HEX      exact route id or a prefix of >= 8 hex chars\n"
    "  --backend B         cpu | cuda\n"
    "  --dtype D           storage dtype policy: f32 | tf32 | bf16 | f16\n"
    "  --state-dtype S     recurrent state storage: f32 | bf16\n"
    "  --gemm-mode M       deterministic | cublas-fast | cublas-pedantic\n"
    "  --family F          inference | triad\n"
    "  --device NAME       exact device name (\"NVIDIA H200\", \"cpu\")\n"
    "  --deadline-ms N     request deadline (default: the broker's)\n";

__attribute__((format(printf, 2, 3))) static int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mambad %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(see `mambad %s --help`)\n", cmd);
  return EXIT_USAGE;
}

static int parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo) {
    fprintf(stderr, "mambad %s: %s wants an integer >= %" PRId64 ", got '%s'\n", cmd, flag, lo, s);
    return EXIT_USAGE;
  }
  *out = v;
  return 0;
}

static int parse_f64(const char *cmd, const char *flag, const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < 0) {
    fprintf(stderr, "mambad %s: %s wants a number >= 0, got '%s'\n", cmd, flag, s);
    return EXIT_USAGE;
  }
  *out = v;
  return 0;
}

static int set_str(const char *cmd, const char *flag, char *dst, size_t cap, const char *s) {
  if (strlen(s) >= cap) {
    fprintf(stderr, "mambad %s: %s value '%s' is too long\n", cmd, flag, s);
    return EXIT_USAGE;
  }
  snprintf(dst, cap, "%s", s);
  return 0;
}

/* Parses argv (argv[0] = subcommand) into o; `allowed` lists accepted option
 * ids (0-terminated) so each command rejects flags it does not use. Returns 0,
 * EXIT_USAGE, or -1 for --help. */
static int parse_opts(const char *cmd, int argc, char **argv, const int *allowed, cli_opts *o) {
  memset(o, 0, sizeof *o);
  o->connect = getenv("MAMBAD_CONNECT") ? getenv("MAMBAD_CONNECT") : default_endpoint();
  mbd_generate_params_init(&o->gen);
  o->gen.stop = o->stop;
  o->requests = 100;
  o->batch = 1;
  o->seq = 16;
  o->gemm_dtype = "f32";
  optind = 1;
  opterr = 0;
  int c, rc = 0;
  mbd_error err;
  while ((c = getopt_long(argc, argv, "h", k_long, NULL)) != -1) {
    if (c == 'h' || c == O_HELP) return -1;
    if (c == '?' || c == ':')
      return usage_error(cmd, "unknown option or missing value: %s", argv[optind - 1]);
    bool ok = false;
    for (const int *a = allowed; *a; a++) ok = ok || *a == c;
    if (!ok) return usage_error(cmd, "option %s does not apply here", argv[optind - 1]);
    const char *v = optarg;
    switch (c) {
    case O_CONNECT: o->connect = v; break;
    case O_MODEL: o->model = v; break;
    case O_INPUT: o->input = v; break;
    case O_OUTPUT: o->output = v; break;
    case O_ROUTE_ID: rc = set_str(cmd, "--route-id", o->route.route_id, sizeof o->route.route_id, v); break;
    case O_BACKEND: {
      mbd_backend_kind b;
      if (mbd_backend_parse(v, &b, &err)) return usage_error(cmd, "--backend: %s", err.msg);
      rc = set_str(cmd, "--backend", o->route.backend, sizeof o->route.backend, v);
      break;
    }
    case O_DTYPE: {
      mbd_dtype_policy p;
      mbd_dtype d;
      if (!strcmp(cmd, "gemm")) {
        if (mbd_dtype_parse(v, &d, &err) || d == MBD_DTYPE_I64)
          return usage_error(cmd, "--dtype: '%s' is not f32, bf16 or f16", v);
        o->gemm_dtype = v;
      }
      /* gemm's input dtype is also its storage policy constraint */
      if (mbd_dtype_policy_parse(v, &p, &err)) return usage_error(cmd, "--dtype: %s", err.msg);
      rc = set_str(cmd, "--dtype", o->route.dtype, sizeof o->route.dtype, v);
      break;
    }
    case O_STATE_DTYPE: {
      mbd_state_dtype sd;
      if (mbd_state_dtype_parse(v, &sd, &err)) return usage_error(cmd, "--state-dtype: %s", err.msg);
      rc = set_str(cmd, "--state-dtype", o->route.state, sizeof o->route.state, v);
      break;
    }
    case O_GEMM_MODE: {
      mbd_gemm_mode m;
      if (mbd_gemm_mode_parse(v, &m, &err)) return usage_error(cmd, "--gemm-mode: %s", err.msg);
      rc = set_str(cmd, "--gemm-mode", o->route.gemm_mode, sizeof o->route.gemm_mode, v);
      break;
    }
    case O_FAMILY: {
      mbd_family f;
      if (mbd_family_parse(v, &f, &err)) return usage_error(cmd, "--family: %s", err.msg);
      rc = set_str(cmd, "--family", o->route.family, sizeof o->route.family, v);
      break;
    }
    case O_DEVICE: rc = set_str(cmd, "--device", o->route.device_name, sizeof o->route.device_name, v); break;
    case O_DEADLINE: rc = parse_i64(cmd, "--deadline-ms", v, 1, &o->deadline_ms); break;
    case O_SHM: o->shm = true; break;
    case O_LAST_ONLY: o->last_only = true; break;
    case O_FULL: o->full = true; break;
    case O_QUIET: o->quiet = true; break;
    case O_VERBOSE: o->verbose = true; break;
    case O_GENERATE: rc = parse_i64(cmd, "--generate", v, 1, &o->gen.max_tokens); break;
    case O_TEMP: rc = parse_f64(cmd, "--temperature", v, &o->gen.temperature); break;
    case O_TOPK: rc = parse_i64(cmd, "--top-k", v, 0, &o->gen.top_k); break;
    case O_TOPP:
      rc = parse_f64(cmd, "--top-p", v, &o->gen.top_p);
      if (!rc && o->gen.top_p > 1) return usage_error(cmd, "--top-p must be in [0,1], got %s", v);
      break;
    case O_SEED: {
      int64_t s = 0;
      rc = parse_i64(cmd, "--seed", v, 0, &s);
      o->seed = o->gen.seed = (uint64_t)s;
      break;
    }
    case O_STOP:
      if (o->gen.n_stop >= 64) return usage_error(cmd, "at most 64 --stop tokens");
      rc = parse_i64(cmd, "--stop", v, 0, &o->stop[o->gen.n_stop++]);
      break;
    case O_M: rc = parse_i64(cmd, "--m", v, 1, &o->m); break;
    case O_N: rc = parse_i64(cmd, "--n", v, 1, &o->n); break;
    case O_K: rc = parse_i64(cmd, "--k", v, 1, &o->k); break;
    case O_REQUESTS: rc = parse_i64(cmd, "--requests", v, 1, &o->requests); break;
    case O_BATCH: rc = parse_i64(cmd, "--batch", v, 1, &o->batch); break;
    case O_SEQ: rc = parse_i64(cmd, "--seq", v, 1, &o->seq); break;
    case O_TOKENIZER: o->tokenizer = v; break;
    case O_ADD_SPECIAL: o->add_special = true; break;
    case O_SKIP_SPECIAL: o->skip_special = true; break;
    case O_PROMPT: o->prompt = v; break;
    case O_PROMPT_FILE: o->prompt_file = v; break;
    default: return usage_error(cmd, "unhandled option %s", argv[optind - 1]);
    }
    if (rc) return rc;
  }
  if (optind < argc) return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  return 0;
}

/* Prints "mambad CMD: NAME: message [worker W, route R]" and returns EXIT_FAIL. */
static int report(const char *cmd, const mbd_error *err, const mbd_client *c) {
  fprintf(stderr, "mambad %s: %s: %s", cmd, mbd_status_name(err->code), err->msg);
  const mbd_reply_meta *m = c ? mbd_client_last_reply(c) : NULL;
  if (m && m->trace[0]) fprintf(stderr, " [request %s]", m->trace);
  if (m && (m->worker[0] || m->route_id[0]))
    fprintf(stderr, " [worker %s, route %.12s]", m->worker[0] ? m->worker : "-",
            m->route_id[0] ? m->route_id : "-");
  fputc('\n', stderr);
  return EXIT_FAIL;
}

/* --verbose: who answered the last request and its request id, which the
 * broker and the worker print in their logs at MBD_LOG_LEVEL=debug. */
static void trace_line(const char *cmd, const cli_opts *o, const mbd_client *c, const char *what) {
  if (!o->verbose) return;
  const mbd_reply_meta *m = mbd_client_last_reply(c);
  fprintf(stderr, "mambad %s: %s: request %s (tag %" PRIu64 ") worker %s route %.12s weights %.12s\n",
          cmd, what, m->trace, m->request_id, m->worker[0] ? m->worker : "-",
          m->route_id[0] ? m->route_id : "-", m->model_digest[0] ? m->model_digest : "-");
}

static int connect_client(const char *cmd, const cli_opts *o, mbd_client **c) {
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = o->deadline_ms;
  co.route = o->route;
  co.curve_key = getenv("MAMBAD_CURVE_KEY"); /* tcp with CURVE: docs/security.md */
  co.server_key = getenv("MAMBAD_SERVER_KEY");
  mbd_error err = {0};
  if (mbd_client_new(o->connect, &co, c, &err)) return report(cmd, &err, NULL);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- status ------------------------------------------------------------- */

/* One line of the broker's durable-session counters (docs/cli.md). */
static void print_durable(const mbd_durable_status *d) {
  if (d->budget_mb == 0) {
    printf("durable: off (broker --durable-mb 0), %" PRIu64 " sessions lost\n", d->sessions_lost);
    return;
  }
  char budget[40] = "";
  if (d->budget_mb > 0) snprintf(budget, sizeof budget, " of %" PRId64 " MiB", d->budget_mb);
  printf("durable: %" PRIu64 " sessions, %.1f MiB held%s, %" PRIu64 " checkpoints (%" PRIu64
         " dropped), %" PRIu64 " sessions re-homed, %" PRIu64 " tokens replayed, %" PRIu64
         " generates resumed, %" PRIu64 " sessions lost\n",
         d->sessions, (double)d->checkpoint_bytes / (1024.0 * 1024.0), budget, d->checkpoints,
         d->checkpoints_dropped, d->sessions_rehomed, d->replayed_tokens, d->generates_resumed,
         d->sessions_lost);
}

static int cmd_status(int argc, char **argv) {
  static const int allowed[] = {O_CONNECT, O_FULL, O_DEADLINE, 0};
  cli_opts o;
  int rc = parse_opts("status", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad status [--connect EP] [--full] [--deadline-ms N]\n"
           "Lists the workers the broker knows: name, route id (short; --full prints the full\n"
           "id and the canonical route encoding), load/capacity, sessions, models; and the\n"
           "broker's durable sessions: held, checkpoints, re-homed, replayed, lost.\n");
    return 0;
  }
  if (rc) return rc;
  mbd_client *c = NULL;
  if ((rc = connect_client("status", &o, &c))) return rc;
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  if (mbd_client_status(c, &r, &err)) {
    rc = report("status", &err, c);
    mbd_client_destroy(&c);
    return rc;
  }
  printf("broker %s: %zu worker%s, %" PRId64 " queued\n", o.connect, r->n_workers,
         r->n_workers == 1 ? "" : "s", r->queue);
  if (r->durable.reported) print_durable(&r->durable);
  if (r->n_workers) printf("%-16s %-14s %-9s %-8s %-8s %s\n", "WORKER", "ROUTE", "LOAD", "SESSIONS", "PID", "MODELS");
  for (size_t i = 0; i < r->n_workers; i++) {
    const mbd_worker_info *w = &r->workers[i];
    char load[48], sess[24], models[256] = "";
    snprintf(load, sizeof load, "%" PRId64 "/%" PRId64, w->load, w->capacity);
    if (w->sessions >= 0) snprintf(sess, sizeof sess, "%" PRId64, w->sessions);
    else snprintf(sess, sizeof sess, "-");
    for (size_t k = 0; k < w->n_models; k++) {
      size_t used = strlen(models);
      snprintf(models + used, sizeof models - used, "%s%s@%.8s", k ? "," : "", w->models[k].name,
               w->models[k].digest);
    }
    printf("%-16s %-14.12s %-9s %-8s %-8" PRId64 " %s%s\n", w->name, w->route_id, load, sess, w->pid,
           models, w->alive ? "" : "  (not responding)");
    if (w->has_prefix_cache) {
      const mbd_prefix_cache_info *x = &w->prefix_cache;
      printf("  prefix cache: %" PRId64 " lookups, %" PRId64 " hits, %" PRId64 " hit tokens, %" PRId64
             " entries (%.1f MiB), %" PRId64 " inserts, %" PRId64 " evictions\n",
             x->lookups, x->hits, x->hit_tokens, x->entries, (double)x->bytes / (1 << 20), x->inserts,
             x->evictions);
      if (x->device_entries || x->device_hits || x->demotions)
        printf("    device tier: %" PRId64 " hits, %" PRId64 " entries (%.1f MiB), %" PRId64
               " demotions\n",
               x->device_hits, x->device_entries, (double)x->device_bytes / (1 << 20),
               x->demotions);
    }
    if (o.full) {
      printf("  uid %s, host %s, up %.1f s, last heartbeat %" PRId64 " ms ago\n  route id %s\n", w->uid,
             w->host_id[0] ? w->host_id : "-", w->uptime_ms / 1000.0, w->heartbeat_age_ms, w->route_id);
      const char *p = w->route;
      while (p && *p) { /* indent the canonical encoding, one field per line */
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        printf("    %.*s\n", len, p);
        p = nl ? nl + 1 : p + len;
      }
      for (size_t k = 0; k < w->n_models; k++)
        printf("  model %s %s%s%s\n", w->models[k].name, w->models[k].digest,
               w->models[k].tokenizer_digest[0] ? " tokenizer " : "", w->models[k].tokenizer_digest);
    }
  }
  /* Workers that could not start: why their models have no live worker. */
  for (size_t i = 0; i < r->n_failed; i++) {
    const mbd_failed_worker *f = &r->failed[i];
    printf("worker %s is not running (models %s): %s (reported %.1f s ago)\n", f->name,
           f->models[0] ? f->models : "-", f->error, f->age_ms / 1000.0);
  }
  /* Models as the broker routes them: two digests under one name are two rows. */
  if (r->n_models) printf("%-24s %-18s %-8s %s\n", "MODEL", "DIGEST", "WORKERS", "NOTE");
  for (size_t i = 0; i < r->n_models; i++) {
    const mbd_model_entry *m = &r->models[i];
    size_t same = 0;
    for (size_t j = 0; j < r->n_models; j++) same += !strcmp(r->models[j].name, m->name);
    printf("%-24s %-18.16s %-8" PRId64 " %s\n", m->name, m->digest, m->workers,
           m->is_default ? "default" : same > 1 ? "pin with NAME@DIGEST" : "");
  }
  mbd_status_report_free(&r);
  mbd_client_destroy(&c);
  return 0;
}

/* ---- tokenize / detokenize ------------------------------------------------- */

static int load_tokenizer(const char *cmd, const char *path, mbd_tokenizer **t) {
  mbd_error err = {0};
  if (!path) return usage_error(cmd, "--tokenizer FILE|DIR is required");
  if (mbd_tokenizer_load(path, t, &err)) return report(cmd, &err, NULL);
  return 0;
}

/* Fails line `lineno` of stdin with a message; returns EXIT_FAIL. */
__attribute__((format(printf, 3, 4))) static int line_error(const char *cmd, size_t lineno, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mambad %s: stdin line %zu: ", cmd, lineno);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_FAIL;
}

/* Shared loop: each non-blank stdin line is a JSON object; `fn` turns it into
 * one output line. Stops at the first bad line (exit 1, earlier lines written). */
typedef int (*jsonl_fn)(const char *cmd, const mbd_tokenizer *t, const cli_opts *o, const json_t *in,
                        size_t lineno);

static int jsonl_loop(const char *cmd, const mbd_tokenizer *t, const cli_opts *o, jsonl_fn fn) {
  char *line = NULL;
  size_t cap = 0, lineno = 0;
  ssize_t got;
  int rc = 0;
  while (!rc && (got = getline(&line, &cap, stdin)) > 0) {
    lineno++;
    size_t n = (size_t)got;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
    if (!n) continue;
    json_error_t je;
    json_t *in = json_loadb(line, n, JSON_ALLOW_NUL, &je);
    if (!json_is_object(in)) rc = line_error(cmd, lineno, "not a JSON object%s%s", in ? "" : ": ", in ? "" : je.text);
    else rc = fn(cmd, t, o, in, lineno);
    json_decref(in);
  }
  free(line);
  if (fflush(stdout) || ferror(stdout)) {
    fprintf(stderr, "mambad %s: writing stdout: %s\n", cmd, strerror(errno));
    rc = EXIT_FAIL;
  }
  return rc;
}

static int tokenize_line(const char *cmd, const mbd_tokenizer *t, const cli_opts *o, const json_t *in,
                         size_t lineno) {
  const json_t *text = json_object_get(in, "text");
  if (!json_is_string(text)) return line_error(cmd, lineno, "wants {\"text\": \"...\"}");
  int32_t *ids = NULL;
  size_t n = 0;
  mbd_error err = {0};
  if (mbd_tokenizer_encode(t, json_string_value(text), json_string_length(text), o->add_special, &ids, &n, &err))
    return line_error(cmd, lineno, "%s: %s", mbd_status_name(err.code), err.msg);
  fputs("{\"ids\": [", stdout);
  for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
  fputs("]}\n", stdout);
  free(ids);
  return 0;
}

static int detokenize_line(const char *cmd, const mbd_tokenizer *t, const cli_opts *o, const json_t *in,
                           size_t lineno) {
  const json_t *arr = json_object_get(in, "ids");
  if (!json_is_array(arr)) return line_error(cmd, lineno, "wants {\"ids\": [...]}");
  size_t n = json_array_size(arr);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) return line_error(cmd, lineno, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
      free(ids);
      return line_error(cmd, lineno, "ids[%zu] is not a token id", i);
    }
    ids[i] = (int32_t)json_integer_value(v);
  }
  char *s = NULL;
  size_t len = 0;
  mbd_error err = {0};
  int rc = mbd_tokenizer_decode(t, ids, n, o->skip_special, &s, &len, &err);
  free(ids);
  if (rc) return line_error(cmd, lineno, "%s: %s", mbd_status_name(err.code), err.msg);
  json_t *out = json_pack("{s:s%}", "text", s, len);
  char *js = out ? json_dumps(out, JSON_COMPACT) : NULL;
  free(s);
  json_decref(out);
  if (!js) return line_error(cmd, lineno, "out of memory");
  puts(js);
  free(js);
  return 0;
}

/* generate --prompt / --prompt-file: the prompt's ids as input_ids I64 [1,T]
 * in *ids (freed by the caller), described by *entry. */
static int encode_prompt(const cli_opts *o, const mbd_tokenizer *t, int64_t **ids, mbd_st_entry *entry) {
  mbd_error err = {0};
  size_t n = 0;
  if (mbd_text_prompt_ids(t, o->prompt, o->prompt_file, o->add_special, ids, &n, &err))
    return report("generate", &err, NULL);
  int64_t shape[2] = {1, (int64_t)n};
  memset(entry, 0, sizeof *entry);
  entry->name = "input_ids";
  mbd_tensor_desc_make(&entry->desc, MBD_DTYPE_I64, 2, shape, NULL);
  entry->data = *ids;
  entry->nbytes = n * sizeof **ids;
  return 0;
}

static int cmd_tokenize(int argc, char **argv) {
  static const int allowed[] = {O_TOKENIZER, O_ADD_SPECIAL, 0};
  cli_opts o;
  int rc = parse_opts("tokenize", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad tokenize --tokenizer FILE|DIR [--add-special-tokens] < in.jsonl\n"
           "Reads JSON lines {\"text\": \"...\"} on stdin and writes {\"ids\": [...]} lines, encoded\n"
           "as Hugging Face tokenizers does with the tokenizer.json given (or the one in DIR).\n"
           "--add-special-tokens applies the post-processor's template (BOS/EOS).\n");
    return 0;
  }
  if (rc) return rc;
  mbd_tokenizer *t = NULL;
  if ((rc = load_tokenizer("tokenize", o.tokenizer, &t))) return rc;
  rc = jsonl_loop("tokenize", t, &o, tokenize_line);
  mbd_tokenizer_destroy(&t);
  return rc;
}

static int cmd_detokenize(int argc, char **argv) {
  static const int allowed[] = {O_TOKENIZER, O_SKIP_SPECIAL, 0};
  cli_opts o;
  int rc = parse_opts("detokenize", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad detokenize --tokenizer FILE|DIR [--skip-special-tokens] < in.jsonl\n"
           "Reads JSON lines {\"ids\": [...]} on stdin and writes {\"text\": \"...\"} lines.\n"
           "--skip-special-tokens drops added tokens marked special.\n");
    return 0;
  }
  if (rc) return rc;
  mbd_tokenizer *t = NULL;
  if ((rc = load_tokenizer("detokenize", o.tokenizer, &t))) return rc;
  rc = jsonl_loop("detokenize", t, &o, detokenize_line);
  mbd_tokenizer_destroy(&t);
  return rc;
}

/* ---- forward / generate ---------------------------------------------------- */

/* Opens IN.safetensors and finds input_ids I64 [B,T]. */
static int open_input(const char *cmd, const char *path, mbd_safetensors **st,
                      const mbd_st_entry **ids) {
  mbd_error err = {0};
  if (mbd_safetensors_open(path, st, &err)) return report(cmd, &err, NULL);
  *ids = mbd_safetensors_find(*st, "input_ids");
  if (!*ids || (*ids)->desc.dtype != MBD_DTYPE_I64 || (*ids)->desc.ndim != 2) {
    mbd_error_set(&err, MBD_E_SHAPE, "%s: needs a tensor input_ids of dtype I64 and shape [B,T]",
                  path);
    mbd_safetensors_destroy(st);
    return report(cmd, &err, NULL);
  }
  return 0;
}

typedef struct out_tensor {
  const char *name;
  const mbd_tensor_desc *desc;
  const void *data;
} out_tensor;

/* Writes tensors ts[0..n) to a safetensors file, with the route_id and
 * worker of the last reply as metadata. */
static int write_outputs(const char *cmd, const char *path, const out_tensor *ts, size_t n,
                         const mbd_client *c) {
  mbd_st_writer *w = NULL;
  mbd_error err = {0};
  const mbd_reply_meta *m = mbd_client_last_reply(c);
  int rc = mbd_st_writer_new(&w, &err);
  for (size_t i = 0; i < n && !rc; i++)
    rc = mbd_st_writer_add(w, ts[i].name, ts[i].desc, ts[i].data, &err);
  if (!rc && m->route_id[0]) rc = mbd_st_writer_set_metadata(w, "route_id", m->route_id, &err);
  if (!rc && m->worker[0]) rc = mbd_st_writer_set_metadata(w, "worker", m->worker, &err);
  if (!rc) rc = mbd_st_writer_write(w, path, &err);
  mbd_st_writer_destroy(&w);
  return rc ? report(cmd, &err, NULL) : 0;
}

static int write_output(const char *cmd, const char *path, const char *name,
                        const mbd_tensor_desc *d, const void *data, const mbd_client *c) {
  out_tensor t = {name, d, data};
  return write_outputs(cmd, path, &t, 1, c);
}

static const int k_forward_opts[] = {O_CONNECT, O_MODEL, O_INPUT, O_OUTPUT, O_ROUTE_ID, O_BACKEND,
                                     O_DTYPE, O_STATE_DTYPE, O_GEMM_MODE, O_FAMILY, O_DEVICE,
                                     O_DEADLINE, O_SHM, O_LAST_ONLY, O_VERBOSE, 0};

static int cmd_forward(int argc, char **argv) {
  cli_opts o;
  int rc = parse_opts("forward", argc, argv, k_forward_opts, &o);
  if (rc < 0) {
    printf("usage: mambad forward --model NAME[@DIGEST] --input IN.safetensors --output OUT.safetensors\n"
           "                      [--last-only] [--shm] [route options]\n"
           "Runs input_ids (I64 [B,T]) through the service and writes logits (F32 [B,T,V], or\n"
           "[B,V] with --last-only), plus metadata route_id and worker. --shm passes input_ids\n"
           "through POSIX shared memory (worker on the same host); logits come back inline.\n%s",
           k_route_help);
    return 0;
  }
  if (rc) return rc;
  if (!o.model || !o.input || !o.output)
    return usage_error("forward", "--model, --input and --output are required");
  mbd_safetensors *st = NULL;
  const mbd_st_entry *ids = NULL;
  if ((rc = open_input("forward", o.input, &st, &ids))) return rc;
  mbd_client *c = NULL;
  mbd_shm *in_shm = NULL;
  mbd_tensor_out logits = {0};
  mbd_error err = {0};
  mbd_tensor_in in = {.desc = ids->desc, .data = ids->data};
  if ((rc = connect_client("forward", &o, &c))) goto done;
  if (o.shm) { /* input_ids by reference; logits come back inline (V is not known here) */
    if (mbd_shm_create(NULL, ids->nbytes ? ids->nbytes : 8, &in_shm, &err) ||
        mbd_shm_tensor(in_shm, 0, &ids->desc, &in, &err)) {
      rc = report("forward", &err, NULL);
      goto done;
    }
    memcpy(mbd_shm_data(in_shm), ids->data, ids->nbytes);
  }
  double t0 = now_s();
  if (mbd_client_forward(c, NULL, o.model, &in, o.last_only, NULL, &logits, &err)) {
    rc = report("forward", &err, c);
    goto done;
  }
  double dt = now_s() - t0;
  trace_line("forward", &o, c, "forward");
  if ((rc = write_output("forward", o.output, "logits", &logits.desc, logits.data, c))) goto done;
  char shape[96];
  mbd_tensor_desc_format(&logits.desc, shape, sizeof shape);
  fprintf(stderr, "logits %s from worker %s (route %.12s, weights %.12s) in %.1f ms -> %s\n", shape,
          mbd_client_last_reply(c)->worker, mbd_client_last_reply(c)->route_id,
          mbd_client_last_reply(c)->model_digest[0] ? mbd_client_last_reply(c)->model_digest : "-",
          dt * 1e3, o.output);
done:
  mbd_tensor_out_release(&logits);
  mbd_shm_destroy(&in_shm);
  mbd_client_destroy(&c);
  mbd_safetensors_destroy(&st);
  return rc;
}

typedef struct stream_ctx {
  bool print; /* echo tokens to stdout as they stream */
  int64_t row;
  bool started;
  size_t shown; /* tokens printed from PARTIALs; FINAL may carry more */
  mbd_text_stream *text; /* --prompt: print text instead of ids */
} stream_ctx;

/* --prompt: the text the tokens complete, as they come. */
static void on_text(stream_ctx *s, const int64_t *t, size_t n) {
  mbd_error err = {0};
  if (mbd_text_stream_push(s->text, t, n, &err)) fprintf(stderr, "mambad generate: %s\n", err.msg);
  s->started = true;
  s->shown += n;
}

static void on_tokens(void *user, const int64_t *t, size_t n) {
  stream_ctx *s = user;
  if (s->text) {
    on_text(s, t, n);
    return;
  }
  if (!s->print) return;
  if (!s->started) printf("row %" PRId64 ":", s->row);
  s->started = true;
  for (size_t i = 0; i < n; i++) printf(" %" PRId64, t[i]);
  s->shown += n;
  fflush(stdout);
}

/* Ctrl-C during `generate`: set by the SIGINT handler, read by libmambad,
 * which cancels the running request. */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
  (void)sig;
  g_interrupted = 1;
}

static int cmd_generate(int argc, char **argv) {
  static const int allowed[] = {O_CONNECT, O_MODEL, O_INPUT, O_OUTPUT, O_ROUTE_ID, O_BACKEND, O_DTYPE,
                                O_STATE_DTYPE, O_GEMM_MODE, O_FAMILY, O_DEVICE, O_DEADLINE, O_GENERATE, O_TEMP,
                                O_TOPK, O_TOPP, O_SEED, O_STOP, O_QUIET, O_SHM, O_TOKENIZER,
                                O_PROMPT, O_PROMPT_FILE, O_ADD_SPECIAL, O_SKIP_SPECIAL, O_VERBOSE, 0};
  cli_opts o;
  int rc = parse_opts("generate", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad generate --model NAME[@DIGEST] --input IN.safetensors [--output OUT.safetensors]\n"
           "                       [--generate N | --max-tokens N] [--temperature T] [--top-k K]\n"
           "                       [--top-p P] [--seed S] [--stop ID]... [--quiet] [route options]\n"
           "       mambad generate --model NAME --tokenizer FILE|DIR (--prompt TEXT | --prompt-file F)\n"
           "                       [--add-special-tokens] [--skip-special-tokens] [same options]\n"
           "Opens one session per prompt row of input_ids (I64 [B,T]), prefills it, and generates\n"
           "up to N tokens on the worker (greedy unless --temperature > 0), streaming them to\n"
           "stdout. --output writes tokens I64 [B,T+N] (prompt then generated tokens; rows that\n"
           "stopped early are padded with -1) and lengths I64 [B].\n"
           "With --prompt (or --prompt-file, its bytes as they are) the prompt is encoded with the\n"
           "tokenizer and the generated text streams to stdout as tokens arrive.\n%s",
           k_route_help);
    return 0;
  }
  if (rc) return rc;
  bool text = o.prompt || o.prompt_file;
  if (!o.model || (!o.input == !text) || (o.prompt && o.prompt_file))
    return usage_error("generate", "--model and one of --input, --prompt, --prompt-file are required");
  mbd_safetensors *st = NULL;
  const mbd_st_entry *ids = NULL;
  mbd_tokenizer *tok = NULL;
  mbd_text_stream *text_out = NULL;
  int64_t *prompt_ids = NULL;
  mbd_st_entry prompt_entry;
  if (text) {
    if ((rc = load_tokenizer("generate", o.tokenizer, &tok))) return rc;
    if ((rc = encode_prompt(&o, tok, &prompt_ids, &prompt_entry))) {
      mbd_tokenizer_destroy(&tok);
      return rc;
    }
    ids = &prompt_entry;
  } else if ((rc = open_input("generate", o.input, &st, &ids))) {
    return rc;
  }
  int64_t B = ids->desc.shape[0], T = ids->desc.shape[1], N = o.gen.max_tokens;
  mbd_client *c = NULL;
  mbd_session *s = NULL;
  mbd_shm *shm = NULL;
  mbd_error err = {0};
  int64_t *out = NULL, *lengths = NULL, *toks = NULL;
  size_t ntok = 0;
  if (T < 1) {
    mbd_error_set(&err, MBD_E_SHAPE, "%s: input_ids has no tokens (T = 0)", o.input);
    rc = report("generate", &err, NULL);
    goto done;
  }
  out = malloc((size_t)(B * (T + N)) * sizeof *out);
  lengths = malloc((size_t)B * sizeof *lengths);
  if (!out || !lengths) {
    mbd_error_set(&err, MBD_E_NOMEM, "out of memory for %" PRId64 " x %" PRId64 " tokens", B, T + N);
    rc = report("generate", &err, NULL);
    goto done;
  }
  if ((rc = connect_client("generate", &o, &c))) goto done;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint; /* no SA_RESTART: the wait wakes up at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  mbd_client_set_interrupt(c, &g_interrupted);
  if (o.shm && (mbd_shm_create(NULL, ids->nbytes, &shm, &err) == 0))
    memcpy(mbd_shm_data(shm), ids->data, ids->nbytes);
  else if (o.shm) {
    rc = report("generate", &err, NULL);
    goto done;
  }
  double t0 = now_s();
  size_t total = 0;
  for (int64_t b = 0; b < B; b++) {
    const unsigned char *row = (const unsigned char *)ids->data + (size_t)(b * T) * 8;
    memcpy(out + b * (T + N), row, (size_t)T * 8);
    mbd_tensor_in in = {.data = row};
    int64_t shape[2] = {1, T};
    mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
    if (shm) mbd_shm_tensor(shm, (uint64_t)(b * T) * 8, &in.desc, &in, NULL);
    mbd_tensor_out last = {0};
    stream_ctx sc = {!o.quiet, b, false, 0, NULL};
    mbd_text_stream_destroy(&text_out);
    if (tok && mbd_text_stream_new(tok, o.skip_special, o.quiet ? NULL : stdout, &text_out, &err)) {
      rc = report("generate", &err, NULL);
      goto done;
    }
    sc.text = text_out;
    char reason[16];
    int grc = mbd_session_open_prompt(c, NULL, o.model, out + b * (T + N), T, 0, NULL, 0, &s, &err);
    if (!grc) trace_line("generate", &o, c, "open");
    if (!grc && !(grc = mbd_session_prefill(s, NULL, &in, true, &last, &err)))
      trace_line("generate", &o, c, "prefill");
    if (!grc &&
        !(grc = mbd_session_generate(s, NULL, &o.gen, on_tokens, &sc, &toks, &ntok, reason, &err)))
      trace_line("generate", &o, c, "generate");
    if (grc) {
      mbd_tensor_out_release(&last);
      if (g_interrupted) { /* Ctrl-C: the request was cancelled; close the session */
        if (sc.started) printf("\n");
        fflush(stdout);
        fprintf(stderr, "mambad generate: interrupted; the generation was cancelled\n");
        mbd_client_set_interrupt(c, NULL);
        mbd_session_close(&s, NULL);
        rc = 130;
        goto done;
      }
      rc = report("generate", &err, c);
      goto done;
    }
    mbd_tensor_out_release(&last);
    if (sc.shown < ntok) on_tokens(&sc, toks + sc.shown, ntok - sc.shown);
    if (text_out) {
      mbd_text_stream_finish(text_out, &err);
      if (!o.quiet) putchar('\n');
      fprintf(stderr, "(%s)\n", reason);
    } else if (sc.started) {
      printf("  (%s)\n", reason);
    }
    fflush(stdout); /* keep the streamed rows ahead of the summary on stderr */
    if (mbd_session_close(&s, &err)) {
      rc = report("generate", &err, c);
      goto done;
    }
    if (ntok > (size_t)N) ntok = (size_t)N; /* never trust a count for our buffer */
    for (int64_t i = 0; i < N; i++) out[b * (T + N) + T + i] = i < (int64_t)ntok ? toks[i] : -1;
    lengths[b] = T + (int64_t)ntok;
    total += ntok;
    free(toks);
    toks = NULL;
  }
  double dt = now_s() - t0;
  fprintf(stderr, "%zu tokens for %" PRId64 " prompt%s in %.3f s (%.1f tokens/s), worker %s, route %.12s\n",
          total, B, B == 1 ? "" : "s", dt, dt > 0 ? total / dt : 0.0,
          mbd_client_last_reply(c)->worker, mbd_client_last_reply(c)->route_id);
  if (o.output) {
    mbd_tensor_desc d, ld;
    int64_t shape[2] = {B, T + N}, lshape[1] = {B};
    mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 2, shape, NULL);
    mbd_tensor_desc_make(&ld, MBD_DTYPE_I64, 1, lshape, NULL);
    const out_tensor ts[2] = {{"tokens", &d, out}, {"lengths", &ld, lengths}};
    rc = write_outputs("generate", o.output, ts, 2, c);
  }
done:
  if (s) mbd_session_close(&s, NULL);
  free(toks);
  free(out);
  free(lengths);
  mbd_shm_destroy(&shm);
  mbd_client_destroy(&c);
  mbd_safetensors_destroy(&st);
  mbd_text_stream_destroy(&text_out);
  mbd_tokenizer_destroy(&tok);
  free(prompt_ids);
  return rc;
}

/* ---- gemm ----------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Fills n values uniform in [-1,1) of dtype dt (f32/bf16/f16). */
static void fill_random(void *dst, mbd_dtype dt, size_t n, uint64_t *seed) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)((splitmix(seed) >> 40) * (1.0 / (1 << 23))) - 1.0f;
    if (dt == MBD_DTYPE_F32) ((float *)dst)[i] = v;
    else if (dt == MBD_DTYPE_BF16) ((uint16_t *)dst)[i] = mbd_f32_to_bf16(v);
    else ((uint16_t *)dst)[i] = mbd_f32_to_f16(v);
  }
}

static int cmd_gemm(int argc, char **argv) {
  static const int allowed[] = {O_CONNECT, O_ROUTE_ID, O_BACKEND, O_DTYPE, O_STATE_DTYPE,
                                O_GEMM_MODE, O_FAMILY, O_DEVICE, O_DEADLINE, O_M, O_N, O_K, O_SEED,
                                O_INPUT, O_OUTPUT, O_SHM, 0};
  cli_opts o;
  int rc = parse_opts("gemm", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad gemm (--m M --n N --k K [--seed S] | --input AB.safetensors)\n"
           "                   [--dtype f32|bf16|f16] [--output C.safetensors] [--shm] [route options]\n"
           "C = A B^T (+ bias) on a worker. Random A [M,K] and B [N,K] (seeded), or tensors a, b\n"
           "and optional bias [N] (f32) from --input. Writes c (F32 [M,N]) with --output.\n%s",
           k_route_help);
    return 0;
  }
  if (rc) return rc;
  mbd_safetensors *st = NULL;
  mbd_client *c = NULL;
  mbd_shm *shm = NULL;
  void *buf = NULL;
  mbd_tensor_out out = {0};
  mbd_error err = {0};
  mbd_tensor_in a = {0}, b = {0}, bias = {0};
  bool has_bias = false;
  if (o.input) {
    if (mbd_safetensors_open(o.input, &st, &err)) return report("gemm", &err, NULL);
    const mbd_st_entry *ea = mbd_safetensors_find(st, "a"), *eb = mbd_safetensors_find(st, "b"),
                       *ec = mbd_safetensors_find(st, "bias");
    if (!ea || !eb) {
      mbd_error_set(&err, MBD_E_NOT_FOUND, "%s: needs tensors a [M,K] and b [N,K]", o.input);
      rc = report("gemm", &err, NULL);
      goto done;
    }
    a = (mbd_tensor_in){.desc = ea->desc, .data = ea->data};
    b = (mbd_tensor_in){.desc = eb->desc, .data = eb->data};
    if (ec) {
      bias = (mbd_tensor_in){.desc = ec->desc, .data = ec->data};
      has_bias = true;
    }
    o.gemm_dtype = mbd_dtype_name(ea->desc.dtype);
  } else {
    if (!o.m || !o.n || !o.k) return usage_error("gemm", "give --m, --n and --k (or --input)");
    mbd_dtype dt;
    mbd_dtype_parse(o.gemm_dtype, &dt, NULL);
    int64_t sa[2] = {o.m, o.k}, sb[2] = {o.n, o.k};
    size_t na = 0, nb = 0;
    if (mbd_tensor_desc_make(&a.desc, dt, 2, sa, &err) || mbd_tensor_desc_make(&b.desc, dt, 2, sb, &err) ||
        mbd_tensor_desc_nbytes(&a.desc, &na, &err) || mbd_tensor_desc_nbytes(&b.desc, &nb, &err)) {
      rc = report("gemm", &err, NULL);
      goto done;
    }
    buf = malloc(na + nb);
    if (!buf) {
      mbd_error_set(&err, MBD_E_NOMEM, "out of memory for %zu bytes of inputs", na + nb);
      rc = report("gemm", &err, NULL);
      goto done;
    }
    uint64_t seed = o.seed;
    fill_random(buf, dt, (size_t)(o.m * o.k), &seed);
    fill_random((char *)buf + na, dt, (size_t)(o.n * o.k), &seed);
    a.data = buf;
    b.data = (char *)buf + na;
  }
  if (o.shm) { /* a and b side by side in one region */
    size_t na = 0, nb = 0;
    mbd_tensor_desc_nbytes(&a.desc, &na, NULL);
    mbd_tensor_desc_nbytes(&b.desc, &nb, NULL);
    size_t off_b = (na + 63) & ~(size_t)63;
    mbd_tensor_desc ad = a.desc, bd = b.desc;
    if (mbd_shm_create(NULL, off_b + nb + 1, &shm, &err) ||
        (memcpy(mbd_shm_data(shm), a.data, na), memcpy((char *)mbd_shm_data(shm) + off_b, b.data, nb),
         mbd_shm_tensor(shm, 0, &ad, &a, &err)) ||
        mbd_shm_tensor(shm, off_b, &bd, &b, &err)) {
      rc = report("gemm", &err, NULL);
      goto done;
    }
  }
  if ((rc = connect_client("gemm", &o, &c))) goto done;
  double t0 = now_s();
  if (mbd_client_gemm(c, NULL, o.gemm_dtype, &a, &b, has_bias ? &bias : NULL, &out, &err)) {
    rc = report("gemm", &err, c);
    goto done;
  }
  double dt = now_s() - t0;
  char shape[96];
  mbd_tensor_desc_format(&out.desc, shape, sizeof shape);
  double flops = 2.0 * (double)a.desc.shape[0] * (double)b.desc.shape[0] * (double)a.desc.shape[1];
  fprintf(stderr, "c %s from worker %s (route %.12s) in %.2f ms (%.2f GFLOP/s end to end)\n", shape,
          mbd_client_last_reply(c)->worker, mbd_client_last_reply(c)->route_id, dt * 1e3,
          dt > 0 ? flops / dt * 1e-9 : 0.0);
  if (o.output) rc = write_output("gemm", o.output, "c", &out.desc, out.data, c);
done:
  mbd_tensor_out_release(&out);
  mbd_shm_destroy(&shm);
  mbd_client_destroy(&c);
  free(buf);
  mbd_safetensors_destroy(&st);
  return rc;
}

/* ---- bench ---------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static int cmd_bench(int argc, char **argv) {
  static const int allowed[] = {O_CONNECT, O_MODEL, O_ROUTE_ID, O_BACKEND, O_DTYPE, O_STATE_DTYPE,
                                O_GEMM_MODE, O_FAMILY, O_DEVICE, O_DEADLINE, O_REQUESTS, O_BATCH, O_SEQ,
                                O_GENERATE, O_SHM, 0};
  cli_opts o;
  int rc = parse_opts("bench", argc, argv, allowed, &o);
  if (rc < 0) {
    printf("usage: mambad bench [--model NAME] [--requests N] [--batch B] [--seq T]\n"
           "                    [--generate TOKENS] [--shm] [route options]\n"
           "Round trips through the service: N STATUS requests (broker only), then with --model\n"
           "N forward requests of B x T tokens (last-position logits) and one session that\n"
           "generates TOKENS tokens (default 64). Prints latency percentiles and tokens/s.\n%s",
           k_route_help);
    return 0;
  }
  if (rc) return rc;
  mbd_client *c = NULL;
  mbd_session *s = NULL;
  mbd_shm *shm = NULL;
  mbd_error err = {0};
  double *lat = calloc((size_t)o.requests, sizeof *lat);
  int64_t *ids = calloc((size_t)(o.batch * o.seq), sizeof *ids), *toks = NULL;
  if (!lat || !ids) {
    free(lat);
    free(ids);
    fprintf(stderr, "mambad bench: NOMEM: out of memory\n");
    return EXIT_FAIL;
  }
  if ((rc = connect_client("bench", &o, &c))) goto done;
  mbd_progress_opts po; /* long runs: a line every 5 s on stderr; short ones stay quiet */
  mbd_progress_opts_init(&po, mbd_progress_print, stderr);
  po.min_bytes = po.every_bytes = 0;
  mbd_progress pr;
  mbd_progress_begin(&pr, &po, "bench status", "round trips", 0, (uint64_t)o.requests);
  for (int64_t i = 0; i < o.requests; i++) {
    mbd_status_report *r = NULL;
    double t0 = now_s();
    if (mbd_client_status(c, &r, &err)) {
      rc = report("bench", &err, c);
      goto done;
    }
    lat[i] = now_s() - t0;
    mbd_status_report_free(&r);
    mbd_progress_add(&pr, 0, 1);
  }
  mbd_progress_end(&pr);
  qsort(lat, (size_t)o.requests, sizeof *lat, cmp_double);
  printf("status   %6" PRId64 " round trips  p50 %8.3f ms  p99 %8.3f ms\n", o.requests,
         lat[o.requests / 2] * 1e3, lat[(o.requests * 99) / 100] * 1e3);
  if (!o.model) goto done;
  for (int64_t i = 0; i < o.batch * o.seq; i++) ids[i] = (i * 7 + 3) % 200;
  mbd_tensor_in in = {.data = ids};
  int64_t shape[2] = {o.batch, o.seq};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  if (o.shm) {
    if (mbd_shm_create(NULL, (size_t)(o.batch * o.seq) * 8, &shm, &err)) {
      rc = report("bench", &err, NULL);
      goto done;
    }
    memcpy(mbd_shm_data(shm), ids, (size_t)(o.batch * o.seq) * 8);
    mbd_tensor_desc d = in.desc;
    mbd_shm_tensor(shm, 0, &d, &in, NULL);
  }
  double wall0 = now_s();
  mbd_progress_begin(&pr, &po, "bench forward", "requests", 0, (uint64_t)o.requests);
  for (int64_t i = 0; i < o.requests; i++) {
    mbd_tensor_out logits = {0};
    double t0 = now_s();
    if (mbd_client_forward(c, NULL, o.model, &in, true, NULL, &logits, &err)) {
      rc = report("bench", &err, c);
      goto done;
    }
    lat[i] = now_s() - t0;
    mbd_tensor_out_release(&logits);
    mbd_progress_add(&pr, 0, 1);
  }
  mbd_progress_end(&pr);
  double wall = now_s() - wall0;
  qsort(lat, (size_t)o.requests, sizeof *lat, cmp_double);
  printf("forward  %6" PRId64 " requests [%" PRId64 "x%" PRId64 "]  p50 %8.3f ms  p99 %8.3f ms  "
         "%.1f req/s  %.1f prompt tokens/s  (worker %s)\n",
         o.requests, o.batch, o.seq, lat[o.requests / 2] * 1e3, lat[(o.requests * 99) / 100] * 1e3,
         o.requests / wall, (double)(o.requests * o.batch * o.seq) / wall, mbd_client_last_reply(c)->worker);
  mbd_generate_params gp;
  mbd_generate_params_init(&gp);
  gp.max_tokens = o.gen.max_tokens != 16 ? o.gen.max_tokens : 64;
  mbd_tensor_in prompt = {.data = ids};
  int64_t ps[2] = {1, o.seq};
  mbd_tensor_desc_make(&prompt.desc, MBD_DTYPE_I64, 2, ps, NULL);
  mbd_tensor_out last = {0};
  size_t n = 0;
  char reason[16];
  double t0 = now_s();
  if (mbd_session_open(c, NULL, o.model, &s, &err) ||
      mbd_session_prefill(s, NULL, &prompt, true, &last, &err) ||
      mbd_session_generate(s, NULL, &gp, NULL, NULL, &toks, &n, reason, &err)) {
    mbd_tensor_out_release(&last);
    rc = report("bench", &err, c);
    goto done;
  }
  double gdt = now_s() - t0;
  mbd_tensor_out_release(&last);
  printf("generate %6zu tokens  %.3f s  %.1f tokens/s (one stream, incl. open+prefill)\n", n, gdt,
         gdt > 0 ? n / gdt : 0.0);
done:
  if (s) mbd_session_close(&s, NULL);
  free(toks);
  free(lat);
  free(ids);
  mbd_shm_destroy(&shm);
  mbd_client_destroy(&c);
  return rc;
}

/* ---- dispatch -------------------------------------------------------------- */

/* Execs mambad-<name>: first next to this binary (/proc/self/exe), then PATH. */
static int exec_tool(const char *name, int argc, char **argv) {
  char prog[64], self[PATH_MAX], path[PATH_MAX + 64];
  snprintf(prog, sizeof prog, "mambad-%s", name);
  char **args = calloc((size_t)argc + 1, sizeof *args);
  if (!args) return EXIT_FAIL;
  args[0] = prog;
  for (int i = 1; i < argc; i++) args[i] = argv[i];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      snprintf(path, sizeof path, "%s/%s", self, prog);
      if (access(path, X_OK) == 0) execv(path, args);
    }
  }
  execvp(prog, args);
  fprintf(stderr, "mambad: cannot run '%s': %s (looked next to the mambad binary and on PATH)\n",
          prog, strerror(errno));
  free(args);
  return 127;
}

/* mambad keygen --out PREFIX: a CURVE key pair, PREFIX.key (secret, 0600)
 * and PREFIX.pub, never overwriting an existing key. */
static int cmd_keygen(int argc, char **argv) {
  const char *prefix = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: mambad keygen --out PREFIX\n"
             "Writes a CURVE key pair: PREFIX.key (public + secret, mode 0600) and PREFIX.pub\n"
             "(the public key alone: list it in the broker's admitted keys). docs/security.md.\n");
      return 0;
    }
    if (!strcmp(argv[i], "--out") && i + 1 < argc) prefix = argv[++i];
    else return usage_error("keygen", "unknown argument '%s'", argv[i]);
  }
  if (!prefix) return usage_error("keygen", "--out PREFIX is required");
  mbd_curve_pair kp;
  mbd_error err = {0};
  if (mbd_curve_generate(&kp, &err) || mbd_curve_write(prefix, &kp, &err)) {
    fprintf(stderr, "mambad keygen: %s\n", err.msg);
    return 1;
  }
  printf("%s\n", kp.public_key);
  fprintf(stderr, "wrote %s.key (secret, 0600) and %s.pub\n", prefix, prefix);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad <command> [options]   (mambad <command> --help for details)\n"
          "       mambad --version   version and kernel source digest of this build\n"
          "\n"
          "service client commands:\n"
          "  status     workers, routes, models and load of a running service\n"
          "  forward    input_ids -> logits through the service (safetensors files)\n"
          "  generate   prompts -> generated tokens through worker sessions\n"
          "  gemm       C = A B^T on a worker (random or file inputs)\n"
          "  bench      round trips and tokens/s through the service\n"
          "  keygen     a CURVE key pair for tcp endpoints (docs/security.md)\n"
          "\n"
          "text (no service needed):\n"
          "  tokenize   JSON lines of text -> token ids with a tokenizer.json\n"
          "  detokenize JSON lines of token ids -> text\n"
          "\n"
          "programs (exec mambad-<command>):\n"
          "  up         start a deployment from a YAML file and supervise it\n"
          "  run        run a model in this process (no service)\n"
          "  model      make synthetic checkpoints and prompt files\n"
          "  broker     the broker process\n"
          "  worker     a worker process\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("mambad %s\nkernel sources sha256 %s\n", MBD_VERSION, MBD_KERNEL_SRC_DIGEST);
    return 0;
  }
  static const char *const tools[] = {"run", "model", "up", "broker", "worker", NULL};
  for (const char *const *t = tools; *t; t++)
    if (!strcmp(cmd, *t)) return exec_tool(cmd, argc - 1, argv + 1);
  if (!strcmp(cmd, "status")) return cmd_status(argc - 1, argv + 1);
  if (!strcmp(cmd, "forward")) return cmd_forward(argc - 1, argv + 1);
  if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
  if (!strcmp(cmd, "gemm")) return cmd_gemm(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "detokenize")) return cmd_detokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "keygen")) return cmd_keygen(argc - 1, argv + 1);
  fprintf(stderr, "mambad: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return EXIT_USAGE;
}
