/* `mambad up` (mambad-up): starts a whole deployment from a YAML file and
 * supervises it in the foreground.
 *
 * It starts the broker, then every worker the file lists (cpu replicas and
 * `device: all` expanded), then, when the file has an `http:` section, the
 * HTTP gateway (mambad-gateway) serving every model of the catalogue, each in its own process group so a terminal's
 * Ctrl-C reaches only the supervisor, which then stops things in order.
 * A child that exits is restarted with exponential backoff (reset after it
 * has run for a while); workers re-register with the broker on their own.
 * SIGINT/SIGTERM: SIGTERM to the gateway, then the workers, then the broker, wait up to the
 * grace period, SIGKILL what is left. Children get PR_SET_PDEATHSIG so they
 * do not outlive a supervisor that was killed.
 *
 * Host roles: --role broker|workers|gateway (comma-separated; default all)
 * starts only those parts, so every host of a multi-host deployment runs
 * `mambad up` on the same file: the broker host with --role broker, a GPU
 * host with --role workers --broker-host HOST (its workers connect to HOST's
 * tcp endpoints and register again on their own when that broker restarts).
 * --check validates the file and the plan for the roles (models, devices,
 * programs) without starting anything. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/mambad.h"
#include "common/curve.h"
#include "common/defaults.h"
#include "common/deploy_config.h"

#define MAX_CHILDREN (1 + MBD_DEPLOY_MAX_WORKERS * 64)
#define MAX_ARGS 96
#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 10000
#define HEALTHY_MS 30000 /* a child that ran this long starts its backoff afresh */
#define CRASH_LOOP_RESTARTS 4 /* quick exits in a row reported as a crash loop */

typedef struct child {
  char name[80];          /* "broker" or the worker name */
  bool is_broker;
  int stop_phase;         /* order of SIGTERM: 0 gateway, 1 workers, 2 broker */
  char *argv[MAX_ARGS];   /* owned strings, NULL-terminated */
  pid_t pid;              /* 0 when not running */
  int64_t started_ms;     /* when the current process started */
  int64_t restart_at_ms;  /* when to start it again (pid == 0) */
  int restarts;           /* consecutive quick failures */
} child;

/* Which parts of the deployment this host runs (--role). */
enum { ROLE_BROKER = 1, ROLE_WORKERS = 2, ROLE_GATEWAY = 4, ROLE_ALL = 7 };

typedef struct supervisor {
  child kids[MAX_CHILDREN];
  size_t n;
  char bin_dir[PATH_MAX];
  int64_t grace_ms;
  char clients_connect[MBD_DEPLOY_EP_MAX];
  size_t n_workers;       /* expected worker registrations */
  bool announced;         /* printed "ready" */
  char http_listen[64];   /* the gateway's HOST:PORT, "" without an http: section */
  int roles;              /* ROLE_* bits: the parts this host runs */
  const char *broker_host; /* --broker-host: where the broker's tcp endpoints are, or NULL */
} supervisor;

static volatile sig_atomic_t g_stop; /* set by SIGINT/SIGTERM: the only global */

static void on_signal(int sig) { g_stop = sig; }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static int add_arg(child *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_arg(child *c, const char *fmt, ...) {
  size_t i = 0;
  while (c->argv[i]) i++;
  if (i + 1 >= MAX_ARGS) return -1;
  va_list ap;
  va_start(ap, fmt);
  int rc = vasprintf(&c->argv[i], fmt, ap);
  va_end(ap);
  if (rc < 0) {
    c->argv[i] = NULL;
    return -1;
  }
  return 0;
}

/* Finds mambad-<prog> next to this binary (or in --bin-dir); "" = use PATH. */
static void find_bin_dir(char *out, size_t cap) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  out[0] = '\0';
  if (n <= 0) return;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash) return;
  *slash = '\0';
  snprintf(out, cap, "%s", self);
}

/* GPUs this process may use (`device: all`): the driver's list
 * (/proc/driver/nvidia/gpus, else `nvidia-smi -L`), capped by the number of
 * entries in CUDA_VISIBLE_DEVICES when it is set (workers then see ordinals
 * 0..n-1). No CUDA runtime needed, so CPU-only builds keep working. */
