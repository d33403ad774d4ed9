/* Deployment YAML: a full file parses into the expected values; every kind of
 * mistake is an error that names the file, the line and the field; the shipped
 * deploy/ example files load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/defaults.h"
#include "common/deploy_config.h"

static const char *k_full =
    "# a comment\n"
    "broker:\n"
    "  clients: ipc:///tmp/mbd-test/clients.sock\n"
    "  workers: tcp://*:5556\n"
    "  heartbeat_ms: 250\n"
    "  liveness: 4\n"
    "  queue_limit: 77\n"
    "  max_message_mb: 64\n"
    "  default_deadline_ms: 9000\n"
    "models:\n"
    "  - name: tiny\n"
    "    path: models/tiny\n"
    "  - {name: abs, path: /srv/models/abs}\n"
    "workers:\n"
    "  - name: cpu-a\n"
    "    device: cpu\n"
    "    dtype: bf16\n"
    "    gemm_mode: deterministic\n"
    "    threads: 2\n"
    "    capacity: 8\n"
    "    max_batch: 16\n"
    "    session_idle_s: 600\n"
    "    models: [abs]\n"
    "    count: 3\n"
    "  - name: gpu1\n"
    "    device: cuda:1\n"
    "  - name: gpus\n"
    "    device: all\n"
    "security:\n"
    "  curve: false\n"
    "  insecure: {workers: true}\n"
    "  server_public_key: \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"\n"
    "  client_public_keys: [\"Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID\"]\n";

static mbd_deploy_config *parse_ok(const char *text) {
  mbd_deploy_config *c = NULL;
  mbd_error err = {0};
  int rc = mbd_deploy_config_parse(text, strlen(text), "t.yaml", "/base", &c, &err);
  if (rc) fprintf(stderr, "unexpected error: %s\n", err.msg);
  assert_int_equal(rc, 0);
  assert_non_null(c);
  return c;
}

/* Parses text expecting failure with `code`; checks the message holds `line`
 * ("t.yaml:N:") and `needle`. */
static void parse_bad(const char *text, int code, int line, const char *needle) {
  mbd_deploy_config *c = NULL;
  mbd_error err = {0};
  int rc = mbd_deploy_config_parse(text, strlen(text), "t.yaml", "/base", &c, &err);
  char where[32];
  snprintf(where, sizeof where, "t.yaml:%d:", line);
  if (rc != code || !strstr(err.msg, where) || !strstr(err.msg, needle))
    fprintf(stderr, "rc=%d msg='%s' (wanted %d, '%s', '%s')\n", rc, err.msg, code, where, needle);
  assert_int_equal(rc, code);
  assert_int_equal(err.code, code);
  assert_null(c);
  assert_non_null(strstr(err.msg, where));
  assert_non_null(strstr(err.msg, needle));
}

