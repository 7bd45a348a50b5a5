// deltacast: lossless BF16 delta broadcast for RL rollout fleets.
#include "commands.h"
#include "deltacast/transport/host.h"

int main(int argc, char** argv) {
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
