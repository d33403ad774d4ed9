/* Session export blob: the format and its functions live with the state
 * image they wrap, in kernels/state_blob.h (one owner); this header keeps the
 * worker's include path. */
#ifndef MBD_WORKER_STATE_BLOB_H
#define MBD_WORKER_STATE_BLOB_H

#include "kernels/state_blob.h"

#endif
