/* bench_broker: what the broker hop costs. Starts the real mambad-broker on
 * ipc:// endpoints, one in-process echo worker (capacity 256; it answers
 * FINAL {route_id, worker} as a worker's reply opens) and N client
 * threads; prints round-trip p50/p99 of a tiny request through the broker
 * next to a direct ZeroMQ REQ/REP round trip, the two interleaved, then
 * requests/s with 1, 4 and 16 client threads (each thread one request at a
 * time) through the broker and, as the floor, straight to one REP thread,
 * with the CPU time each request costs. MBD_BENCH_CELL_S: seconds per
 * throughput cell (1). Usage: bench_broker [path/to/mambad-broker] (default $MBD_BIN_DIR). */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/protocol.h"
#include "common/route.h"
#include "common/wire.h"
#include "support/quantile.h"

static void *g_ctx;  /* the clients' context (one I/O thread) */
static void *g_sctx; /* the servers' (echo worker, REP server): their own I/O thread, as a
                        worker process has */
static char g_cep[128], g_wep[128], g_direct[128];
static volatile int g_stop;  /* worker and REP server */
static volatile int g_cstop; /* client threads */
static useconds_t g_cell_us = 1000000; /* one throughput cell; MBD_BENCH_CELL_S overrides */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void *echo_worker(void *arg) {
  (void)arg;
  void *s = zmq_socket(g_sctx, ZMQ_DEALER);
  int zero = 0, tmo = 100;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_connect(s, g_wep);
  mbd_route_identity r;
  memset(&r, 0, sizeof r);
  strcpy(r.device_name, "cpu");
  char enc[1024], id[65];
  size_t len;
  mbd_route_encode(&r, enc, sizeof enc, &len, NULL);
  mbd_route_id_hex(&r, id);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5);
  mbd_pack_kv_str(&pk, "name", "echo");
  mbd_pack_kv_str(&pk, "uid", "echo-1");
  mbd_pack_kv_str(&pk, "route", enc);
  mbd_pack_kv_str(&pk, "route_id", id);
  mbd_pack_kv_u64(&pk, "capacity", 256);
  mbd_msg *m = NULL;
  mbd_msg_new(MBD_CMD_READY, 0, &m, NULL);
  mbd_msg_take_body(m, &sb, NULL);
  msgpack_sbuffer_destroy(&sb);
  mbd_msg_send(&m, s, 0, NULL);
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  mbd_pack_kv_str(&pk, "route_id", id);
  mbd_pack_kv_str(&pk, "worker", "echo");
  uint8_t reply[256];
  size_t reply_len = sb.size < sizeof reply ? sb.size : 0;
  memcpy(reply, sb.data, reply_len);
  msgpack_sbuffer_destroy(&sb);
  double last_hb = now_us();
  while (!g_stop) {
    if (now_us() - last_hb > 500e3) {
      mbd_msg_new(MBD_CMD_HEARTBEAT, 0, &m, NULL);
      mbd_msg_send(&m, s, 0, NULL);
      last_hb = now_us();
    }
    if (mbd_msg_recv(s, false, 0, &m, NULL)) {
      mbd_msg_destroy(&m);
      continue;
    }
    if (mbd_cmd_is_request(mbd_msg_cmd(m))) {
      /* FINAL under the same ticket, its body opening as a worker's does */
      mbd_msg *f = NULL;
      mbd_msg_new(MBD_CMD_FINAL, mbd_msg_tag(m), &f, NULL);
      mbd_msg_set_body(f, reply, reply_len, NULL);
      mbd_msg_send(&f, s, 0, NULL);
    }
    mbd_msg_destroy(&m);
  }
  zmq_close(s);
  return NULL;
}

typedef struct client_arg {
  int n;          /* requests to send (latency mode) or 0 = until g_stop */
  double *lat;    /* per-request microseconds (latency mode) */
  long done;
} client_arg;