static void test_full_file(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok(k_full);
  assert_string_equal(c->clients_ep, "ipc:///tmp/mbd-test/clients.sock");
  assert_string_equal(c->workers_ep, "tcp://*:5556");
  assert_int_equal(c->heartbeat_ms, 250);
  assert_int_equal(c->liveness, 4);
  assert_int_equal(c->queue_limit, 77);
  assert_int_equal(c->max_message_mb, 64);
  assert_int_equal(c->default_deadline_ms, 9000);
  assert_int_equal(c->n_models, 2);
  assert_string_equal(c->models[0].name, "tiny");
  assert_string_equal(c->models[0].path, "/base/models/tiny");
  assert_int_equal(c->models[0].line, 11);
  assert_string_equal(c->models[1].path, "/srv/models/abs");
  assert_int_equal(c->n_workers, 3);
  const mbd_deploy_worker *w = &c->workers[0];
  assert_string_equal(w->name, "cpu-a");
  assert_int_equal(w->device, MBD_DEPLOY_DEVICE_CPU);
  assert_string_equal(w->dtype, "bf16");
  assert_string_equal(w->gemm_mode, "deterministic");
  assert_int_equal(w->threads, 2);
  assert_int_equal(w->capacity, 8);
  assert_int_equal(w->max_batch, 16);
  assert_int_equal(w->session_idle_s, 600);
  assert_int_equal(w->count, 3);
  assert_int_equal(w->n_models, 1);
  assert_int_equal(w->models[0], 1);
  w = &c->workers[1];
  assert_int_equal(w->device, MBD_DEPLOY_DEVICE_CUDA);
  assert_int_equal(w->cuda_index, 1);
  assert_int_equal(w->count, 1);
  assert_int_equal(w->n_models, 2); /* no list: whole catalogue */
  assert_string_equal(w->dtype, "");
  assert_int_equal(c->workers[2].device, MBD_DEPLOY_DEVICE_ALL);
  assert_false(c->security.curve);
  assert_string_equal(c->security.server_public_key, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
  assert_int_equal(c->security.n_client_keys, 1);
  mbd_deploy_config_free(&c);
  assert_null(c);
  mbd_deploy_config_free(&c); /* NULL-safe */
}

static void test_defaults(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok("broker: {clients: 'ipc:///tmp/a', workers: 'ipc:///tmp/b'}\n");
  /* the one table every process uses (common/defaults.h) */
  assert_int_equal(c->heartbeat_ms, MBD_DEFAULT_HEARTBEAT_MS);
  assert_int_equal(c->liveness, MBD_DEFAULT_LIVENESS);
  assert_int_equal(c->queue_limit, MBD_DEFAULT_QUEUE_LIMIT);
  assert_int_equal(c->queue_mb, MBD_DEFAULT_QUEUE_MB);
  assert_int_equal(c->max_message_mb, MBD_DEFAULT_MAX_MESSAGE_MB);
  assert_int_equal(c->default_deadline_ms, MBD_DEFAULT_DEADLINE_MS);
  assert_int_equal(c->durable_mb, MBD_DEFAULT_DURABLE_MB);
  assert_int_equal(c->checkpoint_tokens, MBD_DEFAULT_CHECKPOINT_TOKENS);
  assert_int_equal(c->checkpoint_ms, MBD_DEFAULT_CHECKPOINT_MS);
  assert_int_equal(c->prefix_cache.mb, MBD_DEFAULT_PREFIX_CACHE_MB);
  assert_int_equal(c->prefix_cache.block, MBD_DEFAULT_PREFIX_BLOCK);
  assert_int_equal(c->n_models, 0);
  assert_int_equal(c->n_workers, 0);
  mbd_deploy_config_free(&c);
}

#define BROKER "broker:\n  clients: ipc:///tmp/a\n  workers: ipc:///tmp/b\n"

static void test_errors_name_line_and_field(void **state) {
  (void)state;
  parse_bad("", MBD_E_FORMAT, 1, "empty");
  parse_bad("broker: [\n", MBD_E_FORMAT, 2, "not valid YAML");
  parse_bad("- a\n- b\n", MBD_E_INVALID, 1, "top level: must be a mapping");
  parse_bad("models: []\n", MBD_E_INVALID, 1, "broker: missing");
  parse_bad(BROKER "bogus: 1\n", MBD_E_INVALID, 4, "unknown key 'bogus'");
  parse_bad("broker:\n  clients: ipc:///tmp/a\n", MBD_E_INVALID, 2, "broker.workers: missing");
  parse_bad("broker:\n  clients: http://x\n  workers: ipc:///b\n", MBD_E_INVALID, 2,
            "broker.clients: 'http://x' must start with ipc:// or tcp://");
  parse_bad("broker:\n  clients: ipc:///a\n  workers: tcp://host:99999\n", MBD_E_INVALID, 3,
            "broker.workers");
  parse_bad("broker:\n  clients: ipc:///a\n  workers: ipc:///a\n", MBD_E_INVALID, 3, "must differ");
  parse_bad(BROKER "  heartbeat_ms: fast\n", MBD_E_INVALID, 4, "broker.heartbeat_ms: 'fast' is not an integer");
  parse_bad(BROKER "  liveness: 0\n", MBD_E_INVALID, 4, "broker.liveness: 0 is out of range");
  parse_bad(BROKER "  liveness: 3\n  liveness: 4\n", MBD_E_INVALID, 5, "appears twice");
  parse_bad(BROKER "models:\n  - name: m\n", MBD_E_INVALID, 5, "models[0].path: missing");
  parse_bad(BROKER "models:\n  - {name: 'a b', path: x}\n", MBD_E_INVALID, 5, "models[0].name");
  parse_bad(BROKER "models:\n  - {name: m, path: x}\n  - {name: m, path: y}\n", MBD_E_INVALID, 6,
            "listed twice");
  parse_bad(BROKER "workers:\n  - name: w\n", MBD_E_INVALID, 5, "workers[0].device: missing");
  parse_bad(BROKER "workers:\n  - name: w\n    device: gpu\n", MBD_E_INVALID, 6,
            "workers[0].device: 'gpu' is not cpu, cuda:N or all");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cuda:x\n", MBD_E_INVALID, 6, "GPU index");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    dtype: f64\n", MBD_E_INVALID, 7,
            "workers[0].dtype");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    gemm_mode: fast\n", MBD_E_INVALID, 7,
            "deterministic");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    models: [nope]\n", MBD_E_NOT_FOUND,
            7, "workers[0].models[0]: model 'nope' is not in the models: catalogue");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cuda:0\n    count: 2\n", MBD_E_INVALID, 7,
            "workers[0].count");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    capacity: -1\n", MBD_E_INVALID, 7,
            "workers[0].capacity");
  parse_bad(BROKER "workers:\n  - {name: w, device: cpu}\n  - {name: w, device: cpu}\n", MBD_E_INVALID,
            6, "listed twice");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    threads: [1]\n", MBD_E_INVALID, 7,
            "must be a single value");
  parse_bad(BROKER "security:\n  server_public_key: short\n", MBD_E_INVALID, 5, "Z85");
  parse_bad(BROKER "security:\n  curve: maybe\n", MBD_E_INVALID, 5, "security.curve");
  parse_bad(BROKER "security:\n  curve: true\n", MBD_E_INVALID, 5, "needs broker_key");
  parse_bad(BROKER "security:\n  insecure: {clients: yes, other: true}\n", MBD_E_INVALID, 5,
            "security.insecure");
}

