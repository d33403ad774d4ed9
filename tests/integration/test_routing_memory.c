/* Bounded broker memory, with real processes: a 64 MiB request body (an
 * array of 64 Mi one-byte elements, ~1.5 GiB as decoded msgpack objects) and
 * 1000 requests of 1 MiB each sent while the only matching worker is stopped
 * (SIGSTOP) keep the broker's peak resident memory (VmHWM) under
 * BROKER_HWM_BOUND_MIB with --queue-mb 64: the big body is answered from
 * its routing header alone, and the queue refuses with BUSY "by bytes" what
 * would pass 64 MiB. Then the worker resumes, the queued requests are
 * answered, and a good request gives the same logits bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "support/wh_requests.h"
#include "support/worker_harness.h"

#define QUEUE_MB 64
#define BIG_MIB 64
#define N_SMALL 1000
/* The bound: the largest message (64 MiB, held once while it is read) +
 * the queue's bytes (64 MiB) + 128 MiB for the process, ZeroMQ's buffers and
 * requests in transit between the sockets and the queue. */
#define BROKER_HWM_BOUND_MIB (BIG_MIB + QUEUE_MB + 128)

static wh g;

/* VmHWM or VmRSS of pid in KiB, -1 when unreadable. */
static long proc_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long v = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':') v = strtol(line + fl + 1, NULL, 10);
  fclose(f);
  return v;
}

/* FORWARD {model, tensors: [input_ids [1,8]], pad: bin(pad_bytes)?} with the ids inline. */
static uint64_t send_forward(const char *model, size_t pad_bytes, const int64_t *ids) {
  wh_pack p;
  wh_pack_init(&p);
  msgpack_pack_map(&p.pk, 2 + (pad_bytes > 0));
  mbd_pack_kv_str(&p.pk, "model", model);
  mbd_pack_str(&p.pk, "tensors");
  msgpack_pack_array(&p.pk, 1);
  int64_t shape[2] = {1, 8};
  wh_ref(&p.pk, "input_ids", "i64", 2, shape, 0);
  if (pad_bytes) {
    static char zeros[1 << 20];
    mbd_pack_str(&p.pk, "pad");
    msgpack_pack_bin(&p.pk, pad_bytes);
    msgpack_pack_bin_body(&p.pk, zeros, pad_bytes < sizeof zeros ? pad_bytes : sizeof zeros);
  }
  const void *pl[1] = {ids};
  size_t lens[1] = {8 * sizeof(int64_t)};
  return wh_send(&g, MBD_CMD_FORWARD, &p.sb, 1, pl, lens);
}

/* The logits payload of a FINAL (copied into out, cap bytes); its size. */
static size_t logits_of(const mbd_msg *m, void *out, size_t cap) {
  size_t n = 0;
  const void *d = mbd_msg_payload(m, 0, &n);
  assert_non_null(d);
  assert_true(n <= cap);
  memcpy(out, d, n);
  return n;
}

