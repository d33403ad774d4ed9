/* Progress of long work (common/progress.h): reports come every byte step
 * and close with a final one, work below the threshold stays silent; and the
 * real users: synthesising, writing and loading a checkpoint above a
 * threshold set low report tensors and bytes that add up to the file's,
 * while the same checkpoint under the default threshold reports nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/progress.h"
#include "common/safetensors.h"
#include "kernels/model/mamba1.h"
#include "kernels/model/synth.h"

#define MAX_REPORTS 4096

/* Every report received, with its label copied. */
typedef struct seen {
  size_t n;
  mbd_progress_info r[MAX_REPORTS];
  char what[MAX_REPORTS][128];
} seen;

static void collect(void *user, const mbd_progress_info *info) {
  seen *s = user;
  assert_true(s->n < MAX_REPORTS);
  s->r[s->n] = *info;
  snprintf(s->what[s->n], sizeof s->what[0], "%s", info->what);
  s->r[s->n].what = s->what[s->n];
  s->n++;
}

/* Byte steps only (no clock): a report per `every` bytes, then a closing one. */
static mbd_progress_opts low(seen *s, uint64_t min_bytes, uint64_t every) {
  mbd_progress_opts o;
  mbd_progress_opts_init(&o, collect, s);
  o.min_bytes = min_bytes;
  o.every_bytes = every;
  o.every_s = 0;
  return o;
}

static void test_steps_and_threshold(void **state) {
  (void)state;
  seen *s = calloc(1, sizeof *s);
  mbd_progress_opts o = low(s, 100, 10);
  mbd_progress p;
  mbd_progress_begin(&p, &o, "job", "parts", 100, 20);
  for (int i = 0; i < 20; i++) mbd_progress_add(&p, 5, 1);
  mbd_progress_end(&p);
  assert_int_equal(s->n, 11); /* at 10, 20, ... 100 bytes, then the closing report */
  for (size_t i = 0; i < 10; i++) {
    assert_int_equal(s->r[i].bytes, 10 * (i + 1));
    assert_false(s->r[i].last);
  }
  assert_true(s->r[10].last);
  assert_int_equal(s->r[10].bytes, 100);
  assert_int_equal(s->r[10].items, 20);
  mbd_progress_end(&p); /* once only */
  assert_int_equal(s->n, 11);

  s->n = 0; /* below the threshold: silent, closing report included */
  mbd_progress_begin(&p, &o, "small", "parts", 99, 1);
  mbd_progress_add(&p, 99, 1);
  mbd_progress_end(&p);
  mbd_progress_begin(&p, NULL, "no sink", "parts", 1000, 1);
  mbd_progress_add(&p, 1000, 1);
  mbd_progress_end(&p);
  assert_int_equal(s->n, 0);

  char line[256];
  mbd_progress_info in = {.what = "loading /m", .unit = "tensors", .bytes = 512ull << 20,
                          .total_bytes = 2048ull << 20, .items = 3, .total_items = 12,
                          .elapsed_s = 2.25};
  mbd_progress_format(&in, line, sizeof line);
  assert_string_equal(line, "loading /m: 512.0 of 2048.0 MiB (25%), 3 of 12 tensors, 2.2 s");
  in.last = true;
  in.bytes = in.total_bytes;
  in.items = 12;
  mbd_progress_format(&in, line, sizeof line);
  assert_string_equal(line, "loading /m: 2048.0 of 2048.0 MiB (100%), 12 of 12 tensors, done in 2.2 s");
  free(s);
}

/* Checks one job's reports s->r[from..) labelled `what`: bytes and items
 * never go back, the last one closes the job with the totals. Returns the
 * index after the job. */
static size_t check_job(const seen *s, size_t from, const char *what, uint64_t bytes,
                        uint64_t items) {
  size_t i = from;
  uint64_t b = 0, k = 0;
  assert_true(i < s->n);
  for (; i < s->n && !strcmp(s->what[i], what); i++) {
    assert_true(s->r[i].bytes >= b && s->r[i].items >= k);
    b = s->r[i].bytes;
    k = s->r[i].items;
    assert_int_equal(s->r[i].total_bytes, bytes);
    assert_int_equal(s->r[i].total_items, items);
    if (s->r[i].last) {
      assert_int_equal(b, bytes);
      assert_int_equal(k, items);
      return i + 1;
    }
  }
  fail_msg("job '%s': no closing report (report %zu is '%s')", what, i, i < s->n ? s->what[i] : "-");
  return i;
}

static void test_checkpoint(void **state) {
  (void)state;
  char dir[] = "/tmp/mbd-progress-XXXXXX", what[300], path[200];
  assert_non_null(mkdtemp(dir));
  mbd_mamba_config cfg;
  mbd_synth_custom(64, 3, 512, &cfg);
  seen *s = calloc(1, sizeof *s);
  mbd_progress_opts o = low(s, 1, 16384);
  mbd_error err = {0};
  assert_int_equal(mbd_synth_write_progress(&cfg, MBD_DTYPE_F32, 7, dir, &o, &err), MBD_OK);

  /* the data section of the file is what the jobs count */
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  mbd_safetensors *st = NULL;
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  uint64_t bytes = 0, tensors = mbd_safetensors_count(st);
  for (size_t i = 0; i < tensors; i++) bytes += mbd_safetensors_at(st, i)->nbytes;
  mbd_safetensors_destroy(&st);
  assert_true(bytes > 10 * 16384); /* several steps */

  snprintf(what, sizeof what, "synthesising %s", dir);
  size_t i = check_job(s, 0, what, bytes, tensors);
  assert_true(i > 3);
  snprintf(what, sizeof what, "writing %s", path);
  i = check_job(s, i, what, bytes, tensors);
  assert_int_equal(i, s->n);

  s->n = 0; /* loading */
  mbd_mamba1_options mo;
  mbd_mamba1_options_default(&mo);
  mo.threads = 1;
  mo.progress = &o;
  mbd_mamba1_model *m = NULL;
  assert_int_equal(mbd_mamba1_load(dir, &mo, &m, &err), MBD_OK);
  snprintf(what, sizeof what, "loading %s", dir);
  assert_true(s->n > 3);
  assert_int_equal(check_job(s, 0, what, bytes, tensors), s->n);
  mbd_mamba1_destroy(&m);

  /* the default threshold (256 MiB): this checkpoint is quiet */
  s->n = 0;
  mbd_progress_opts quiet;
  mbd_progress_opts_init(&quiet, collect, s);
  mo.progress = &quiet;
  assert_int_equal(mbd_mamba1_load(dir, &mo, &m, &err), MBD_OK);
  mbd_mamba1_destroy(&m);
  assert_int_equal(mbd_synth_write_progress(&cfg, MBD_DTYPE_F32, 7, dir, &quiet, &err), MBD_OK);
  assert_int_equal(s->n, 0);

  const char *files[] = {"model.safetensors", "config.json"};
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[k]);
    unlink(path);
  }
  rmdir(dir);
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_steps_and_threshold),
      cmocka_unit_test(test_checkpoint),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
