#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace deltacast::tools {

ProgressBar::ProgressBar(std::string label, std::uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled && isatty(STDERR_FILENO)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(std::uint64_t done) {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (finished_ || done < best_) return;
  best_ = done;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
  last_draw_ = now;
  draw(done);
}

void ProgressBar::draw(std::uint64_t done) {
  constexpr int kWidth = 30;
  double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  int filled = static_cast<int>(frac * kWidth);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double eta = frac > 0 ? secs * (1 - frac) / frac : 0;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r%-12s [%s] %5.1f%%  %6.1fs elapsed, %6.1fs left ", label_.c_str(), bar.c_str(), frac * 100, secs, eta);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  draw(total_);
  std::fputc('\n', stderr);
}

}  // namespace deltacast::tools
