#include "cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deltacast::sim {

int CpuModel::host_of(int node, int host) {
  if (cores_per_host_ == 0) return -1;  // no CPU model
  if (work_.size() <= static_cast<std::size_t>(node)) work_.resize(static_cast<std::size_t>(node) + 1);
  if (host >= 0) {
    auto [it, fresh] = shared_.emplace(host, static_cast<int>(cpus_.size()));
    if (!fresh) return it->second;
  }
  HostCpu c;
  c.cores = cores_per_host_;
  cpus_.push_back(c);
  return static_cast<int>(cpus_.size()) - 1;
}

void CpuModel::advance(HostCpu& c) {
  const double now = static_cast<double>(events_.now_us());
  if (!c.busy.empty()) {
    const double done = (now - c.updated_us) * share(c);
    for (auto [n, q] : c.busy) work_[n][q].front().left_us -= done;
  }
  c.updated_us = now;
}

void CpuModel::schedule(int h) {
  HostCpu& c = cpus_[h];
  if (c.busy.empty()) return;
  double left = std::numeric_limits<double>::infinity();
  for (auto [n, q] : c.busy) left = std::min(left, work_[n][q].front().left_us);
  const double at = c.updated_us + std::max(0.0, left) / share(c);
  events_.at(static_cast<std::uint64_t>(std::ceil(at)), *this, static_cast<std::uint64_t>(h) << 32 | (++c.schedule & 0xffffffffu));
}

void CpuModel::add(int node, int cpu, Queue q, Work w) {
  auto& queue = work_[node][q];
  if (!queue.empty()) {  // behind others: no share changes, nothing to reschedule
    queue.push_back(std::move(w));
    return;
  }
  advance(cpus_[cpu]);
  cpus_[cpu].busy.emplace_back(node, q);
  queue.push_back(std::move(w));
  schedule(cpu);
}

void CpuModel::fire(std::uint64_t key) {
  const int h = static_cast<int>(key >> 32);
  HostCpu& c = cpus_[h];
  if ((c.schedule & 0xffffffffu) != (key & 0xffffffffu)) return;  // replaced by a later schedule
  advance(c);
  // Everything done by now leaves first; then it runs, which may queue more work here.
  std::vector<std::pair<int, Work>>& done = finished_;
  done.clear();
  for (std::size_t k = 0; k < c.busy.size();) {
    auto [n, q] = c.busy[k];
    auto& queue = work_[n][q];
    if (queue.front().left_us > 1e-6) {
      ++k;
      continue;
    }
    done.emplace_back(n, std::move(queue.front()));
    queue.pop_front();
    if (!queue.empty()) {
      ++k;
    } else {
      c.busy.erase(c.busy.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  schedule(h);
  for (auto& [n, w] : done) owner_.on_work_done(n, w);
}

void CpuModel::drop(int node, int cpu) {
  HostCpu& c = cpus_[cpu];
  advance(c);
  std::erase_if(c.busy, [node](const auto& b) { return b.first == node; });
  for (auto& q : work_[node]) q.clear();
  schedule(cpu);
}

}  // namespace deltacast::sim
