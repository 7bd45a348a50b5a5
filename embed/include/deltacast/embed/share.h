// One image per host (docs/RUNTIME.md, "One image per host"). A worker whose images live in
// memfds (runtime::NodeConfig::share_images) serves each verified version on a Unix socket; the
// host's other processes (an engine's ranks) attach and map it read-only. The host downloads,
// verifies and holds each version once, whatever the number of ranks reading it.
//
// A reader holds a lease on each version it was sent, until it lets go of the version: the
// worker does not write into an image while any reader holds it (it allocates another). A
// reader that dies lets go of everything with its connection; its mappings go with it.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "deltacast/embed/worker.h"

namespace deltacast::embed {

struct ShareLimits {
  std::uint32_t readers_max = 256;  // connections at once; more are refused with a message
  // Versions one reader holds at once. A reader at the bound gets no newer version until it lets
  // one go: each version held past the newest keeps an image alive.
  std::uint32_t leases_per_reader_max = 4;
  std::uint64_t meta_bytes_max = 16ull << 30;  // a version's tables and change history
};

// The socket a worker serves; started by Worker::start for WorkerOptions::share_path.
class ImageSharer {
 public:
  struct Callbacks {
    std::function<void(const RunId&, std::uint64_t)> hold_history_from;  // the oldest version a reader holds history from
    std::function<void(const runtime::ModelState&, const std::string&)> report_model;  // the readers' models, as one
  };
  // Listens on `path`, made 0660 (the worker's user and group may attach). A stale socket file (nobody listening) is replaced; a path
  // another process serves, or that is not a socket, is an error.
  static Result<std::unique_ptr<ImageSharer>> start(const std::string& path, Callbacks callbacks, ShareLimits limits = {});
  ~ImageSharer();  // stop()
  // Closes every connection (readers keep what they mapped) and removes the socket file; what
  // is offered afterwards goes nowhere. Idempotent.
  void stop();
  ImageSharer(const ImageSharer&) = delete;
  ImageSharer& operator=(const ImageSharer&) = delete;

  // The newest verified version, from any thread: sent to every reader.
  void offer(std::shared_ptr<const runtime::ModelVersion> v);
  // The sharing process's own engine's history hold and report, from any thread: folded in with
  // the readers' before they reach the worker (a process that reads its own worker and shares it).
  void hold_local(const RunId& run, std::uint64_t version);
  void report_local(const runtime::ModelState& model, const std::string& error);

  struct Counts {
    std::uint64_t readers = 0;        // connected now
    std::uint64_t leases = 0;         // versions held by readers now, summed over them
    std::uint64_t versions_sent = 0;  // since the start
    std::uint64_t readers_refused = 0;
    std::uint64_t copies = 0;         // versions not in a memfd (resumed from disk) copied into one
  };
  Counts counts() const;

 private:
  struct Impl;
  explicit ImageSharer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A reader attached to a worker's socket: the versions it reads are the worker's images,
// mapped read-only. It attaches again by itself after the worker goes away. hold_history_from and report_model go to the worker, which keeps history
// from the oldest version any reader holds and reports the readers' models to the fleet as one
// (an error if any reader's update failed, else the oldest version they hold).
class Attached final : public VersionSource {
 public:
  // Connects to `path`, waiting up to timeout_ms for the socket to appear (a worker starting;
  // UINT64_MAX: no limit).
  static Result<std::unique_ptr<Attached>> attach(const std::string& path, std::uint64_t timeout_ms, ShareLimits limits = {});
  ~Attached() override;

  std::shared_ptr<const runtime::ModelVersion> current() const override;
  std::shared_ptr<const runtime::ModelVersion> wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms) override;
  std::shared_ptr<const runtime::ModelVersion> wait_for_run_version(const RunId& run, std::uint64_t version, std::uint64_t timeout_ms) override;
  std::shared_ptr<const runtime::ModelVersion> wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms) override;
  void hold_history_from(const RunId& run, std::uint64_t version) override;
  void report_model(const runtime::ModelState& model, const std::string& error) override;
  // Empty: a reader never stops asking. When the worker goes away (or refuses this reader, or
  // sends what it cannot map), the reader attaches again every 0.1 to 2 s and the versions held
  // stay mapped and readable meanwhile; a worker restarted on the path serves it again.
  std::string refusal() const override;
  // Why the reader is not attached now (empty while it is).
  std::string disconnected() const;
  Status stop(bool save_current = false) override;

 private:
  struct State;
  explicit Attached(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// A version's tables as a sharing worker hands them to its readers (docs/RUNTIME.md, "One image
// per host"): everything but the image. parse_shared_version bounds every count by the bytes
// left and checks the tensor table and chunk states against the image it is given.
Bytes serialize_shared_version(const runtime::ModelVersion& v);
Result<std::unique_ptr<runtime::ModelVersion>> parse_shared_version(ByteSpan meta, Image image);

}  // namespace deltacast::embed

#pragma GCC visibility pop
