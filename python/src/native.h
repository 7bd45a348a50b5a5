// The native side of the Python package: what module.cc binds. Every call that waits or works
// on the network releases the GIL; waits wake every 100 ms to let Python handle signals (Ctrl-C).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "deltacast/transport/worker.h"

namespace deltacast::python {

// Raised as deltacast.Error, with the library's message.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One verified version: its numbers, its tensors' places, and its image as a read-only buffer
// that keeps the version alive while any view of it lives.
class Version {
 public:
  explicit Version(std::shared_ptr<const runtime::ModelVersion> v) : v_(std::move(v)) {}
  std::uint64_t number() const { return v_->version; }
  std::uint64_t base_number() const { return v_->base_version; }
  std::uint64_t checksum() const { return v_->checksum; }
  std::string run() const;
  // (name, safetensors dtype, shape, byte offset, byte count), in image order.
  pybind11::list tensor_infos() const;
  pybind11::buffer_info buffer() const;
  // The elements of tensor `index` that differ from version `since` (int64, ascending), from the
  // changes the worker kept. Raises deltacast.Error when they do not reach back that far.
  pybind11::array_t<std::int64_t> changed_elements(std::size_t index, std::uint64_t since) const;
  // The oldest version the kept changes reach back to (this version's number when none are kept).
  std::uint64_t changes_since() const;
  const std::shared_ptr<const runtime::ModelVersion>& get() const { return v_; }

 private:
  std::shared_ptr<const runtime::ModelVersion> v_;
};

struct WorkerArgs {
  std::string id;
  std::vector<std::string> parents;
  std::optional<std::pair<std::string, std::string>> keys;  // own CURVE pair (public, secret), Z85
  std::vector<std::string> parent_keys;                      // one per parent, Z85
  std::vector<std::string> trust_keys;                        // Ed25519 publisher keys (hex)
  std::string state_dir;
  bool in_place = false;
  std::string listen;
  std::string metrics;
  std::size_t change_history = 0;  // NodeConfig::change_history_versions_max
};

class Worker {
 public:
  explicit Worker(const WorkerArgs& args);
  ~Worker();
  // A version >= min_version, waiting up to timeout_s (negative: no limit). Raises TimeoutError.
  std::shared_ptr<Version> wait(std::uint64_t min_version, double timeout_s);
  // A version newer than `after` (null: any), or None after timeout_s.
  std::shared_ptr<Version> wait_newer(const std::shared_ptr<Version>& after, double timeout_s);
  std::shared_ptr<Version> current() const;
  void close();
  std::string listening() const;

 private:
  transport::Worker& live() const;
  std::unique_ptr<transport::Worker> w_;
};

}  // namespace deltacast::python