static int count_gpus(void) {
  int n = 0;
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)))
      if (e->d_name[0] != '.') n++;
    closedir(d);
  }
  if (n == 0) {
    FILE *f = popen("nvidia-smi -L 2>/dev/null", "r");
    if (f) {
      char line[512];
      while (fgets(line, sizeof line, f))
        if (!strncmp(line, "GPU ", 4)) n++;
      pclose(f);
    }
  }
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis) {
    int v = 0;
    for (const char *p = vis; *p;) {
      size_t len = strcspn(p, ",");
      if (len && strncmp(p, "-1", 2)) v++;
      else if (len) break; /* an invalid entry hides the rest from CUDA */
      p += len + (p[len] == ',');
    }
    if (v < n) n = v;
  }
  return n;
}

/* mkdir -p of the directory an ipc:// socket lives in. */
static int ensure_ipc_dir(const char *ep, mbd_error *err) {
  if (strncmp(ep, "ipc://", 6)) return 0;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", ep + 6);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(dir, 0755);
    *p = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) /* the broker refuses a wider one */
    return mbd_error_set(err, MBD_E_IO, "cannot create %s for %s: %s", dir, ep, strerror(errno));
  return 0;
}

static child *new_child(supervisor *s, const char *name, bool broker, const char *prog) {
  if (s->n >= MAX_CHILDREN) return NULL;
  child *c = &s->kids[s->n++];
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  c->is_broker = broker;
  c->stop_phase = broker ? 2 : 1;
  add_arg(c, "%s", prog);
  return c;
}

static int add_worker(supervisor *s, const mbd_deploy_config *cfg, const mbd_deploy_worker *w,
                      const char *name, const char *device, const char *workers_connect) {
  child *c = new_child(s, name, false, "mambad-worker");
  if (!c) return -1;
  int rc = 0;
  rc |= add_arg(c, "--connect") | add_arg(c, "%s", workers_connect);
  rc |= add_arg(c, "--name") | add_arg(c, "%s", name);
  rc |= add_arg(c, "--device") | add_arg(c, "%s", device);
  if (w->dtype[0]) rc |= add_arg(c, "--dtype") | add_arg(c, "%s", w->dtype);
  if (w->gemm_mode[0]) rc |= add_arg(c, "--gemm-mode") | add_arg(c, "%s", w->gemm_mode);
  if (w->state_dtype[0])
    rc |= add_arg(c, "--state-dtype") | add_arg(c, "%s", w->state_dtype);
  for (size_t k = 0; k < w->n_models; k++) {
    const mbd_deploy_model *m = &cfg->models[w->models[k]];
    rc |= add_arg(c, "--model") | add_arg(c, "%s=%s", m->name, m->path);
  }
  if (w->threads) rc |= add_arg(c, "--threads") | add_arg(c, "%d", w->threads);
  if (w->capacity) rc |= add_arg(c, "--capacity") | add_arg(c, "%d", w->capacity);
  if (w->sessions) rc |= add_arg(c, "--sessions") | add_arg(c, "%d", w->sessions);
  if (w->max_batch) rc |= add_arg(c, "--max-batch") | add_arg(c, "%d", w->max_batch);
  if (w->session_idle_s) rc |= add_arg(c, "--session-idle-s") | add_arg(c, "%d", w->session_idle_s);
  if (w->checkpoint_tokens)
    rc |= add_arg(c, "--checkpoint-tokens") | add_arg(c, "%d", w->checkpoint_tokens);
  if (w->checkpoint_ms) rc |= add_arg(c, "--checkpoint-ms") | add_arg(c, "%d", w->checkpoint_ms);
  if (w->prefix_cache.mb != MBD_DEFAULT_PREFIX_CACHE_MB)
    rc |= add_arg(c, "--prefix-cache-mb") | add_arg(c, "%" PRId64, w->prefix_cache.mb);
  if (w->prefix_cache.block != MBD_DEFAULT_PREFIX_BLOCK)
    rc |= add_arg(c, "--prefix-block") | add_arg(c, "%d", w->prefix_cache.block);
  if (w->prefix_cache.device_mb != MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB)
    rc |= add_arg(c, "--prefix-cache-device-mb") | add_arg(c, "%" PRId64, w->prefix_cache.device_mb);
  rc |= add_arg(c, "--heartbeat-ms") | add_arg(c, "%" PRId64, cfg->heartbeat_ms);
  rc |= add_arg(c, "--liveness") | add_arg(c, "%" PRId64, cfg->liveness);
  rc |= add_arg(c, "--max-message-mb") | add_arg(c, "%" PRId64, cfg->max_message_mb);
  const mbd_deploy_security *sec = &cfg->security;
  if (sec->curve && !strncmp(cfg->workers_ep, "tcp://", 6)) /* docs/security.md */
    rc |= add_arg(c, "--curve-secret") | add_arg(c, "%s", sec->worker_key) |
          add_arg(c, "--server-key") | add_arg(c, "%s", sec->broker_key);
  s->n_workers++;
  return rc;
}

