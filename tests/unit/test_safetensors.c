/* Safetensors reader/writer: round trip of every dtype, the exact on-disk
 * layout the reference implementation writes, the Hugging Face fixtures, a
 * corpus of broken files (one per validation rule, each with its error code
 * and a message naming file and tensor), every truncation and bit flip of a
 * good file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"

/* ---- helpers ---- */

static char g_dir[64];

static int setup_dir(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/mbd_st_test_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, de->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(g_dir);
  return 0;
}

static size_t dir_entries(void) {
  size_t n = 0;
  DIR *d = opendir(g_dir);
  struct dirent *de;
  while (d && (de = readdir(d)))
    if (de->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n;
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* File image: u64 header length, header text, data_len patterned bytes. */
static uint8_t *image(const char *hdr, size_t data_len, size_t *len) {
  size_t hl = strlen(hdr);
  uint8_t *b = malloc(8 + hl + data_len + 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, hdr, hl);
  for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)(i * 13 + 1);
  *len = 8 + hl + data_len;
  return b;
}

/* Parses an exactly-sized heap copy (so ASan sees any overread). */
static int parse_copy(const uint8_t *b, size_t len, mbd_error *err) {
  uint8_t *c = malloc(len ? len : 1);
  if (len) memcpy(c, b, len);
  mbd_safetensors *st = NULL;
  int rc = mbd_safetensors_parse(len ? c : NULL, len, "corpus.safetensors", &st, err);
  if (rc) assert_null(st);
  else assert_non_null(st);
  mbd_safetensors_destroy(&st);
  assert_null(st);
  free(c);
  return rc;
}

/* ---- round trip ---- */

static float g_f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
static uint16_t g_bf16[5] = {0x3f80, 0xbf80, 0x7fc0, 0x0001, 0xffff}; /* odd count: misaligns next */
static uint16_t g_f16[3] = {0x3c00, 0x7c00, 0x8001};
static int64_t g_i64[1] = {-1234567890123LL};

static void write_sample(const char *path) {
  mbd_st_writer *w = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_st_writer_new(&w, &err), MBD_OK);
  mbd_tensor_desc d;
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){2, 3}, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "w32", &d, g_f32, &err), MBD_OK);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_BF16, 1, (int64_t[]){5}, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "b16", &d, g_bf16, &err), MBD_OK);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_I64, 0, NULL, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "scalar", &d, g_i64, &err), MBD_OK);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){0, 4}, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "empty", &d, NULL, &err), MBD_OK);
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F16, 3, (int64_t[]){1, 1, 3}, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "h16", &d, g_f16, &err), MBD_OK);
  assert_int_equal(mbd_st_writer_set_metadata(w, "format", "pt", &err), MBD_OK);
  assert_int_equal(mbd_st_writer_set_metadata(w, "note", "caf\xc3\xa9 \"q\"", &err), MBD_OK);
  assert_int_equal(mbd_st_writer_write(w, path, &err), MBD_OK);
  mbd_st_writer_destroy(&w);
  assert_null(w);
}

static void check_entry(const mbd_st_entry *e, const char *name, mbd_dtype dt, int ndim,
                        const int64_t *shape, const void *data, size_t nbytes) {
  assert_non_null(e);
  assert_string_equal(e->name, name);
  assert_int_equal(e->desc.dtype, dt);
  assert_int_equal(e->desc.ndim, ndim);
  for (int i = 0; i < ndim; i++) assert_int_equal(e->desc.shape[i], shape[i]);
  assert_int_equal(e->nbytes, nbytes);
  if (nbytes) assert_memory_equal(e->data, data, nbytes);
}

