/* Model identity in routing, with real processes: one broker, two CPU workers
 * on one route serving the same model name with different weights (two
 * synthetic checkpoints of different seeds). Unpinned requests are refused
 * with both digests listed; pinned ones always land on the matching weights
 * (1000 requests, every reply's digest, worker and logits checked bit for
 * bit); a broker started with --default-digest serves unpinned requests from
 * the default only; STATUS shows the name twice, once per digest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/mambad.h"
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "support/procs.h"

#define NTOK 8

typedef struct fx {
  char dir[64];
  char bin[512];
  char clients[128], workers[128];
  pid_t broker, wa, wb;
  char digest[2][72]; /* weights of worker wa (seed 1) and wb (seed 2) */
} fx;

static fx g;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static pid_t start_broker(const char *default_digest) {
  char exe[600], dflt[128];
  snprintf(exe, sizeof exe, "%s/mambad-broker", g.bin);
  char *argv[16] = {exe, "--clients", g.clients, "--workers", g.workers, "--heartbeat-ms", "200",
                    "--liveness", "3", NULL};
  if (default_digest) {
    snprintf(dflt, sizeof dflt, "tiny=%s", default_digest);
    argv[9] = "--default-digest";
    argv[10] = dflt;
    argv[11] = NULL;
  }
  return procs_spawn(argv, NULL);
}

static pid_t start_worker(const char *name, const char *sub) {
  char exe[600], model[300];
  snprintf(exe, sizeof exe, "%s/mambad-worker", g.bin);
  snprintf(model, sizeof model, "tiny=%s/%s", g.dir, sub);
  char *argv[] = {exe, "--connect", g.workers, "--name", (char *)name, "--model", model,
                  "--heartbeat-ms", "200", "--threads", "1", "--capacity", "4", NULL};
  return procs_spawn(argv, NULL);
}

static mbd_client *client(void) {
  mbd_client_options o;
  mbd_client_options_init(&o);
  o.deadline_ms = 20000;
  o.connect_ms = 2000;
  mbd_client *c = NULL;
  assert_int_equal(mbd_client_new(g.clients, &o, &c, NULL), 0);
  return c;
}

/* Waits until workers wa and wb are both registered; fills g.digest. */
static void wait_workers(mbd_client *c) {
  int64_t t0 = now_ms();
  while (now_ms() - t0 < 30000) {
    mbd_status_report *r = NULL;
    if (mbd_client_status(c, &r, NULL) == 0) {
      int found = 0;
      for (size_t i = 0; i < r->n_workers; i++) {
        const mbd_worker_info *w = &r->workers[i];
        int k = !strcmp(w->name, "wa") ? 0 : !strcmp(w->name, "wb") ? 1 : -1;
        if (k < 0 || w->n_models != 1) continue;
        snprintf(g.digest[k], sizeof g.digest[k], "%s", w->models[0].digest);
        found |= 1 << k;
      }
      mbd_status_report_free(&r);
      if (found == 3) return;
    }
    nap_ms(50);
  }
  fail_msg("workers did not register within 30 s");
}

static void forward(mbd_client *c, const char *model, const int64_t *ids, mbd_tensor_out *out,
                    mbd_error *err, int expect_rc) {
  mbd_tensor_in in;
  memset(&in, 0, sizeof in);
  int64_t shape[2] = {1, NTOK};
  assert_int_equal(mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL), 0);
  in.data = ids;
  int rc = mbd_client_forward(c, NULL, model, &in, false, NULL, out, err);
  if (rc != expect_rc) fail_msg("forward %s: rc %d (%s), want %d", model, rc, err->msg, expect_rc);
}

static int setup(void **state) {
  (void)state;
  memset(&g, 0, sizeof g);
  const char *bin = getenv("MBD_BIN_DIR");
  if (!bin) return -1;
  snprintf(g.bin, sizeof g.bin, "%s", bin);
  snprintf(g.dir, sizeof g.dir, "/tmp/mbd-rid-XXXXXX");
  if (!mkdtemp(g.dir)) return -1;
  snprintf(g.clients, sizeof g.clients, "ipc://%s/c.sock", g.dir);
  snprintf(g.workers, sizeof g.workers, "ipc://%s/w.sock", g.dir);
  for (int s = 1; s <= 2; s++)
    if (procs_sh("'%s/mambad-model' synth --shape custom --d-model 64 --layers 2 --vocab 256 "
                 "--seed %d --out '%s/m%d' >/dev/null",
                 g.bin, s, g.dir, s))
      return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  procs_stop(g.wa, SIGTERM, 5000, NULL);
  procs_stop(g.wb, SIGTERM, 5000, NULL);
  procs_stop(g.broker, SIGTERM, 5000, NULL);
  if (!getenv("MBD_KEEP_TMP")) procs_sh("rm -rf '%s'", g.dir);
  return 0;
}