/* tcp endpoints need CURVE (with its keys) or an explicit insecure mark. */
static void test_tcp_needs_curve_or_insecure(void **state) {
  (void)state;
#define TCP "broker:\n  clients: tcp://*:5555\n  workers: tcp://*:5556\n"
  parse_bad(TCP, MBD_E_INVALID, 1, "tcp without CURVE");
  parse_bad(TCP "security:\n  insecure: {clients: true}\n", MBD_E_INVALID, 1, "broker.workers");
  mbd_deploy_config *c =
      parse_ok(TCP "security:\n  insecure: {clients: true, workers: true}\n  ipc_group: mambad\n");
  assert_true(c->security.insecure_clients && c->security.insecure_workers);
  assert_string_equal(c->security.ipc_group, "mambad");
  mbd_deploy_config_free(&c);
  parse_bad(TCP "security:\n  curve: true\n  broker_key: keys/broker.key\n", MBD_E_INVALID, 1,
            "worker_keys");
  c = parse_ok(TCP "security:\n  curve: true\n  broker_key: keys/broker.key\n"
                   "  worker_key: /etc/mambad/worker.key\n  worker_keys: keys/workers\n"
                   "  client_keys: \"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"\n");
  assert_true(c->security.curve);
  assert_string_equal(c->security.broker_key, "/base/keys/broker.key");
  assert_string_equal(c->security.worker_key, "/etc/mambad/worker.key");
  assert_string_equal(c->security.worker_keys, "/base/keys/workers");
  assert_string_equal(c->security.client_keys, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
  mbd_deploy_config_free(&c);
#undef TCP
}

static void test_http_section(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok(BROKER);
  assert_false(c->http.enabled);
  mbd_deploy_config_free(&c);
  c = parse_ok(BROKER "http:\n  listen: \"127.0.0.1:8000\"\n  max_body_bytes: 65536\n"
                      "  conn_timeout_s: 5\n  max_running: 8\n  deadline_ms: 1000\n");
  assert_true(c->http.enabled);
  assert_string_equal(c->http.listen, "127.0.0.1:8000");
  assert_int_equal(c->http.max_body_bytes, 65536);
  assert_int_equal(c->http.conn_timeout_s, 5);
  assert_int_equal(c->http.max_running, 8);
  assert_int_equal(c->http.deadline_ms, 1000);
  assert_int_equal(c->http.line, 5);
  mbd_deploy_config_free(&c);
  parse_bad(BROKER "http: {}\n", MBD_E_INVALID, 4, "http.listen: missing");
  parse_bad(BROKER "http:\n  listen: 8000\n", MBD_E_INVALID, 5, "must be HOST:PORT");
  parse_bad(BROKER "http:\n  listen: \"h:99999\"\n", MBD_E_INVALID, 5, "must be HOST:PORT");
  parse_bad(BROKER "http:\n  listen: \"h:1\"\n  port: 2\n", MBD_E_INVALID, 6, "unknown key 'port'");
  parse_bad(BROKER "http:\n  listen: \"h:1\"\n  conn_timeout_s: 0\n", MBD_E_INVALID, 6,
            "http.conn_timeout_s");
}

/* Durable sessions: the deployment-wide cadence is every worker's unless it
 * sets its own (0 turns it off); the budget is the broker's; a cadence with
 * a zero budget is refused where it is written. */
static void test_durable_section(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok(BROKER "workers:\n  - {name: w, device: cpu}\n");
  assert_int_equal(c->workers[0].checkpoint_tokens, MBD_DEFAULT_CHECKPOINT_TOKENS);
  assert_int_equal(c->workers[0].checkpoint_ms, MBD_DEFAULT_CHECKPOINT_MS);
  mbd_deploy_config_free(&c);
  c = parse_ok(BROKER "durable:\n  checkpoint_tokens: 16\n  checkpoint_ms: 500\n"
                      "  budget_mb: 256\n"
                      "workers:\n  - {name: a, device: cpu}\n"
                      "  - {name: b, device: cpu, checkpoint_tokens: 64}\n"
                      "  - {name: c, device: 'cuda:0', checkpoint_tokens: 0, checkpoint_ms: 0}\n");
  assert_int_equal(c->durable_mb, 256);
  assert_int_equal(c->checkpoint_tokens, 16);
  assert_int_equal(c->checkpoint_ms, 500);
  assert_int_equal(c->workers[0].checkpoint_tokens, 16);
  assert_int_equal(c->workers[0].checkpoint_ms, 500);
  assert_int_equal(c->workers[1].checkpoint_tokens, 64);
  assert_int_equal(c->workers[1].checkpoint_ms, 500);
  assert_int_equal(c->workers[2].checkpoint_tokens, 0);
  assert_int_equal(c->workers[2].checkpoint_ms, 0);
  mbd_deploy_config_free(&c);
  /* No budget and no cadence: sessions die with their worker, as asked. */
  c = parse_ok(BROKER "durable: {budget_mb: 0}\nworkers:\n  - {name: w, device: cpu, "
                      "checkpoint_ms: 0}\n");
  assert_int_equal(c->durable_mb, 0);
  mbd_deploy_config_free(&c);
  parse_bad(BROKER "durable:\n  checkpoint_tokens: 65537\n", MBD_E_INVALID, 5,
            "durable.checkpoint_tokens: 65537 is out of range [0, 65536]");
  parse_bad(BROKER "durable:\n  checkpoint_ms: -1\n", MBD_E_INVALID, 5, "durable.checkpoint_ms");
  parse_bad(BROKER "durable:\n  budget_mb: lots\n", MBD_E_INVALID, 5,
            "durable.budget_mb: 'lots' is not an integer");
  parse_bad(BROKER "durable:\n  cadence: 3\n", MBD_E_INVALID, 5,
            "unknown key 'cadence' (known: checkpoint_tokens, checkpoint_ms, budget_mb)");
  parse_bad(BROKER "durable: [16]\n", MBD_E_INVALID, 4, "durable: must be a mapping");
  parse_bad(BROKER "durable:\n  budget_mb: 0\n  checkpoint_ms: 100\n", MBD_E_INVALID, 5,
            "budget_mb: 0 keeps no checkpoints");
  parse_bad(BROKER "durable: {budget_mb: 0}\nworkers:\n  - name: w\n    device: cpu\n"
                   "    checkpoint_ms: 100\n",
            MBD_E_INVALID, 8,
            "workers[0].checkpoint_ms: worker 'w' checkpoints, but durable.budget_mb is 0");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    checkpoint_tokens: 1.5\n",
            MBD_E_INVALID, 7, "workers[0].checkpoint_tokens: '1.5' is not an integer");
}

/* The prefix state cache: the section is every worker's unless it sets its
 * own keys (0 turns the cache off); out-of-range values name their field. */
static void test_prefix_cache_section(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok(BROKER "workers:\n  - {name: w, device: cpu}\n");
  assert_int_equal(c->workers[0].prefix_cache.mb, MBD_DEFAULT_PREFIX_CACHE_MB);
  assert_int_equal(c->workers[0].prefix_cache.block, MBD_DEFAULT_PREFIX_BLOCK);
  assert_int_equal(c->workers[0].prefix_cache.device_mb, MBD_DEFAULT_PREFIX_CACHE_DEVICE_MB);
  mbd_deploy_config_free(&c);
  c = parse_ok(BROKER "prefix_cache:\n  mb: 1024\n  block: 128\n  device_mb: 64\n"
                      "workers:\n  - {name: a, device: cpu}\n"
                      "  - {name: b, device: cpu, prefix_block: 64}\n"
                      "  - {name: c, device: 'cuda:0', prefix_cache_mb: 0,"
                      " prefix_cache_device_mb: 0}\n");
  assert_int_equal(c->prefix_cache.device_mb, 64);
  assert_int_equal(c->workers[0].prefix_cache.device_mb, 64);
  assert_int_equal(c->workers[2].prefix_cache.device_mb, 0);
  assert_int_equal(c->prefix_cache.mb, 1024);
  assert_int_equal(c->prefix_cache.block, 128);
  assert_int_equal(c->workers[0].prefix_cache.mb, 1024);
  assert_int_equal(c->workers[0].prefix_cache.block, 128);
  assert_int_equal(c->workers[1].prefix_cache.mb, 1024);
  assert_int_equal(c->workers[1].prefix_cache.block, 64);
  assert_int_equal(c->workers[2].prefix_cache.mb, 0);
  assert_int_equal(c->workers[2].prefix_cache.block, 128);
  mbd_deploy_config_free(&c);
  parse_bad(BROKER "prefix_cache:\n  mb: -1\n", MBD_E_INVALID, 5,
            "prefix_cache.mb: -1 is out of range [0, 1048576]");
  parse_bad(BROKER "prefix_cache:\n  block: 16777217\n", MBD_E_INVALID, 5,
            "prefix_cache.block: 16777217 is out of range");
  parse_bad(BROKER "prefix_cache:\n  size: 3\n", MBD_E_INVALID, 5,
            "unknown key 'size' (known: mb, block, device_mb)");
  parse_bad(BROKER "prefix_cache:\n  device_mb: -5\n", MBD_E_INVALID, 5,
            "prefix_cache.device_mb: -5 is out of range [0, 1048576]");
  parse_bad(BROKER "prefix_cache: 256\n", MBD_E_INVALID, 4, "prefix_cache: must be a mapping");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    prefix_block: big\n",
            MBD_E_INVALID, 7, "workers[0].prefix_block: 'big' is not an integer");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    prefix_cache_mb: 2097152\n",
            MBD_E_INVALID, 7, "workers[0].prefix_cache_mb: 2097152 is out of range");
}

