/* Waiting on what a test can observe (a line in a log file, a condition it
 * polls) instead of sleeping: the timeouts here only guard against hangs and
 * are never a speed requirement, so a loaded machine (sanitizers, 2 cores)
 * makes a test slower, never red. */
#ifndef MBD_TEST_EVENTS_H
#define MBD_TEST_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

/* Generous guard for events that take well under a second on an idle machine. */
#define EV_HANG_MS 60000

/* Monotonic clock in milliseconds. */
int64_t ev_now_ms(void);

/* Sleeps ms milliseconds: only as the pause between two polls. */
void ev_nap_ms(int64_t ms);

/* Number of lines of the file at path that contain needle (0 when the file
 * does not exist yet). */
int ev_count_lines(const char *path, const char *needle);

/* Waits until at least n lines of path contain needle; true when they do,
 * false after timeout_ms. */
bool ev_wait_lines(const char *path, const char *needle, int n, int64_t timeout_ms);

#endif
