/* A rollout process of ten lines, built against an installed libdeltacast with nothing but
 * `pkg-config --cflags --libs deltacast` (tests/install/install_test.sh).
 * Usage: embed PARENT VERSION -> prints "version N checksum HEX" once it holds version N. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <deltacast/c/worker.h>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const char* parents[] = {argv[1]};
  dc_worker_options o = {0};
  o.node_id = "embed-c";
  o.parents = parents;
  o.parent_count = 1;
  char err[256];
  dc_worker* w = dc_worker_start(&o, err, sizeof err);
  if (!w) {
    fprintf(stderr, "start: %s\n", err);
    return 1;
  }
  dc_version* v = dc_worker_wait(w, strtoull(argv[2], NULL, 10), 60000);
  if (v) printf("libdeltacast %s: version %" PRIu64 " checksum %016" PRIx64 "\n", dc_library_version(), dc_version_number(v), dc_version_checksum(v));
  if (v) dc_version_release(v);
  dc_worker_stop(w);
  return v ? 0 : 1;
}
