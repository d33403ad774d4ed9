/* Worker session table: ids "<uid>/<n>" never reused, capacity (BUSY when
 * full), lookups of foreign/malformed/closed ids, idle expiry that spares busy
 * sessions, and the free callback running exactly once per session. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/session.h"

static int g_freed; /* free callback calls */

static void on_free(void *ctx, mbd_wsession *s) {
  (void)ctx;
  free(s->state);
  g_freed++;
}

static void test_open_find_close(void **state) {
  (void)state;
  mbd_wsession_table *t = NULL;
  mbd_error err = {0};
  g_freed = 0;
  assert_int_equal(mbd_wsession_table_new("abc123", 2, on_free, NULL, &t, &err), 0);
  mbd_wsession *a = NULL, *b = NULL, *c = NULL, *f = NULL;
  assert_int_equal(mbd_wsession_open(t, 0, malloc(4), 1.0, &a, &err), 0);
  assert_int_equal(strlen(a->id), 6 + 1 + 32); /* "<uid>/<32 hex>" */
  assert_memory_equal(a->id, "abc123/", 7);
  assert_int_equal(mbd_wsession_open(t, 1, malloc(4), 1.0, &b, &err), 0);
  assert_string_not_equal(a->id, b->id);
  char a_id[MBD_SESSION_ID_MAX], b_id[MBD_SESSION_ID_MAX];
  strcpy(a_id, a->id);
  strcpy(b_id, b->id);
  assert_int_equal(b->model, 1);
  /* Full. */
  void *st = malloc(4);
  assert_int_equal(mbd_wsession_open(t, 0, st, 1.0, &c, &err), MBD_E_BUSY);
  assert_non_null(strstr(err.msg, "--sessions"));
  free(st); /* not taken on failure */
  assert_int_equal(mbd_wsession_count(t), 2);
  assert_int_equal(mbd_wsession_find(t, b_id, &f, &err), 0);
  assert_ptr_equal(f, b);
  /* Foreign, malformed, unknown. */
  assert_int_equal(mbd_wsession_find(t, "zzz/1", &f, &err), MBD_E_NOT_FOUND);
  assert_non_null(strstr(err.msg, "does not belong"));
  assert_int_equal(mbd_wsession_find(t, "abc1234/1", &f, &err), MBD_E_NOT_FOUND);
  assert_int_equal(mbd_wsession_find(t, "abc123/", &f, &err), MBD_E_NOT_FOUND);
  assert_int_equal(mbd_wsession_find(t, "", &f, &err), MBD_E_INVALID);
  assert_int_equal(mbd_wsession_find(t, NULL, &f, &err), MBD_E_INVALID);
  assert_int_equal(mbd_wsession_find(t, "abc123/99", &f, &err), MBD_E_NOT_FOUND);
  assert_null(f);
  /* Close frees once; the id is dead and never reused. */
  mbd_wsession_close(t, a);
  assert_int_equal(g_freed, 1);
  assert_int_equal(mbd_wsession_find(t, a_id, &f, &err), MBD_E_NOT_FOUND);
  assert_int_equal(mbd_wsession_open(t, 0, malloc(4), 2.0, &c, &err), 0);
  assert_string_not_equal(c->id, a_id);
  mbd_wsession_table_destroy(&t);
  assert_null(t);
  assert_int_equal(g_freed, 3);
  mbd_wsession_table_destroy(&t);
}

/* Owners: a foreign owner reads NOT_FOUND exactly like a closed id; limits per
 * owner; 10k random ids never hit a live session. */