/* The gateway: a broker client serving the catalogue over HTTP. A model whose
 * directory has no tokenizer.json cannot take text: it is left out with a
 * warning (and the gateway too when no model has one). */
static int add_gateway(supervisor *s, const mbd_deploy_config *cfg, mbd_error *err) {
  const mbd_deploy_http *h = &cfg->http;
  bool has[MBD_DEPLOY_MAX_MODELS];
  size_t n = 0;
  for (size_t k = 0; k < cfg->n_models; k++) {
    char tj[MBD_DEPLOY_PATH_MAX + 32];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", cfg->models[k].path);
    has[k] = access(tj, R_OK) == 0;
    n += has[k];
    if (!has[k])
      fprintf(stderr, "mambad up: %s:%d: http: model '%s' has no %s: the gateway leaves it out "
              "(text needs the checkpoint's tokenizer.json)\n",
              cfg->path, h->line, cfg->models[k].name, tj);
  }
  if (n == 0) {
    fprintf(stderr, "mambad up: %s:%d: http: no model has a tokenizer.json; not starting the "
            "gateway\n", cfg->path, h->line);
    s->http_listen[0] = '\0';
    return 0;
  }
  child *c = new_child(s, "gateway", false, "mambad-gateway");
  if (!c) return mbd_error_set(err, MBD_E_NOMEM, "too many processes to start");
  c->stop_phase = 0; /* the front door closes first, while workers still answer */
  int rc = 0;
  rc |= add_arg(c, "--connect") | add_arg(c, "%s", s->clients_connect);
  rc |= add_arg(c, "--listen") | add_arg(c, "%s", h->listen);
  for (size_t k = 0; k < cfg->n_models; k++)
    if (has[k])
      rc |= add_arg(c, "--model") | add_arg(c, "%s=%s", cfg->models[k].name, cfg->models[k].path);
  if (h->max_body_bytes) rc |= add_arg(c, "--max-body-bytes") | add_arg(c, "%" PRId64, h->max_body_bytes);
  if (h->conn_timeout_s) rc |= add_arg(c, "--conn-timeout-s") | add_arg(c, "%" PRId64, h->conn_timeout_s);
  if (h->max_running) rc |= add_arg(c, "--max-running") | add_arg(c, "%" PRId64, h->max_running);
  if (h->deadline_ms) rc |= add_arg(c, "--deadline-ms") | add_arg(c, "%" PRId64, h->deadline_ms);
  if (rc) return mbd_error_set(err, MBD_E_NOMEM, "too many gateway arguments");
  return 0;
}

/* Turns the config into child command lines. */
/* The endpoint a peer connects to for the broker's bound `ep`: on this host,
 * or with --broker-host, that host's port of a tcp endpoint. */
static int connect_endpoint(const supervisor *s, const char *ep, char *out, size_t cap,
                            mbd_error *err) {
  mbd_deploy_connect_endpoint(ep, out, cap);
  if (!s->broker_host) return 0;
  const char *port = strrchr(ep, ':');
  if (strncmp(ep, "tcp://", 6) || !port)
    return mbd_error_set(err, MBD_E_INVALID,
                         "--broker-host: the broker endpoint %s is not tcp://HOST:PORT (a broker "
                         "on another host needs tcp endpoints in broker:)", ep);
  if ((size_t)snprintf(out, cap, "tcp://%s%s", s->broker_host, port) >= cap)
    return mbd_error_set(err, MBD_E_INVALID, "--broker-host '%s' is too long", s->broker_host);
  return 0;
}

