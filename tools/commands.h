// The deltacast subcommands. Each registers its options on the CLI11 app and runs when chosen;
// errors go to stderr and become a non-zero exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

namespace deltacast::tools {

struct Command {
  CLI::App* app;              // the subcommand
  std::function<int()> run;  // runs it once parsed; returns the exit status
};
using Runner = Command;

// Each registers one subcommand.
Runner add_gen_command(CLI::App& app);
Runner add_encode_command(CLI::App& app);
Runner add_decode_command(CLI::App& app);
Runner add_inspect_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_bench_worker_command(CLI::App& app);
Runner add_publish_command(CLI::App& app);
Runner add_relay_command(CLI::App& app);
Runner add_worker_command(CLI::App& app);
Runner add_keygen_command(CLI::App& app);
Runner add_status_command(CLI::App& app);
Runner add_net_bench_command(CLI::App& app);
Runner add_fleet_init_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);
Runner add_sim_command(CLI::App& app);

// Prints "deltacast: error: <message>" on stderr and returns the exit status for failures.
int fail(const std::string& message);

}  // namespace deltacast::tools
