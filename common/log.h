/* Minimal leveled logging to stderr:
 * "[2026-12-01T10:25:42.123Z] LEVEL component[pid]: message" (ISO-8601, UTC).
 * The level comes from MBD_LOG_LEVEL (error, warn, info, debug; default info)
 * read once by mbd_log_init; there is no other global state. */
#ifndef MBD_LOG_H
#define MBD_LOG_H

typedef enum { MBD_LOG_ERROR = 0, MBD_LOG_WARN, MBD_LOG_INFO, MBD_LOG_DEBUG } mbd_log_level;

/* Reads MBD_LOG_LEVEL; call once at process start (safe to skip: default info). */
void mbd_log_init(void);
void mbd_log(mbd_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MBD_LOGE(comp, ...) mbd_log(MBD_LOG_ERROR, comp, __VA_ARGS__)
#define MBD_LOGW(comp, ...) mbd_log(MBD_LOG_WARN, comp, __VA_ARGS__)
#define MBD_LOGI(comp, ...) mbd_log(MBD_LOG_INFO, comp, __VA_ARGS__)
#define MBD_LOGD(comp, ...) mbd_log(MBD_LOG_DEBUG, comp, __VA_ARGS__)

#endif