static void test_owner_and_guessing(void **state) {
  (void)state;
  mbd_wsession_table *t = NULL;
  mbd_error err = {0}, err2 = {0};
  assert_int_equal(mbd_wsession_table_new("0123456789abcdef", 64, on_free, NULL, &t, &err), 0);
  mbd_wsession *s = NULL, *f = NULL;
  for (int i = 0; i < 32; i++) {
    assert_int_equal(mbd_wsession_admit(t, "uid:1000", 32, &err), 0);
    assert_int_equal(mbd_wsession_open(t, 0, malloc(1), 1.0, &s, &err), 0);
    mbd_wsession_own(s, "uid:1000");
  }
  assert_int_equal(mbd_wsession_admit(t, "uid:1000", 32, &err), MBD_E_BUSY);
  assert_non_null(strstr(err.msg, "--client-sessions"));
  assert_int_equal(mbd_wsession_admit(t, "uid:1001", 32, &err), 0);
  assert_int_equal(mbd_wsession_count_owned(t, "uid:1000"), 32);
  assert_int_equal(mbd_wsession_find_for(t, s->id, "uid:1000", &f, &err), 0);
  assert_ptr_equal(f, s);
  char id[MBD_SESSION_ID_MAX];
  strcpy(id, s->id);
  assert_int_equal(mbd_wsession_find_for(t, id, "uid:1001", &f, &err), MBD_E_NOT_FOUND);
  assert_null(f);
  assert_int_equal(mbd_wsession_find_for(t, id, NULL, &f, &err), MBD_E_NOT_FOUND);
  /* Same message as an id that was never open. */
  char closed[MBD_SESSION_ID_MAX];
  snprintf(closed, sizeof closed, "0123456789abcdef/%032x", 7);
  assert_int_equal(mbd_wsession_find_for(t, closed, "uid:1001", &f, &err2), MBD_E_NOT_FOUND);
  char a[MBD_ERROR_MSG_MAX], b[MBD_ERROR_MSG_MAX];
  snprintf(a, sizeof a, "%s", strstr(err.msg, "' is"));
  snprintf(b, sizeof b, "%s", strstr(err2.msg, "' is"));
  assert_string_equal(a, b);
  srand(12345);
  for (int i = 0; i < 10000; i++) {
    char g[MBD_SESSION_ID_MAX];
    int n = snprintf(g, sizeof g, "0123456789abcdef/");
    for (int k = 0; k < 32; k++) n += snprintf(g + n, sizeof g - (size_t)n, "%x", rand() % 16);
    assert_int_equal(mbd_wsession_find(t, g, &f, &err), MBD_E_NOT_FOUND);
  }
  mbd_wsession_table_destroy(&t);
}

static void test_expire(void **state) {
  (void)state;
  mbd_wsession_table *t = NULL;
  mbd_error err = {0};
  g_freed = 0;
  assert_int_equal(mbd_wsession_table_new("u", 4, on_free, NULL, &t, &err), 0);
  mbd_wsession *s[4];
  for (int i = 0; i < 4; i++)
    assert_int_equal(mbd_wsession_open(t, 0, malloc(1), 100.0 + i, &s[i], &err), 0);
  s[0]->busy = true; /* generating: never expired */
  assert_int_equal(mbd_wsession_expire(t, 200.0, 0), 0); /* disabled */
  assert_int_equal(mbd_wsession_expire(t, 111.5, 10.0), 1); /* only s[1] (idle 10.5 s) */
  assert_int_equal(mbd_wsession_count(t), 3);
  assert_null(mbd_wsession_at(t, 1));
  assert_non_null(mbd_wsession_at(t, 0));
  assert_int_equal(mbd_wsession_expire(t, 1000.0, 10.0), 2);
  assert_int_equal(mbd_wsession_count(t), 1);
  assert_int_equal(g_freed, 3);
  mbd_wsession_table_destroy(&t);
  assert_int_equal(g_freed, 4);
}

static void test_bad_args(void **state) {
  (void)state;
  mbd_wsession_table *t = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_wsession_table_new("a/b", 2, NULL, NULL, &t, &err), MBD_E_INVALID);
  assert_int_equal(mbd_wsession_table_new("", 2, NULL, NULL, &t, &err), MBD_E_INVALID);
  assert_int_equal(mbd_wsession_table_new("ok", 0, NULL, NULL, &t, &err), MBD_E_INVALID);
  assert_null(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_find_close),
      cmocka_unit_test(test_owner_and_guessing),
      cmocka_unit_test(test_expire),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
