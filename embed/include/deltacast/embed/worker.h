// A worker as a rollout process embeds it: a NodeHost that rebuilds and verifies every version,
// the versions it keeps on disk, resuming from the newest after a restart, and a thread that
// saves each new version while the host goes on. The CLI's `deltacast worker`, the C ABI and
// the Python package are front ends of this class.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "deltacast/embed/node_config.h"
#include "deltacast/transport/host.h"
#include "deltacast/runtime/version_store.h"
#include "deltacast/transport/directory_storage.h"

namespace deltacast::embed {

using VersionTag = transport::NodeHost::VersionTag;

// Where a rollout process reads verified versions from: a Worker of its own, or one on the same
// host it attached to (share.h). The Python package and the C ABI read through this.
class VersionSource {
 public:
  virtual ~VersionSource() = default;
  // The newest verified version (null before the first), from any thread.
  virtual std::shared_ptr<const runtime::ModelVersion> current() const = 0;
  // Block until a version >= min_version is current, or timeout_ms passes (null).
  virtual std::shared_ptr<const runtime::ModelVersion> wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms) = 0;
  // NodeHost::wait_for_run_version.
  virtual std::shared_ptr<const runtime::ModelVersion> wait_for_run_version(const RunId& run, std::uint64_t version,
                                                                           std::uint64_t timeout_ms) = 0;
  // Block until a version newer than `after` (or of a newer run; any when empty) is current.
  virtual std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms) = 0;
  // Keep every version from `version` of `run` on readable (runtime::Node::hold_history_from).
  virtual void hold_history_from(const RunId& run, std::uint64_t version) = 0;
  // What the engine fed from here holds (runtime::Node::report_model).
  virtual void report_model(const runtime::ModelState& model, const std::string& error) = 0;
  // Why no more versions will come (the worker was refused by its parents, the shared worker
  // went away); empty while they may.
  virtual std::string refusal() const = 0;
  // Stop; Worker::stop says what save_current does. Idempotent.
  virtual Status stop(bool save_current = false) = 0;
  // Serve these tensors from now on (runtime::Node::set_tensors): a worker's own only.
  virtual Status set_tensors(TensorSubset) {
    return Status::invalid_argument("an attached reader reads the tensors the host's worker serves: set them on that worker");
  }
};

struct WorkerOptions {
  runtime::NodeConfig node;  // node_id and parents required; reconstruct is set
  transport::HostConfig host;           // bind_endpoint set: it serves other workers too (peer to peer)
  // Each verified version is saved here (safetensors + a JSON record; docs/RUNTIME.md); empty:
  // nothing is saved. A save that fails (a full disk) is logged and retried, the worker goes on.
  std::string out_dir;
  std::size_t keep_versions = 2;
  bool resume = true;  // start from the newest version saved in out_dir, if one verifies
  // Called on the loop thread each time a version becomes current (keep it short), with the
  // node for its timings and counters.
  std::function<void(std::shared_ptr<const runtime::ModelVersion>, const runtime::Node&)> on_version;
  // A Unix socket path: the worker shares each version with the host's other processes, which
  // attach to it (share.h; docs/RUNTIME.md, "One image per host"). Needs node.share_images.
  std::string share_path;
};

// The options of a worker from its loaded settings (node, host, share path); out_dir and the
// rest left to the caller.
WorkerOptions worker_options(LoadedNode loaded);

class ImageSharer;

class Worker final : public VersionSource {
 public:
  // Checks the options, prepares out_dir (created if missing; temporary files of earlier runs
  // removed), resumes from it, and starts the host and the saver. The error names the option.
  static Result<std::unique_ptr<Worker>> start(WorkerOptions options);
  ~Worker();  // stop(), without waiting for a save
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Stops the host and the saver. With save_current the saver first saves the current version
  // if it is not on disk yet. Returns IOError naming the version when one that was ready is
  // not on disk (a full disk, say, or an in-place update under way over it); the worker is
  // stopped either way. Idempotent.
  Status stop(bool save_current = false) override;

  std::shared_ptr<const runtime::ModelVersion> current() const override { return host_->current(); }
  std::shared_ptr<const runtime::ModelVersion> wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms) override {
    return host_->wait_for_version(min_version, timeout_ms);
  }
  std::shared_ptr<const runtime::ModelVersion> wait_for_run_version(const RunId& run, std::uint64_t version, std::uint64_t timeout_ms) override {
    return host_->wait_for_run_version(run, version, timeout_ms);
  }
  // With a sharer, folded in with its readers' reports (and holds, below).
  void report_model(const runtime::ModelState& model, const std::string& error) override;
  // Why the worker stopped asking its parents (another live process holds its id); empty while
  // it has not.
  std::string refusal() const override { return host_->refusal(); }
  // runtime::Node::set_tensors, on the loop thread (waits for it).
  Status set_tensors(TensorSubset tensors) override;
  void hold_history_from(const RunId& run, std::uint64_t version) override;
  // Blocks until a version newer than `after` (or of a newer run) is current, or timeout_ms.
  std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::shared_ptr<const runtime::ModelVersion>& after,
                                                               std::uint64_t timeout_ms) {
    return host_->wait_for_newer(after, timeout_ms);
  }
  // The same after a version known by its run and number only: a caller that holds no version
  // between calls lets an in-place worker apply the next one.
  std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms) override {
    return host_->wait_for_newer(after, timeout_ms);
  }
  // The version resumed from out_dir at start, or null.
  const std::shared_ptr<const runtime::ModelVersion>& resumed() const { return resumed_; }
  transport::NodeHost& host() { return *host_; }
  // The sharer of share_path, or null.
  ImageSharer* sharer() { return sharer_.get(); }

 private:
  Worker() = default;
  void save_loop();
  // To the node, on its loop: what the engines fed from here report and hold, as one.
  void post_report(const runtime::ModelState& model, const std::string& error);
  void post_hold(const RunId& run, std::uint64_t version);

  std::unique_ptr<transport::NodeHost> host_;
  std::unique_ptr<ImageSharer> sharer_;  // stopped before the host
  std::optional<runtime::VersionStore> store_;
  std::shared_ptr<const runtime::ModelVersion> resumed_;
  std::thread saver_;
  std::atomic<bool> stopping_{false};
  // The saver's waits: while a save failed (to retry it when due), and otherwise (a new version
  // and stop() wake it earlier).
  static constexpr std::uint64_t kSaveRetryPollMs = 100;
  static constexpr std::uint64_t kIdleWaitMs = 10000;
  std::atomic<bool> save_current_{false};
  bool stopped_ = false;
  // Written by the saver thread, read after it has been joined.
  std::optional<std::uint64_t> unsaved_;  // the version ready but not saved
  std::string save_error_;
};

}  // namespace deltacast::embed

#pragma GCC visibility pop
