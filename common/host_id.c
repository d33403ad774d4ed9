/* Host id for same-host detection. See host_id.h. */
#include "common/host_id.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void mbd_host_id_get(char *buf, size_t cap) {
  FILE *f = fopen("/etc/machine-id", "r");
  if (f) {
    char line[128] = "";
    if (fgets(line, sizeof line, f)) line[strcspn(line, "\r\n")] = '\0';
    fclose(f);
    if (line[0]) {
      snprintf(buf, cap, "%s", line);
      return;
    }
  }
  char host[128] = "unknown-host";
  if (gethostname(host, sizeof host) == 0) host[sizeof host - 1] = '\0';
  snprintf(buf, cap, "%s", host);
}
