/* Acting as a second uid (nobody) from a root test process. */
#include "support/security.h"

#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

uid_t sec_nobody_uid;
gid_t sec_nobody_gid;

int sec_init(void) {
  if (geteuid() != 0) {
    printf("SKIP: needs root, to act as a second uid (nobody) against root-owned state\n");
    return 77;
  }
  struct passwd *pw = getpwnam("nobody");
  if (!pw) {
    printf("SKIP: no user 'nobody' on this system to act as the second uid\n");
    return 77;
  }
  sec_nobody_uid = pw->pw_uid;
  sec_nobody_gid = pw->pw_gid;
  if (!getenv("MBD_BIN_DIR") || !getenv("MBD_FIXTURES_DIR")) {
    printf("SKIP: MBD_BIN_DIR / MBD_FIXTURES_DIR not set\n");
    return 77;
  }
  return 0;
}

void sec_open_socket(const wh *h) {
  char sock[400];
  chmod(h->dir, 0755);
  snprintf(sock, sizeof sock, "%s/clients", h->dir);
  chmod(sock, 0777);
}

int sec_as_nobody(const wh *h, int (*fn)(wh *client)) {
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    if (setgroups(0, NULL) || setgid(sec_nobody_gid) || setuid(sec_nobody_uid)) _exit(90);
    wh c = *h;
    c.zctx = zmq_ctx_new();
    c.sock = zmq_socket(c.zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(c.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(c.sock, c.clients)) _exit(91);
    int rc = fn(&c);
    zmq_close(c.sock);
    zmq_ctx_term(c.zctx);
    _exit(rc);
  }
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}
