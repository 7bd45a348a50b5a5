// The bounds of a node's timing and limits: one table each, read by config files (embed/), the
// C ABI and Python through them, and the simulator's scenarios.
#include "deltacast/runtime/node_types.h"

namespace deltacast::runtime {

namespace {
constexpr std::uint64_t KiB = 1024, MiB = KiB << 10, TiB = MiB << 20;
constexpr std::uint64_t kSecondMs = 1000, kDayMs = 24 * 3600 * kSecondMs;
}  // namespace

std::span<const SettingBound<Timing>> timing_bounds() {
  static const SettingBound<Timing> bounds[] = {
      DC_SETTING(Timing, "heartbeat_ms", heartbeat_ms, 1, kDayMs, false),
      DC_SETTING(Timing, "parent_timeout_ms", parent_timeout_ms, 1, kDayMs, false),
      DC_SETTING(Timing, "child_timeout_ms", child_timeout_ms, 1, kDayMs, false),
      DC_SETTING(Timing, "need_after_ms", need_after_ms, 1, kDayMs, false),
      DC_SETTING(Timing, "parent_return_ms", parent_return_ms, 0, kDayMs, false),
  };
  return bounds;
}

Status check_timing(const Timing& t) {
  DC_RETURN_IF_ERROR(check_settings(timing_bounds(), t));
  for (auto [name, ms] : {std::pair{"parent_timeout_ms", t.parent_timeout_ms}, std::pair{"child_timeout_ms", t.child_timeout_ms}})
    if (ms < 2 * t.heartbeat_ms)
      return Status::invalid_argument(std::string(name) + " (" + std::to_string(ms) + ") must be at least twice heartbeat_ms (" +
                                      std::to_string(t.heartbeat_ms) + ")");
  return Status::ok();
}

std::span<const SettingBound<NodeConfig>> node_limit_bounds() {
  static const SettingBound<NodeConfig> bounds[] = {
      DC_SETTING(NodeConfig, "image_bytes_max", manifest_limits.image_bytes_max, MiB, TiB << 10, true),
      DC_SETTING(NodeConfig, "tensors_max", manifest_limits.tensors_max, 1, kTensorsMax, false),
      DC_SETTING(NodeConfig, "chunks_max", manifest_limits.chunks_max, 1, kChunksMax, false),
      DC_SETTING(NodeConfig, "version_jump_max", version_jump_max, 1, std::uint64_t{1} << 40, false),
      DC_SETTING(NodeConfig, "versions_requested_max", versions_requested_max, 1, 4096, false),
      DC_SETTING(NodeConfig, "needs_per_s_max", needs_per_s_max, 1, 1'000'000, false),
      DC_SETTING(NodeConfig, "upstream_needs_per_s_max", upstream_needs_per_s_max, 1, 1'000'000, false),
      DC_SETTING(NodeConfig, "resends_per_chunk_max", resends_per_chunk_max, 1, 1000, false),
      DC_SETTING(NodeConfig, "corrupt_chunks_per_parent_max", corrupt_chunks_per_parent_max, 1, 1'000'000, false),
      DC_SETTING(NodeConfig, "anchor_interval_ms_min", anchor_interval_ms_min, 0, kDayMs, false),
      DC_SETTING(NodeConfig, "ledger_workers_max", ledger_workers_max, 1, 10'000'000, false),
      DC_SETTING(NodeConfig, "ledger_silent_ms_max", ledger_silent_ms_max, 60 * kSecondMs, 30 * kDayMs, false),
      DC_SETTING(NodeConfig, "child_workers_max", child_workers_max, 1, 10'000'000, false),
      DC_SETTING(NodeConfig, "run_clock_skew_ms_max", run_clock_skew_ms_max, kSecondMs, kDayMs, false),
      DC_SETTING(NodeConfig, "freshness_ms_max", freshness_ms_max, kSecondMs, kDayMs, false),
      DC_SETTING(NodeConfig, "timestamp_interval_ms", timestamp_interval_ms, 10, 60 * kSecondMs, false),
      DC_SETTING(NodeConfig, "tensor_match_ms_max", tensor_match_ms_max, 0, 60 * kSecondMs, false),
      DC_SETTING(NodeConfig, "reconnect_backoff_ms_max", reconnect_backoff_ms_max, 500, kDayMs, false),
      DC_SETTING(NodeConfig, "check_bytes_in_flight_max", check_bytes_in_flight_max, MiB, TiB, true),
      DC_SETTING(NodeConfig, "shard_stream_bytes_max", shard_stream_bytes_max, MiB, TiB, true),
  };
  return bounds;
}

}  // namespace deltacast::runtime
