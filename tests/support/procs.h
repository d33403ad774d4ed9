/* Child processes of the tests (broker, workers, `mambad up`, CLI runs): one
 * spawner, one stopper and a shell runner, shared by every harness.
 *
 * Every child is tied to the test process (PR_SET_PDEATHSIG = SIGKILL): a
 * failed cmocka assertion longjmps past the test's own cleanup, and a broker
 * or worker left running keeps ctest's output pipe open, so ctest would wait
 * out the whole test timeout for a test that had failed in a second. */
#ifndef MBD_TEST_PROCS_H
#define MBD_TEST_PROCS_H

#include <sys/types.h>

/* Runs the printf-formatted command line under /bin/sh; returns its exit
 * status, or -1 when it did not exit normally. */
int procs_sh(const char *fmt, ...);

/* Starts argv[0] with argv. log NULL: stdout and stderr are the test's;
 * otherwise both are appended to the file `log`. Returns the pid, or -1. */
pid_t procs_spawn(char *const argv[], const char *log);

/* Sends sig to p and reaps it, waiting up to timeout_ms before SIGKILL.
 * Returns the raw wait status, or -1 when p was not a child or had to be
 * killed after the timeout (the status is then in *st_out when non-NULL). */
int procs_stop(pid_t p, int sig, int timeout_ms, int *st_out);

/* Reaps child p once it exits by itself, waiting up to timeout_ms (a guard
 * against hangs, not a speed requirement). Returns the raw wait status, or -1
 * on timeout (p is left running) or when p is not a child. */
int procs_wait_exit(pid_t p, int timeout_ms);

#endif
