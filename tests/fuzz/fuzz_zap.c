/* Fuzz target: the broker's ZAP decision (broker/zap.c) on arbitrary request
 * frames, and the ipc peer-credential parser (broker/caller.c).
 *
 * Input layout: frames as [u8 length][bytes] (a length past the end takes the
 * rest), at most 16. Invariants: a verdict is 200, 400 or 500; 200 only for
 * mechanism CURVE with a 32-byte key listed for the domain, and then the
 * user id is "key:" or "op:" + that key; a parsed peer address has a uid
 * whose decimal form ends the id. */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "broker/caller.h"
#include "broker/zap.h"
#include "mbd_fuzz.h"

static mbd_zap_keys *g_keys;
static uint8_t g_raw[32]; /* the admitted client key, raw */

static void init_once(void) {
  if (g_keys) return;
  MBD_FUZZ_CHECK(mbd_zap_keys_new(&g_keys, NULL) == 0);
  for (int i = 0; i < 32; i++) g_raw[i] = (uint8_t)(i * 7 + 1);
  char z[MBD_CURVE_KEY_LEN + 1];
  MBD_FUZZ_CHECK(zmq_z85_encode(z, g_raw, 32) != NULL);
  MBD_FUZZ_CHECK(mbd_zap_keys_add(g_keys, MBD_ZAP_CLIENTS, z, NULL) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init_once();
  const uint8_t *fr[16];
  size_t len[16], n = 0, at = 0;
  while (at < size && n < 16) {
    size_t l = data[at++];
    if (l > size - at) l = size - at;
    fr[n] = data + at;
    len[n++] = l;
    at += l;
  }
  mbd_zap_verdict v;
  mbd_zap_decide(g_keys, fr, len, n, &v);
  MBD_FUZZ_CHECK(!strcmp(v.status, "200") || !strcmp(v.status, "400") || !strcmp(v.status, "500"));
  MBD_FUZZ_CHECK(v.ok == !strcmp(v.status, "200"));
  if (v.ok) {
    MBD_FUZZ_CHECK(n == 7 && len[6] == 32 && len[5] == 5 && !memcmp(fr[5], "CURVE", 5));
    MBD_FUZZ_CHECK(!memcmp(fr[6], g_raw, 32));
    MBD_FUZZ_CHECK(!strncmp(v.user_id, "key:", 4) && !strcmp(v.user_id + 4, v.key));
  } else {
    MBD_FUZZ_CHECK(v.user_id[0] == '\0');
  }
  /* The same bytes as a Peer-Address string. */
  char pa[300];
  size_t m = size < sizeof pa - 1 ? size : sizeof pa - 1;
  if (m) memcpy(pa, data, m);
  pa[m] = '\0';
  mbd_bcaller c;
  if (mbd_bcaller_parse_peer(pa, &c)) {
    char want[32];
    snprintf(want, sizeof want, "uid:%u", c.uid);
    MBD_FUZZ_CHECK(c.has_uid && !strcmp(c.id, want));
  }
  return 0;
}

static uint8_t g_seed[2][128];

size_t mbd_fuzz_seeds(const mbd_fuzz_seed **out) {
  static mbd_fuzz_seed seeds[2];
  const char *f[6] = {"1.0", "1", "clients", "127.0.0.1", "", "CURVE"};
  for (int s = 0; s < 2; s++) {
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
      size_t l = strlen(f[i]);
      g_seed[s][at++] = (uint8_t)l;
      memcpy(g_seed[s] + at, f[i], l);
      at += l;
    }
    g_seed[s][at++] = 32;
    for (int i = 0; i < 32; i++) g_seed[s][at++] = s ? (uint8_t)i : (uint8_t)(i * 7 + 1);
    seeds[s].data = g_seed[s];
    seeds[s].len = at;
  }
  *out = seeds;
  return 2;
}