/* One tiny GEMM-tagged request through the broker on DEALER s; 0 or -1. */
static int broker_rt(void *s, uint64_t tag) {
  static const uint8_t body[] = {0x81, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa0}; /* {model: ""} */
  mbd_msg *m = NULL;
  mbd_msg_new(MBD_CMD_GEMM, tag, &m, NULL);
  mbd_msg_set_body(m, body, sizeof body, NULL);
  if (mbd_msg_send(&m, s, 0, NULL)) return -1;
  for (;;) {
    int rc = mbd_msg_recv(s, false, 0, &m, NULL);
    if (rc == MBD_E_IO) {
      fprintf(stderr, "bench: no reply\n");
      return -1;
    }
    /* The broker's liveness probe (an empty frame) and HEARTBEATs are not
     * replies: skipped, as libmambad does. */
    if (rc || mbd_msg_tag(m) != tag) {
      mbd_msg_destroy(&m);
      continue;
    }
    int ok = mbd_msg_cmd(m) == MBD_CMD_FINAL;
    if (!ok) fprintf(stderr, "bench: %s reply\n", mbd_cmd_name(mbd_msg_cmd(m)));
    mbd_msg_destroy(&m);
    return ok ? 0 : -1;
  }
}

static void *client(void *p) {
  client_arg *a = p;
  void *s = zmq_socket(g_ctx, ZMQ_DEALER);
  int zero = 0, tmo = 5000;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_connect(s, g_cep);
  for (uint64_t tag = 1; a->n ? (int)tag <= a->n : !g_cstop; tag++) {
    double t0 = now_us();
    if (broker_rt(s, tag)) break;
    if (a->lat) a->lat[tag - 1] = now_us() - t0;
    a->done++;
  }
  zmq_close(s);
  return NULL;
}

/* One thread's REQ/REP round trips to the direct server until g_cstop. */
static void *direct_client(void *p) {
  client_arg *a = p;
  void *s = zmq_socket(g_ctx, ZMQ_REQ);
  int zero = 0, tmo = 5000;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_connect(s, g_direct);
  char buf[64];
  while (!g_cstop) {
    if (zmq_send(s, "ping-ping", 9, 0) < 0 || zmq_recv(s, buf, sizeof buf, 0) < 0) break;
    a->done++;
  }
  zmq_close(s);
  return NULL;
}

static void *rep_server(void *arg) {
  (void)arg;
  void *s = zmq_socket(g_sctx, ZMQ_REP);
  int zero = 0, tmo = 100;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_bind(s, g_direct);
  char buf[64];
  while (!g_stop) {
    int n = zmq_recv(s, buf, sizeof buf, 0);
    if (n >= 0) zmq_send(s, buf, (size_t)n, 0);
  }
  zmq_close(s);
  return NULL;
}

static void pct(double *v, int n, double *p50, double *p99) {
  *p50 = quantile_of(v, (size_t)n, 0.5);
  *p99 = quantile_of(v, (size_t)n, 0.99);
}

/* CPU time the process has used, all its threads, in microseconds (Linux
 * schedstat; 0 where it cannot be read). */
static double cpu_us(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  double ns = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char f[96];
    snprintf(f, sizeof f, "%s/%.20s/schedstat", path, e->d_name);
    FILE *fp = fopen(f, "r");
    unsigned long long run = 0;
    if (fp && fscanf(fp, "%llu", &run) == 1) ns += (double)run;
    if (fp) fclose(fp);
  }
  closedir(d);
  return ns / 1e3;
}

/* Requests/s of nt threads running fn for one second; *done: requests. */
static double throughput(void *(*fn)(void *), int nt, long *done) {
  pthread_t th[16];
  client_arg ca[16];
  g_cstop = 0;
  for (int i = 0; i < nt; i++) {
    ca[i] = (client_arg){0, NULL, 0};
    pthread_create(&th[i], NULL, fn, &ca[i]);
  }
  double t0 = now_us();
  usleep(g_cell_us);
  g_cstop = 1;
  long total = 0;
  for (int i = 0; i < nt; i++) {
    pthread_join(th[i], NULL);
    total += ca[i].done;
  }
  *done = total;
  return (double)total / ((now_us() - t0) / 1e6);
}

