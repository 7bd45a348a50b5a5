// Freshness (docs/RELIABILITY.md, "Freshness"): the newest timestamp statement a node holds,
// issued here (the origin signs one every timestamp_interval_ms) or from a parent (checked when
// the node verifies), and whether a version of a run may be exposed by it. The node decides
// what to do with a parent whose statement does not pass (refuse it, back off).
#pragma once

#include <optional>
#include <string>

#include "node_context.h"

namespace deltacast::runtime {

class Freshness {
 public:
  explicit Freshness(NodeContext& ctx) : ctx_(ctx) {}

  // This node checks signatures: it trusts keys, and is not a trainer shard or simulated.
  bool verifying() const;
  // Origin: signs a statement of `run` and its newest version, as of now (nothing without a
  // signing key or a run). `due` says whether timestamp_interval_ms has passed since the last.
  void issue(const RunId& run, std::uint64_t newest_version);
  bool issue_due(std::uint64_t now_ms) const { return !held_ || now_ms - issued_ms_ >= ctx_.config.timestamp_interval_ms; }
  std::uint64_t next_issue_ms() const { return held_ ? issued_ms_ + ctx_.config.timestamp_interval_ms : 0; }

  // What a parent's statement (Welcome, Heartbeat) came to.
  struct Taken {
    enum class Verdict {
      kKept,       // checked (when verifying) and kept if newer than the one held
      kMalformed,  // does not parse
      kUntrusted,  // its signature does not verify with a trusted key
      kReplay,     // names a run older than one this node knows of (`known`)
    } verdict = Verdict::kKept;
    std::string why;
    bool fresh = false;  // kKept: issued within freshness_ms_max of this node's clock
    std::optional<Timestamp> statement;
  };
  // `known`: the newest run this node holds versions of.
  Taken take(const SharedBytes& bytes, const RunId& known);

  // Whether a version of `run` may be exposed: a statement of that run no older than
  // freshness_ms_max is held (always, for a node that does not verify).
  bool fresh_for(const RunId& run) const;
  // A statement's age in ms on this node's clock (negative: from its future); 0 without a clock.
  std::int64_t age_ms(const Timestamp& t) const;
  // How old the held statement is, for a message: "12 s old", "3 s in the future", "none".
  std::string held_age() const;

  const std::optional<Timestamp>& held() const { return held_; }
  const SharedBytes& held_bytes() const { return held_bytes_; }

 private:
  bool within_bound(const Timestamp& t) const;

  NodeContext& ctx_;
  std::optional<Timestamp> held_;
  SharedBytes held_bytes_;
  std::uint64_t issued_ms_ = 0;  // origin: when it last signed one
};

}  // namespace deltacast::runtime
