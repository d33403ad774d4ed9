/* `mambad generate --prompt` through a real service (mambad up, one CPU worker,
 * the tiny fixture model with a synthetic tokenizer of its vocabulary): the
 * prompt ids the worker saw are the tokenizer's encoding of the prompt, the
 * text streamed to stdout is the decode of the generated ids written to
 * --output, and --prompt-file gives the same as --prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

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

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 16);
  *len = fread(buf, 1, (1 << 16) - 1, f);
  buf[*len] = '\0';
  fclose(f);
  return buf;
}

static void test_prompt(void **state) {
  (void)state;
  if (!svc_init(&s)) {
    print_message("skipped: needs MBD_BIN_DIR programs and the tiny-d64 fixture\n");
    skip();
  }
  mbd_error err = {0};
  assert_int_equal(mbd_synth_tokenizer_write(512, s.dir, &err), MBD_OK); /* tiny-d64: vocab 512 */
  char yaml[700];
  svc_yaml(&s, "  - {name: w32, device: cpu, dtype: f32, threads: 1}\n", yaml);
  svc_up(&s, yaml);
  mbd_client *c = svc_client(&s);
  const char *names[] = {"w32"};
  assert_true(svc_wait_workers(c, names, 1, NULL, NULL, 20000) >= 0);
  mbd_client_destroy(&c);

  const char *prompt = "the quick brown fox jumps";
  char out[700], errf[700], st_path[700], pf[700];
  snprintf(out, sizeof out, "%s/gen.out", s.dir);
  snprintf(errf, sizeof errf, "%s/gen.err", s.dir);
  snprintf(st_path, sizeof st_path, "%s/gen.safetensors", s.dir);
  int rc = procs_sh("'%s/mambad' generate --connect '%s' --model tiny --tokenizer '%s' --prompt '%s' "
                    "--max-tokens 16 --output '%s' > '%s' 2> '%s'",
                    s.bin, s.clients, s.dir, prompt, st_path, out, errf);
  size_t text_len = 0, el = 0;
  char *text = slurp(out, &text_len), *errs = slurp(errf, &el);
  if (rc) fail_msg("generate --prompt exit %d: %s", rc, errs ? errs : "");
  assert_non_null(text);
  assert_true(text_len >= 1 && text[text_len - 1] == '\n');
  text[--text_len] = '\0';

  mbd_tokenizer *t = NULL;
  assert_int_equal(mbd_tokenizer_load(s.dir, &t, &err), MBD_OK);
  int32_t *pids = NULL;
  size_t np = 0;
  assert_int_equal(mbd_tokenizer_encode(t, prompt, strlen(prompt), false, &pids, &np, &err), MBD_OK);
  mbd_safetensors *st = NULL;
  if (mbd_safetensors_open(st_path, &st, &err)) fail_msg("%s", err.msg);
  const mbd_st_entry *toks = mbd_safetensors_find(st, "tokens"), *lens = mbd_safetensors_find(st, "lengths");
  assert_non_null(toks);
  assert_non_null(lens);
  int64_t total;
  memcpy(&total, lens->data, sizeof total);
  assert_true(total > (int64_t)np);
  int64_t all[1024];
  assert_true(toks->nbytes <= sizeof all);
  memcpy(all, toks->data, toks->nbytes);
  for (size_t i = 0; i < np; i++) assert_int_equal(all[i], pids[i]); /* the worker saw the encoding */
  int32_t gen[1024];
  size_t ng = (size_t)total - np;
  for (size_t i = 0; i < ng; i++) gen[i] = (int32_t)all[np + i];
  char *want = NULL;
  size_t wl = 0;
  assert_int_equal(mbd_tokenizer_decode(t, gen, ng, false, &want, &wl, &err), MBD_OK);
  if (wl != text_len || memcmp(want, text, wl))
    fail_msg("streamed text \"%s\" differs from decode of the %zu generated ids \"%s\"", text, ng, want);
  free(want);
  free(pids);
  mbd_safetensors_destroy(&st);
  mbd_tokenizer_destroy(&t);

  /* --prompt-file: the same bytes, the same text (greedy) */
  svc_write(&s, "prompt.txt", pf, "%s", prompt);
  rc = procs_sh("'%s/mambad' generate --connect '%s' --model tiny --tokenizer '%s/tokenizer.json' "
                "--prompt-file '%s' --max-tokens 16 > '%s' 2> '%s'",
                s.bin, s.clients, s.dir, pf, out, errf);
  assert_int_equal(rc, 0);
  size_t l2 = 0;
  char *text2 = slurp(out, &l2);
  assert_int_equal(l2, text_len + 1);
  assert_memory_equal(text2, text, text_len);
  free(text2);
  /* usage errors */
  assert_int_equal(procs_sh("'%s/mambad' generate --model tiny --prompt x > /dev/null 2>&1", s.bin), 2);
  assert_int_equal(procs_sh("'%s/mambad' generate --model tiny --prompt x --prompt-file y --tokenizer '%s' "
                            "> /dev/null 2>&1", s.bin, s.dir), 2);
  free(text);
  free(errs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_prompt, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
