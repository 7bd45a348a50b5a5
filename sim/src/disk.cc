#include "deltacast/sim/disk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace deltacast::sim {

using runtime::OwnedBlob;
using runtime::SharedBytes;

SimDisk::SimDisk(std::string name, const runtime::Clock& clock, std::uint64_t seed, double write_bytes_per_s, std::uint64_t capacity_bytes)
    : name_(std::move(name)), clock_(clock), rng_(seed), write_bytes_per_s_(write_bytes_per_s), capacity_bytes_(capacity_bytes) {}

Status SimDisk::open(const std::string&) { return Status::ok(); }  // one process per disk: nobody to lock out

void SimDisk::settle() const {
  const double now = static_cast<double>(clock_.now_us());
  while (!pending_.empty() && pending_.front().end_us <= now) {
    Op& op = pending_.front();
    if (op.write) durable_[op.name] = std::move(op.durable);
    else durable_.erase(op.name);
    pending_.pop_front();
  }
}

std::uint64_t SimDisk::used_bytes() const {
  std::uint64_t used = 0;
  for (const auto& [name, f] : view_) used += f.bytes->size();
  return used;
}

std::vector<runtime::StoredFile> SimDisk::list() const {
  std::vector<runtime::StoredFile> out;
  for (const auto& [name, f] : view_) out.push_back({name, f.bytes->size()});
  return out;
}

Status SimDisk::write(const std::string& name, std::span<const ByteSpan> parts, bool) {
  std::uint64_t size = 0;
  for (const ByteSpan& p : parts) size += p.size();
  const auto it = view_.find(name);
  const std::uint64_t replaced = it == view_.end() ? 0 : it->second.bytes->size();
  if (full_ || used_bytes() - replaced + size > capacity_bytes_) {
    stats_.writes_refused_full++;
    return Status::resource_exhausted("cannot write " + where() + "/" + name + ": No space left on device");
  }
  Bytes bytes;
  bytes.reserve(size);
  for (const ByteSpan& p : parts) bytes.insert(bytes.end(), p.begin(), p.end());
  Op op;
  op.name = name;
  if (torn_) {
    Bytes cut = bytes;
    std::fill(cut.begin() + static_cast<std::ptrdiff_t>(cut.size() / 2), cut.end(), std::uint8_t{0});
    op.durable = File{std::make_shared<const OwnedBlob>(std::move(cut)), /*intact=*/false};
    stats_.torn_writes++;
  }
  File seen{std::make_shared<const OwnedBlob>(std::move(bytes)), true};
  if (!torn_) op.durable = seen;
  const double now = static_cast<double>(clock_.now_us());
  op.start_us = std::max(now, busy_until_us_);
  op.end_us = op.start_us + static_cast<double>(size) / write_bytes_per_s_ * 1e6 * slowdown_;
  busy_until_us_ = op.end_us;
  view_[name] = std::move(seen);
  pending_.push_back(std::move(op));
  stats_.writes++;
  settle();
  return Status::ok();
}

Result<SharedBytes> SimDisk::read(const std::string& name, std::uint64_t bytes_max) const {
  const auto it = view_.find(name);
  if (it == view_.end()) return Status::not_found(where() + "/" + name + ": not there");
  const SharedBytes& bytes = it->second.bytes;
  if (bytes->size() > bytes_max)
    return Status::corruption(where() + "/" + name + ": " + std::to_string(bytes->size()) + " bytes, larger than it can be (" + std::to_string(bytes_max) + ")");
  if (!corrupt_reads_ || bytes->size() == 0 || rng_() % 2 == 0) return bytes;
  Bytes copy(bytes->data(), bytes->data() + bytes->size());
  copy[rng_() % copy.size()] ^= 0x10;
  stats_.corrupt_reads++;
  return SharedBytes(std::make_shared<const OwnedBlob>(std::move(copy)));
}

Status SimDisk::remove(const std::string& name) {
  if (!view_.erase(name)) return Status::ok();
  Op op;
  op.write = false;
  op.name = name;
  op.start_us = op.end_us = std::max(static_cast<double>(clock_.now_us()), busy_until_us_);  // after the writes before it
  pending_.push_back(std::move(op));
  settle();
  return Status::ok();
}

std::optional<std::uint64_t> SimDisk::available_bytes() const {
  const std::uint64_t used = used_bytes();
  return full_ || used >= capacity_bytes_ ? 0 : capacity_bytes_ - used;
}

void SimDisk::crash() {
  settle();
  stats_.crashes++;
  const double now = static_cast<double>(clock_.now_us());
  if (!pending_.empty() && pending_.front().write && pending_.front().start_us < now) {
    // Cut mid-write: the temporary file holds what the disk had written of it.
    const Op& op = pending_.front();
    const double done = (now - op.start_us) / std::max(1e-9, op.end_us - op.start_us);
    const ByteSpan all = *op.durable.bytes;
    const auto kept = static_cast<std::size_t>(static_cast<double>(all.size()) * std::clamp(done, 0.0, 1.0));
    durable_[op.name + ".tmp.sim"] = File{std::make_shared<const OwnedBlob>(Bytes(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(kept))), false};
    stats_.temp_files_left++;
  }
  pending_.clear();
  busy_until_us_ = now;
  view_ = durable_;
}

std::uint64_t SimDisk::busy_until_us() const { return static_cast<std::uint64_t>(std::max(busy_until_us_, static_cast<double>(clock_.now_us()))); }

std::optional<std::pair<std::uint64_t, std::uint64_t>> SimDisk::write_pending() const {
  settle();
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it)
    if (it->write) return std::make_pair(static_cast<std::uint64_t>(it->start_us), static_cast<std::uint64_t>(std::ceil(it->end_us)));
  return std::nullopt;
}

std::vector<std::string> SimDisk::durable_intact() const {
  settle();
  std::vector<std::string> out;
  for (const auto& [name, f] : durable_)
    if (f.intact) out.push_back(name);
  return out;
}

}  // namespace deltacast::sim
