/* Child processes of the tests (see procs.h). */
#include "support/procs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/events.h"

int procs_sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

pid_t procs_spawn(char *const argv[], const char *log) {
  pid_t parent = getpid();
  pid_t p = fork();
  if (p != 0) return p;
  /* Dies with the test, even when the test dies between fork and prctl. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
  if (log) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
  }
  execv(argv[0], argv);
  fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

int procs_wait_exit(pid_t p, int timeout_ms) {
  if (p <= 0) return -1;
  int st = 0;
  int64_t end = ev_now_ms() + timeout_ms;
  for (;;) {
    pid_t got = waitpid(p, &st, WNOHANG);
    if (got == p) return st;
    if (got < 0 || ev_now_ms() > end) return -1;
    ev_nap_ms(10);
  }
}

int procs_stop(pid_t p, int sig, int timeout_ms, int *st_out) {
  if (st_out) *st_out = 0;
  if (p <= 0) return -1;
  kill(p, sig);
  int st = procs_wait_exit(p, timeout_ms);
  if (st == -1 && waitpid(p, &st, WNOHANG) == 0) { /* still running: the timeout passed */
    kill(p, SIGKILL);
    waitpid(p, &st, 0);
    if (st_out) *st_out = st;
    return -1;
  }
  if (st == -1) return -1; /* not a child */
  if (st_out) *st_out = st;
  return st;
}
