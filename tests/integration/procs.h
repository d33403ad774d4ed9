/* Child processes of the tests (broker, workers, `mambad up`, CLI runs): one
 * spawner and one stopper shared by worker_harness.h, test_service_util.h and
 * test_broker_protocol.c, and a shell runner for the CLI tests. Header-only
 * (static) like its users.
 *
 * Every child is tied to the test process (PR_SET_PDEATHSIG = SIGKILL): a
 * failed cmocka assertion longjmps past the test's own cleanup, and a broker
 * or worker left running keeps ctest's output pipe open, so ctest waited out
 * the whole test timeout (300 s) for a test that had failed in a second. */
#ifndef MBD_TEST_PROCS_H
#define MBD_TEST_PROCS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runs the printf-formatted command line under /bin/sh; returns its exit
 * status, or -1 when it did not exit normally. */
static inline int procs_sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Starts argv[0] with argv. log NULL: stdout and stderr are the test's;
 * otherwise both are appended to the file `log`. Returns the pid, or -1. */
static inline pid_t procs_spawn(char *const argv[], const char *log) {
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

/* Sends sig to p and reaps it, waiting up to timeout_ms before SIGKILL.
 * Returns the raw wait status, or -1 when p was not a child or had to be
 * killed after the timeout (the status is then in *st_out when non-NULL). */
static inline int procs_stop(pid_t p, int sig, int timeout_ms, int *st_out) {
  int st = 0;
  if (st_out) *st_out = 0;
  if (p <= 0) return -1;
  kill(p, sig);
  struct timespec t0, t, nap = {0, 10 * 1000000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    pid_t got = waitpid(p, &st, WNOHANG);
    if (got == p) break;
    if (got < 0) return -1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > timeout_ms) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
      if (st_out) *st_out = st;
      return -1;
    }
    nanosleep(&nap, NULL);
  }
  if (st_out) *st_out = st;
  return st;
}

#endif
