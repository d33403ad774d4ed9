/* Text through the in-process runner and through the service, compared:
 * `mambad run --prompt` on the tiny fixture model with a synthetic tokenizer
 * of its vocabulary streams the same text as `mambad generate --prompt`
 * through a live deployment (mambad up, one CPU worker) for greedy decoding,
 * and that text is the decode of the generated ids that run writes to
 * --output; --prompt-file gives the same. `mambad status --full` shows the
 * tokenizer's SHA-256 beside the model's digest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/synth_tokenizer.h"
#include "support/svc.h"

static svc s;

static int teardown(void **state) {
  (void)state;
  svc_cleanup(&s);
  return 0;
}

/* The whole file (NUL-terminated, caller frees), or NULL. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 16);
  *len = fread(buf, 1, (1 << 16) - 1, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

/* Runs a command line with stdout into dir/name.out and stderr into
 * dir/name.err; returns the exit code and stdout (caller frees). */
static char *sh_out(const char *name, int *rc, size_t *len, const char *cmd) {
  char o[700], e[700];
  snprintf(o, sizeof o, "%s/%s.out", s.dir, name);
  snprintf(e, sizeof e, "%s/%s.err", s.dir, name);
  *rc = procs_sh("%s > '%s' 2> '%s'", cmd, o, e);
  if (*rc) {
    size_t el = 0;
    char *errs = slurp(e, &el);
    print_message("%s: exit %d: %s\n", name, *rc, errs ? errs : "");
    free(errs);
  }
  return slurp(o, len);
}

