/* Numbers through the service: on the f32 CPU route the logits the service
 * returns equal `mambad-run`'s (in-process, same route) bit for bit, and the
 * CLI's `mambad forward` equals the library's; `mambad generate` reproduces
 * the Hugging Face fixture's greedy tokens exactly; a session exported and
 * imported (same route) continues bit-exactly like the original. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "support/svc.h"

static svc s;
static mbd_client *c;
static mbd_safetensors *expected;
static char route32[65];

static int setup(void **state) {
  (void)state;
  if (!svc_init(&s)) exit(77); /* no binaries or fixtures: ctest reports skipped */
  char yaml[700], path[700];
  svc_yaml(&s, "  - {name: w32, device: cpu, dtype: f32, threads: 1}\n", yaml);
  svc_up(&s, yaml);
  c = svc_client(&s);
  const char *names[] = {"w32"};
  mbd_worker_info w;
  if (!c || svc_wait_workers(c, names, 1, NULL, &w, EV_HANG_MS) < 0) return -1;
  snprintf(route32, sizeof route32, "%s", w.route_id);
  snprintf(path, sizeof path, "%s/expected.safetensors", s.fixture);
  return mbd_safetensors_open(path, &expected, NULL) ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  mbd_safetensors_destroy(&expected);
  mbd_client_destroy(&c);
  svc_cleanup(&s);
  return 0;
}

/* Service forward of the fixture's input_ids [3,20] on the f32 route. */
static void service_logits(mbd_tensor_out *out) {
  const mbd_st_entry *ids = mbd_safetensors_find(expected, "input_ids");
  assert_non_null(ids);
  mbd_tensor_in in = {.desc = ids->desc, .data = ids->data};
  mbd_route_want want;
  memset(&want, 0, sizeof want);
  snprintf(want.route_id, sizeof want.route_id, "%s", route32);
  mbd_call_opts o = {.route = &want};
  mbd_error err = {0};
  int rc = mbd_client_forward(c, &o, "tiny", &in, false, NULL, out, &err);
  if (rc) fprintf(stderr, "forward: %s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_string_equal(mbd_client_last_reply(c)->route_id, route32);
}

static void test_service_equals_mambad_run(void **state) {
  (void)state;
  if (!c) skip();
  mbd_tensor_out svc_out = {0};
  service_logits(&svc_out);
  char out[8192], run_path[700];
  snprintf(run_path, sizeof run_path, "%s/run.safetensors", s.dir);
  int rc = svc_sh(&s, out, sizeof out,
                  "'%s/mambad' run --model '%s' --input '%s/expected.safetensors' --output '%s' "
                  "--backend cpu --dtype f32",
                  s.bin, s.fixture, s.fixture, run_path);
  if (rc) fprintf(stderr, "mambad run failed (%d):\n%s\n", rc, out);
  assert_int_equal(rc, 0);
  mbd_safetensors *run = NULL;
  assert_int_equal(mbd_safetensors_open(run_path, &run, NULL), 0);
  const mbd_st_entry *l = mbd_safetensors_find(run, "logits");
  assert_non_null(l);
  assert_int_equal(l->nbytes, svc_out.nbytes);
  assert_int_equal(l->desc.ndim, svc_out.desc.ndim);
  assert_memory_equal(l->data, svc_out.data, svc_out.nbytes);
  mbd_safetensors_destroy(&run);
  mbd_tensor_out_release(&svc_out);
}

static void test_cli_forward_and_generate(void **state) {
  (void)state;
  if (!c) skip();
  mbd_tensor_out lib = {0};
  service_logits(&lib);
  char out[8192], path[700];
  snprintf(path, sizeof path, "%s/fwd.safetensors", s.dir);
  int rc = svc_sh(&s, out, sizeof out,
                  "'%s/mambad' forward --connect '%s' --model tiny --route-id %s "
                  "--input '%s/expected.safetensors' --output '%s' --shm",
                  s.bin, s.clients, route32, s.fixture, path);
  if (rc) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  mbd_safetensors *f = NULL;
  assert_int_equal(mbd_safetensors_open(path, &f, NULL), 0);
  const mbd_st_entry *l = mbd_safetensors_find(f, "logits");
  assert_non_null(l);
  assert_int_equal(l->nbytes, lib.nbytes);
  assert_memory_equal(l->data, lib.data, lib.nbytes);
  assert_string_equal(mbd_safetensors_metadata(f, "route_id"), route32);
  assert_string_equal(mbd_safetensors_metadata(f, "worker"), "w32");
  mbd_safetensors_destroy(&f);
  mbd_tensor_out_release(&lib);

  /* greedy generation reproduces the reference tokens exactly */
  const mbd_st_entry *g = mbd_safetensors_find(expected, "greedy");
  assert_non_null(g);
  int64_t G = g->desc.shape[1] - 20;
  snprintf(path, sizeof path, "%s/gen.safetensors", s.dir);
  rc = svc_sh(&s, out, sizeof out,
              "'%s/mambad' generate --connect '%s' --model tiny --dtype f32 --generate %lld "
              "--input '%s/expected.safetensors' --output '%s'",
              s.bin, s.clients, (long long)G, s.fixture, path);
  if (rc) fprintf(stderr, "%s\n", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "row 2:"));
  assert_int_equal(mbd_safetensors_open(path, &f, NULL), 0);
  const mbd_st_entry *t = mbd_safetensors_find(f, "tokens");
  assert_non_null(t);
  assert_int_equal(t->nbytes, g->nbytes);
  assert_memory_equal(t->data, g->data, g->nbytes);
  mbd_safetensors_destroy(&f);
}

