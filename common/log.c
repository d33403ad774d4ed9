/* stderr logger; one write per line so lines of concurrent processes don't mix. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_level = MBD_LOG_INFO; /* process-wide verbosity, set once at start */

void mbd_log_init(void) {
  const char *v = getenv("MBD_LOG_LEVEL");
  if (!v) return;
  if (!strcmp(v, "error")) g_level = MBD_LOG_ERROR;
  else if (!strcmp(v, "warn")) g_level = MBD_LOG_WARN;
  else if (!strcmp(v, "info")) g_level = MBD_LOG_INFO;
  else if (!strcmp(v, "debug")) g_level = MBD_LOG_DEBUG;
}

void mbd_log(mbd_log_level level, const char *component, const char *fmt, ...) {
  static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if ((int)level > g_level) return;
  char line[1024];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "[%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ] %s %s[%d]: ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000, names[level], component, (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof line) n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