static void test_run_prompt(void **state) {
  (void)state;
  if (!svc_init(&s)) {
    print_message("skipped: needs MBD_BIN_DIR programs and the tiny-d64 fixture\n");
    skip();
  }
  /* The model directory: the fixture's files and a tokenizer.json of its vocabulary. */
  char model[400], src[700], dst[700];
  snprintf(model, sizeof model, "%s/tiny", s.dir);
  assert_int_equal(procs_sh("mkdir '%s'", model), 0);
  const char *files[] = {"config.json", "model.safetensors"};
  for (int i = 0; i < 2; i++) {
    snprintf(src, sizeof src, "%s/%s", s.fixture, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", model, files[i]);
    assert_int_equal(symlink(src, dst), 0);
  }
  mbd_error err = {0};
  assert_int_equal(mbd_synth_tokenizer_write(512, model, &err), MBD_OK); /* tiny-d64: vocab 512 */
  char bare[512]; /* the fixture itself: no tokenizer.json */
  snprintf(bare, sizeof bare, "%s", s.fixture);
  snprintf(s.fixture, sizeof s.fixture, "%s", model);
  char yaml[700];
  svc_yaml(&s, "  - {name: w32, device: cpu, dtype: f32, threads: 1}\n", yaml);
  svc_up(&s, yaml);
  mbd_client *c = svc_client(&s);
  const char *names[] = {"w32"};
  assert_true(svc_wait_workers(c, names, 1, NULL, NULL, 20000) >= 0);
  mbd_client_destroy(&c);

  const char *prompt = "the quick brown fox jumps over";
  char cmd[4096], st_path[700], pf[700];
  snprintf(st_path, sizeof st_path, "%s/run.safetensors", s.dir);
  int rc = 0;
  size_t gl = 0, rl = 0, fl = 0;
  snprintf(cmd, sizeof cmd,
           "'%s/mambad' generate --connect '%s' --model tiny --tokenizer '%s' --prompt '%s' "
           "--max-tokens 24",
           s.bin, s.clients, model, prompt);
  char *gen = sh_out("generate", &rc, &gl, cmd);
  assert_int_equal(rc, 0);
  snprintf(cmd, sizeof cmd, "'%s/mambad' run --model '%s' --prompt '%s' --max-tokens 24 --output '%s'",
           s.bin, model, prompt, st_path);
  char *run = sh_out("run", &rc, &rl, cmd);
  assert_int_equal(rc, 0);
  assert_non_null(gen);
  assert_non_null(run);
  assert_true(rl >= 2 && run[rl - 1] == '\n');
  if (gl != rl || memcmp(gen, run, rl))
    fail_msg("run streamed \"%s\", generate through the service \"%s\"", run, gen);

  /* the text is the decode of the generated ids in --output */
  mbd_tokenizer *t = NULL;
  assert_int_equal(mbd_tokenizer_load(model, &t, &err), MBD_OK);
  int32_t *pids = NULL;
  size_t np = 0;
  assert_int_equal(mbd_tokenizer_encode(t, prompt, strlen(prompt), false, &pids, &np, &err), MBD_OK);
  mbd_safetensors *st = NULL;
  if (mbd_safetensors_open(st_path, &st, &err)) fail_msg("%s", err.msg);
  const mbd_st_entry *toks = mbd_safetensors_find(st, "tokens");
  assert_non_null(toks);
  assert_int_equal(toks->desc.ndim, 2);
  assert_int_equal(toks->desc.shape[0], 1);
  assert_int_equal(toks->desc.shape[1], (int64_t)np + 24);
  int64_t all[1024];
  assert_true(toks->nbytes <= sizeof all);
  memcpy(all, toks->data, toks->nbytes);
  for (size_t i = 0; i < np; i++) assert_int_equal(all[i], pids[i]);
  int32_t ids[64];
  size_t ng = 0;
  for (size_t i = np; i < np + 24 && all[i] >= 0; i++) ids[ng++] = (int32_t)all[i];
  assert_int_equal(ng, 24);
  char *want = NULL;
  size_t wl = 0;
  assert_int_equal(mbd_tokenizer_decode(t, ids, ng, false, &want, &wl, &err), MBD_OK);
  if (wl != rl - 1 || memcmp(want, run, wl))
    fail_msg("streamed \"%s\" is not the decode of the ids in --output \"%s\"", run, want);
  free(want);
  mbd_safetensors_destroy(&st);

  /* --prompt-file and --tokenizer FILE: the same bytes, the same text */
  svc_write(&s, "prompt.txt", pf, "%s", prompt);
  snprintf(cmd, sizeof cmd, "'%s/mambad' run --model '%s' --tokenizer '%s/tokenizer.json' "
           "--prompt-file '%s' --max-tokens 24", s.bin, model, model, pf);
  char *runf = sh_out("runf", &rc, &fl, cmd);
  assert_int_equal(rc, 0);
  assert_non_null(runf);
  assert_int_equal(fl, rl);
  assert_memory_equal(runf, run, rl);

  /* status --full: the tokenizer's SHA-256 is part of the model's identity */
  snprintf(cmd, sizeof cmd, "'%s/mambad' status --connect '%s' --full", s.bin, s.clients);
  size_t sl = 0;
  char *status = sh_out("status", &rc, &sl, cmd);
  assert_int_equal(rc, 0);
  char line[200];
  snprintf(line, sizeof line, " tokenizer %s\n", mbd_tokenizer_digest(t));
  if (!strstr(status, line)) fail_msg("status --full lacks \"%s\":\n%s", line, status);

  /* usage errors: exit 2; a model directory without a tokenizer: exit 1 */
  assert_int_equal(procs_sh("'%s/mambad' run --model '%s' --prompt x --input y > /dev/null 2>&1",
                            s.bin, model), 2);
  assert_int_equal(procs_sh("'%s/mambad' run --model '%s' --prompt x --prompt-file '%s' "
                            "> /dev/null 2>&1", s.bin, model, pf), 2);
  assert_int_equal(procs_sh("'%s/mambad' run --model '%s' --input y --output z --quiet "
                            "> /dev/null 2>&1", s.bin, model), 2);
  snprintf(cmd, sizeof cmd, "'%s/mambad' run --model '%s' --prompt x", s.bin, bare);
  free(sh_out("notok", &rc, &sl, cmd));
  assert_int_equal(rc, 1);
  free(status);
  free(runf);
  free(pids);
  mbd_tokenizer_destroy(&t);
  free(run);
  free(gen);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_run_prompt, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
