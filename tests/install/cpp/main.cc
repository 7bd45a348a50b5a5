// A rollout process in C++, built against an installed libdeltacast with find_package(deltacast)
// (tests/install/install_test.sh). Usage: embed_cpp PARENT VERSION
#include <cinttypes>
#include <cstdio>
#include <string>

#include <deltacast/embed/worker.h>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  deltacast::embed::WorkerOptions o;
  o.node.node_id = "embed-cpp";
  o.node.parents = {argv[1]};
  auto w = deltacast::embed::Worker::start(std::move(o));
  if (!w.is_ok()) {
    std::fprintf(stderr, "start: %s\n", w.status().to_string().c_str());
    return 1;
  }
  auto v = (*w)->wait_for_version(std::stoull(argv[2]), 60000);
  if (v) std::printf("version %" PRIu64 " checksum %016" PRIx64 ", %zu tensors\n", v->version, v->checksum, v->tensors.size());
  (void)(*w)->stop(false);
  return v ? 0 : 1;
}
