// A striped link's messages back in the order the parent sent them (docs/RUNTIME.md, "Striped
// links"). The parent numbers every message of one stream from 1 and sends each on whichever
// of the link's connections has room; each connection keeps its own order, so a message can
// only arrive early, never late, unless a connection died with messages on it. Held messages
// are bounded by `held_bytes_max`; a gap that outlives `gap_timeout_ms` or would hold more is
// given up, and what was held goes on in order (the node asks again for what it misses, as
// after any lost connection).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace deltacast::transport {

template <typename T>
class Reorder {
 public:
  Reorder(std::uint64_t held_bytes_max, std::uint64_t gap_timeout_ms) : held_bytes_max_(held_bytes_max), gap_timeout_ms_(gap_timeout_ms) {}

  // Message `seq` of `stream`, `bytes` large: appends to `out` every message now in order.
  void add(std::uint64_t stream, std::uint64_t seq, T message, std::uint64_t bytes, std::uint64_t now_ms, std::vector<T>& out) {
    if (stream != stream_) {  // a new stream (the parent took the child again): what was held goes first
      release_all(out);
      stream_ = stream;
      next_ = 1;
    }
    if (seq < next_) {  // behind a gap already given up on: late, but not lost
      out.push_back(std::move(message));
      return;
    }
    if (seq > next_) {
      if (held_.empty()) gap_since_ms_ = now_ms;
      if (!held_.emplace(seq, std::make_pair(std::move(message), bytes)).second) return;  // a number sent twice: the first stands
      held_bytes_ += bytes;
      while (held_bytes_ > held_bytes_max_) skip_gap(out, now_ms);
      return;
    }
    out.push_back(std::move(message));
    ++next_;
    release_in_order(out, now_ms);
  }

  // Gives up on a gap older than the timeout: appends what was held, in order.
  void expire(std::uint64_t now_ms, std::vector<T>& out) {
    if (!held_.empty() && now_ms - gap_since_ms_ >= gap_timeout_ms_) skip_gap(out, now_ms);
  }

  std::uint64_t held_bytes() const { return held_bytes_; }
  std::size_t held() const { return held_.size(); }
  std::uint64_t gaps_skipped() const { return gaps_skipped_; }

 private:
  void release_in_order(std::vector<T>& out, std::uint64_t now_ms) {
    while (!held_.empty() && held_.begin()->first == next_) {
      take_first(out);
      ++next_;
    }
    gap_since_ms_ = now_ms;  // a gap still open starts counting now
  }
  // The messages before the first held one are not coming: go on from it.
  void skip_gap(std::vector<T>& out, std::uint64_t now_ms) {
    ++gaps_skipped_;
    next_ = held_.begin()->first;
    release_in_order(out, now_ms);
  }
  void release_all(std::vector<T>& out) {
    if (!held_.empty()) ++gaps_skipped_;
    while (!held_.empty()) take_first(out);
  }
  void take_first(std::vector<T>& out) {
    auto it = held_.begin();
    held_bytes_ -= it->second.second;
    out.push_back(std::move(it->second.first));
    held_.erase(it);
  }

  const std::uint64_t held_bytes_max_, gap_timeout_ms_;
  std::uint64_t stream_ = 0, next_ = 1, held_bytes_ = 0, gap_since_ms_ = 0, gaps_skipped_ = 0;
  std::map<std::uint64_t, std::pair<T, std::uint64_t>> held_;
};

}  // namespace deltacast::transport