static void test_round_trip(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/rt.safetensors", g_dir);
  write_sample(path);
  assert_int_equal(dir_entries(), 1); /* no temp file left behind */
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  assert_int_equal(mbd_safetensors_count(st), 5);
  /* Offset order == insertion order (the zero-size tensor sits at its offset). */
  check_entry(mbd_safetensors_at(st, 0), "w32", MBD_DTYPE_F32, 2, (int64_t[]){2, 3}, g_f32, 24);
  check_entry(mbd_safetensors_at(st, 1), "b16", MBD_DTYPE_BF16, 1, (int64_t[]){5}, g_bf16, 10);
  check_entry(mbd_safetensors_at(st, 2), "scalar", MBD_DTYPE_I64, 0, NULL, g_i64, 8);
  check_entry(mbd_safetensors_at(st, 3), "empty", MBD_DTYPE_F32, 2, (int64_t[]){0, 4}, NULL, 0);
  check_entry(mbd_safetensors_at(st, 4), "h16", MBD_DTYPE_F16, 3, (int64_t[]){1, 1, 3}, g_f16, 6);
  assert_null(mbd_safetensors_at(st, 5));
  assert_ptr_equal(mbd_safetensors_find(st, "h16"), mbd_safetensors_at(st, 4));
  assert_ptr_equal(mbd_safetensors_find(st, "w32"), mbd_safetensors_at(st, 0));
  assert_null(mbd_safetensors_find(st, "h1"));
  assert_null(mbd_safetensors_find(st, "__metadata__"));
  assert_string_equal(mbd_safetensors_metadata(st, "format"), "pt");
  assert_string_equal(mbd_safetensors_metadata(st, "note"), "caf\xc3\xa9 \"q\"");
  assert_null(mbd_safetensors_metadata(st, "missing"));

  const mbd_st_entry *e = NULL;
  assert_int_equal(mbd_safetensors_expect(st, "b16", MBD_DTYPE_BF16, 1, (int64_t[]){5}, &e, &err),
                   MBD_OK);
  assert_ptr_equal(e, mbd_safetensors_at(st, 1));
  assert_int_equal(mbd_safetensors_expect(st, "b16", MBD_DTYPE_F16, 1, (int64_t[]){5}, &e, &err),
                   MBD_E_SHAPE);
  assert_null(e);
  assert_non_null(strstr(err.msg, "expected f16[5], found bf16[5]"));
  assert_non_null(strstr(err.msg, path));
  assert_int_equal(mbd_safetensors_expect(st, "w32", MBD_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, &err),
                   MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "'w32'"));
  assert_int_equal(mbd_safetensors_expect(st, "w32", MBD_DTYPE_F32, 1, (int64_t[]){6}, NULL, &err),
                   MBD_E_SHAPE);
  assert_int_equal(mbd_safetensors_expect(st, "nope", MBD_DTYPE_F32, 0, NULL, NULL, &err),
                   MBD_E_NOT_FOUND);
  assert_non_null(strstr(err.msg, "'nope'"));
  mbd_safetensors_destroy(&st);
  assert_null(st);
  mbd_safetensors_destroy(&st); /* NULL-safe */
  mbd_safetensors_destroy(NULL);
}

/* The bytes on disk are exactly what the reference writer produces: compact
 * JSON, metadata first, header padded with spaces to a multiple of 8,
 * contiguous data starting at offset 0 and ending at the end of the file. */
static void test_exact_layout(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/layout.safetensors", g_dir);
  write_sample(path);
  size_t len;
  uint8_t *b = read_file(path, &len);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
  assert_int_equal(hl % 8, 0);
  assert_int_equal(len, 8 + hl + 24 + 10 + 8 + 0 + 6);
  const char *want =
      "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\xc3\xa9 \\\"q\\\"\"},"
      "\"w32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"b16\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[24,34]},"
      "\"scalar\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[34,42]},"
      "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[42,42]},"
      "\"h16\":{\"dtype\":\"F16\",\"shape\":[1,1,3],\"data_offsets\":[42,48]}}";
  size_t wl = strlen(want);
  assert_true(wl <= hl && hl - wl < 8);
  assert_memory_equal(b + 8, want, wl);
  for (size_t i = wl; i < hl; i++) assert_int_equal(b[8 + i], ' ');
  assert_memory_equal(b + 8 + hl, g_f32, 24);
  assert_memory_equal(b + 8 + hl + 24, g_bf16, 10);
  assert_memory_equal(b + 8 + hl + 42, g_f16, 6);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0644);
  free(b);
}

