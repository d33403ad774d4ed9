/* A worker that always answers the broker (real broker + CPU worker):
 *
 * - A FORWARD of [32, 2048] runs while two live sessions keep stepping. The
 *   worker must stay registered throughout (its I/O thread heartbeats while
 *   the compute thread works: no WORKER_LOST, no re-send, no second
 *   registration), the FORWARD's rows must equal the in-process reference bit
 *   for bit (slicing is scheduling only), and the sessions' STEP p99 must
 *   stay under a bound derived from the measured cost of one slice.
 * - PREFILL chunks and FORWARD row groups give the bits of one call.
 * - SIGTERM under 4 x [1, 1024] FORWARD load: the worker exits 0 within its
 *   drain period (plus process start-up slack), and every request gets
 *   exactly one final reply (FINAL, or an ERROR saying the worker shut down).
 *
 * The STEP bound is 4 x the slowest of five measured one-slice FORWARDs (a
 * FORWARD slice is whole rows of at most --slice-tokens tokens, at least one
 * row: here one row of 2048) plus 250 ms. A STEP waits for at most the slice
 * in progress plus one batched step, so the bound holds with a 4x margin over
 * the cost measured on this machine, under this load, a moment earlier: it
 * does not depend on how fast the machine is. An unsliced worker would hold
 * a STEP for the whole forward (32 slices), so the bound tells them apart. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <signal.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/procs.h"
#include "support/quantile.h"
#include "support/wh_fixture.h"
#include "support/wh_requests.h"
#include "support/wh_sessions.h"
#include "support/worker_harness.h"

#define FB 32
#define FT 2048
#define SLICE "512"

static void test_forward_while_stepping(void **state) {
  (void)state;
  wh h;
  wh_fixture f;
  wh_init_or_skip(&h);
  assert_int_equal(wh_fixture_load(&h, &f), 0);
  const int64_t V = f.V;
  wh_start_broker(&h);
  wh_start_worker(&h, "wA", "--slice-tokens", SLICE, NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  int64_t *ids = malloc((size_t)(FB * FT) * sizeof *ids);
  wh_fill_ids(ids, (size_t)(FB * FT), V);
  /* Two live sessions. */
  char sid[2][64];
  for (int i = 0; i < 2; i++) {
    mbd_msg *m = wh_open(&h, sid[i], sizeof sid[i]);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    m = wh_wait(&h, wh_send_prefill(&h, sid[i], ids, 3, true), 30000);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
  }
  /* The cost of one slice (one row of FT tokens), slowest of five. */
  double slice = 0;
  for (int i = 0; i < 5; i++) {
    double t0 = wh_now();
    mbd_msg *m = wh_wait(&h, wh_send_forward(&h, ids, 1, FT, true), 30000);
    double dt = wh_now() - t0;
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    if (dt > slice) slice = dt;
  }
  double bound = 4 * slice + 0.25;
  uint64_t joined0 = wh_counter(&h, "workers_joined");
  /* The big FORWARD (full logits of the last position of each row). */
  double t0 = wh_now();
  uint64_t ftag = wh_send_forward(&h, ids, FB, FT, true);
  mbd_msg *fin = NULL;
  double lat[4096];
  int nlat = 0;
  while (!fin && wh_now() - t0 < 240) {
    int i = nlat % 2;
    double s0 = wh_now();
    uint64_t st = wh_send_step(&h, sid[i], (int64_t)(nlat % V));
    mbd_msg *rep = NULL;
    while (!rep && wh_now() - s0 < 60) {
      mbd_msg *m = wh_recv(&h, 100);
      if (!m) continue;
      if (mbd_msg_tag(m) == ftag) fin = m;
      else if (mbd_msg_tag(m) == st) rep = m;
      else mbd_msg_destroy(&m);
    }
    assert_non_null(rep);
    assert_int_equal(wh_code(rep), 0);
    mbd_msg_destroy(&rep);
    if (nlat < 4096) lat[nlat++] = wh_now() - s0;
  }
  double ftime = wh_now() - t0;
  assert_non_null(fin);
  assert_int_equal(wh_code(fin), 0);
  /* Rows 0 and FB-1 against the in-process reference, bit for bit. */
  size_t len = 0;
  const float *got = wh_tensor(fin, &len);
  assert_int_equal(len, (size_t)(FB * V) * 4);
  float *ref = malloc((size_t)(FT * V) * 4);
  int rows[2] = {0, FB - 1};
  for (int k = 0; k < 2; k++) {
    mbd_mamba1_state *s = NULL;
    assert_int_equal(mbd_mamba1_state_new(f.model, &s, NULL), 0);
    wh_ref_prefill(&f, s, ids + (size_t)rows[k] * FT, FT, ref);
    mbd_mamba1_state_destroy(&s);
    assert_memory_equal(got + (size_t)rows[k] * V, ref + (size_t)(FT - 1) * V, (size_t)V * 4);
  }
  free(ref);
  mbd_msg_destroy(&fin);
  assert_true(nlat > 0);
  double p50 = quantile_of(lat, (size_t)nlat, 0.5), p99 = quantile_of(lat, (size_t)nlat, 0.99);
  fprintf(stderr,
          "forward [%d,%d] took %.2f s; slice %.1f ms; %d steps meanwhile, p50 %.2f ms p99 %.2f ms "
          "(bound %.0f ms)\n",
          FB, FT, ftime, slice * 1e3, nlat, p50 * 1e3, p99 * 1e3, bound * 1e3);
  assert_true(nlat >= 2);
  assert_true(p99 < bound);
  /* Registered all along: no loss, no re-send, no new registration. */
  assert_int_equal(wh_counter(&h, "worker_lost"), 0);
  assert_int_equal(wh_counter(&h, "workers_lost"), 0);
  assert_int_equal(wh_counter(&h, "failovers"), 0);
  assert_int_equal(wh_counter(&h, "workers_joined"), joined0);
  free(ids);
  wh_fini(&h);
  wh_fixture_free(&f);
}