static int plan(supervisor *s, const mbd_deploy_config *cfg, mbd_error *err) {
  int rc = 0;
  if (s->roles & ROLE_BROKER) {
    child *b = new_child(s, "broker", true, "mambad-broker");
    rc |= add_arg(b, "--clients") | add_arg(b, "%s", cfg->clients_ep);
    rc |= add_arg(b, "--workers") | add_arg(b, "%s", cfg->workers_ep);
    rc |= add_arg(b, "--heartbeat-ms") | add_arg(b, "%" PRId64, cfg->heartbeat_ms);
    rc |= add_arg(b, "--liveness") | add_arg(b, "%" PRId64, cfg->liveness);
    rc |= add_arg(b, "--queue-limit") | add_arg(b, "%" PRId64, cfg->queue_limit);
    rc |= add_arg(b, "--queue-mb") | add_arg(b, "%" PRId64, cfg->queue_mb);
    rc |= add_arg(b, "--max-message-mb") | add_arg(b, "%" PRId64, cfg->max_message_mb);
    rc |= add_arg(b, "--default-deadline-ms") | add_arg(b, "%" PRId64, cfg->default_deadline_ms);
    rc |= add_arg(b, "--durable-mb") | add_arg(b, "%" PRId64, cfg->durable_mb);
    for (size_t i = 0; i < cfg->n_models; i++)
      if (cfg->models[i].default_digest[0])
        rc |= add_arg(b, "--default-digest") |
              add_arg(b, "%s=%s", cfg->models[i].name, cfg->models[i].default_digest);
    const mbd_deploy_security *sec = &cfg->security;
    if (sec->curve) rc |= add_arg(b, "--curve-secret") | add_arg(b, "%s", sec->broker_key);
    if (sec->client_keys[0]) rc |= add_arg(b, "--client-keys") | add_arg(b, "%s", sec->client_keys);
    for (size_t k = 0; k < sec->n_client_keys; k++)
      rc |= add_arg(b, "--client-keys") | add_arg(b, "%s", sec->client_public_keys[k]);
    if (sec->worker_keys[0]) rc |= add_arg(b, "--worker-keys") | add_arg(b, "%s", sec->worker_keys);
    if (sec->operator_keys[0])
      rc |= add_arg(b, "--operator-keys") | add_arg(b, "%s", sec->operator_keys);
    if (sec->ipc_group[0]) rc |= add_arg(b, "--ipc-group") | add_arg(b, "%s", sec->ipc_group);
    if (sec->insecure_clients) rc |= add_arg(b, "--insecure") | add_arg(b, "clients");
    if (sec->insecure_workers) rc |= add_arg(b, "--insecure") | add_arg(b, "workers");
  }
  char wconn[MBD_DEPLOY_EP_MAX];
  int erc = connect_endpoint(s, cfg->workers_ep, wconn, sizeof wconn, err);
  if (!erc)
    erc = connect_endpoint(s, cfg->clients_ep, s->clients_connect, sizeof s->clients_connect, err);
  if (erc) return erc;
  for (size_t i = 0; i < cfg->n_workers && rc == 0 && (s->roles & ROLE_WORKERS); i++) {
    const mbd_deploy_worker *w = &cfg->workers[i];
    char name[80], dev[32];
    /* Fail fast here rather than restart a worker that can never load. */
    for (size_t k = 0; k < w->n_models; k++) {
      const mbd_deploy_model *m = &cfg->models[w->models[k]];
      struct stat st;
      if (stat(m->path, &st) != 0)
        return mbd_error_set(err, MBD_E_NOT_FOUND,
                             "%s:%d: models: '%s' path %s: %s (worker %s serves it; make a "
                             "checkpoint there, e.g. `mambad model synth --shape 130m --out %s`)",
                             cfg->path, m->line, m->name, m->path, strerror(errno), w->name, m->path);
    }
    if (w->device == MBD_DEPLOY_DEVICE_ALL) {
      int n = count_gpus();
      if (n == 0)
        return mbd_error_set(err, MBD_E_DEVICE,
                             "%s:%d: workers[%zu].device: 'all' but this host shows no NVIDIA GPU "
                             "(/proc/driver/nvidia/gpus, nvidia-smi -L and CUDA_VISIBLE_DEVICES give none); "
                             "use device: cpu here",
                             cfg->path, w->line, i);
      for (int g = 0; g < n && rc == 0; g++) {
        snprintf(name, sizeof name, "%s-%d", w->name, g);
        snprintf(dev, sizeof dev, "cuda:%d", g);
        rc = add_worker(s, cfg, w, name, dev, wconn);
      }
    } else if (w->device == MBD_DEPLOY_DEVICE_CUDA) {
      snprintf(dev, sizeof dev, "cuda:%d", w->cuda_index);
      rc = add_worker(s, cfg, w, w->name, dev, wconn);
    } else {
      for (int r = 0; r < w->count && rc == 0; r++) {
        if (w->count == 1) snprintf(name, sizeof name, "%s", w->name);
        else snprintf(name, sizeof name, "%s-%d", w->name, r);
        rc = add_worker(s, cfg, w, name, "cpu", wconn);
      }
    }
  }
  if (rc) return mbd_error_set(err, MBD_E_NOMEM, "too many workers or arguments to start");
  if (cfg->http.enabled && (s->roles & ROLE_GATEWAY)) {
    snprintf(s->http_listen, sizeof s->http_listen, "%s", cfg->http.listen);
    return add_gateway(s, cfg, err);
  }
  return 0;
}