static int setup(void **state) {
  (void)state;
  int rc = wh_init(&g);
  if (rc) return rc == 77 ? 0 : -1;
  char exe[600], qmb[16];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g.bin);
  snprintf(qmb, sizeof qmb, "%d", QUEUE_MB);
  /* liveness 100 x 200 ms: the stopped worker stays registered while its queue fills */
  char *argv[] = {exe, "--clients", g.clients, "--workers", g.workers, "--heartbeat-ms", "200",
                  "--liveness", "100", "--queue-mb", qmb, NULL};
  /* Under AddressSanitizer freed blocks wait in a quarantine (256 MiB by
   * default) before reuse, which would count every refused 1 MiB request:
   * keep it small so the bound measures the broker, not the sanitizer. */
  const char *asan = getenv("ASAN_OPTIONS");
  char opts[512];
  snprintf(opts, sizeof opts, "%s%squarantine_size_mb=8", asan ? asan : "", asan && *asan ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1);
  g.broker = procs_spawn(argv, NULL);
  if (asan) setenv("ASAN_OPTIONS", asan, 1);
  else unsetenv("ASAN_OPTIONS");
  g.zctx = zmq_ctx_new();
  g.sock = zmq_socket(g.zctx, ZMQ_DEALER);
  int linger = 0, hwm = 0;
  zmq_setsockopt(g.sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(g.sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_connect(g.sock, g.clients);
  /* liveness 100: resumed after SIGSTOP, it must not take the pause for a dead broker */
  wh_start_worker(&g, "w0", "--capacity", "1", "--liveness", "100", NULL);
  return wh_wait_workers(&g, 1, 30000) ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  if (g.nprocs) kill(g.procs[0], SIGCONT);
  wh_fini(&g);
  return 0;
}

static void test_broker_memory_bounded(void **state) {
  (void)state;
  if (!g.broker) skip();
  int64_t ids[8] = {1, 5, 9, 17, 33, 65, 129, 255};
  static float ref[8 * 4096], got[8 * 4096];
  mbd_msg *m = wh_wait(&g, send_forward("tiny", 0, ids), 30000);
  assert_int_equal(wh_code(m), 0);
  size_t nref = logits_of(m, ref, sizeof ref);
  mbd_msg_destroy(&m);

  /* 64 MiB body: a 64 Mi-element array after the routing fields */
  size_t big = (size_t)BIG_MIB << 20;
  uint8_t *body = malloc(big + 64);
  assert_non_null(body);
  size_t o = 0;
  body[o++] = 0x82; /* map of 2 */
  body[o++] = 0xa5;
  memcpy(body + o, "model", 5), o += 5;
  body[o++] = 0xa4;
  memcpy(body + o, "nope", 4), o += 4;
  body[o++] = 0xa4;
  memcpy(body + o, "junk", 4), o += 4;
  body[o++] = 0xdd; /* array 32 */
  uint32_t n = (uint32_t)(big - o - 4);
  body[o++] = (uint8_t)(n >> 24), body[o++] = (uint8_t)(n >> 16);
  body[o++] = (uint8_t)(n >> 8), body[o++] = (uint8_t)n;
  memset(body + o, 0x01, n);
  o += n;
  mbd_msg *bm = NULL;
  assert_int_equal(mbd_msg_new(MBD_CMD_FORWARD, 999999, &bm, NULL), 0);
  assert_int_equal(mbd_msg_set_body(bm, body, o, NULL), 0);
  free(body);
  assert_int_equal(mbd_msg_send(&bm, g.sock, 0, NULL), 0);
  m = wh_wait(&g, 999999, 60000);
  assert_int_equal(wh_code(m), MBD_E_NO_ROUTE);
  mbd_msg_destroy(&m);
  long hwm_big = proc_kib(g.broker, "VmHWM");

  /* the worker stops; one request fills its capacity, then 1000 x 1 MiB */
  kill(g.procs[0], SIGSTOP);
  uint64_t first = send_forward("tiny", 0, ids);
  uint64_t t0 = 0;
  for (int i = 0; i < N_SMALL; i++) {
    uint64_t t = send_forward("tiny", (size_t)1 << 20, ids);
    if (!t0) t0 = t;
  }
  int busy_bytes = 0, other = 0;
  double end = wh_now() + 60;
  while (busy_bytes + other < N_SMALL && wh_now() < end) {
    m = wh_recv(&g, 500);
    if (!m) continue;
    if (mbd_msg_cmd(m) == MBD_CMD_ERROR) {
      mbd_body *b = wh_body(m);
      char msg[600] = "";
      int64_t code = 0;
      mbd_obj_i64(mbd_body_root(b), "code", false, &code, NULL);
      mbd_obj_str(mbd_body_root(b), "message", false, msg, sizeof msg, NULL);
      mbd_body_destroy(&b);
      if (code == MBD_E_BUSY && strstr(msg, "by bytes")) busy_bytes++;
      else other++;
    } else {
      other++;
    }
    mbd_msg_destroy(&m);
    /* the queue holds what fits in QUEUE_MB: everything else is refused at once */
    if (busy_bytes >= N_SMALL - (QUEUE_MB + 1)) break;
  }
  long hwm = proc_kib(g.broker, "VmHWM"), rss = proc_kib(g.broker, "VmRSS");
  fprintf(stderr, "broker VmHWM after the 64 MiB body %ld KiB, after the queue %ld KiB (RSS %ld), "
                  "bound %d MiB; %d BUSY by bytes\n",
          hwm_big, hwm, rss, BROKER_HWM_BOUND_MIB, busy_bytes);
  assert_int_equal(other, 0);
  assert_true(busy_bytes >= N_SMALL - (QUEUE_MB + 1));
  assert_true(hwm > 0 && hwm < (long)BROKER_HWM_BOUND_MIB * 1024);

  /* the worker resumes: the first and every queued request are answered */
  kill(g.procs[0], SIGCONT);
  int finals = 0, errors = 0;
  end = wh_now() + 120;
  while (finals + busy_bytes + errors < N_SMALL + 1 && wh_now() < end) {
    m = wh_recv(&g, 500);
    if (!m) continue;
    uint64_t t = mbd_msg_tag(m);
    if (t == first || (t >= t0 && t < t0 + N_SMALL)) {
      if (mbd_msg_cmd(m) == MBD_CMD_FINAL) {
        finals++;
        size_t ng = logits_of(m, got, sizeof got);
        assert_int_equal(ng, nref);
        assert_memory_equal(got, ref, nref);
      } else if (mbd_msg_cmd(m) == MBD_CMD_ERROR) {
        if (wh_code(m) == MBD_E_BUSY) busy_bytes++; /* refused before the resume, read late */
        else errors++;
      }
    }
    mbd_msg_destroy(&m);
  }
  assert_int_equal(errors, 0);
  assert_int_equal(finals + busy_bytes, N_SMALL + 1);
  fprintf(stderr, "%d answered after the resume, %d BUSY by bytes in all\n", finals, busy_bytes);
  assert_true(finals >= 2 && finals <= QUEUE_MB + 2); /* + one the worker may finish as it stops */

  /* and a fresh request after all that: the same bits */
  m = wh_wait(&g, send_forward("tiny", 0, ids), 30000);
  assert_int_equal(wh_code(m), 0);
  assert_int_equal(logits_of(m, got, sizeof got), nref);
  assert_memory_equal(got, ref, nref);
  mbd_msg_destroy(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_broker_memory_bounded, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
