// The versions a worker keeps in its Storage (interfaces.h), so that a restarted worker resumes
// from the newest one instead of fetching an anchor. Each verified version is written as
//   <node_id>-v<version>.safetensors   the model, byte for byte what the trainer's checkpoint
//                                      would be (any safetensors reader)
//   <node_id>-v<version>.json          {"version", "checksum", "image_xxh3", "run"}: the version
//                                      number, its checksum as in its manifest, the xxh3-64 of
//                                      the data section (checked on loading) and the run it was
//                                      published in ({"started_us", "nonce"}; absent for no run)
// Each file is written atomically (Storage::write), the JSON last, so a crash leaves no version
// that loads half-written; a save that fails (a full disk, say) leaves nothing of its version
// and keeps the older ones. The same code runs over a directory (transport::DirectoryStorage)
// and over the simulator's disk with its faults (sim::SimDisk).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deltacast/runtime/interfaces.h"
#include "deltacast/runtime/node_types.h"

namespace deltacast::runtime {

using LogFn = std::function<void(LogLevel, const std::string&)>;

class VersionStore {
 public:
  // Keeps the newest `keep_versions` (at least 1) versions of node `node_id` in `storage`.
  // `log`: what the store tells the operator (files removed, room made); may be empty.
  VersionStore(std::shared_ptr<Storage> storage, std::string node_id, std::size_t keep_versions = 2, LogFn log = {});

  // Call before the first save, as the worker starts: opens the storage (Storage::open) under
  // the lock .<node_id>.lock, and removes the temporary files of this node's earlier processes
  // (killed mid-save; each as large as the model).
  Status prepare();
  // The tensors the worker serves (NodeConfig::tensors): each record says what its version was
  // built for (ModelVersion::served), and a version saved for other tensors is not loaded (its
  // file holds other tensors, packed).
  void set_tensors(const TensorSubset& tensors) { tensors_ = tensors; }
  // Writes the version, then removes this node's older versions beyond keep_versions. On failure
  // (ResourceExhausted for a full disk, IOError otherwise, naming the file and the reason) no
  // file of this version is left and the older versions are all kept, unless removing the
  // oldest ones is what makes room for it.
  Status save(const ModelVersion& version) const;
  // The newest version that loads and verifies; older ones are tried when a newer one fails
  // (each failure named in `skipped`). NotFound when none does.
  Result<std::shared_ptr<ModelVersion>> load_newest(std::vector<std::string>* skipped = nullptr) const;
  // Loads and verifies one version.
  Result<std::shared_ptr<ModelVersion>> load(std::uint64_t version) const;
  // load_newest, logging the versions skipped and the one resumed from; null when there is none.
  std::shared_ptr<ModelVersion> resume() const;

  // Removes this node's saved versions of any other run, and all but the newest keep_versions
  // of `run` (save() does this after each save; a worker that moves to a new run does it at
  // once, so a restart never resumes the old run).
  void prune(const RunId& run) const;

  // The model file's name of a version, and where it is (Storage::where joined with the name).
  std::string name_of(std::uint64_t version) const;
  std::string path_of(std::uint64_t version) const;
  // This node's saved versions and their model files' names, newest first.
  std::vector<std::pair<std::uint64_t, std::string>> files() const;
  Storage& storage() const { return *storage_; }

 private:
  bool is_temp_file(const std::string& name) const;
  std::vector<std::pair<std::uint64_t, std::string>> files_in(const std::vector<StoredFile>& listed) const;
  void log(LogLevel level, const std::string& what) const {
    if (log_) log_(level, what);
  }

  std::shared_ptr<Storage> storage_;
  std::string node_id_;
  std::size_t keep_versions_;
  LogFn log_;
  TensorSubset tensors_;  // set_tensors
};

// Saves the newest version it is given, and keeps at it when the storage refuses (full,
// failing): the failure is logged and tried again every `retry_ms`, or as soon as a newer
// version is offered. It holds no version between attempts (an in-place worker applies nothing
// while anyone holds its image): a retry saves the version current then, which is the one that
// failed or newer. Logs once when saving works again. Used from one thread; `clock` is read
// from it.
class VersionSaver {
 public:
  static constexpr std::uint64_t kSaveRetryMsDefault = 5000;
  // `on_failure`: called after every save that failed.
  VersionSaver(const VersionStore& store, const Clock& clock, std::uint64_t retry_ms = kSaveRetryMsDefault,
               std::function<void()> on_failure = {}, LogFn log = {})
      : store_(store), clock_(clock), retry_ms_(retry_ms), on_failure_(std::move(on_failure)), log_(std::move(log)) {}
  // Saves `v` now, in place of any older version not saved yet.
  void offer(std::shared_ptr<const ModelVersion> v);
  // Once `retry_ms` has passed since the last failure, saves `current` (the worker's current
  // version, null while it has none to show) if it is the version not saved yet or newer.
  void retry_if_due(const std::shared_ptr<const ModelVersion>& current);
  // The worker holds (or awaits) versions of `run` now: saved versions of other runs go.
  void on_run(const RunId& run);
  // The number of the version that is ready but not saved (none when every one is), and why.
  const std::optional<std::uint64_t>& unsaved() const { return unsaved_; }
  const std::string& last_error() const { return last_error_; }
  std::uint64_t failures() const { return failures_; }

 private:
  void try_save(const ModelVersion& v);
  void log(LogLevel level, const std::string& what) const {
    if (log_) log_(level, what);
  }

  const VersionStore& store_;
  const Clock& clock_;
  std::uint64_t retry_ms_;
  std::function<void()> on_failure_;
  LogFn log_;
  std::uint64_t failures_ = 0;
  std::optional<std::uint64_t> unsaved_;
  RunId unsaved_run_;
  std::string last_error_;  // empty while saves work
  std::uint64_t retry_at_ms_ = 0;
  std::optional<RunId> run_;
};

}  // namespace deltacast::runtime

#pragma GCC visibility pop