static int start(supervisor *s, child *c) {
  char path[PATH_MAX + 64] = "";
  if (s->bin_dir[0]) {
    snprintf(path, sizeof path, "%s/%s", s->bin_dir, c->argv[0]);
    if (access(path, X_OK) != 0) path[0] = '\0';
  }
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "mambad up: fork for %s failed: %s\n", c->name, strerror(errno));
    return -1;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (path[0]) execv(path, c->argv);
    else execvp(c->argv[0], c->argv);
    fprintf(stderr, "mambad up: cannot run %s: %s (build it, or put it next to mambad-up or on PATH)\n",
            c->argv[0], strerror(errno));
    _exit(127);
  }
  c->pid = pid;
  c->started_ms = now_ms();
  return 0;
}

static void print_cmd(const child *c) {
  for (size_t i = 0; c->argv[i]; i++) printf("%s%s", i ? " " : "", c->argv[i]);
  printf("\n");
}

/* Reaps exited children; schedules restarts. Returns -1 on a fatal exit. */
static int reap(supervisor *s) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (size_t i = 0; i < s->n; i++) {
      child *c = &s->kids[i];
      if (c->pid != pid) continue;
      c->pid = 0;
      int64_t ran = now_ms() - c->started_ms;
      if (g_stop) break;
      char how[64];
      if (WIFEXITED(status)) snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
      else snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
      if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        fprintf(stderr, "mambad up: %s could not be started; stopping the deployment\n", c->name);
        return -1;
      }
      if (ran >= HEALTHY_MS) c->restarts = 0;
      int64_t backoff = BACKOFF_MIN_MS << (c->restarts < 6 ? c->restarts : 6);
      if (backoff > BACKOFF_MAX_MS) backoff = BACKOFF_MAX_MS;
      c->restarts++;
      c->restart_at_ms = now_ms() + backoff;
      fprintf(stderr, "mambad up: %s (pid %d) %s after %.1f s; restarting in %" PRId64 " ms\n",
              c->name, (int)pid, how, ran / 1000.0, backoff);
      if (c->restarts >= CRASH_LOOP_RESTARTS)
        fprintf(stderr,
                "mambad up: %s is crash-looping: %d exits in a row, each within %d s of its "
                "start (last: %s); its own messages above say why (a model that does not load, "
                "a registration the broker refuses); backoff is now %" PRId64 " ms\n",
                c->name, c->restarts, HEALTHY_MS / 1000, how, backoff);
      s->announced = false; /* report again once it is back */
    }
  }
  return 0;
}

/* Asks the broker which workers registered; prints once when all are up. */
static void check_ready(supervisor *s, mbd_client *cl, int64_t t0) {
  mbd_status_report *r = NULL;
  mbd_error err = {0};
  if (mbd_client_status(cl, &r, &err)) return;
  /* Workers of this deployment with a live record, by name: a crashed
   * worker's old record (until the broker expires it) must not count for
   * the process that replaced it, nor a stranger's worker for ours. */
  size_t up = 0;
  for (size_t k = 0; k < s->n; k++) {
    if (s->kids[k].is_broker || !s->kids[k].pid) continue;
    for (size_t i = 0; i < r->n_workers; i++) {
      /* registered after this process started (uptime is a duration, so
       * the two clocks need not agree), with slack for the round trip */
      if (r->workers[i].alive && !strcmp(r->workers[i].name, s->kids[k].name) &&
          r->workers[i].uptime_ms <= now_ms() - s->kids[k].started_ms + 500) {
        up++;
        break;
      }
    }
  }
  if (up >= s->n_workers) {
    printf("mambad up: ready in %.1f s: %zu worker%s registered\n", (now_ms() - t0) / 1000.0, up,
           up == 1 ? "" : "s");
    if (s->http_listen[0]) printf("  http gateway on http://%s\n", s->http_listen);
    for (size_t i = 0; i < r->n_workers; i++)
      printf("  worker %-16s route %.12s  models %zu  pid %" PRId64 "\n", r->workers[i].name,
             r->workers[i].route_id, r->workers[i].n_models, r->workers[i].pid);
    fflush(stdout);
    s->announced = true;
  }
  mbd_status_report_free(&r);
}

