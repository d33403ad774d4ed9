/* Progress reports of long work (see progress.h). */
#include "common/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mbd_progress_opts_init(mbd_progress_opts *o, mbd_progress_fn fn, void *user) {
  o->fn = fn;
  o->user = user;
  o->min_bytes = MBD_PROGRESS_MIN_BYTES;
  o->every_bytes = MBD_PROGRESS_EVERY_BYTES;
  o->every_s = MBD_PROGRESS_EVERY_S;
}

void mbd_progress_begin(mbd_progress *p, const mbd_progress_opts *o, const char *what,
                        const char *unit, uint64_t total_bytes, uint64_t total_items) {
  memset(p, 0, sizeof *p);
  if (o) p->o = *o;
  p->info.what = what ? what : "";
  p->info.unit = unit ? unit : "items";
  p->info.total_bytes = total_bytes;
  p->info.total_items = total_items;
  p->active = p->o.fn && total_bytes >= p->o.min_bytes;
  p->t0 = p->last_t = p->active ? mono_s() : 0;
}

static void report(mbd_progress *p, double now, bool last) {
  p->info.elapsed_s = now - p->t0;
  p->info.last = last;
  p->o.fn(p->o.user, &p->info);
  p->reports++;
  p->last_bytes = p->info.bytes;
  p->last_t = now;
}

void mbd_progress_add(mbd_progress *p, uint64_t bytes, uint64_t items) {
  p->info.bytes += bytes;
  p->info.items += items;
  if (!p->active) return;
  double now = mono_s();
  if ((p->o.every_bytes && p->info.bytes - p->last_bytes >= p->o.every_bytes) ||
      (p->o.every_s > 0 && now - p->last_t >= p->o.every_s))
    report(p, now, false);
}

void mbd_progress_end(mbd_progress *p) {
  if (p->active && p->reports) report(p, mono_s(), true);
  p->active = false;
}

void mbd_progress_format(const mbd_progress_info *in, char *buf, size_t cap) {
  char bytes[96] = "", items[96];
  const double mib = 1048576.0;
  if (in->total_bytes)
    snprintf(bytes, sizeof bytes, "%.1f of %.1f MiB (%d%%), ", (double)in->bytes / mib,
             (double)in->total_bytes / mib,
             (int)(100.0 * (double)in->bytes / (double)in->total_bytes));
  else if (in->bytes)
    snprintf(bytes, sizeof bytes, "%.1f MiB, ", (double)in->bytes / mib);
  if (in->total_items)
    snprintf(items, sizeof items, "%llu of %llu %s, ", (unsigned long long)in->items,
             (unsigned long long)in->total_items, in->unit);
  else
    snprintf(items, sizeof items, "%llu %s, ", (unsigned long long)in->items, in->unit);
  bool complete = !in->total_items || in->items >= in->total_items;
  snprintf(buf, cap, "%s: %s%s%s%.1f s", in->what, bytes, items,
           !in->last ? "" : complete ? "done in " : "stopped after ", in->elapsed_s);
}

void mbd_progress_print(void *user, const mbd_progress_info *info) {
  char line[512];
  mbd_progress_format(info, line, sizeof line);
  FILE *f = user ? (FILE *)user : stderr;
  fprintf(f, "%s\n", line);
  fflush(f);
}