static void test_writer_errors(void **state) {
  (void)state;
  mbd_st_writer *w = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_st_writer_new(&w, &err), MBD_OK);
  mbd_tensor_desc d;
  assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 1, (int64_t[]){2}, &err), 0);
  assert_int_equal(mbd_st_writer_add(w, "a", &d, g_f32, &err), MBD_OK);
  assert_int_equal(mbd_st_writer_add(w, "a", &d, g_f32, &err), MBD_E_INVALID);
  assert_non_null(strstr(err.msg, "'a'"));
  assert_int_equal(mbd_st_writer_add(w, "__metadata__", &d, g_f32, &err), MBD_E_INVALID);
  assert_int_equal(mbd_st_writer_add(w, "", &d, g_f32, &err), MBD_E_INVALID);
  assert_int_equal(mbd_st_writer_add(w, "nodata", &d, NULL, &err), MBD_E_INVALID);
  assert_int_equal(mbd_st_writer_add(w, "bad\xff", &d, g_f32, &err), MBD_E_INVALID);
  mbd_tensor_desc huge = d;
  huge.ndim = 2;
  huge.shape[0] = huge.shape[1] = INT64_MAX / 2;
  assert_int_equal(mbd_st_writer_add(w, "huge", &huge, g_f32, &err), MBD_E_TOO_LARGE);
  mbd_tensor_desc bad = d;
  bad.dtype = (mbd_dtype)42;
  assert_int_equal(mbd_st_writer_add(w, "baddt", &bad, g_f32, &err), MBD_E_INVALID);
  assert_int_equal(mbd_st_writer_set_metadata(w, "k", NULL, &err), MBD_E_INVALID);
  /* Write into a missing directory: IO error, nothing created. */
  assert_int_equal(mbd_st_writer_write(w, "/nonexistent-dir-mbd/x.safetensors", &err), MBD_E_IO);
  assert_non_null(strstr(err.msg, "/nonexistent-dir-mbd/x.safetensors"));
  /* The failed adds left the writer usable: one tensor. */
  char path[128];
  snprintf(path, sizeof path, "%s/one.safetensors", g_dir);
  assert_int_equal(mbd_st_writer_write(w, path, &err), MBD_OK);
  mbd_st_writer_destroy(&w);
  mbd_st_writer_destroy(&w);
  mbd_safetensors *st = NULL;
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  assert_int_equal(mbd_safetensors_count(st), 1);
  mbd_safetensors_destroy(&st);
  /* Overwrite is atomic replacement: an empty writer now. */
  assert_int_equal(mbd_st_writer_new(&w, &err), MBD_OK);
  assert_int_equal(mbd_st_writer_write(w, path, &err), MBD_OK);
  mbd_st_writer_destroy(&w);
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  assert_int_equal(mbd_safetensors_count(st), 0);
  mbd_safetensors_destroy(&st);
  size_t len;
  uint8_t *b = read_file(path, &len);
  assert_int_equal(len, 16); /* "{}" padded to 8 */
  assert_memory_equal(b + 8, "{}      ", 8);
  free(b);
}

/* ---- fixtures ---- */

static void test_fixtures(void **state) {
  (void)state;
  const char *fx = getenv("MBD_FIXTURES_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/mamba1/tiny-d64/model.safetensors", fx ? fx : "");
  if (!fx || access(path, R_OK)) {
    print_message("fixtures not found (%s); set MBD_FIXTURES_DIR\n", path);
    skip();
  }
  mbd_safetensors *st = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  assert_int_equal(mbd_safetensors_count(st), 22);
  assert_string_equal(mbd_safetensors_metadata(st, "format"), "pt");
  const mbd_st_entry *e = NULL;
  assert_int_equal(mbd_safetensors_expect(st, "backbone.embeddings.weight", MBD_DTYPE_F32, 2,
                                          (int64_t[]){512, 64}, &e, &err),
                   MBD_OK);
  assert_ptr_equal(e, mbd_safetensors_at(st, 0));
  assert_int_equal(mbd_safetensors_expect(st, "backbone.layers.1.mixer.A_log", MBD_DTYPE_F32, 2,
                                          (int64_t[]){128, 16}, NULL, &err),
                   MBD_OK);
  assert_int_equal(mbd_safetensors_expect(st, "backbone.layers.0.mixer.conv1d.weight",
                                          MBD_DTYPE_F32, 3, (int64_t[]){128, 1, 4}, NULL, &err),
                   MBD_OK);
  assert_null(mbd_safetensors_find(st, "lm_head.weight")); /* tied, not stored */
  /* Contiguous, increasing, covering the data section. */
  const uint8_t *prev = mbd_safetensors_at(st, 0)->data;
  size_t total = 0;
  for (size_t i = 0; i < mbd_safetensors_count(st); i++) {
    e = mbd_safetensors_at(st, i);
    assert_ptr_equal(e->data, prev);
    prev = (const uint8_t *)e->data + e->nbytes;
    total += e->nbytes;
  }
  size_t flen;
  uint8_t *raw = read_file(path, &flen);
  assert_int_equal(total, flen - 8 - 2208);
  /* The same bytes through the in-memory parser. */
  mbd_safetensors *st2 = NULL;
  assert_int_equal(mbd_safetensors_parse(raw, flen, "mem", &st2, &err), MBD_OK);
  for (size_t i = 0; i < mbd_safetensors_count(st); i++) {
    const mbd_st_entry *a = mbd_safetensors_at(st, i), *b = mbd_safetensors_at(st2, i);
    assert_string_equal(a->name, b->name);
    assert_memory_equal(a->data, b->data, a->nbytes);
  }
  mbd_safetensors_destroy(&st2);
  free(raw);
  mbd_safetensors_destroy(&st);

  snprintf(path, sizeof path, "%s/mamba1/tiny-d64/expected.safetensors", fx);
  assert_int_equal(mbd_safetensors_open(path, &st, &err), MBD_OK);
  assert_int_equal(mbd_safetensors_count(st), 4);
  assert_null(mbd_safetensors_metadata(st, "format"));
  assert_int_equal(mbd_safetensors_expect(st, "input_ids", MBD_DTYPE_I64, 2, (int64_t[]){3, 20},
                                          &e, &err),
                   MBD_OK);
  int64_t first;
  memcpy(&first, e->data, 8);
  assert_true(first >= 0 && first < 512);
  assert_int_equal(mbd_safetensors_expect(st, "logits", MBD_DTYPE_F32, 3, (int64_t[]){3, 20, 512},
                                          NULL, &err),
                   MBD_OK);
  assert_int_equal(mbd_safetensors_expect(st, "greedy", MBD_DTYPE_I64, 2, (int64_t[]){3, 36}, NULL,
                                          &err),
                   MBD_OK);
  mbd_safetensors_destroy(&st);
}

