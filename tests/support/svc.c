/* A deployment under test (see svc.h). */
#include "support/svc.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Prints why the test cannot run; returns false. */
static bool missing(const char *what, const char *path) {
  printf("skipped: %s %s\n", what, path);
  return false;
}

bool svc_init(svc *s) {
  memset(s, 0, sizeof *s);
  const char *bin = getenv("MBD_BIN_DIR"), *fx = getenv("MBD_FIXTURES_DIR");
  if (!bin || !fx) return missing("MBD_BIN_DIR or MBD_FIXTURES_DIR not set", "(ctest sets both)");
  snprintf(s->bin, sizeof s->bin, "%s", bin);
  snprintf(s->fixture, sizeof s->fixture, "%s/mamba1/tiny-d64", fx);
  char probe[700];
  snprintf(probe, sizeof probe, "%s/config.json", s->fixture);
  if (access(probe, R_OK) != 0) return missing("no fixture", probe);
  const char *progs[] = {"mambad", "mambad-up", "mambad-broker", "mambad-worker"};
  for (size_t i = 0; i < 4; i++) {
    snprintf(probe, sizeof probe, "%s/%s", s->bin, progs[i]);
    if (access(probe, X_OK) != 0) return missing("program not built:", probe);
  }
  snprintf(s->dir, sizeof s->dir, "/tmp/mbd-svc-XXXXXX");
  if (!mkdtemp(s->dir)) return missing("cannot create", s->dir);
  snprintf(s->clients, sizeof s->clients, "ipc://%s/c.sock", s->dir);
  snprintf(s->workers, sizeof s->workers, "ipc://%s/w.sock", s->dir);
  return true;
}

void svc_write(const svc *s, const char *name, char *out, const char *fmt, ...) {
  snprintf(out, 700, "%s/%s", s->dir, name);
  FILE *f = fopen(out, "w");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

void svc_yaml(const svc *s, const char *workers_yaml, char *path) {
  svc_write(s, "deploy.yaml", path,
            "broker:\n  clients: %s\n  workers: %s\n  heartbeat_ms: 200\n  liveness: 3\n"
            "  default_deadline_ms: 20000\n"
            "models:\n  - name: tiny\n    path: %s\n"
            "workers:\n%s",
            s->clients, s->workers, s->fixture, workers_yaml);
}

pid_t svc_spawn(const svc *s, const char *log_name, char *const argv[]) {
  char log[700];
  snprintf(log, sizeof log, "%s/%s", s->dir, log_name);
  return procs_spawn(argv, log);
}

void svc_up(svc *s, const char *yaml) {
  char prog[600];
  snprintf(prog, sizeof prog, "%s/mambad", s->bin);
  char *argv[] = {prog, "up", "--config", (char *)yaml, "--grace-ms", "3000", NULL};
  s->up = svc_spawn(s, "up.log", argv);
}

int svc_down(svc *s, int64_t ms) {
  if (s->up <= 0) return 0;
  int st = procs_stop(s->up, SIGTERM, (int)ms, NULL);
  s->up = 0;
  return st;
}

void svc_cleanup(svc *s) {
  svc_down(s, 5000);
  if (s->dir[0] && getenv("MBD_KEEP_TMP") == NULL) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s->dir);
  }
}

int svc_sh(const svc *s, char *out, size_t cap, const char *fmt, ...) {
  char cmd[4096], file[700];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd - 800, fmt, ap);
  va_end(ap);
  snprintf(file, sizeof file, "%s/cmd.out", s->dir);
  snprintf(cmd + n, sizeof cmd - (size_t)n, " >'%s' 2>&1", file);
  int st = system(cmd);
  if (out && cap) {
    out[0] = '\0';
    FILE *f = fopen(file, "r");
    if (f) {
      size_t got = fread(out, 1, cap - 1, f);
      out[got] = '\0';
      fclose(f);
    }
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const mbd_worker_info *svc_find(const mbd_status_report *r, const char *name) {
  for (size_t i = 0; i < r->n_workers; i++)
    if (!strcmp(r->workers[i].name, name) && r->workers[i].alive) return &r->workers[i];
  return NULL;
}

int64_t svc_wait_workers(mbd_client *c, const char *const *names, size_t n, const char *not_uid,
                         mbd_worker_info *first, int64_t timeout_ms) {
  int64_t t0 = ev_now_ms();
  while (ev_now_ms() - t0 < timeout_ms) {
    mbd_status_report *r = NULL;
    if (mbd_client_status(c, &r, NULL) == 0) {
      size_t ok = 0;
      for (size_t i = 0; i < n; i++) {
        const mbd_worker_info *w = svc_find(r, names[i]);
        if (w && (i || !not_uid || strcmp(w->uid, not_uid))) ok++;
        if (w && i == 0 && first) {
          *first = *w;
          first->route = NULL; /* owned by the report */
          first->models = NULL;
          first->n_models = 0;
        }
      }
      mbd_status_report_free(&r);
      if (ok == n) return ev_now_ms() - t0;
    }
    ev_nap_ms(50);
  }
  return -1;
}

mbd_client *svc_client(const svc *s) {
  mbd_client_options o;
  mbd_client_options_init(&o);
  o.deadline_ms = 20000;
  o.connect_ms = 2000;
  mbd_client *c = NULL;
  mbd_error err = {0};
  if (mbd_client_new(s->clients, &o, &c, &err)) fprintf(stderr, "client: %s\n", err.msg);
  return c;
}
