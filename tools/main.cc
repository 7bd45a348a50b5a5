// deltacast: lossless BF16 delta broadcast for RL rollout fleets.
#include <malloc.h>

#include "commands.h"
#include "deltacast/transport/host.h"

int main(int argc, char** argv) {
  // Every version allocates buffers of the same few sizes (chunk payloads, decode scratch) and
  // frees them. By default glibc maps blocks above 128 KiB on their own and unmaps them when
  // freed, so each version faults its buffers in again, page by page: about half of an anchor's
  // encode time on a VM (docs/BENCHMARKS.md, "Anchors"). Kept in the heap instead: only blocks
  // of 64 MiB or more (images) are mapped on their own, and the heap gives memory back to the
  // kernel only when more than 1 GiB at its top is free.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"deltacast: lossless BF16 weight-delta codec and broadcast runtime for RL rollout fleets"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deltacast 0.1.0");
  using namespace deltacast::tools;
  deltacast::transport::log_to_stderr();  // stdout is for reports
  const std::vector<Command> commands = {add_gen_command(app), add_encode_command(app), add_decode_command(app),
                                         add_inspect_command(app), add_bench_command(app),   add_bench_worker_command(app), add_publish_command(app),
                                         add_relay_command(app),   add_worker_command(app),  add_keygen_command(app),
                                         add_status_command(app),  add_net_bench_command(app), add_fleet_init_command(app),
                                         add_plan_command(app), add_sim_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 1;
}
