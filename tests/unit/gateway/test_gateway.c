/* The gateway's pure parts: stop strings across piece boundaries (never a
 * partial stop emitted), request parsing with OpenAI's defaults and a 400
 * naming the field for each bad input, route strings, and the metrics text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <unistd.h>

#include "client/gateway/gateway.h"
#include "client/gateway/metrics.h"
#include "client/gateway/request.h"
#include "client/gateway/stop.h"
#include "kernels/model/synth_tokenizer.h"

/* Feeds pieces; returns the released text and whether a stop hit. */
static char *feed(char *const *stops, size_t ns, const char *const *pieces, size_t np, int *hit) {
  gw_stop s;
  gw_stop_init(&s, stops, ns);
  char *out = NULL;
  size_t len = 0;
  *hit = 0;
  for (size_t i = 0; i < np && !*hit; i++) {
    int rc = gw_stop_push(&s, pieces[i], strlen(pieces[i]), &out, &len);
    assert_true(rc >= 0);
    *hit = rc;
  }
  if (!*hit) assert_int_equal(gw_stop_flush(&s, &out, &len), 0);
  gw_stop_free(&s);
  if (!out) out = calloc(1, 1);
  return out;
}

static void test_stop_across_pieces(void **state) {
  (void)state;
  char *stops[] = {"o w", "zzz"};
  const char *p[] = {"Hel", "lo", " wo", "rld"};
  int hit;
  char *t = feed(stops, 2, p, 4, &hit);
  assert_int_equal(hit, 1);
  assert_string_equal(t, "Hell");
  free(t);
  const char *p3[] = {"ab", "c<", "|e", "nd", "|>tail"};
  char *s2[] = {"<|end|>"};
  t = feed(s2, 1, p3, 5, &hit);
  assert_int_equal(hit, 1);
  assert_string_equal(t, "abc");
  free(t);
}

static void test_stop_held_then_released(void **state) {
  (void)state;
  char *stops[] = {"xyz"};
  gw_stop s;
  gw_stop_init(&s, stops, 1);
  char *out = NULL;
  size_t len = 0;
  assert_int_equal(gw_stop_push(&s, "abx", 3, &out, &len), 0);
  assert_string_equal(out, "ab"); /* "x" could start "xyz": held */
  assert_int_equal(gw_stop_push(&s, "y", 1, &out, &len), 0);
  assert_string_equal(out, "ab");
  assert_int_equal(gw_stop_push(&s, "q", 1, &out, &len), 0);
  assert_string_equal(out, "abxyq"); /* no longer a prefix: released */
  assert_int_equal(gw_stop_push(&s, "xy", 2, &out, &len), 0);
  assert_int_equal(gw_stop_flush(&s, &out, &len), 0);
  assert_string_equal(out, "abxyqxy"); /* a partial stop at the end is text */
  gw_stop_free(&s);
  free(out);
}

static void test_stop_earliest_and_none(void **state) {
  (void)state;
  char *stops[] = {"cd", "b"};
  const char *p[] = {"abcd"};
  int hit;
  char *t = feed(stops, 2, p, 1, &hit);
  assert_int_equal(hit, 1);
  assert_string_equal(t, "a");
  free(t);
  const char *q[] = {"plain ", "text"};
  t = feed(NULL, 0, q, 2, &hit);
  assert_int_equal(hit, 0);
  assert_string_equal(t, "plain text");
  free(t);
}

static int parse(const char *body, bool chat, gw_request *r, gw_err *e) {
  memset(e, 0, sizeof *e);
  return gw_request_parse(body, strlen(body), chat, r, e);
}

static void test_request_defaults_and_fields(void **state) {
  (void)state;
  gw_request r;
  gw_err e;
  assert_int_equal(parse("{\"model\":\"m\",\"prompt\":\"hi\"}", false, &r, &e), 0);
  assert_string_equal(r.model, "m");
  assert_int_equal(r.n_prompts, 1);
  assert_string_equal(r.prompts[0].text, "hi");
  assert_int_equal(r.max_tokens, 16);
  assert_true(r.temperature == 1.0 && r.top_p == 1.0 && r.n == 1 && r.logprobs == -1);
  gw_request_free(&r);
  assert_int_equal(
      parse("{\"model\":\"m\",\"prompt\":[[1,2],[3]],\"stop\":[\"a\",7],\"n\":2,"
            "\"stream\":false,\"stream_options\":{\"include_usage\":true},"
            "\"logprobs\":2,\"echo\":true,\"seed\":-1,\"route\":\"backend=cpu,dtype=f32,state=bf16\"}",
            false, &r, &e),
      0);
  assert_int_equal(r.n_prompts, 2);
  assert_int_equal(r.prompts[0].n_ids, 2);
  assert_int_equal(r.prompts[1].ids[0], 3);
  assert_int_equal(r.n_stop, 1);
  assert_string_equal(r.stop[0], "a");
  assert_int_equal(r.n_stop_ids, 1);
  assert_int_equal(r.stop_ids[0], 7);
  assert_true(!r.stream && r.include_usage && r.echo && r.has_route);
  assert_int_equal(r.logprobs, 2);
  assert_true(r.seed == UINT64_MAX);
  assert_string_equal(r.route.backend, "cpu");
  assert_string_equal(r.route.dtype, "f32");
  assert_string_equal(r.route.state, "bf16");
  gw_request_free(&r);
  assert_int_equal(
      parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
            "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
            true, &r, &e),
      0);
  assert_int_equal(r.n_msgs, 1);
  assert_string_equal(r.msgs[0].role, "user");
  assert_string_equal(r.msgs[0].content, "ab");
  assert_int_equal(r.max_tokens, 256);
  gw_request_free(&r);
}

