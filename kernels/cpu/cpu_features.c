/* Placeholder replaced by the CPU backend. */
#include "common/status.h"
int mbd_cpu_placeholder(void);
int mbd_cpu_placeholder(void) { return MBD_OK; }