/* Slicing is scheduling only: a PREFILL of 1000 tokens in chunks of 128
 * (full logits, then last_only, then a STEP after it) and a FORWARD [3, 200]
 * in row groups of 2 + 1 (full logits) equal the in-process reference bit
 * for bit. */
static void test_slices_bit_exact(void **state) {
  (void)state;
  wh h;
  wh_fixture f;
  wh_init_or_skip(&h);
  assert_int_equal(wh_fixture_load(&h, &f), 0);
  const int64_t V = f.V, T = 1000;
  wh_start_broker(&h);
  wh_start_worker(&h, "wA", "--slice-tokens", "128", NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  int64_t *ids = malloc((size_t)T * sizeof *ids);
  wh_fill_ids(ids, (size_t)T, V);
  float *ref = malloc((size_t)(T + 1) * (size_t)V * 4);
  mbd_mamba1_state *rs = NULL;
  assert_int_equal(mbd_mamba1_state_new(f.model, &rs, NULL), 0);
  wh_ref_prefill(&f, rs, ids, T, ref);
  int64_t next = 3;
  wh_ref_prefill(&f, rs, &next, 1, ref + (size_t)T * V); /* the STEP after it */
  mbd_mamba1_state_destroy(&rs);
  for (int last = 0; last < 2; last++) {
    char sid[64];
    mbd_msg *m = wh_open(&h, sid, sizeof sid);
    assert_int_equal(wh_code(m), 0);
    mbd_msg_destroy(&m);
    m = wh_wait(&h, wh_send_prefill(&h, sid, ids, T, last), 60000);
    assert_int_equal(wh_code(m), 0);
    size_t len = 0;
    const void *got = wh_tensor(m, &len);
    if (last) {
      assert_int_equal(len, (size_t)V * 4);
      assert_memory_equal(got, ref + (size_t)(T - 1) * V, (size_t)V * 4);
    } else {
      assert_int_equal(len, (size_t)(T * V) * 4);
      assert_memory_equal(got, ref, (size_t)(T * V) * 4);
    }
    mbd_msg_destroy(&m);
    m = wh_wait(&h, wh_send_step(&h, sid, next), 30000);
    assert_int_equal(wh_code(m), 0);
    got = wh_tensor(m, &len);
    assert_int_equal(len, (size_t)V * 4);
    assert_memory_equal(got, ref + (size_t)T * V, (size_t)V * 4);
    mbd_msg_destroy(&m);
  }
  /* FORWARD [3, 200], full logits: row groups of 2 then 1. */
  const int64_t B = 3, FT2 = 200;
  mbd_msg *m = wh_wait(&h, wh_send_forward(&h, ids, B, FT2, false), 60000);
  assert_int_equal(wh_code(m), 0);
  size_t len = 0;
  const float *got = wh_tensor(m, &len);
  assert_int_equal(len, (size_t)(B * FT2 * V) * 4);
  for (int64_t b = 0; b < B; b++) {
    assert_int_equal(mbd_mamba1_state_new(f.model, &rs, NULL), 0);
    wh_ref_prefill(&f, rs, ids + b * FT2, FT2, ref);
    mbd_mamba1_state_destroy(&rs);
    assert_memory_equal(got + (size_t)(b * FT2 * V), ref, (size_t)(FT2 * V) * 4);
  }
  mbd_msg_destroy(&m);
  free(ref);
  free(ids);
  wh_fini(&h);
  wh_fixture_free(&f);
}

/* Starts a worker with --drain-ms drain, sends 4 FORWARDs [B, T], SIGTERMs
 * it once they are on the worker; returns how many of the 4 ended in ERROR. */
static int sigterm_run(const char *drain, int64_t B, int64_t T) {
  wh h;
  wh_init_or_skip(&h);
  wh_start_broker(&h);
  pid_t w = wh_start_worker(&h, "wA", "--drain-ms", drain, NULL);
  assert_int_equal(wh_wait_workers(&h, 1, 30000), 0);
  int64_t *ids = malloc((size_t)(B * T) * sizeof *ids);
  wh_fill_ids(ids, (size_t)(B * T), 512);
  uint64_t tags[4];
  for (int i = 0; i < 4; i++) tags[i] = wh_send_forward(&h, ids, B, T, true);
  /* SIGTERM once the broker has sent all four to the worker. */
  for (int i = 0; i < 200 && wh_worker_inflight(&h, 0) < 4; i++) usleep(10000);
  /* Exit 0 within the drain period; 3 s of slack for the last slice and
   * process teardown on a loaded machine (procs_stop kills it after that). */
  double t0 = wh_now();
  int st = 0;
  assert_true(procs_stop(w, SIGTERM, atoi(drain) + 3000, &st) >= 0);
  h.procs[0] = 0;
  fprintf(stderr, "worker (--drain-ms %s) exited %.2f s after SIGTERM\n", drain, wh_now() - t0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  int finals[4] = {0}, errors = 0;
  double end = wh_now() + 5;
  while (wh_now() < end) {
    mbd_msg *m = wh_recv(&h, 200);
    if (!m) continue;
    for (int i = 0; i < 4; i++)
      if (mbd_msg_tag(m) == tags[i] && mbd_msg_cmd(m) != MBD_CMD_PARTIAL) {
        finals[i]++;
        int code = wh_code(m);
        /* Finished, or told clearly that the worker shut down: by the worker
         * (STATE: started, not finished; BUSY: arrived while stopping) or by
         * the broker (WORKER_LOST: still on its way when the worker left). */
        assert_true(code == 0 || code == MBD_E_STATE || code == MBD_E_BUSY ||
                    code == MBD_E_WORKER_LOST);
        errors += code != 0;
      }
    mbd_msg_destroy(&m);
  }
  for (int i = 0; i < 4; i++) assert_int_equal(finals[i], 1);
  free(ids);
  wh_fini(&h);
  return errors;
}

static void test_sigterm_under_load(void **state) {
  (void)state;
  /* 4 x [1, 1024] under a 1 s drain: those the compute thread had taken
   * finish (one that was still in the pipe when SIGTERM landed gets BUSY). */
  assert_true(sigterm_run("1000", 1, 1024) < 4);
  /* No drain time and 4 x [32, 2048] (about 1 s each): the unfinished ones
   * are answered with the shutdown error, and the worker still exits 0. */
  assert_true(sigterm_run("0", FB, FT) > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forward_while_stepping),
                                     cmocka_unit_test(test_slices_bit_exact),
                                     cmocka_unit_test(test_sigterm_under_load)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
