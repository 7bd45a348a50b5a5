// The versions a worker keeps on disk, so that a restarted worker resumes from the newest one
// instead of fetching an anchor. Each verified version is written as
//   <dir>/<node_id>-v<version>.safetensors   the model, byte for byte what the trainer's
//                                            checkpoint would be (any safetensors reader)
//   <dir>/<node_id>-v<version>.json          {"version", "checksum", "image_xxh3", "run"}: the
//                                            version number, its checksum as in its manifest,
//                                            the xxh3-64 of the data section (checked on
//                                            loading) and the run it was published in
//                                            ({"started_us", "nonce"}; absent for no run)
// Both are written under temporary names (<name>.tmp.<pid>) and renamed, the JSON last, so a
// crash leaves no file that loads; a save that fails (a full disk, say) leaves nothing of its
// version and keeps the older ones.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deltacast/runtime/node.h"
#include "deltacast/transport/host.h"

namespace deltacast::embed {

class VersionStore {
 public:
  // Keeps the newest `keep_versions` (at least 1) files of node `node_id` in `dir`.
  VersionStore(std::string dir, std::string node_id, std::size_t keep_versions = 2);

  // Call before the first save, as the worker starts: creates the directory if missing, checks
  // that it is a directory this process can create files in, takes the lock on this node's
  // files (<dir>/.<node_id>.lock, flock: held until the store is destroyed), and removes the
  // temporary files of this node's earlier runs (killed mid-save; each as large as the model).
  // Another live process holding the lock is ResourceExhausted, naming its pid. A full disk is not an
  // error here (saves fail and are retried); anything else is, with its reason.
  Status prepare();
  // Writes the version, then removes this node's older files beyond keep_versions. On failure
  // (IOError naming the file and the reason) no file of this version is left and the older
  // versions are all kept.
  Status save(const runtime::ModelVersion& version) const;
  // The newest file that loads and verifies; older ones are tried when a newer one fails
  // (each failure named in `skipped`). NotFound when none does.
  Result<std::shared_ptr<runtime::ModelVersion>> load_newest(std::vector<std::string>* skipped = nullptr) const;
  // Loads and verifies one file.
  static Result<std::shared_ptr<runtime::ModelVersion>> load(const std::string& path);
  // Hands the newest good saved version to `host` (NodeHost::restore, before it starts),
  // logging the files skipped. Returns it, or null when there is none.
  std::shared_ptr<const runtime::ModelVersion> resume(transport::NodeHost& host) const;

  // Removes this node's saved versions of any other run, and all but the newest keep_versions
  // of `run` (save() does this after each save; a worker that moves to a new run does it at
  // once, so a restart never resumes the old run).
  void prune(const RunId& run) const;

  std::string path_of(std::uint64_t version) const;
  // This node's files, newest version first.
  std::vector<std::pair<std::uint64_t, std::string>> files() const;

 private:
  bool is_temp_file(const std::string& name) const;

  std::string dir_;
  std::string node_id_;
  std::size_t keep_versions_;
  // The lock file's descriptor while prepare() holds it; closing it lets go.
  struct LockFile {
    int fd = -1;
    ~LockFile();
  };
  std::shared_ptr<const LockFile> lock_;
};

// Saves the newest version it is given, and keeps at it when the disk refuses (full, failing):
// the failure is logged and tried again every `retry`, or as soon as a newer version is offered.
// It holds no version between attempts (an in-place worker applies nothing while anyone holds
// its image): a retry saves the version current then, which is the one that failed or newer.
// Logs once when saving works again. Used from one thread.
class VersionSaver {
 public:
  static constexpr std::chrono::milliseconds save_retry_ms{5000};
  // `on_failure`: called (on the saver's thread) after every save that failed.
  explicit VersionSaver(const VersionStore& store, std::chrono::milliseconds retry = save_retry_ms, std::function<void()> on_failure = {})
      : store_(store), retry_(retry), on_failure_(std::move(on_failure)) {}
  // Saves `v` now, in place of any older version not saved yet.
  void offer(std::shared_ptr<const runtime::ModelVersion> v);
  // Once `retry` has passed since the last failure, saves `current` (the worker's current
  // version, null while it has none to show) if it is the version not saved yet or newer.
  void retry_if_due(const std::shared_ptr<const runtime::ModelVersion>& current);
  // The worker holds (or awaits) versions of `run` now: saved versions of other runs go.
  void on_run(const RunId& run);
  // The number of the version that is ready but not on disk (none when every one is), and why.
  const std::optional<std::uint64_t>& unsaved() const { return unsaved_; }
  const std::string& last_error() const { return last_error_; }
  std::uint64_t failures() const { return failures_; }

 private:
  void try_save(const runtime::ModelVersion& v);

  const VersionStore& store_;
  std::chrono::milliseconds retry_;
  std::function<void()> on_failure_;
  std::uint64_t failures_ = 0;
  std::optional<std::uint64_t> unsaved_;
  RunId unsaved_run_;
  std::string last_error_;  // empty while saves work
  std::chrono::steady_clock::time_point retry_at_;
  std::optional<RunId> run_;
};

}  // namespace deltacast::embed

#pragma GCC visibility pop