/* ---- broken files ---- */

typedef struct bad_case {
  const char *what;
  const char *hdr; /* header text, or NULL for raw */
  size_t data_len;
  int code;
  const char *needle; /* must appear in the message (tensor name etc.) */
} bad_case;

#define E(n, dt, shape, offs) "\"" n "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const bad_case k_bad[] = {
    {"not JSON", "{abc", 0, MBD_E_FORMAT, "not valid JSON"},
    {"empty header", "", 0, MBD_E_FORMAT, "not valid JSON"},
    {"JSON array", "[1,2]", 0, MBD_E_FORMAT, "expected a JSON object"},
    {"JSON string", "\"x\"", 0, MBD_E_FORMAT, "JSON"},
    {"trailing garbage", "{} x", 0, MBD_E_FORMAT, "not valid JSON"},
    {"invalid UTF-8", "{\"t\xff\":{}}", 0, MBD_E_FORMAT, "not valid JSON"},
    {"entry not object", "{\"tname\":5}", 0, MBD_E_FORMAT, "'tname'"},
    {"entry array", "{\"tname\":[]}", 0, MBD_E_FORMAT, "'tname'"},
    {"dtype missing", "{\"tname\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, MBD_E_FORMAT,
     "'tname': 'dtype'"},
    {"dtype not string", "{\"tname\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     MBD_E_FORMAT, "'tname'"},
    {"dtype F64", "{" E("tname", "F64", "[1]", "[0,8]") "}", 8, MBD_E_UNSUPPORTED,
     "'F64' is not supported (allowed: F32, BF16, F16, I64)"},
    {"dtype lower case", "{" E("tname", "f32", "[1]", "[0,4]") "}", 4, MBD_E_UNSUPPORTED, "'f32'"},
    {"dtype U8", "{" E("tname", "U8", "[1]", "[0,1]") "}", 1, MBD_E_UNSUPPORTED, "'tname'"},
    {"shape missing", "{\"tname\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, MBD_E_FORMAT,
     "'tname': 'shape'"},
    {"shape not array", "{" E("tname", "F32", "4", "[0,4]") "}", 4, MBD_E_FORMAT, "'tname'"},
    {"shape negative", "{" E("tname", "F32", "[-1]", "[0,0]") "}", 0, MBD_E_FORMAT,
     "'tname': shape[0]"},
    {"shape real", "{" E("tname", "F32", "[1,2.0]", "[0,8]") "}", 8, MBD_E_FORMAT,
     "'tname': shape[1]"},
    {"shape string", "{" E("tname", "F32", "[\"2\"]", "[0,8]") "}", 8, MBD_E_FORMAT, "'tname'"},
    {"shape null", "{" E("tname", "F32", "[null]", "[0,8]") "}", 8, MBD_E_FORMAT, "'tname'"},
    {"9 dims", "{" E("tname", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, MBD_E_UNSUPPORTED,
     "'tname': 9 dims"},
    {"offsets missing", "{\"tname\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, MBD_E_FORMAT,
     "'tname': 'data_offsets'"},
    {"offsets one", "{" E("tname", "F32", "[1]", "[4]") "}", 4, MBD_E_FORMAT, "'tname'"},
    {"offsets three", "{" E("tname", "F32", "[1]", "[0,4,8]") "}", 8, MBD_E_FORMAT, "'tname'"},
    {"offsets object", "{" E("tname", "F32", "[1]", "{}") "}", 4, MBD_E_FORMAT, "'tname'"},
    {"offsets strings", "{" E("tname", "F32", "[1]", "[\"0\",\"4\"]") "}", 4, MBD_E_FORMAT,
     "'tname'"},
    {"offsets negative", "{" E("tname", "F32", "[1]", "[-4,0]") "}", 4, MBD_E_FORMAT, "'tname'"},
    {"offsets real", "{" E("tname", "F32", "[1]", "[0,4.0]") "}", 4, MBD_E_FORMAT, "'tname'"},
    {"offsets beyond int64", "{" E("tname", "F32", "[1]", "[0,99999999999999999999]") "}", 4,
     MBD_E_FORMAT, "not valid JSON"},
    {"begin > end", "{" E("tname", "F32", "[0]", "[8,4]") "}", 8, MBD_E_FORMAT,
     "'tname': data_offsets begin 8 > end 4"},
    {"end past data", "{" E("tname", "F32", "[2]", "[0,8]") "}", 7, MBD_E_FORMAT,
     "'tname': data_offsets end 8 is past"},
    {"end far past data", "{" E("tname", "F32", "[1]", "[9223372036854775800,9223372036854775804]") "}",
     4, MBD_E_FORMAT, "'tname'"},
    {"size mismatch small", "{" E("tname", "F32", "[2,3]", "[0,20]") "}", 24, MBD_E_FORMAT,
     "'tname': data_offsets span 20 bytes but f32[2,3] needs 24"},
    {"size mismatch big", "{" E("tname", "BF16", "[3]", "[0,8]") "}", 8, MBD_E_FORMAT, "'tname'"},
    {"numel overflow", "{" E("tname", "F32", "[4294967296,4294967296,16]", "[0,0]") "}", 0,
     MBD_E_FORMAT, "'tname': tensor element count overflows"},
    {"nbytes overflow", "{" E("tname", "I64", "[4611686018427387904]", "[0,0]") "}", 0,
     MBD_E_FORMAT, "'tname': tensor byte size overflows"},
    {"wrapping product", "{" E("tname", "F32", "[4611686018427387904,4]", "[0,0]") "}", 0,
     MBD_E_FORMAT, "overflows"},
    {"overlap", "{" E("ta", "F32", "[2]", "[0,8]") "," E("tb", "F32", "[2]", "[4,12]") "}", 12,
     MBD_E_FORMAT, "'tb' (bytes 4..12) overlaps tensor 'ta' (bytes 0..8)"},
    {"overlap reversed order", "{" E("tb", "F32", "[2]", "[4,12]") "," E("ta", "F32", "[2]", "[0,8]") "}",
     12, MBD_E_FORMAT, "overlaps"},
    {"same range", "{" E("ta", "F32", "[2]", "[0,8]") "," E("tb", "F32", "[2]", "[0,8]") "}", 8,
     MBD_E_FORMAT, "overlaps"},
    {"zero-size inside another", "{" E("ta", "F32", "[2]", "[0,8]") "," E("tz", "F32", "[0]", "[4,4]") "}",
     8, MBD_E_FORMAT, "'tz'"},
    {"contained", "{" E("ta", "F32", "[4]", "[0,16]") "," E("tb", "F32", "[1]", "[4,8]") "}", 16,
     MBD_E_FORMAT, "overlaps"},
    {"duplicate names", "{" E("tdup", "F32", "[1]", "[0,4]") "," E("tdup", "F32", "[1]", "[4,8]") "}",
     8, MBD_E_FORMAT, "duplicate"},
    {"metadata not object", "{\"__metadata__\":[\"a\"]}", 0, MBD_E_FORMAT, "'__metadata__'"},
    {"metadata string", "{\"__metadata__\":\"pt\"}", 0, MBD_E_FORMAT, "'__metadata__'"},
    {"metadata int value", "{\"__metadata__\":{\"format\":1}}", 0, MBD_E_FORMAT,
     "'__metadata__' key 'format'"},
    {"metadata null value", "{\"__metadata__\":{\"k\":null}}", 0, MBD_E_FORMAT, "'k'"},
    {"metadata nested", "{\"__metadata__\":{\"k\":{}}}", 0, MBD_E_FORMAT, "'k'"},
    {"embedded NUL in key", "{\"a\\u0000b\":{}}", 0, MBD_E_FORMAT, "not valid JSON"},
    {"control char name shown escaped", "{\"t\\u0001x\":5}", 0, MBD_E_FORMAT, "'t\\x01x'"},
};

static void test_broken_corpus(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case *c = &k_bad[i];
    size_t len;
    uint8_t *b = image(c->hdr, c->data_len, &len);
    mbd_error err = {0};
    int rc = parse_copy(b, len, &err);
    if (rc != c->code || err.code != c->code || !strstr(err.msg, "corpus.safetensors") ||
        !strstr(err.msg, c->needle))
      fail_msg("case '%s': rc %d (want %d), msg: %s (want '%s')", c->what, rc, c->code, err.msg,
               c->needle);
    free(b);
  }
}