int main(int argc, char **argv) {
  char path[512];
  const char *bin = getenv("MBD_BIN_DIR");
  snprintf(path, sizeof path, "%s", argc > 1 ? argv[1] : "");
  if (!path[0]) snprintf(path, sizeof path, "%s/mambad-broker", bin ? bin : "build/bin");
  const char *cell = getenv("MBD_BENCH_CELL_S");
  if (cell && atof(cell) > 0 && atof(cell) <= 60) g_cell_us = (useconds_t)(atof(cell) * 1e6);
  char dir[] = "/tmp/mbd-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  snprintf(g_cep, sizeof g_cep, "ipc://%s/c", dir);
  snprintf(g_wep, sizeof g_wep, "ipc://%s/w", dir);
  snprintf(g_direct, sizeof g_direct, "ipc://%s/d", dir);
  pid_t pid = fork();
  if (pid == 0) {
    execl(path, path, "--clients", g_cep, "--workers", g_wep, "--heartbeat-ms", "500", (char *)NULL);
    _exit(127);
  }
  usleep(300000);
  g_ctx = zmq_ctx_new();
  g_sctx = zmq_ctx_new();
  pthread_t wt, rt;
  pthread_create(&wt, NULL, echo_worker, NULL);
  pthread_create(&rt, NULL, rep_server, NULL);
  usleep(300000);

  enum { N = 20000 };
  double *lat = calloc(N, sizeof *lat), *dlat = calloc(N, sizeof *dlat);
  client_arg warm = {1000, NULL, 0};
  client(&warm);
  /* Interleaved: one brokered round trip, then one direct REQ/REP round trip
   * over the same transport, N times, so a burst of outside load on this
   * shared machine lands on both alike. */
  void *dealer = zmq_socket(g_ctx, ZMQ_DEALER), *req = zmq_socket(g_ctx, ZMQ_REQ);
  int zero = 0, tmo = 5000;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_connect(dealer, g_cep);
  zmq_connect(req, g_direct);
  char buf[64];
  int nb = 0;
  for (int i = 0; i < N + 1000; i++) {
    double t0 = now_us();
    if (broker_rt(dealer, (uint64_t)i + 1)) break;
    double t1 = now_us();
    zmq_send(req, "ping-ping", 9, 0);
    zmq_recv(req, buf, sizeof buf, 0);
    double t2 = now_us();
    if (i >= 1000) lat[nb] = t1 - t0, dlat[nb++] = t2 - t1;
  }
  zmq_close(req);
  zmq_close(dealer);
  double b50, b99, d50, d99;
  pct(lat, nb, &b50, &b99);
  pct(dlat, nb, &d50, &d99);
  printf("round trip, tiny request (%d samples)   p50 us   p99 us\n", N);
  printf("  via broker (client->broker->worker)  %7.1f  %7.1f\n", b50, b99);
  printf("  direct REQ/REP, same transport       %7.1f  %7.1f\n", d50, d99);
  printf("  broker hop overhead (p50)            %7.1f   ratio %.2fx\n", b50 - d50, b50 / d50);
  printf("throughput, %.1f s per cell (direct: REQ/REP to one REP thread, the floor); CPU: us of\n"
         "CPU time (all threads, schedstat) per request, of the broker process and of this one\n"
         "(client threads, echo worker or REP server, their I/O threads)\n"
         "  clients   via broker/s    direct/s   broker/direct   CPU broker+bench   CPU direct\n",
         g_cell_us / 1e6);
  int threads[] = {1, 4, 16};
  pid_t self = getpid();
  for (int k = 0; k < 3; k++) {
    long nb_done = 0, nd_done = 0;
    double c0 = cpu_us(pid), s0 = cpu_us(self);
    double rb = throughput(client, threads[k], &nb_done);
    double c1 = cpu_us(pid), s1 = cpu_us(self);
    double rd = throughput(direct_client, threads[k], &nd_done);
    double s2 = cpu_us(self);
    printf("  %7d   %11.0f  %10.0f   %13.2f   %7.1f + %6.1f   %10.1f\n", threads[k], rb, rd,
           rb / rd, nb_done ? (c1 - c0) / (double)nb_done : 0.0,
           nb_done ? (s1 - s0) / (double)nb_done : 0.0, nd_done ? (s2 - s1) / (double)nd_done : 0.0);
  }
  g_stop = 1;
  pthread_join(wt, NULL);
  pthread_join(rt, NULL);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  zmq_ctx_term(g_ctx);
  zmq_ctx_term(g_sctx);
  free(lat);
  free(dlat);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) ? 1 : 0;
}
