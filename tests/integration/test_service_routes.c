/* Route matching through real processes: two CPU workers with different
 * routes (f32 and bf16 storage). Requests pinned to a route id (full or an
 * 8+ hex prefix) or constrained by dtype reach only the matching worker, and
 * the reply names the serving route id and worker; an unknown route is
 * NO_ROUTE (with the code and message through the library); a route that
 * appears later (a worker started after the first requests) is then served.
 * The same request on the same route gives the same bits every time. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>

#include <cmocka.h>

#include "support/svc.h"

static svc s;
static pid_t extra_worker;

static int teardown(void **state) {
  (void)state;
  if (extra_worker > 0) {
    procs_stop(extra_worker, SIGTERM, 10000, NULL);
    extra_worker = 0;
  }
  svc_cleanup(&s);
  return 0;
}

static const int64_t k_ids[2][6] = {{5, 17, 99, 3, 250, 7}, {1, 2, 3, 4, 5, 6}};

/* forward of k_ids under want; returns the rc and keeps the logits in out. */
static int forward(mbd_client *c, const mbd_route_want *want, mbd_tensor_out *out, mbd_error *err) {
  mbd_tensor_in in = {.data = k_ids};
  int64_t shape[2] = {2, 6};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  mbd_call_opts o = {.route = want};
  return mbd_client_forward(c, &o, "tiny", &in, false, NULL, out, err);
}

static void test_routes(void **state) {
  (void)state;
  if (!svc_init(&s)) exit(77); /* ctest: skipped */
  char yaml[700];
  svc_yaml(&s,
           "  - {name: w32, device: cpu, dtype: f32, threads: 1}\n"
           "  - {name: w16, device: cpu, dtype: bf16, threads: 1}\n",
           yaml);
  svc_up(&s, yaml);
  mbd_client *c = svc_client(&s);
  assert_non_null(c);
  const char *names[] = {"w32", "w16"}, *n16[] = {"w16"};
  mbd_worker_info i32, i16;
  assert_true(svc_wait_workers(c, names, 2, NULL, &i32, EV_HANG_MS) >= 0);
  assert_true(svc_wait_workers(c, n16, 1, NULL, &i16, 1000) >= 0);
  assert_string_not_equal(i32.route_id, i16.route_id);

  mbd_error err = {0};
  mbd_tensor_out first = {0}, again = {0}, other = {0};
  mbd_route_want want;

  /* pinned by the full id: only w32, every time, same bits */
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", i32.route_id);
  assert_int_equal(forward(c, &want, &first, &err), 0);
  assert_string_equal(mbd_client_last_reply(c)->route_id, i32.route_id);
  assert_string_equal(mbd_client_last_reply(c)->worker, "w32");
  assert_int_equal(first.desc.dtype, MBD_DTYPE_F32);
  assert_int_equal(first.desc.ndim, 3);
  assert_int_equal(first.desc.shape[2], 512);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(forward(c, &want, &again, &err), 0);
    assert_string_equal(mbd_client_last_reply(c)->worker, "w32");
    assert_int_equal(again.nbytes, first.nbytes);
    assert_memory_equal(again.data, first.data, first.nbytes);
    mbd_tensor_out_release(&again);
  }

  /* pinned by a 12-hex prefix: only w16 */
  memset(&want, 0, sizeof want);
  memcpy(want.route_id, i16.route_id, 12); /* 12-hex prefix; rest stays NUL */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(forward(c, &want, &other, &err), 0);
    assert_string_equal(mbd_client_last_reply(c)->route_id, i16.route_id);
    assert_string_equal(mbd_client_last_reply(c)->worker, "w16");
    if (i < 3) mbd_tensor_out_release(&other);
  }
  /* bf16 storage is a different route: close to f32, not the same bits */
  assert_int_equal(other.nbytes, first.nbytes);
  assert_memory_not_equal(other.data, first.data, first.nbytes);
  const float *a = first.data, *b = other.data;
  float maxd = 0, maxa = 0;
  for (size_t i = 0; i < first.nbytes / 4; i++) {
    float d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    if (d > maxd) maxd = d;
    if ((a[i] > 0 ? a[i] : -a[i]) > maxa) maxa = a[i] > 0 ? a[i] : -a[i];
  }
  fprintf(stderr, "f32 vs bf16 route: max |diff| %.4g (max |logit| %.4g)\n", maxd, maxa);
  assert_true(maxd < 0.05f * maxa + 0.05f);
  mbd_tensor_out_release(&other);

  /* a constraint instead of an id */
  memset(&want, 0, sizeof want);
  snprintf(want.dtype, sizeof want.dtype, "bf16");
  assert_int_equal(forward(c, &want, &other, &err), 0);
  assert_string_equal(mbd_client_last_reply(c)->worker, "w16");
  mbd_tensor_out_release(&other);

  /* unknown route id and an unserved dtype: NO_ROUTE with a message */
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "0123456789abcdef");
  assert_int_equal(forward(c, &want, &other, &err), MBD_E_NO_ROUTE);
  assert_int_equal(err.code, MBD_E_NO_ROUTE);
  assert_string_equal(mbd_client_last_reply(c)->error, "NO_ROUTE");
  assert_true(strlen(err.msg) > 10);
  assert_null(other.data);
  memset(&want, 0, sizeof want);
  snprintf(want.dtype, sizeof want.dtype, "f16");
  assert_int_equal(forward(c, &want, &other, &err), MBD_E_NO_ROUTE);

  /* the f16 route appears later: a worker started by hand */
  char prog[600];
  snprintf(prog, sizeof prog, "%s/mambad-worker", s.bin);
  char model[700];
  snprintf(model, sizeof model, "tiny=%s", s.fixture);
  char *argv[] = {prog, "--connect", s.workers, "--name", "late16", "--device", "cpu", "--dtype",
                  "f16", "--model", model, "--threads", "1", "--heartbeat-ms", "200",
                  "--liveness", "3", NULL};
  extra_worker = svc_spawn(&s, "late16.log", argv);
  const char *nl[] = {"late16"};
  mbd_worker_info il;
  assert_true(svc_wait_workers(c, nl, 1, NULL, &il, EV_HANG_MS) >= 0);
  assert_int_equal(forward(c, &want, &other, &err), 0);
  assert_string_equal(mbd_client_last_reply(c)->worker, "late16");
  assert_string_equal(mbd_client_last_reply(c)->route_id, il.route_id);
  mbd_tensor_out_release(&other);
  /* the old routes still go where they went */
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", i32.route_id);
  assert_int_equal(forward(c, &want, &again, &err), 0);
  assert_string_equal(mbd_client_last_reply(c)->worker, "w32");
  assert_memory_equal(again.data, first.data, first.nbytes);
  mbd_tensor_out_release(&again);
  mbd_tensor_out_release(&first);
  mbd_client_destroy(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_routes, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