/* Raw framing errors: short files, header length past the end or absurd. */
static void test_framing(void **state) {
  (void)state;
  mbd_error err = {0};
  uint8_t b[32] = {0};
  for (size_t n = 0; n < 8; n++) {
    assert_int_equal(parse_copy(b, n, &err), MBD_E_FORMAT);
    assert_non_null(strstr(err.msg, "shorter than the 8-byte header"));
  }
  assert_int_equal(mbd_safetensors_parse(NULL, 0, "nul", &(mbd_safetensors *){NULL}, &err),
                   MBD_E_FORMAT);
  /* Length 3 with only 2 header bytes present. */
  b[0] = 3;
  memcpy(b + 8, "{}", 2);
  assert_int_equal(parse_copy(b, 10, &err), MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "runs past the end"));
  /* Absurd lengths: the limit + 1, 2^63, 2^64 - 1 (must not wrap when adding 8). */
  const uint64_t big[] = {(uint64_t)MBD_ST_MAX_HEADER + 1, 1ull << 63, ~0ull};
  for (size_t i = 0; i < 3; i++) {
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)(big[i] >> (8 * k));
    assert_int_equal(parse_copy(b, sizeof b, &err), MBD_E_TOO_LARGE);
    assert_non_null(strstr(err.msg, "corpus.safetensors"));
  }
  /* Exactly at the limit but past the end: FORMAT, not a 100 MB read. */
  for (int k = 0; k < 8; k++) b[k] = (uint8_t)((uint64_t)MBD_ST_MAX_HEADER >> (8 * k));
  assert_int_equal(parse_copy(b, sizeof b, &err), MBD_E_FORMAT);
}

