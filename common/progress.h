/* Progress of long work (loading or synthesising a checkpoint, a long
 * benchmark): a line every few hundred MB or every few seconds of work, and
 * nothing at all for work below a size threshold, so small models and short
 * runs (the tests) stay quiet. The sink is a callback: tools print to stderr
 * (mbd_progress_print), the worker logs through common/log. Plain data, no
 * global state; the thresholds are fields so a test can set them low. */
#ifndef MBD_PROGRESS_H
#define MBD_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One report. */
typedef struct mbd_progress_info {
  const char *what;      /* "loading /models/m", borrowed */
  const char *unit;      /* what items count ("tensors", "requests") */
  uint64_t bytes;        /* bytes done so far */
  uint64_t total_bytes;  /* bytes of the whole job; 0 when unknown */
  uint64_t items;        /* items done so far */
  uint64_t total_items;  /* items of the whole job; 0 when unknown */
  double elapsed_s;      /* since mbd_progress_begin */
  bool last;             /* the closing report (mbd_progress_end) */
} mbd_progress_info;

typedef void (*mbd_progress_fn)(void *user, const mbd_progress_info *info);

/* When to report. mbd_progress_opts_init gives the defaults below. */
typedef struct mbd_progress_opts {
  mbd_progress_fn fn;   /* NULL: never */
  void *user;           /* passed to fn */
  uint64_t min_bytes;   /* jobs of fewer total bytes report nothing */
  uint64_t every_bytes; /* a report each time this many more bytes are done; 0: never */
  double every_s;       /* or once this many seconds passed since the last; <= 0: never */
} mbd_progress_opts;

#define MBD_PROGRESS_MIN_BYTES (256ull << 20)
#define MBD_PROGRESS_EVERY_BYTES (256ull << 20)
#define MBD_PROGRESS_EVERY_S 5.0

/* fn and user as given; 256 MiB threshold, every 256 MiB or 5 s. */
void mbd_progress_opts_init(mbd_progress_opts *o, mbd_progress_fn fn, void *user);

/* The running count of one job (embed it; plain data). */
typedef struct mbd_progress {
  mbd_progress_opts o;
  mbd_progress_info info;
  bool active;             /* fn set and the job above the threshold */
  uint64_t reports;        /* reports made so far */
  uint64_t last_bytes;     /* bytes at the last report */
  double t0, last_t;       /* monotonic seconds: begin, last report */
} mbd_progress;

/* Starts a job; o may be NULL (silent). `what` and `unit` are borrowed for the
 * job's lifetime. */
void mbd_progress_begin(mbd_progress *p, const mbd_progress_opts *o, const char *what,
                        const char *unit, uint64_t total_bytes, uint64_t total_items);
/* Counts work done; reports when a byte step or the time step is reached. */
void mbd_progress_add(mbd_progress *p, uint64_t bytes, uint64_t items);
/* Ends the job: a closing report (last = true) when any report was made, so
 * work that stayed quiet stays quiet to the end. */
void mbd_progress_end(mbd_progress *p);

/* "loading DIR: 512.0 of 1434.2 MiB (36%), 96 of 290 tensors, 2.1 s" into buf
 * ("..., done in 5.3 s" for a closing report). */
void mbd_progress_format(const mbd_progress_info *info, char *buf, size_t cap);
/* A ready sink: the formatted line and '\n' to the FILE * `user` (stderr
 * when NULL). */
void mbd_progress_print(void *user, const mbd_progress_info *info);

#endif