static void test_request_rejections(void **state) {
  (void)state;
  static const struct {
    const char *body, *param;
    int http;
  } k[] = {
      {"{\"model\":\"m\",\"prompt\":\"x\"", "", 400},
      {"[]", "", 400},
      {"{\"prompt\":\"x\"}", "model", 400},
      {"{\"model\":\"m\"}", "prompt", 400},
      {"{\"model\":\"m\",\"prompt\":[]}", "prompt", 400},
      {"{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1e3}", "max_tokens", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":99999999999}", "max_tokens", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}", "top_p", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"n\":17}", "n", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"stream\":1}", "stream", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"presence_penalty\":0.5}", "presence_penalty", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"route\":\"abc\"}", "route", 400},
      {"{\"model\":\"m\",\"prompt\":\"x\",\"model\":\"n\"}", "", 400},
      {"{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages", 400},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    gw_request r;
    gw_err e;
    bool chat = strstr(k[i].body, "messages") != NULL;
    assert_int_equal(parse(k[i].body, chat, &r, &e), -1);
    assert_int_equal(e.http, k[i].http);
    assert_string_equal(e.param, k[i].param);
    assert_true(e.msg[0] != '\0');
    gw_request_free(&r);
  }
}

static void test_metrics_text(void **state) {
  (void)state;
  const char *names[] = {"tiny"};
  gw_metrics *m = gw_metrics_new(1, names);
  assert_non_null(m);
  gw_metrics_request(m, 0, "/v1/completions", 200);
  gw_metrics_request(m, -1, "/v1/completions", 400);
  gw_metrics_tokens(m, 0, 5, 7);
  gw_metrics_observe(m, 0, GW_H_TTFT, 0.003);
  gw_metrics_observe(m, 0, GW_H_TTFT, 100.0);
  char *t = gw_metrics_render(m, NULL);
  assert_non_null(t);
  assert_non_null(strstr(
      t,
      "mambad_http_requests_total{endpoint=\"/v1/completions\",model=\"tiny\",code=\"200\"} 1\n"));
  assert_non_null(strstr(t, "model=\"\",code=\"400\"} 1\n"));
  assert_non_null(strstr(t, "mambad_prompt_tokens_total{model=\"tiny\"} 5\n"));
  assert_non_null(strstr(t, "mambad_generation_tokens_total{model=\"tiny\"} 7\n"));
  assert_non_null(
      strstr(t, "mambad_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.0025\"} 0\n"));
  assert_non_null(
      strstr(t, "mambad_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.005\"} 1\n"));
  assert_non_null(
      strstr(t, "mambad_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"80\"} 1\n"));
  assert_non_null(
      strstr(t, "mambad_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 2\n"));
  assert_non_null(strstr(t, "mambad_time_to_first_token_seconds_count{model=\"tiny\"} 2\n"));
  assert_non_null(strstr(t, "mambad_gateway_broker_up 0\n"));
  free(t);
  gw_metrics_destroy(&m);
  assert_null(m);
}

/* The serving check against a STATUS the cache already holds: a worker with
 * another tokenizer digest makes the model unservable; one with the same, or
 * with none reported, is fine; no live worker is a 503 too. */
static void test_model_check_tokenizer_digest(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd-gwtok-XXXXXX";
  assert_non_null(mkdtemp(dir));
  mbd_error err = {0};
  assert_int_equal(mbd_synth_tokenizer_write(300, dir, &err), 0);
  static gw_ctx g;
  memset(&g, 0, sizeof g);
  pthread_mutex_init(&g.mu, NULL);
  pthread_mutex_init(&g.status_mu, NULL);
  g.n_models = 1;
  gw_model *m = &g.models[0];
  snprintf(m->name, sizeof m->name, "tiny");
  snprintf(m->dir, sizeof m->dir, "%s", dir);
  assert_int_equal(mbd_tokenizer_load(dir, &m->tok, &err), 0);
  mbd_status_report *r = calloc(1, sizeof *r);
  r->n_workers = 1;
  r->workers = calloc(1, sizeof *r->workers);
  mbd_worker_info *w = &r->workers[0];
  snprintf(w->name, sizeof w->name, "w0");
  w->alive = true;
  w->n_models = 1;
  w->models = calloc(1, sizeof *w->models);
  snprintf(w->models[0].name, sizeof w->models[0].name, "tiny");
  g.status = r;
  static const struct {
    const char *digest;
    bool alive;
    int rc;
    const char *code;
  } k[] = {{"", true, 0, ""},
           {NULL, true, 0, ""}, /* the loaded tokenizer's own digest */
           {"0000000000000000000000000000000000000000000000000000000000000000", true, -1,
            "tokenizer_mismatch"},
           {"", false, -1, "no_worker"}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    snprintf(w->models[0].tokenizer_digest, sizeof w->models[0].tokenizer_digest, "%s",
             k[i].digest ? k[i].digest : mbd_tokenizer_digest(m->tok));
    w->alive = k[i].alive;
    g.status_ms = gw_now_ms(); /* fresh: no broker is asked */
    gw_err e;
    memset(&e, 0, sizeof e);
    assert_int_equal(gw_model_check(&g, m, &e), k[i].rc);
    assert_string_equal(e.code, k[i].code);
    if (k[i].rc) assert_int_equal(e.http, 503);
  }
  mbd_status_report_free(&g.status);
  mbd_tokenizer_destroy(&m->tok);
  char path[600];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stop_across_pieces),
      cmocka_unit_test(test_stop_held_then_released),
      cmocka_unit_test(test_stop_earliest_and_none),
      cmocka_unit_test(test_request_defaults_and_fields),
      cmocka_unit_test(test_request_rejections),
      cmocka_unit_test(test_metrics_text),
      cmocka_unit_test(test_model_check_tokenizer_digest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
