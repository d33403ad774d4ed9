/* A whole deployment under test: a temporary directory holding the YAML,
 * sockets and logs, `mambad up` as a child process, CLI runs, and waiting for
 * workers to register (the service integration tests and the GPU ones). */
#ifndef MBD_TEST_SVC_H
#define MBD_TEST_SVC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client/mambad.h"
#include "support/events.h"
#include "support/procs.h"

typedef struct svc {
  char dir[64];      /* mkdtemp directory: yaml, sockets, logs, files */
  char clients[128]; /* ipc:// endpoint for clients */
  char workers[128]; /* ipc:// endpoint for workers */
  char bin[512];     /* MBD_BIN_DIR */
  char fixture[512]; /* tiny-d64 fixture directory */
  pid_t up;          /* the `mambad up` process, 0 when none */
} svc;

/* Fills s; returns false (caller skips) when binaries or fixtures are missing,
 * having printed which. */
bool svc_init(svc *s);

/* Writes s->dir/name with printf-style content; returns the path in out. */
__attribute__((format(printf, 4, 5))) void svc_write(const svc *s, const char *name, char *out,
                                                     const char *fmt, ...);

/* YAML head: broker on the test's sockets, fast heartbeats, the tiny model. */
void svc_yaml(const svc *s, const char *workers_yaml, char *path);

/* Starts argv with its output in dir/log_name; returns the pid. */
pid_t svc_spawn(const svc *s, const char *log_name, char *const argv[]);

/* Starts `mambad up --config yaml --grace-ms 3000` with output in dir/up.log. */
void svc_up(svc *s, const char *yaml);

/* SIGTERM to `mambad up`; waits up to ms; returns its wait status or -1. */
int svc_down(svc *s, int64_t ms);

/* Stops `mambad up` and removes dir (kept when MBD_KEEP_TMP is set). */
void svc_cleanup(svc *s);

/* Runs a shell command line (printf-style) with stdout+stderr into dir/cmd.out;
 * returns the exit code (or -1) and leaves the output in out (cap bytes). */
__attribute__((format(printf, 4, 5))) int svc_sh(const svc *s, char *out, size_t cap,
                                                 const char *fmt, ...);

/* Finds a live worker by name in a status report. */
const mbd_worker_info *svc_find(const mbd_status_report *r, const char *name);

/* Waits until every name in names[0..n) is registered (and, when not NULL,
 * the first one's uid differs from not_uid); copies that worker's info into
 * *first. Returns the elapsed ms or -1 on timeout. */
int64_t svc_wait_workers(mbd_client *c, const char *const *names, size_t n, const char *not_uid,
                         mbd_worker_info *first, int64_t timeout_ms);

/* A client of the deployment (20 s deadline); NULL with a printed reason. */
mbd_client *svc_client(const svc *s);

#endif
