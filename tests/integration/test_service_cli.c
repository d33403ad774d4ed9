/* The CLI's exit codes and messages: 0 on success, 1 with "CODE_NAME: message"
 * on a failed request or file, 2 on bad usage, 127 for a missing program;
 * `mambad up` rejects a bad YAML naming file, line and field and passes the
 * durable settings; `mambad status` prints the durable-session counters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/svc.h"

static svc s;

static int teardown(void **state) {
  (void)state;
  svc_cleanup(&s);
  return 0;
}

/* Runs `mambad ARGS` and checks the exit code and that the output holds want. */
#define EXPECT(code, want, ...)                                                             \
  do {                                                                                      \
    char out_[8192];                                                                        \
    int rc_ = svc_sh(&s, out_, sizeof out_, __VA_ARGS__);                                   \
    if (rc_ != (code) || !strstr(out_, want))                                               \
      fprintf(stderr, "exit %d (wanted %d), output:\n%s\n(wanted '%s')\n", rc_, code, out_, \
              want);                                                                        \
    assert_int_equal(rc_, code);                                                            \
    assert_non_null(strstr(out_, want));                                                    \
  } while (0)

static void test_without_service(void **state) {
  (void)state;
  if (!svc_init(&s)) exit(77); /* ctest: skipped */
  const char *b = s.bin;
  EXPECT(0, "usage: mambad <command>", "'%s/mambad' --help", b);
  EXPECT(2, "usage: mambad <command>", "'%s/mambad'", b);
  EXPECT(2, "unknown command 'frobnicate'", "'%s/mambad' frobnicate", b);
  const char *cmds[] = {"status", "forward", "generate", "gemm", "bench", "up"};
  for (size_t i = 0; i < 6; i++) EXPECT(0, "usage: mambad", "'%s/mambad' %s --help", b, cmds[i]);
  EXPECT(2, "unknown option", "'%s/mambad' status --bogus", b);
  EXPECT(2, "does not apply", "'%s/mambad' status --model x", b);
  EXPECT(2, "--model, --input and --output are required", "'%s/mambad' forward --model x", b);
  EXPECT(2, "deterministic", "'%s/mambad' forward --gemm-mode fast", b);
  EXPECT(2, "--generate wants an integer", "'%s/mambad' generate --generate -3", b);
  EXPECT(2, "--top-p must be in [0,1]", "'%s/mambad' generate --top-p 2", b);
  /* no broker at the endpoint: TIMEOUT (`timeout` turns a hang into exit 124, a failure) */
  EXPECT(1, "status: TIMEOUT: broker at ipc:///nonexistent",
         "timeout 120 '%s/mambad' status --connect ipc:///nonexistent/x.sock", b);
  EXPECT(1, "INVALID", "'%s/mambad' status --connect bogus://x", b);
  /* input files are checked before any request */
  EXPECT(1, "forward: IO:", "'%s/mambad' forward --model m --input /nonexistent.st --output /tmp/x", b);
  EXPECT(1, "gemm: NOT_FOUND", "'%s/mambad' gemm --input '%s/model.safetensors'", b, s.fixture);
  EXPECT(1, "needs a tensor input_ids", "'%s/mambad' forward --model m --input '%s/model.safetensors' --output /tmp/x", b, s.fixture);

  /* mambad up on bad YAML: file:line: field */
  char yaml[700];
  svc_write(&s, "bad.yaml", yaml, "broker:\n  clients: ipc:///tmp/x\n  workers: ipc:///tmp/y\n"
                                  "workers:\n  - name: w\n    device: gpu\n");
  EXPECT(1, "bad.yaml:6: workers[0].device: 'gpu' is not cpu, cuda:N or all", "'%s/mambad' up --config '%s'", b, yaml);
  svc_write(&s, "curve.yaml", yaml, "broker: {clients: 'ipc:///tmp/x', workers: 'ipc:///tmp/y'}\n"
                                    "security: {curve: true, server_public_key: \"rq:rM>}U?@Lns47E1%%kR.o@n%%FcmmsL/@{H8]yf7\", "
                                    "server_secret_key: \"JTKVSB%%%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6\"}\n");
  EXPECT(1, "curve: true needs broker_key", "'%s/mambad' up --config '%s'", b, yaml);
  EXPECT(1, "cannot open", "'%s/mambad' up --config /nonexistent.yaml", b);
  svc_write(&s, "nomodel.yaml", yaml, "broker: {clients: 'ipc:///tmp/x', workers: 'ipc:///tmp/y'}\n"
                                      "models:\n  - {name: m, path: /nonexistent/m}\n"
                                      "workers:\n  - {name: w, device: cpu}\n");
  EXPECT(1, "NOT_FOUND: ", "'%s/mambad' up --config '%s'", b, yaml);
  EXPECT(1, "nomodel.yaml:3: models: 'm' path /nonexistent/m", "'%s/mambad' up --config '%s'", b, yaml);
  EXPECT(2, "usage: mambad up", "'%s/mambad' up", b);
  /* --dry-run prints the command lines */
  svc_yaml(&s, "  - {name: r, device: cpu, count: 2, threads: 1}\n", yaml);
  EXPECT(0, "mambad-worker --connect", "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  EXPECT(0, "--name r-1 --device cpu", "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  /* the durable settings reach the broker and each worker (0 = not passed) */
  svc_yaml(&s,
           "  - {name: d, device: cpu, threads: 1}\n"
           "  - {name: e, device: cpu, threads: 1, checkpoint_tokens: 0, checkpoint_ms: 250}\n"
           "durable: {checkpoint_tokens: 8, budget_mb: 64}\n",
           yaml);
  EXPECT(0, "--default-deadline-ms 20000 --durable-mb 64", "'%s/mambad' up --config '%s' --dry-run",
         b, yaml);
  EXPECT(0, "--threads 1 --checkpoint-tokens 8 --heartbeat-ms",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  EXPECT(0, "--threads 1 --checkpoint-ms 250 --heartbeat-ms",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  /* the prefix cache settings that differ from the worker's defaults */
  svc_yaml(&s,
           "  - {name: p, device: cpu, threads: 1, prefix_block: 64}\n"
           "  - {name: q, device: cpu, threads: 1, prefix_cache_mb: 0}\n"
           "prefix_cache: {mb: 512}\n",
           yaml);
  EXPECT(0, "--threads 1 --prefix-cache-mb 512 --prefix-block 64 --heartbeat-ms",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  EXPECT(0, "--threads 1 --prefix-cache-mb 0 --heartbeat-ms",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  /* the state dtype: the top-level default and a worker's own; a cpu worker cannot take bf16 */
  svc_yaml(&s,
           "  - {name: g, device: 'cuda:0'}\n"
           "  - {name: c, device: cpu, threads: 1, state_dtype: f32}\n"
           "state_dtype: bf16\n",
           yaml);
  EXPECT(0, "--name g --device cuda:0 --state-dtype bf16 --model tiny=",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  EXPECT(0, "--name c --device cpu --state-dtype f32 --model tiny=",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  svc_yaml(&s, "  - {name: c, device: cpu}\nstate_dtype: bf16\n", yaml);
  EXPECT(1, "workers[0].state_dtype: worker 'c' runs on the cpu",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  /* a cpu worker refuses a bf16 state at start, saying where it runs */
  EXPECT(1, "state dtype bf16 is supported for Mamba-1 and Mamba-2 on CUDA only",
         "'%s/mambad-worker' --connect ipc:///nonexistent/w.sock --name w --state-dtype bf16", b);
  EXPECT(2, "--state-dtype: invalid state dtype 'f16' (valid: f32, bf16)",
         "'%s/mambad-worker' --connect ipc:///nonexistent/w.sock --name w --state-dtype f16", b);
  EXPECT(2, "--state-dtype: invalid state dtype", "'%s/mambad' forward --state-dtype f16", b);
  svc_yaml(&s, "  - {name: d, device: cpu, checkpoint_ms: 100}\ndurable: {budget_mb: 0}\n", yaml);
  EXPECT(1, "workers[0].checkpoint_ms: worker 'd' checkpoints, but durable.budget_mb is 0",
         "'%s/mambad' up --config '%s' --dry-run", b, yaml);
  /* a tool that is not there */
  /* a program that is neither next to the binary nor on PATH */
  EXPECT(0, "", "cp '%s/mambad' '%s/mambad'", b, s.dir);
  EXPECT(127, "cannot run 'mambad-run'", "PATH=/nonexistent '%s/mambad' run --help", s.dir);
  EXPECT(0, "usage: mambad-broker", "PATH=/nonexistent '%s/mambad' broker --help", b);
}

static void test_with_service(void **state) {
  (void)state;
  if (!svc_init(&s)) exit(77); /* ctest: skipped */
  const char *b = s.bin;
  char yaml[700];
  svc_yaml(&s,
           "  - {name: w32, device: cpu, dtype: f32, threads: 1}\n"
           "durable: {checkpoint_tokens: 4, budget_mb: 64}\n",
           yaml);
  svc_up(&s, yaml);
  mbd_client *c = svc_client(&s);
  const char *names[] = {"w32"};
  assert_true(svc_wait_workers(c, names, 1, NULL, NULL, EV_HANG_MS) >= 0);
  mbd_client_destroy(&c);
  char in[700];
  snprintf(in, sizeof in, "%s/expected.safetensors", s.fixture);
  EXPECT(1, "forward: NO_ROUTE:", "'%s/mambad' forward --connect '%s' --model tiny --dtype bf16 --input '%s' --output '%s/o.st'", b, s.clients, in, s.dir);
  EXPECT(1, "NO_ROUTE", "'%s/mambad' forward --connect '%s' --model nosuchmodel --input '%s' --output '%s/o.st'", b, s.clients, in, s.dir);
  EXPECT(1, "generate: NO_ROUTE", "'%s/mambad' generate --connect '%s' --model tiny --route-id 0123456789abcdef --input '%s'", b, s.clients, in);
  EXPECT(0, "logits f32[3,20,512] from worker w32", "'%s/mambad' forward --connect '%s' --model tiny --input '%s' --output '%s/o.st'", b, s.clients, in, s.dir);
  EXPECT(0, "c f32[9,7] from worker w32", "'%s/mambad' gemm --connect '%s' --m 9 --n 7 --k 13 --seed 3", b, s.clients);
  EXPECT(0, "tokens/s", "'%s/mambad' bench --connect '%s' --model tiny --requests 5 --seq 8 --generate 8", b, s.clients);
  EXPECT(0, "w32", "'%s/mambad' status --connect '%s'", b, s.clients);
  /* The durable line: the sessions above were checkpointed (and closed). */
  EXPECT(0, "tokens", "'%s/mambad' generate --connect '%s' --model tiny --input '%s' --generate 6",
         b, s.clients, in);
  char out[8192];
  assert_int_equal(
      svc_sh(&s, out, sizeof out, "'%s/mambad' status --connect '%s'", b, s.clients), 0);
  const char *d = strstr(out, "\ndurable: ");
  if (!d) fprintf(stderr, "no durable line in:\n%s\n", out);
  assert_non_null(d);
  unsigned long long held = 0, ckpts = 0, dropped = 0, rehomed = 0, replayed = 0, resumed = 0,
                     lost = 0;
  double mib = 0;
  long long budget = 0;
  int n = sscanf(d, "\ndurable: %llu sessions, %lf MiB held of %lld MiB, %llu checkpoints (%llu "
                    "dropped), %llu sessions re-homed, %llu tokens replayed, %llu generates "
                    "resumed, %llu sessions lost",
                 &held, &mib, &budget, &ckpts, &dropped, &rehomed, &replayed, &resumed, &lost);
  if (n != 9) fprintf(stderr, "durable line not as documented (%d fields):\n%s\n", n, out);
  assert_int_equal(n, 9);
  assert_int_equal(budget, 64);
  assert_true(ckpts > 0);
  assert_int_equal(dropped, 0);
  assert_int_equal(rehomed + replayed + resumed + lost, 0); /* no worker died */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_without_service, teardown),
      cmocka_unit_test_teardown(test_with_service, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