static void test_one_name_two_digests(void **state) {
  (void)state;
  g.broker = start_broker(NULL);
  g.wa = start_worker("wa", "m1");
  g.wb = start_worker("wb", "m2");
  mbd_client *c = client();
  wait_workers(c);
  assert_string_not_equal(g.digest[0], g.digest[1]);

  /* STATUS: the name twice, once per digest */
  mbd_status_report *r = NULL;
  assert_int_equal(mbd_client_status(c, &r, NULL), 0);
  int seen = 0;
  for (size_t i = 0; i < r->n_models; i++) {
    assert_string_equal(r->models[i].name, "tiny");
    for (int k = 0; k < 2; k++)
      if (!strcmp(r->models[i].digest, g.digest[k])) seen |= 1 << k;
    assert_false(r->models[i].is_default);
  }
  assert_int_equal(r->n_models, 2);
  assert_int_equal(seen, 3);
  mbd_status_report_free(&r);

  int64_t ids[NTOK];
  for (int i = 0; i < NTOK; i++) ids[i] = (i * 37 + 5) % 256;
  mbd_error err = {0};
  mbd_tensor_out out;

  /* unpinned: refused, listing both digests */
  forward(c, "tiny", ids, &out, &err, MBD_E_INVALID);
  assert_non_null(strstr(err.msg, g.digest[0]));
  assert_non_null(strstr(err.msg, g.digest[1]));
  mbd_tensor_out_release(&out);

  /* a malformed pin is refused by the library; an unknown one is NO_ROUTE */
  forward(c, "tiny@xyz", ids, &out, &err, MBD_E_INVALID);
  forward(c, "tiny@0123456789abcdef0123", ids, &out, &err,
          strncmp(g.digest[0], "0123456789abcdef0123", 20) &&
                  strncmp(g.digest[1], "0123456789abcdef0123", 20)
              ? MBD_E_NO_ROUTE
              : 0);
  mbd_tensor_out_release(&out);

  /* reference logits of each digest */
  mbd_tensor_out ref[2];
  char pin[2][64];
  for (int k = 0; k < 2; k++) {
    snprintf(pin[k], sizeof pin[k], "tiny@%.12s", g.digest[k]);
    forward(c, pin[k], ids, &ref[k], &err, 0);
    assert_string_equal(mbd_client_last_reply(c)->model_digest, g.digest[k]);
    assert_string_equal(mbd_client_last_reply(c)->worker, k ? "wb" : "wa");
  }
  assert_int_equal(ref[0].nbytes, ref[1].nbytes);
  assert_memory_not_equal(ref[0].data, ref[1].data, ref[0].nbytes);

  /* 1000 pinned requests, alternating: 0 mismatches */
  int mismatches = 0;
  for (int i = 0; i < 1000; i++) {
    int k = (i * 7 + i / 3) & 1;
    forward(c, pin[k], ids, &out, &err, 0);
    const mbd_reply_meta *m = mbd_client_last_reply(c);
    if (strcmp(m->model_digest, g.digest[k]) || strcmp(m->worker, k ? "wb" : "wa") ||
        out.nbytes != ref[k].nbytes || memcmp(out.data, ref[k].data, out.nbytes))
      mismatches++;
    mbd_tensor_out_release(&out);
  }
  assert_int_equal(mismatches, 0);

  /* a session opened pinned runs those weights; its state re-imports pinned */
  mbd_session *s = NULL;
  assert_int_equal(mbd_session_open(c, NULL, pin[1], &s, &err), 0);
  assert_string_equal(mbd_session_model_digest(s), g.digest[1]);
  /* STATUS shows the open session on wb once a heartbeat has told the broker */
  int64_t sessions = -1;
  for (int k = 0; k < 100 && sessions != 1; k++) {
    nap_ms(50);
    assert_int_equal(mbd_client_status(c, &r, NULL), 0);
    for (size_t i = 0; i < r->n_workers; i++)
      if (!strcmp(r->workers[i].name, "wb")) sessions = r->workers[i].sessions;
    mbd_status_report_free(&r);
  }
  assert_int_equal(sessions, 1);
  mbd_session_state *st = NULL;
  assert_int_equal(mbd_session_export(s, NULL, &st, &err), 0);
  assert_string_equal(st->model_digest, g.digest[1]);
  mbd_session *s2 = NULL;
  if (mbd_session_import(c, NULL, st, &s2, &err)) fail_msg("import: %s", err.msg);
  assert_string_equal(mbd_client_last_reply(c)->worker, "wb");
  mbd_session_close(&s2, NULL);
  mbd_session_state_free(&st);
  mbd_session_close(&s, NULL);
  mbd_client_destroy(&c);

  /* a broker whose deployment marks seed 1's weights as the default */
  char dflt[16];
  snprintf(dflt, sizeof dflt, "%.10s", g.digest[0]);
  procs_stop(g.broker, SIGTERM, 5000, NULL);
  g.broker = start_broker(dflt);
  c = client();
  wait_workers(c);
  assert_int_equal(mbd_client_status(c, &r, NULL), 0);
  for (size_t i = 0; i < r->n_models; i++)
    assert_int_equal(r->models[i].is_default, !strcmp(r->models[i].digest, g.digest[0]));
  mbd_status_report_free(&r);
  for (int i = 0; i < 100; i++) {
    forward(c, "tiny", ids, &out, &err, 0);
    const mbd_reply_meta *m = mbd_client_last_reply(c);
    assert_string_equal(m->model_digest, g.digest[0]);
    assert_string_equal(m->worker, "wa");
    assert_memory_equal(out.data, ref[0].data, ref[0].nbytes);
    mbd_tensor_out_release(&out);
  }
  /* the pin still wins over the default */
  forward(c, pin[1], ids, &out, &err, 0);
  assert_string_equal(mbd_client_last_reply(c)->worker, "wb");
  assert_memory_equal(out.data, ref[1].data, ref[1].nbytes);
  mbd_tensor_out_release(&out);
  mbd_tensor_out_release(&ref[0]);
  mbd_tensor_out_release(&ref[1]);
  mbd_client_destroy(&c);
}

int main(void) {
  if (!getenv("MBD_BIN_DIR")) {
    fprintf(stderr, "MBD_BIN_DIR not set: skipping\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_name_two_digests, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