/* The readiness poll's client. On a CURVE clients endpoint of a broker this
 * host runs, the poll needs a key the broker admits: the supervisor makes a
 * key pair of its own, passes its public half to the broker as one more
 * --operator-keys entry (operator: STATUS shows the pids "ready" prints) and
 * polls with it. The secret never reaches a disk the service keeps: it is
 * written to a private temporary directory (0700, file 0600) only for
 * libmambad to read at creation and removed at once. */
static int make_poller(supervisor *s, const mbd_deploy_config *cfg, const mbd_curve_pair *probe,
                       mbd_client **out, mbd_error *err) {
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 1000;
  co.connect_ms = 500;
  if (!probe) return mbd_client_new(s->clients_connect, &co, out, err);
  const char *tmp = getenv("TMPDIR");
  char dir[PATH_MAX], prefix[PATH_MAX + 16], key[PATH_MAX + 32], pub[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/mambad-up-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(dir))
    return mbd_error_set(err, MBD_E_IO, "cannot make a private directory for the readiness "
                         "poll's key in %s: %s", tmp && tmp[0] ? tmp : "/tmp", strerror(errno));
  snprintf(prefix, sizeof prefix, "%s/poll", dir);
  snprintf(key, sizeof key, "%s.key", prefix);
  snprintf(pub, sizeof pub, "%s.pub", prefix);
  int rc = mbd_curve_write(prefix, probe, err);
  if (!rc) {
    co.curve_key = key;
    co.server_key = cfg->security.broker_key;
    rc = mbd_client_new(s->clients_connect, &co, out, err);
  }
  unlink(key);
  unlink(pub);
  rmdir(dir);
  return rc;
}

/* SIGTERM the gateway, then the workers, then the broker; SIGKILL what is
 * left of each after the grace period. */
static void stop_all(supervisor *s) {
  for (int phase = 0; phase < 3; phase++) {
    for (size_t i = 0; i < s->n; i++)
      if (s->kids[i].pid > 0 && s->kids[i].stop_phase == phase) kill(s->kids[i].pid, SIGTERM);
    int64_t end = now_ms() + s->grace_ms;
    for (;;) {
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (size_t i = 0; i < s->n; i++)
          if (s->kids[i].pid == pid) s->kids[i].pid = 0;
      bool left = false;
      for (size_t i = 0; i < s->n; i++)
        left = left || (s->kids[i].pid > 0 && s->kids[i].stop_phase == phase);
      if (!left) break;
      if (now_ms() >= end) {
        for (size_t i = 0; i < s->n; i++)
          if (s->kids[i].pid > 0 && s->kids[i].stop_phase == phase) {
            fprintf(stderr, "mambad up: %s did not stop within %" PRId64 " ms; killing it\n",
                    s->kids[i].name, s->grace_ms);
            kill(s->kids[i].pid, SIGKILL);
            waitpid(s->kids[i].pid, NULL, 0);
            s->kids[i].pid = 0;
          }
        break;
      }
      sleep_ms(20);
    }
  }
}

static int parse_roles(const char *arg, int *out) {
  char buf[128];
  if ((size_t)snprintf(buf, sizeof buf, "%s", arg) >= sizeof buf) return -1;
  int roles = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (!strcmp(t, "broker")) roles |= ROLE_BROKER;
    else if (!strcmp(t, "workers")) roles |= ROLE_WORKERS;
    else if (!strcmp(t, "gateway")) roles |= ROLE_GATEWAY;
    else if (!strcmp(t, "all")) roles |= ROLE_ALL;
    else return -1;
  }
  if (!roles) return -1;
  *out = roles;
  return 0;
}