/* Well-formed edge cases that must load. */
static void test_valid_edges(void **state) {
  (void)state;
  static const struct {
    const char *hdr;
    size_t data_len;
    size_t count;
  } ok[] = {
      {"{}", 0, 0},
      {"{}       ", 0, 0},                           /* padding */
      {"{\"__metadata__\":{}}", 0, 0},
      {"{" E("a", "F32", "[1]", "[0,4]") "}", 8, 1}, /* trailing unused data */
      {"{" E("a", "F32", "[1]", "[4,8]") "}", 8, 1}, /* leading gap */
      {"{" E("z1", "F32", "[0]", "[0,0]") "," E("z2", "BF16", "[3,0]", "[0,0]") "," E("a", "F32", "[1]", "[0,4]") "}",
       4, 3},
      {"{" E("b", "F32", "[1]", "[4,8]") "," E("a", "F32", "[1]", "[0,4]") "}", 8, 2}, /* unsorted */
      {"{" E("m", "F16", "[1,1,1,1,1,1,1,2]", "[0,4]") "}", 4, 1}, /* 8 dims */
      {"{" E("", "F32", "[]", "[0,4]") "}", 4, 1},                /* empty name */
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    size_t len;
    uint8_t *b = image(ok[i].hdr, ok[i].data_len, &len);
    mbd_safetensors *st = NULL;
    mbd_error err = {0};
    int rc = mbd_safetensors_parse(b, len, "ok", &st, &err);
    if (rc) fail_msg("valid case %zu rejected: %s", i, err.msg);
    assert_int_equal(mbd_safetensors_count(st), ok[i].count);
    for (size_t j = 1; j < ok[i].count; j++)
      assert_true((const uint8_t *)mbd_safetensors_at(st, j - 1)->data <=
                  (const uint8_t *)mbd_safetensors_at(st, j)->data);
    mbd_safetensors_destroy(&st);
    free(b);
  }
}

/* Every strict prefix of a good file is rejected (never read past its end),
 * through the in-memory parser and, for a few lengths, through open(). */
static void test_truncations(void **state) {
  (void)state;
  char path[128], cut[128];
  snprintf(path, sizeof path, "%s/trunc.safetensors", g_dir);
  snprintf(cut, sizeof cut, "%s/cut.safetensors", g_dir);
  write_sample(path);
  size_t len;
  uint8_t *b = read_file(path, &len);
  mbd_error err = {0};
  assert_int_equal(parse_copy(b, len, &err), MBD_OK);
  for (size_t n = 0; n < len; n++) {
    int rc = parse_copy(b, n, &err);
    if (rc != MBD_E_FORMAT) fail_msg("prefix of %zu/%zu bytes: rc %d (%s)", n, len, rc, err.msg);
  }
  const size_t lens[] = {0, 7, 8, 9, len / 2, len - 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    FILE *f = fopen(cut, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, lens[i], f), lens[i]);
    fclose(f);
    mbd_safetensors *st = NULL;
    assert_int_equal(mbd_safetensors_open(cut, &st, &err), MBD_E_FORMAT);
    assert_null(st);
    assert_non_null(strstr(err.msg, cut));
  }
  unlink(cut);
  free(b);
}

/* Every single-bit flip of a good file: an error or a consistent result,
 * never a crash or an out-of-bounds pointer (ASan build). */
