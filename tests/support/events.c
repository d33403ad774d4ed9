/* Waiting on observable events (see events.h). */
#include "support/events.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

int64_t ev_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ev_nap_ms(int64_t ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

int ev_count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) n++;
  fclose(f);
  return n;
}

bool ev_wait_lines(const char *path, const char *needle, int n, int64_t timeout_ms) {
  int64_t end = ev_now_ms() + timeout_ms;
  for (;;) {
    if (ev_count_lines(path, needle) >= n) return true;
    if (ev_now_ms() > end) return false;
    ev_nap_ms(20);
  }
}
