/* The state image header (kernels/state_blob.h): its byte layout as
 * docs/protocol.md documents it, a round trip, and each rejection (magic,
 * version, family, shape, short buffer, position) with its error code. The
 * session blob around it is tested in test_worker_request.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/state_blob.h"

static const mbd_state_shape k_shape = {.family = MBD_STATE_FAMILY_MAMBA1,
                                        .n_layer = 2, .d_inner = 96, .d_conv = 4, .d_state = 16};

static uint32_t u32_at(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void test_layout(void **state) {
  (void)state;
  uint8_t h[MBD_STATE_IMAGE_HEADER + 1];
  memset(h, 0xee, sizeof h);
  mbd_state_image_write_header(h, &k_shape, 0x0102030405060708LL);
  assert_memory_equal(h, "MBDMSTA1", 8);
  assert_int_equal(u32_at(h + 8), 1);
  assert_int_equal(u32_at(h + 12), 2);
  assert_int_equal(u32_at(h + 16), 96);
  assert_int_equal(u32_at(h + 20), 4);
  assert_int_equal(u32_at(h + 24), 16);
  assert_int_equal(u32_at(h + 28), 0); /* Mamba-1 */
  static const uint8_t pos[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  assert_memory_equal(h + 32, pos, 8);
  assert_int_equal(h[40], 0xee); /* writes exactly the header */
}

static void test_round_trip_and_rejections(void **state) {
  (void)state;
  uint8_t h[MBD_STATE_IMAGE_HEADER];
  mbd_state_image_write_header(h, &k_shape, 12345);
  int64_t pos = -1;
  mbd_error err = {0};
  assert_int_equal(mbd_state_image_read_header(h, sizeof h, &k_shape, &pos, &err), MBD_OK);
  assert_int_equal(pos, 12345);

  assert_int_equal(mbd_state_image_read_header(h, sizeof h - 1, &k_shape, &pos, &err),
                   MBD_E_FORMAT);
  assert_int_equal(mbd_state_image_read_header(NULL, 0, &k_shape, &pos, &err), MBD_E_FORMAT);
  uint8_t bad[MBD_STATE_IMAGE_HEADER];
  memcpy(bad, h, sizeof h);
  bad[7] = '2';
  assert_int_equal(mbd_state_image_read_header(bad, sizeof bad, &k_shape, &pos, &err),
                   MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "bad magic"));
  memcpy(bad, h, sizeof h);
  bad[8] = 2;
  assert_int_equal(mbd_state_image_read_header(bad, sizeof bad, &k_shape, &pos, &err),
                   MBD_E_FORMAT);
  assert_non_null(strstr(err.msg, "version 2"));
  memcpy(bad, h, sizeof h);
  bad[28] = 1;
  assert_int_equal(mbd_state_image_read_header(bad, sizeof bad, &k_shape, &pos, &err),
                   MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "family 1"));
  mbd_state_shape other = k_shape;
  other.d_state = 8;
  assert_int_equal(mbd_state_image_read_header(h, sizeof h, &other, &pos, &err), MBD_E_SHAPE);
  assert_non_null(strstr(err.msg, "d_state=16"));
  memcpy(bad, h, sizeof h);
  bad[39] = 0x80; /* position >= 2^63 */
  assert_int_equal(mbd_state_image_read_header(bad, sizeof bad, &k_shape, &pos, &err),
                   MBD_E_FORMAT);
  assert_int_equal(pos, 12345); /* untouched by a failed read */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_round_trip_and_rejections),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