/* state_dtype: the top-level default, a worker's own value over it; a cpu
 * worker cannot take bf16 (Mamba-1 and Mamba-2 on CUDA only), wherever it came from. */
static void test_state_dtype(void **state) {
  (void)state;
  mbd_deploy_config *c = parse_ok(BROKER "workers:\n  - {name: w, device: cpu}\n");
  assert_string_equal(c->state_dtype, "");
  assert_string_equal(c->workers[0].state_dtype, ""); /* the worker's default (f32) */
  mbd_deploy_config_free(&c);
  c = parse_ok(BROKER "state_dtype: bf16\n"
                      "workers:\n  - {name: g, device: 'cuda:0'}\n"
                      "  - {name: h, device: all, state_dtype: f32}\n"
                      "  - {name: c, device: cpu, state_dtype: f32}\n");
  assert_string_equal(c->state_dtype, "bf16");
  assert_string_equal(c->workers[0].state_dtype, "bf16");
  assert_string_equal(c->workers[1].state_dtype, "f32");
  assert_string_equal(c->workers[2].state_dtype, "f32");
  mbd_deploy_config_free(&c);
  c = parse_ok(BROKER "workers:\n  - {name: g, device: 'cuda:1', state_dtype: bf16}\n");
  assert_string_equal(c->workers[0].state_dtype, "bf16");
  mbd_deploy_config_free(&c);
  parse_bad(BROKER "state_dtype: f16\n", MBD_E_INVALID, 4,
            "state_dtype: invalid state dtype 'f16' (valid: f32, bf16)");
  parse_bad(BROKER "workers:\n  - name: w\n    device: 'cuda:0'\n    state_dtype: [bf16]\n",
            MBD_E_INVALID, 7, "workers[0].state_dtype");
  parse_bad(BROKER "workers:\n  - name: w\n    device: cpu\n    state_dtype: bf16\n",
            MBD_E_INVALID, 7,
            "supported for Mamba-1 and Mamba-2 on CUDA only: give it state_dtype: f32");
  /* inherited: reported at the worker */
  parse_bad(BROKER "state_dtype: bf16\nworkers:\n  - name: w\n    device: cpu\n", MBD_E_INVALID, 6,
            "workers[0].state_dtype: worker 'w' runs on the cpu");
}

