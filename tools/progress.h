// A progress bar on stderr for long commands. It draws only when stderr is a terminal, redraws
// at most ten times a second, and may be updated from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace deltacast::tools {

class ProgressBar {
 public:
  ProgressBar(std::string label, std::uint64_t total, bool enabled = true);
  ~ProgressBar();
  void update(std::uint64_t done);  // absolute count; smaller values than seen before are ignored
  void finish();

 private:
  void draw(std::uint64_t done);
  std::string label_;
  std::uint64_t total_;
  bool enabled_;
  std::mutex mu_;
  std::uint64_t best_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

}  // namespace deltacast::tools
