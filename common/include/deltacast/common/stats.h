// Small statistics for benchmarks, probes and simulator reports: medians of timed runs,
// quantiles of delivery times.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <algorithm>
#include <cmath>
#include <vector>

namespace deltacast {

// The median (the mean of the two middle values for an even count); 0 for no values.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The q-quantile (0 <= q <= 1) by the nearest-rank rule: the smallest value at least a fraction
// q of the values are at or below; 0 for no values.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - (q > 0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace deltacast

#pragma GCC visibility pop
