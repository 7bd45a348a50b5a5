// How many connections a striped parent link deals to (docs/RUNTIME.md, "Links that size
// themselves"). One TCP connection carries at most its window per round trip; a link whose
// bandwidth-delay product is several windows needs several. The parent measures the link and
// doubles its connections while that adds throughput: every sample (kSampleMs) it looks at what
// the connections dealt to did since the last one, and when they were busy (they had data
// waiting to go), the link is longer than a LAN (its smallest round trip at least kLanRttUs) and
// all of them are there, it tries twice as many, up to the child's ceiling. A trial lasts a few
// round trips (the new connections' slow start) from when they are all there; it is kept if
// the busy link then carries at least kGainMin times what it did, else the link goes back and
// does not try again for kHoldMs. A link on a LAN, or one that the network (not the window) limits, so stays where it
// is. The transport feeds it the kernel's counters (zmq_sizing.cc), the simulator its model's.
#pragma once

#include <algorithm>
#include <cstdint>

namespace deltacast::runtime {

// What a link's connections dealt to did over one sample period.
struct LinkSample {
  std::uint64_t busy_us = 0;     // summed over the connections: time with data waiting to go
  std::uint64_t acked_bytes = 0; // bytes the child acknowledged
  std::uint32_t min_rtt_us = 0;  // the smallest round trip any of them has seen (0: unknown)
  std::uint32_t connections = 0; // how many of those dealt to are there
};

class LinkSizing {
 public:
  static constexpr std::uint64_t kSampleMs = 500;
  static constexpr std::uint32_t kLanRttUs = 2000;
  static constexpr double kBusyMin = 0.5;  // of the period, per connection
  static constexpr double kGainMin = 1.1;
  static constexpr std::uint64_t kTrialMsMin = 2000, kTrialMsMax = 10000, kTrialRtts = 20;
  static constexpr std::uint64_t kHoldMs = 60000;
  static constexpr std::uint64_t kTrialWaitMs = 30000;  // for the trial's connections to come up

  // From `start` connections (those the child opens on its own) up to `ceiling`.
  explicit LinkSizing(std::uint32_t ceiling = 1, std::uint32_t start = 1)
      : ceiling_(std::max<std::uint32_t>(ceiling, 1)), wanted_(std::clamp<std::uint32_t>(start, 1, ceiling_)) {}

  std::uint32_t wanted() const { return wanted_; }
  std::uint32_t ceiling() const { return ceiling_; }
  bool trying() const { return trial_; }
  std::uint64_t trials() const { return trials_; }
  std::uint64_t trials_kept() const { return kept_; }
  // When the next sample is due (the first: kSampleMs after start()).
  std::uint64_t next_sample_ms() const { return last_ms_ + kSampleMs; }
  void start(std::uint64_t now_ms) { last_ms_ = now_ms; }

  // One period's figures; true when wanted() changed.
  bool sample(std::uint64_t now_ms, const LinkSample& s) {
    const std::uint64_t period_ms = now_ms > last_ms_ ? now_ms - last_ms_ : 0;
    last_ms_ = now_ms;
    if (period_ms == 0) return false;
    const double rate = static_cast<double>(s.acked_bytes) / static_cast<double>(period_ms);  // bytes per ms
    const bool busy = s.connections > 0 && static_cast<double>(s.busy_us) >= kBusyMin * 1000.0 * static_cast<double>(period_ms) * s.connections;
    if (trial_) {
      // The trial runs from when all its connections are there (the child opens them when it
      // hears of them, behind what the first connection carries), and ends with a period that
      // had data to send: one without says nothing.
      if (trial_until_ms_ == 0) {
        if (s.connections >= wanted_) trial_until_ms_ = now_ms + trial_ms_;
        else if (now_ms >= trial_deadline_ms_) return end_trial(now_ms, false);
        return false;
      }
      if (now_ms < trial_until_ms_ || !busy) return false;
      return end_trial(now_ms, rate >= kGainMin * rate_before_);
    }
    if (wanted_ >= ceiling_ || now_ms < hold_until_ms_ || !busy || s.connections < wanted_) return false;
    if (s.min_rtt_us < kLanRttUs) return false;
    rate_before_ = rate;
    trial_from_ = wanted_;
    wanted_ = std::min(ceiling_, 2 * wanted_);
    trial_ms_ = std::clamp<std::uint64_t>(kTrialRtts * s.min_rtt_us / 1000, kTrialMsMin, kTrialMsMax);
    trial_until_ms_ = 0;
    trial_deadline_ms_ = now_ms + kTrialWaitMs;
    trial_ = true;
    ++trials_;
    return true;
  }

 private:
  // Kept: the link stays at its new size; else it goes back and holds.
  bool end_trial(std::uint64_t now_ms, bool kept) {
    trial_ = false;
    if (kept) {
      ++kept_;
      return false;
    }
    wanted_ = trial_from_;
    hold_until_ms_ = now_ms + kHoldMs;
    return true;
  }

  std::uint32_t ceiling_;
  std::uint32_t wanted_;
  std::uint64_t last_ms_ = 0;
  bool trial_ = false;
  std::uint32_t trial_from_ = 1;
  double rate_before_ = 0;
  std::uint64_t trial_ms_ = 0, trial_until_ms_ = 0, trial_deadline_ms_ = 0, hold_until_ms_ = 0;
  std::uint64_t trials_ = 0, kept_ = 0;
};

}  // namespace deltacast::runtime
