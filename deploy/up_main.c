/* `mambad up` (mambad-up): starts a whole deployment from a YAML file and
 * supervises it in the foreground.
 *
 * It starts the broker, then every worker the file lists (cpu replicas and
 * `device: all` expanded), each in its own process group so a terminal's
 * Ctrl-C reaches only the supervisor, which then stops things in order.
 * A child that exits is restarted with exponential backoff (reset after it
 * has run for a while); workers re-register with the broker on their own.
 * SIGINT/SIGTERM: SIGTERM to the workers, then the broker, wait up to the
 * grace period, SIGKILL what is left. Children get PR_SET_PDEATHSIG so they
 * do not outlive a supervisor that was killed. */
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
#include "common/deploy_config.h"

#define MAX_CHILDREN (1 + MBD_DEPLOY_MAX_WORKERS * 64)
#define MAX_ARGS 96
#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 10000
#define HEALTHY_MS 30000 /* a child that ran this long starts its backoff afresh */

typedef struct child {
  char name[80];          /* "broker" or the worker name */
  bool is_broker;
  char *argv[MAX_ARGS];   /* owned strings, NULL-terminated */
  pid_t pid;              /* 0 when not running */
  int64_t started_ms;     /* when the current process started */
  int64_t restart_at_ms;  /* when to start it again (pid == 0) */
  int restarts;           /* consecutive quick failures */
} child;

typedef struct supervisor {
  child kids[MAX_CHILDREN];
  size_t n;
  char bin_dir[PATH_MAX];
  int64_t grace_ms;
  char clients_connect[MBD_DEPLOY_EP_MAX];
  size_t n_workers;       /* expected worker registrations */
  bool announced;         /* printed "ready" */
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
  for (size_t k = 0; k < w->n_models; k++) {
    const mbd_deploy_model *m = &cfg->models[w->models[k]];
    rc |= add_arg(c, "--model") | add_arg(c, "%s=%s", m->name, m->path);
  }
  if (w->threads) rc |= add_arg(c, "--threads") | add_arg(c, "%d", w->threads);
  if (w->capacity) rc |= add_arg(c, "--capacity") | add_arg(c, "%d", w->capacity);
  if (w->max_batch) rc |= add_arg(c, "--max-batch") | add_arg(c, "%d", w->max_batch);
  if (w->session_idle_s) rc |= add_arg(c, "--session-idle-s") | add_arg(c, "%d", w->session_idle_s);
  rc |= add_arg(c, "--heartbeat-ms") | add_arg(c, "%" PRId64, cfg->heartbeat_ms);
  rc |= add_arg(c, "--liveness") | add_arg(c, "%" PRId64, cfg->liveness);
  const mbd_deploy_security *sec = &cfg->security;
  if (sec->curve && !strncmp(cfg->workers_ep, "tcp://", 6)) /* docs/security.md */
    rc |= add_arg(c, "--curve-secret") | add_arg(c, "%s", sec->worker_key) |
          add_arg(c, "--server-key") | add_arg(c, "%s", sec->broker_key);
  s->n_workers++;
  return rc;
}