/* step + greedy generate on a session; returns logits and tokens */
static void step_and_generate(mbd_session *ss, int64_t token, mbd_tensor_out *logits,
                              int64_t **toks, size_t *n) {
  mbd_error err = {0};
  assert_int_equal(mbd_session_step(ss, NULL, token, logits, &err), 0);
  assert_int_equal(logits->desc.ndim, 1);
  assert_int_equal(logits->desc.shape[0], 512);
  mbd_generate_params p;
  mbd_generate_params_init(&p);
  p.max_tokens = 8;
  char reason[16];
  int rc = mbd_session_generate(ss, NULL, &p, NULL, NULL, toks, n, reason, &err);
  if (rc) fprintf(stderr, "generate: %s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_int_equal(*n, 8);
  assert_string_equal(reason, "length");
}

static void test_session_export_import(void **state) {
  (void)state;
  if (!c) skip();
  const mbd_st_entry *ids = mbd_safetensors_find(expected, "input_ids");
  int64_t prompt[10];
  memcpy(prompt, ids->data, sizeof prompt);
  mbd_tensor_in in = {.data = prompt};
  int64_t shape[2] = {1, 10};
  mbd_tensor_desc_make(&in.desc, MBD_DTYPE_I64, 2, shape, NULL);
  mbd_error err = {0};
  mbd_session *s1 = NULL, *s2 = NULL;
  mbd_tensor_out pre = {0}, l1 = {0}, l2 = {0};
  assert_int_equal(mbd_session_open(c, NULL, "tiny", &s1, &err), 0);
  assert_non_null(strchr(mbd_session_id(s1), '/'));
  assert_int_equal(mbd_session_prefill(s1, NULL, &in, true, &pre, &err), 0);
  assert_int_equal(pre.desc.shape[pre.desc.ndim - 1], 512);
  mbd_session_state *st = NULL;
  assert_int_equal(mbd_session_export(s1, NULL, &st, &err), 0);
  assert_string_equal(st->route_id, route32);
  assert_string_equal(st->model, "tiny");
  assert_true(st->n_tensors >= 1);
  assert_int_equal(mbd_session_import(c, NULL, st, &s2, &err), 0);
  assert_string_not_equal(mbd_session_id(s1), mbd_session_id(s2));
  mbd_session_state_free(&st);
  assert_null(st);

  int64_t *t1 = NULL, *t2 = NULL;
  size_t n1 = 0, n2 = 0;
  step_and_generate(s1, 42, &l1, &t1, &n1);
  step_and_generate(s2, 42, &l2, &t2, &n2);
  assert_memory_equal(l1.data, l2.data, l1.nbytes);
  assert_int_equal(n1, n2);
  assert_memory_equal(t1, t2, n1 * sizeof *t1);
  free(t1);
  free(t2);
  mbd_tensor_out_release(&pre);
  mbd_tensor_out_release(&l1);
  mbd_tensor_out_release(&l2);
  char id[128];
  snprintf(id, sizeof id, "%s", mbd_session_id(s1));
  assert_int_equal(mbd_session_close(&s1, &err), 0);
  assert_null(s1);
  assert_int_equal(mbd_session_close(&s2, &err), 0);
  assert_int_equal(mbd_session_close(&s2, &err), 0); /* NULL-safe */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_service_equals_mambad_run),
      cmocka_unit_test(test_cli_forward_and_generate),
      cmocka_unit_test(test_session_export_import),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