static void test_bit_flips(void **state) {
  (void)state;
  char path[128];
  snprintf(path, sizeof path, "%s/flip.safetensors", g_dir);
  write_sample(path);
  size_t len;
  uint8_t *b = read_file(path, &len);
  size_t accepted = 0;
  for (size_t i = 0; i < len; i++) {
    for (int bit = 0; bit < 8; bit++) {
      b[i] ^= (uint8_t)(1u << bit);
      uint8_t *c = malloc(len);
      memcpy(c, b, len);
      mbd_safetensors *st = NULL;
      mbd_error err = {0};
      int rc = mbd_safetensors_parse(c, len, "flip", &st, &err);
      if (!rc) {
        accepted++;
        for (size_t k = 0; k < mbd_safetensors_count(st); k++) {
          const mbd_st_entry *e = mbd_safetensors_at(st, k);
          assert_true((const uint8_t *)e->data >= c && (const uint8_t *)e->data + e->nbytes <= c + len);
        }
      } else {
        assert_true(err.msg[0] != '\0');
      }
      mbd_safetensors_destroy(&st);
      free(c);
      b[i] ^= (uint8_t)(1u << bit);
    }
  }
  /* Flips inside tensor data (and some in names) keep the file valid. */
  assert_true(accepted >= 48 * 8);
  free(b);
}

static void test_open_errors(void **state) {
  (void)state;
  mbd_safetensors *st = (mbd_safetensors *)1;
  mbd_error err = {0};
  assert_int_equal(mbd_safetensors_open("/nonexistent/x.safetensors", &st, &err), MBD_E_IO);
  assert_null(st);
  assert_non_null(strstr(err.msg, "/nonexistent/x.safetensors"));
  assert_int_equal(mbd_safetensors_open(g_dir, &st, &err), MBD_E_IO);
  assert_non_null(strstr(err.msg, "not a regular file"));
  assert_int_equal(mbd_safetensors_count(NULL), 0);
  assert_null(mbd_safetensors_find(NULL, "x"));
  assert_null(mbd_safetensors_metadata(NULL, "x"));
}

/* ---- checkpoint directories (mbd_st_dir) ---- */

static char g_ck[128]; /* g_dir/ck: one checkpoint directory per case */

static void ck_clear(void) {
  DIR *d = opendir(g_ck);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_ck, de->d_name);
    unlink(p);
  }
  if (d) closedir(d);
}

static void ck_begin(void) {
  snprintf(g_ck, sizeof g_ck, "%s/ck", g_dir);
  mkdir(g_ck, 0700);
  ck_clear();
}

static void ck_end(void) {
  ck_clear();
  rmdir(g_ck);
}

static void ck_text(const char *file, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_ck, file);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

/* A shard holding tensors named in a comma-separated list: "a" f32 [2,3]
 * (g_f32), "b" bf16 [5] (g_bf16), anything else f16 [3] (g_f16). */
static void ck_shard(const char *file, const char *names) {
  mbd_st_writer *w = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_st_writer_new(&w, &err), MBD_OK);
  char list[128], *save = NULL;
  snprintf(list, sizeof list, "%s", names);
  for (char *n = strtok_r(list, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    mbd_tensor_desc d;
    const void *data = g_f16;
    if (!strcmp(n, "a")) {
      assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F32, 2, (int64_t[]){2, 3}, &err), 0);
      data = g_f32;
    } else if (!strcmp(n, "b")) {
      assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_BF16, 1, (int64_t[]){5}, &err), 0);
      data = g_bf16;
    } else {
      assert_int_equal(mbd_tensor_desc_make(&d, MBD_DTYPE_F16, 1, (int64_t[]){3}, &err), 0);
    }
    assert_int_equal(mbd_st_writer_add(w, n, &d, data, &err), MBD_OK);
  }
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_ck, file);
  assert_int_equal(mbd_st_writer_write(w, p, &err), MBD_OK);
  mbd_st_writer_destroy(&w);
}

static void test_dir_single(void **state) {
  (void)state;
  ck_begin();
  mbd_st_dir *d = (mbd_st_dir *)1;
  mbd_error err = {0};
  assert_int_equal(mbd_st_dir_open(g_ck, &d, &err), MBD_E_IO); /* empty directory */
  assert_null(d);
  assert_non_null(strstr(err.msg, "model.safetensors"));
  ck_shard("model.safetensors", "a,b");
  assert_int_equal(mbd_st_dir_open(g_ck, &d, &err), MBD_OK);
  assert_int_equal(mbd_st_dir_shards(d), 1);
  const mbd_st_entry *e = NULL;
  assert_int_equal(mbd_st_dir_get_float(d, "a", 2, (int64_t[]){2, 3}, &e, &err), MBD_OK);
  check_entry(e, "a", MBD_DTYPE_F32, 2, (int64_t[]){2, 3}, g_f32, 24);
  assert_int_equal(mbd_st_dir_get_float(d, "a", 2, (int64_t[]){3, 2}, &e, &err), MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "config says"));
  assert_int_equal(mbd_st_dir_get_float(d, "zz", 1, (int64_t[]){1}, &e, &err), MBD_E_NOT_FOUND);
  assert_non_null(strstr(err.msg, "tensor zz is missing"));
  float *v = NULL;
  size_t n = 0;
  assert_int_equal(mbd_st_dir_read_f32(d, "b", 1, (int64_t[]){5}, &v, &n, &err), MBD_OK);
  assert_int_equal(n, 5);
  assert_true(v[0] == 1.0f && v[1] == -1.0f && isnan(v[2]));
  free(v);
  mbd_st_dir_destroy(&d);
  assert_null(d);
  mbd_st_dir_destroy(&d); /* NULL-safe */
  ck_end();
}