/* Anchors/aliases in place of scalars are refused, not expanded. */
static void test_alias_bomb(void **state) {
  (void)state;
  parse_bad(BROKER "models:\n  - &a {name: m, path: x}\n  - *a\n", MBD_E_INVALID, 5, "listed twice");
  parse_bad("a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
            "broker: [*b, *b, *b, *b, *b, *b, *b]\n",
            MBD_E_INVALID, 1, "unknown key 'a'");
}

static void test_load_file_and_shipped_examples(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd-deploy-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[512];
  snprintf(path, sizeof path, "%s/d.yaml", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(BROKER "models:\n  - {name: m, path: sub/m}\n", f);
  fclose(f);
  mbd_deploy_config *c = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_deploy_config_load(path, &c, &err), 0);
  char want[600];
  snprintf(want, sizeof want, "%s/sub/m", dir);
  assert_string_equal(c->models[0].path, want);
  mbd_deploy_config_free(&c);
  unlink(path);
  rmdir(dir);

  assert_int_equal(mbd_deploy_config_load("/nonexistent/x.yaml", &c, &err), MBD_E_IO);
  assert_non_null(strstr(err.msg, "/nonexistent/x.yaml"));

  const char *src = getenv("MBD_SOURCE_DIR");
  if (!src) return;
  const char *files[] = {"deploy/local.yaml", "deploy/multi-host.yaml", "deploy/local-gpu.yaml"};
  for (size_t i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", src, files[i]);
    int rc = mbd_deploy_config_load(path, &c, &err);
    if (rc) fprintf(stderr, "%s: %s\n", path, err.msg);
    assert_int_equal(rc, 0);
    assert_true(c->n_workers >= 1);
    mbd_deploy_config_free(&c);
  }
}

static void test_connect_endpoint(void **state) {
  (void)state;
  char out[128];
  mbd_deploy_connect_endpoint("tcp://*:5555", out, sizeof out);
  assert_string_equal(out, "tcp://127.0.0.1:5555");
  mbd_deploy_connect_endpoint("tcp://0.0.0.0:7", out, sizeof out);
  assert_string_equal(out, "tcp://127.0.0.1:7");
  mbd_deploy_connect_endpoint("ipc:///tmp/x", out, sizeof out);
  assert_string_equal(out, "ipc:///tmp/x");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_file),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_errors_name_line_and_field),
      cmocka_unit_test(test_http_section),
      cmocka_unit_test(test_durable_section),
      cmocka_unit_test(test_prefix_cache_section),
      cmocka_unit_test(test_state_dtype),
      cmocka_unit_test(test_tcp_needs_curve_or_insecure),
      cmocka_unit_test(test_alias_bomb),
      cmocka_unit_test(test_load_file_and_shipped_examples),
      cmocka_unit_test(test_connect_endpoint),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