/* Turns the config into child command lines. */
static int plan(supervisor *s, const mbd_deploy_config *cfg, mbd_error *err) {
  child *b = new_child(s, "broker", true, "mambad-broker");
  int rc = 0;
  rc |= add_arg(b, "--clients") | add_arg(b, "%s", cfg->clients_ep);
  rc |= add_arg(b, "--workers") | add_arg(b, "%s", cfg->workers_ep);
  rc |= add_arg(b, "--heartbeat-ms") | add_arg(b, "%" PRId64, cfg->heartbeat_ms);
  rc |= add_arg(b, "--liveness") | add_arg(b, "%" PRId64, cfg->liveness);
  rc |= add_arg(b, "--queue-limit") | add_arg(b, "%" PRId64, cfg->queue_limit);
  rc |= add_arg(b, "--max-message-mb") | add_arg(b, "%" PRId64, cfg->max_message_mb);
  rc |= add_arg(b, "--default-deadline-ms") | add_arg(b, "%" PRId64, cfg->default_deadline_ms);
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
  char wconn[MBD_DEPLOY_EP_MAX];
  mbd_deploy_connect_endpoint(cfg->workers_ep, wconn, sizeof wconn);
  mbd_deploy_connect_endpoint(cfg->clients_ep, s->clients_connect, sizeof s->clients_connect);
  for (size_t i = 0; i < cfg->n_workers && rc == 0; i++) {
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
  size_t up = 0;
  for (size_t i = 0; i < r->n_workers; i++) up += r->workers[i].alive;
  if (up >= s->n_workers) {
    printf("mambad up: ready in %.1f s: %zu worker%s registered\n", (now_ms() - t0) / 1000.0, up,
           up == 1 ? "" : "s");
    for (size_t i = 0; i < r->n_workers; i++)
      printf("  worker %-16s route %.12s  models %zu  pid %" PRId64 "\n", r->workers[i].name,
             r->workers[i].route_id, r->workers[i].n_models, r->workers[i].pid);
    fflush(stdout);
    s->announced = true;
  }
  mbd_status_report_free(&r);
}

/* SIGTERM workers, then the broker; SIGKILL what is left after the grace period. */
static void stop_all(supervisor *s) {
  for (int phase = 0; phase < 2; phase++) {
    for (size_t i = 0; i < s->n; i++)
      if (s->kids[i].pid > 0 && s->kids[i].is_broker == (phase == 1)) kill(s->kids[i].pid, SIGTERM);
    int64_t end = now_ms() + s->grace_ms;
    for (;;) {
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (size_t i = 0; i < s->n; i++)
          if (s->kids[i].pid == pid) s->kids[i].pid = 0;
      bool left = false;
      for (size_t i = 0; i < s->n; i++)
        left = left || (s->kids[i].pid > 0 && s->kids[i].is_broker == (phase == 1));
      if (!left) break;
      if (now_ms() >= end) {
        for (size_t i = 0; i < s->n; i++)
          if (s->kids[i].pid > 0 && s->kids[i].is_broker == (phase == 1)) {
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

static void usage(FILE *f) {
  fprintf(f,
          "usage: mambad up --config FILE.yaml [--grace-ms N] [--bin-dir DIR] [--dry-run]\n"
          "Starts the broker and the workers FILE.yaml lists, in the foreground, and keeps\n"
          "them running: a worker that dies is restarted (with backoff) and re-registers.\n"
          "Ctrl-C or SIGTERM stops everything (SIGTERM, then SIGKILL after --grace-ms,\n"
          "default 10000). --dry-run prints the command lines and exits. Programs are\n"
          "looked up in --bin-dir, next to this binary, then on PATH.\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                       {"grace-ms", required_argument, 0, 'g'},
                                       {"bin-dir", required_argument, 0, 'b'},
                                       {"dry-run", no_argument, 0, 'n'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *config = NULL, *bin_dir = NULL;
  int64_t grace_ms = 10000;
  bool dry = false;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 'c': config = optarg; break;
    case 'b': bin_dir = optarg; break;
    case 'n': dry = true; break;
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
  if (ensure_ipc_dir(cfg->clients_ep, &err) || ensure_ipc_dir(cfg->workers_ep, &err)) {
    fprintf(stderr, "mambad up: %s: %s\n", mbd_status_name(err.code), err.msg);
    goto done;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  int64_t t0 = now_ms();
  printf("mambad up: %s: broker on clients %s, workers %s; starting %zu worker%s\n", config,
         cfg->clients_ep, cfg->workers_ep, s->n_workers, s->n_workers == 1 ? "" : "s");
  fflush(stdout);
  for (size_t i = 0; i < s->n; i++) {
    if (start(s, &s->kids[i])) goto stop;
    printf("mambad up: started %s (pid %d)\n", s->kids[i].name, (int)s->kids[i].pid);
    fflush(stdout);
    if (i == 0) sleep_ms(100); /* let the broker bind before workers connect */
  }
  mbd_client_options co;
  mbd_client_options_init(&co);
  co.deadline_ms = 1000;
  co.connect_ms = 500;
  if (mbd_client_new(s->clients_connect, &co, &cl, &err))
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