/* True when prog would start: in bin_dir, or an executable on PATH. */
static bool program_found(const supervisor *s, const char *prog) {
  char path[PATH_MAX + 64];
  if (s->bin_dir[0]) {
    snprintf(path, sizeof path, "%s/%s", s->bin_dir, prog);
    if (access(path, X_OK) == 0) return true;
  }
  const char *env = getenv("PATH");
  char dirs[4096];
  snprintf(dirs, sizeof dirs, "%s", env ? env : "/usr/bin:/bin");
  for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    snprintf(path, sizeof path, "%s/%s", d, prog);
    if (access(path, X_OK) == 0) return true;
  }
  return false;
}

/* --check: the file parsed and planned (models, devices); every program the
 * plan runs must be found. Prints what would start. */
static int check_plan(const supervisor *s, const char *config) {
  int bad = 0;
  for (size_t i = 0; i < s->n; i++)
    if (!program_found(s, s->kids[i].argv[0])) {
      fprintf(stderr, "mambad up: %s: %s needs %s, which is neither in %s nor on PATH (build "
              "it, or install mambad)\n", config, s->kids[i].name, s->kids[i].argv[0],
              s->bin_dir[0] ? s->bin_dir : "the bin dir");
      bad = 1;
    }
  if (s->n == 0) {
    fprintf(stderr, "mambad up: %s: nothing to start for these roles\n", config);
    bad = 1;
  }
  if (bad) return -1;
  printf("mambad up: %s: ok: %s%zu worker%s%s", config,
         (s->roles & ROLE_BROKER) ? "broker, " : "", s->n_workers, s->n_workers == 1 ? "" : "s",
         s->http_listen[0] ? ", gateway" : "");
  printf("%s%s\n", (s->roles & ROLE_BROKER) ? "" : "; broker at ",
         (s->roles & ROLE_BROKER) ? "" : s->clients_connect);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad up --config FILE.yaml [--role broker,workers,gateway|all]\n"
          "                 [--broker-host HOST] [--grace-ms N] [--bin-dir DIR]\n"
          "                 [--dry-run | --check]\n"
          "Starts the broker and the workers FILE.yaml lists, in the foreground, and keeps\n"
          "them running: a worker that dies is restarted (with backoff) and re-registers.\n"
          "Ctrl-C or SIGTERM stops everything (SIGTERM, then SIGKILL after --grace-ms,\n"
          "default 10000). --dry-run prints the command lines and exits. Programs are\n"
          "looked up in --bin-dir, next to this binary, then on PATH.\n"
          "--role: start only these parts (default all); --broker-host: the host whose tcp\n"
          "endpoints (the ports of broker:) workers and the gateway connect to, for hosts\n"
          "without --role broker. --check: validate the file and the plan for the roles\n"
          "(models, devices, programs) and exit 0 when it would start.\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                       {"grace-ms", required_argument, 0, 'g'},
                                       {"bin-dir", required_argument, 0, 'b'},
                                       {"dry-run", no_argument, 0, 'n'},
                                       {"check", no_argument, 0, 'k'},
                                       {"role", required_argument, 0, 'r'},
                                       {"broker-host", required_argument, 0, 'H'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *config = NULL, *bin_dir = NULL;
  int64_t grace_ms = 10000;
  bool dry = false, check = false;
  int roles = ROLE_ALL;
  const char *broker_host = NULL;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 'c': config = optarg; break;
    case 'b': bin_dir = optarg; break;
    case 'n': dry = true; break;
    case 'k': check = true; break;
    case 'H': broker_host = optarg; break;
    case 'r':
      if (parse_roles(optarg, &roles)) {
        fprintf(stderr, "mambad up: --role wants a comma-separated list of broker, workers, "
                "gateway or all, got '%s'\n", optarg);
        return 2;
      }
      break;
    case 'g': {
      char *end = NULL;
      grace_ms = strtoll(optarg, &end, 10);
      if (!*optarg || *end || grace_ms < 0) {
        fprintf(stderr, "mambad up: --grace-ms wants milliseconds >= 0, got '%s'\n", optarg);
        return 2;
      }
      break;
    }
    case 'h': usage(stdout); return 0;
    default:
      fprintf(stderr, "mambad up: unknown option or missing value: %s\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  if (!config || optind < argc) {
    usage(stderr);
    return 2;
  }
  mbd_deploy_config *cfg = NULL;
  mbd_error err = {0};
  supervisor *s = calloc(1, sizeof *s);
  mbd_client *cl = NULL;
  int rc = 1;
  if (!s) {
    fprintf(stderr, "mambad up: out of memory\n");
    return 1;
  }
  s->grace_ms = grace_ms;
  s->roles = roles;
  s->broker_host = broker_host;
  if (bin_dir) snprintf(s->bin_dir, sizeof s->bin_dir, "%s", bin_dir);
  else find_bin_dir(s->bin_dir, sizeof s->bin_dir);
  if (mbd_deploy_config_load(config, &cfg, &err) || plan(s, cfg, &err)) {
    fprintf(stderr, "mambad up: %s: %s\n", mbd_status_name(err.code), err.msg);
    goto done;
  }
  if (dry) {
    for (size_t i = 0; i < s->n; i++) print_cmd(&s->kids[i]);
    rc = 0;
    goto done;
  }
  if (check) {
    rc = check_plan(s, config) ? 1 : 0;
    goto done;
  }
  if (ensure_ipc_dir(cfg->clients_ep, &err) || ensure_ipc_dir(cfg->workers_ep, &err)) {
    fprintf(stderr, "mambad up: %s: %s\n", mbd_status_name(err.code), err.msg);
    goto done;
  }
  mbd_curve_pair probe;
  bool probe_curve = (s->roles & ROLE_BROKER) && s->n && s->kids[0].is_broker &&
                     cfg->security.curve && !strncmp(cfg->clients_ep, "tcp://", 6);
  if (probe_curve) {
    if (mbd_curve_generate(&probe, &err) || add_arg(&s->kids[0], "--operator-keys") ||
        add_arg(&s->kids[0], "%s", probe.public_key)) {
      fprintf(stderr, "mambad up: cannot make the readiness poll's key: %s\n",
              err.msg[0] ? err.msg : "out of memory");
      goto done;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  int64_t t0 = now_ms();
  if (s->roles & ROLE_BROKER)
    printf("mambad up: %s: broker on clients %s, workers %s; starting %zu worker%s\n", config,
           cfg->clients_ep, cfg->workers_ep, s->n_workers, s->n_workers == 1 ? "" : "s");
  else
    printf("mambad up: %s: broker at %s; starting %zu worker%s\n", config, s->clients_connect,
           s->n_workers, s->n_workers == 1 ? "" : "s");
  fflush(stdout);
  for (size_t i = 0; i < s->n; i++) {
    if (start(s, &s->kids[i])) goto stop;
    printf("mambad up: started %s (pid %d)\n", s->kids[i].name, (int)s->kids[i].pid);
    fflush(stdout);
    if (i == 0) sleep_ms(100); /* let the broker bind before workers connect */
  }
  if (make_poller(s, cfg, probe_curve ? &probe : NULL, &cl, &err))
    fprintf(stderr, "mambad up: cannot watch registrations: %s\n", err.msg);
  int64_t last_check = 0;
  rc = 0;
  while (!g_stop) {
    if (reap(s)) {
      rc = 1;
      break;
    }
    int64_t now = now_ms();
    for (size_t i = 0; i < s->n && !g_stop; i++) {
      child *c = &s->kids[i];
      if (c->pid == 0 && now >= c->restart_at_ms && !start(s, c)) {
        printf("mambad up: restarted %s (pid %d)\n", c->name, (int)c->pid);
        fflush(stdout);
      }
    }
    if (cl && !s->announced && now - last_check >= 300) {
      last_check = now;
      check_ready(s, cl, t0);
    }
    sleep_ms(50);
  }
stop:
  if (g_stop) printf("mambad up: signal %d: stopping %zu processes\n", (int)g_stop, s->n);
  fflush(stdout);
  g_stop = g_stop ? g_stop : SIGTERM; /* no restarts from here on */
  stop_all(s);
  printf("mambad up: stopped\n");
done:
  mbd_client_destroy(&cl);
  for (size_t i = 0; i < s->n; i++)
    for (size_t k = 0; s->kids[i].argv[k]; k++) free(s->kids[i].argv[k]);
  free(s);
  mbd_deploy_config_free(&cfg);
  return rc;
}