static void test_dir_sharded(void **state) {
  (void)state;
  ck_begin();
  ck_shard("m-1.safetensors", "a,c");
  ck_shard("m-2.safetensors", "b");
  ck_shard("model.safetensors", "a"); /* the index wins over a stray single file */
  ck_text("model.safetensors.index.json",
          "{\"metadata\": {\"total_size\": 40}, \"weight_map\": {\"a\": \"m-1.safetensors\", "
          "\"b\": \"m-2.safetensors\", \"c\": \"m-1.safetensors\"}}");
  mbd_st_dir *d = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_st_dir_open(g_ck, &d, &err), MBD_OK);
  assert_int_equal(mbd_st_dir_shards(d), 2);
  check_entry(mbd_st_dir_find(d, "a"), "a", MBD_DTYPE_F32, 2, (int64_t[]){2, 3}, g_f32, 24);
  check_entry(mbd_st_dir_find(d, "b"), "b", MBD_DTYPE_BF16, 1, (int64_t[]){5}, g_bf16, 10);
  check_entry(mbd_st_dir_find(d, "c"), "c", MBD_DTYPE_F16, 1, (int64_t[]){3}, g_f16, 6);
  assert_null(mbd_st_dir_find(d, "d"));
  assert_float_equal(mbd_st_entry_f32(mbd_st_dir_find(d, "c"), 0), 1.0f, 0.0f);
  mbd_st_dir_destroy(&d);
  ck_end();
}

/* Each malformed index: its error code and a word of its message. */
static void test_dir_bad_index(void **state) {
  (void)state;
  static const struct {
    const char *index, *code_word;
    int code;
  } cases[] = {
      {"{\"weight_map\": ", "not JSON", MBD_E_FORMAT},
      {"[1, 2]", "not a JSON object", MBD_E_FORMAT},
      {"{\"metadata\": {}}", "no weight_map", MBD_E_FORMAT},
      {"{\"weight_map\": [\"s1.safetensors\"]}", "not an object", MBD_E_FORMAT},
      {"{\"weight_map\": {}}", "empty", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": 7}}", "an integer", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"../s1.safetensors\"}}", "file name", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"sub/s1.safetensors\"}}", "file name", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"\"}}", "file name", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"a\": \"s1.safetensors\"}}", "duplicate",
       MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"missing.safetensors\"}}", "missing.safetensors", MBD_E_IO},
      {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"x\": "
       "\"s2.safetensors\", \"q\": \"s2.safetensors\"}}",
       "does not hold it", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"s1.safetensors\"}}", "does not list", MBD_E_FORMAT},
      {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"y\": "
       "\"s3.safetensors\"}}",
       "another shard", MBD_E_FORMAT}, /* s3 holds a too */
      {"{\"weight_map\": {\"a\": \"bad.safetensors\"}}", "bad.safetensors", MBD_E_FORMAT},
  };
  ck_begin();
  ck_shard("s1.safetensors", "a,b");
  ck_shard("s2.safetensors", "x");
  ck_shard("s3.safetensors", "a,y");
  ck_text("bad.safetensors", "\x10\0\0\0\0\0\0\0{not json}");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_text("model.safetensors.index.json", cases[i].index);
    mbd_st_dir *d = (mbd_st_dir *)1;
    mbd_error err = {0};
    int rc = mbd_st_dir_open(g_ck, &d, &err);
    if (rc != cases[i].code || !strstr(err.msg, cases[i].code_word))
      fail_msg("case %zu (%s): rc %d, message '%s'", i, cases[i].index, rc, err.msg);
    assert_null(d);
  }
  /* The good index over the same shards opens. */
  ck_text("model.safetensors.index.json",
          "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"x\": "
          "\"s2.safetensors\"}}");
  mbd_st_dir *d = NULL;
  mbd_error err = {0};
  assert_int_equal(mbd_st_dir_open(g_ck, &d, &err), MBD_OK);
  assert_int_equal(mbd_st_dir_shards(d), 2);
  mbd_st_dir_destroy(&d);
  ck_end();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_exact_layout),
      cmocka_unit_test(test_writer_errors), cmocka_unit_test(test_fixtures),
      cmocka_unit_test(test_broken_corpus), cmocka_unit_test(test_framing),
      cmocka_unit_test(test_valid_edges),   cmocka_unit_test(test_truncations),
      cmocka_unit_test(test_bit_flips),     cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_dir_single),    cmocka_unit_test(test_dir_sharded),
      cmocka_unit_test(test_dir_bad_index),
  };
  return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
