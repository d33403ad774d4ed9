/* Acting as a second uid, for the tests/integration/test_security_*.c tests.
 * The tests run as root (CI), become `nobody` in a forked child that opens its
 * own client socket to the broker, and report what they saw by exit status. */
#ifndef MBD_TEST_SECURITY_H
#define MBD_TEST_SECURITY_H

#include <stdio.h>
#include <sys/types.h>

#include "support/worker_harness.h"

/* The second uid and its group; set by sec_init. */
extern uid_t sec_nobody_uid;
extern gid_t sec_nobody_gid;

/* 0 when the test can act as a second uid, else 77 after printing why. */
int sec_init(void);

/* Lets the second uid reach h's clients socket (the test's own directory). */
void sec_open_socket(const wh *h);

/* Runs fn(client) in a child that has become nobody, with its own client
 * socket to h's broker; returns the child's exit status (0 = all checks passed). */
int sec_as_nobody(const wh *h, int (*fn)(wh *client));

/* In a child: fails it with the line number when cond is false. */
#define SEC_CHECK(cond)                                                          \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "second uid: check failed at line %d: %s\n", __LINE__, #cond); \
      return __LINE__ % 200 + 1;                                                 \
    }                                                                            \
  } while (0)

#endif
