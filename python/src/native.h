// The native side of the Python package: what module.cc binds. Every call that waits or works
// on the network releases the GIL; waits wake every 100 ms to let Python handle signals (Ctrl-C).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <stdexcept>
#include <string>
#include <vector>

#include "deltacast/embed/node_config.h"
#include "deltacast/embed/publisher.h"
#include "deltacast/embed/worker.h"

namespace deltacast::python {

// Raised as deltacast.Error, with the library's message.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `attempt(slice_ms)` (true: done) in slices of at most 100 ms with the GIL released,
// until it is done or timeout_s passes (negative: no limit), letting Python handle signals in
// between (Ctrl-C raises KeyboardInterrupt). False on time-out.
template <typename Attempt>
bool wait_sliced(double timeout_s, Attempt attempt) {
  using Clock = std::chrono::steady_clock;
  const bool forever = timeout_s < 0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(forever ? 0 : timeout_s));
  for (;;) {
    // Every wait tries at least once, so a zero timeout still sees what is there already.
    std::int64_t left_ms = 100;
    if (!forever) left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    bool done;
    {
      pybind11::gil_scoped_release release;
      done = attempt(static_cast<std::uint64_t>(std::clamp<std::int64_t>(left_ms, 0, 100)));
    }
    if (done) return true;
    if (!forever && left_ms <= 0) return false;
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  }
}

// One verified version: its numbers, its tensors' places, and its image as a read-only buffer
// that keeps the version alive while any view of it lives.
class Version {
 public:
  explicit Version(std::shared_ptr<const runtime::ModelVersion> v) : v_(std::move(v)) {}
  std::uint64_t number() const { return v_->version; }
  std::uint64_t base_number() const { return v_->base_version; }
  std::uint64_t checksum() const { return v_->checksum; }
  std::uint64_t ready_us() const { return v_->ready_us; }
  std::string run() const;
  // (name, safetensors dtype, shape, byte offset, byte count, contiguous strides in elements),
  // in image order.
  pybind11::list tensor_infos() const;
  pybind11::buffer_info buffer() const;
  // The elements of tensor `index` that differ between versions `since` and `at` (int64,
  // ascending), from the changes the worker kept, and their values in version `at` (raw bytes,
  // uint8). Raises deltacast.Error when the history kept does not reach back that far.
  // With values_at, the values are those of version values_at (since: what turns `at` back).
  // With `keep` ((first, last) element ranges, ascending and apart), only the elements inside
  // them; the third item is the count of all changed elements.
  pybind11::tuple patch(std::size_t index, std::uint64_t since, std::uint64_t at, std::optional<std::uint64_t> values_at,
                        std::optional<pybind11::array_t<std::uint64_t, pybind11::array::c_style | pybind11::array::forcecast>> keep) const;
  // The bytes of tensor `index` in version `at`, read back from the history (uint8, a copy).
  pybind11::array_t<std::uint8_t> tensor_at(std::size_t index, std::uint64_t at) const;
  std::uint64_t checksum_at(std::uint64_t at) const;
  // The oldest version the kept changes reach back to (this version's number when none are kept).
  std::uint64_t changes_since() const;
  // The oldest version that can be read back whole (this version's number when none can).
  std::uint64_t values_since() const;
  // A capsule owning a reference to the version, for deltacast._torch_views (version_capsule.h).
  pybind11::object capsule() const;
  const std::shared_ptr<const runtime::ModelVersion>& get() const { return v_; }
  // A stand-in with this version's number and run but no image, to wait for a newer one without
  // holding this one (an in-place worker applies the next version only once nobody holds it).
  std::shared_ptr<Version> stub() const;

 private:
  std::shared_ptr<const runtime::ModelVersion> v_;
};

// One tensor as Python hands it over: contiguous host memory that the caller keeps alive
// for the call.
struct TensorRef {
  std::string name;
  std::string dtype;  // safetensors name: "BF16", "F32", ...
  std::vector<std::uint64_t> shape;
  std::uintptr_t data = 0;
  std::uint64_t nbytes = 0;
  // A trainer shard's rows of a tensor (deltacast.Rows): where they lie in the whole tensor.
  std::optional<TensorPart> part;
};

// The layout of `tensors` placed one after another in the order given, with parts when any is
// rows of a tensor. Raises Error for an unknown dtype, a size that disagrees with the shape, a
// name given twice, or rows past the whole tensor.
ModelLayout layout_of(const std::vector<TensorRef>& tensors);
// Copies the tensors into `image`, resized to the layout's size (the GIL released).
void gather(const std::vector<TensorRef>& tensors, const ModelLayout& layout, Bytes& image);
// Copies the image bytes [offset, offset + out.size()) of the tensors laid out as `layout` into
// `out` (no GIL needed: the caller keeps the tensors alive).
void read_range(const std::vector<TensorRef>& tensors, const ModelLayout& layout, std::uint64_t offset, MutableByteSpan out);

// Encodes `next` as an anchor (no base) or as a delta from `base`, into a container (docs/FORMAT.md).
pybind11::bytes encode_container(const std::vector<TensorRef>* base, const std::vector<TensorRef>& next, std::uint64_t version,
                                 std::uint64_t base_version, bool v2, std::uint64_t chunk_bytes);
// Decodes a container (an anchor, or a delta against `base`) into a new version, every chunk
// and the version checksum verified. Raises Error with what failed.
std::shared_ptr<Version> decode_container(pybind11::buffer container, const std::vector<TensorRef>* base);

struct PublisherArgs {
  std::string id;
  std::string listen;
  // A trainer shard: slice "I/N", sent to the origin at `origin`. An origin merging N shards:
  // expect_shards.
  std::string origin;
  std::string shard;
  std::optional<std::uint32_t> expect_shards;
  std::optional<std::pair<std::string, std::string>> keys;  // own CURVE pair (public, secret), Z85
  std::vector<std::string> allow_keys;                       // workers' and relays' CURVE public keys, Z85
  std::string sign_key;                                      // Ed25519 secret key (hex); empty: unsigned
  std::optional<std::uint64_t> anchor_every;                 // unset: PublisherOptions' default
  std::string codec;         // "v1", "v2" or "auto" (codec_choice.h); empty: PublisherOptions' default
  std::string wan_rate;      // auto: the slowest WAN link a version crosses; empty: the default
  double worker_cores = 0;   // auto: cores a worker applies versions on; 0: the default
  std::optional<std::uint64_t> chunk_bytes;  // unset: VersionEncodeOptions' default
  std::size_t threads = 0;
  std::string metrics;
  // The file the runs of sign_key are kept in (transport/run_state.h); empty: the key's default.
  std::string run_state;
  std::string settings;  // a JSON object of config file fields (limits, timing, ...)
};
// The node settings a Publisher with these arguments runs with (load_node checks them).
embed::NodeSettings publisher_settings(const PublisherArgs& a);

// The origin inside a trainer: publishes each checkpoint, answers anchor requests from a
// thread of its own while the trainer trains, and reports the fleet ledger.
class Publisher {
 public:
  explicit Publisher(const PublisherArgs& args);
  ~Publisher();
  std::uint64_t publish(const std::vector<TensorRef>& tensors, std::uint64_t number);
  // Waits until `workers` workers (0: every worker the ledger knows, at least one) hold
  // `version`; returns (workers ready, workers wanted, median ms, max ms). Raises TimeoutError.
  pybind11::tuple wait_ready(std::uint64_t version, std::size_t workers, double timeout_s);
  pybind11::dict ledger();
  std::uint64_t version() const;
  // How the newest version went out as a delta: {"codec", "v2_tried", "v1_wan_s", "v1_worker_s",
  // "v2_wan_s", "v2_worker_s"}; None when it went out as an anchor.
  pybind11::object last_codec();
  std::string run();
  std::string listening();
  // Stops the publisher. A wait_ready in another thread ends with deltacast.Error. Idempotent.
  void close();

 private:
  std::shared_ptr<embed::Publisher> live() const;
  std::size_t known_workers(embed::Publisher& p);
  std::shared_ptr<embed::Publisher> p_;
  bool merges_ = false;    // an origin of trainer shards: its versions are the merged ones
  std::mutex mu_;          // publish() and serving anchors both use the newest checkpoint
  std::mutex publish_mu_;  // one publish() at a time: the version order
  std::thread anchor_server_;
  std::atomic<bool> stopping_{false};
};

// A Result's value, or deltacast.Error with its message.
template <typename T>
T checked(Result<T> r) {
  if (!r.is_ok()) throw Error(r.status().to_string());
  return std::move(r).value();
}

// What Python's Worker passes: the fields of embed::NodeSettings it names, over a config file
// and a settings object (JSON) holding any other; unset (empty, None) takes the settings'.
struct WorkerArgs {
  std::string id;
  std::vector<std::string> parents;
  std::optional<std::pair<std::string, std::string>> keys;  // own CURVE pair (public, secret), Z85
  std::vector<std::string> parent_keys;                      // one per parent, Z85
  std::vector<std::vector<std::string>> trees;               // NodeConfig::tree_parents, instead of parents
  std::vector<std::vector<std::string>> tree_parent_keys;    // one per parent of `trees`, same shape
  std::vector<std::string> trust_keys;                        // Ed25519 publisher keys (hex or key files)
  std::string state_dir;
  bool in_place = false;
  std::string share;  // a Unix socket path the host's other processes attach to
  std::vector<std::string> tensors;  // globs of the tensors served (NodeConfig::tensors); none: all
  std::string listen;
  std::string metrics;
  std::optional<std::uint64_t> change_history;
  std::optional<std::uint64_t> change_history_bytes;
  std::optional<std::uint32_t> stripes;
  std::string config_path;  // a node config file (docs/RUNTIME.md, "Config files")
  std::string settings;     // a JSON object of config file fields, over the file's
};
// The settings a Worker with these arguments runs with (load_node checks them).
embed::NodeSettings worker_settings(const WorkerArgs& a);

// A rollout process's worker, or a reader attached to the worker its host shares (the same
// reading API over embed::VersionSource).
class Worker {
 public:
  explicit Worker(const WorkerArgs& args);
  // A reader of the versions the worker sharing `path` serves, waiting up to timeout_s for it.
  static std::unique_ptr<Worker> attach(const std::string& path, double timeout_s);
  ~Worker();
  // A version >= min_version, waiting up to timeout_s (negative: no limit). Raises TimeoutError.
  std::shared_ptr<Version> wait(std::uint64_t min_version, double timeout_s);
  // A version newer than `after` (null: any), or None after timeout_s.
  std::shared_ptr<Version> wait_newer(const std::shared_ptr<Version>& after, double timeout_s);
  std::shared_ptr<Version> current() const;
  // The current version once it is `version` of `run` or later in that run, or of a run after it
  // (empty `run`: whichever it is in); None after timeout_s.
  std::shared_ptr<Version> wait_for(const std::string& run, std::uint64_t version, double timeout_s);
  // embed::Worker::hold_history_from (version 0: let go).
  void hold_history_from(const std::string& run, std::uint64_t version);
  // embed::Worker::report_model: the model holds `version` of `run` (0: none deltacast gave
  // it); its last update could not apply `failed_version` of `failed_run` (0: it applied).
  void report_model(const std::string& run, std::uint64_t version, const std::string& failed_run, std::uint64_t failed_version,
                    const std::string& error);
  // embed::Worker::set_tensors: glob patterns (empty: every tensor). Raises ValueError.
  void set_tensors(const std::vector<std::string>& patterns);
  // Stops the worker. A wait in another thread ends with deltacast.Error. Idempotent.
  void close();
  std::string listening() const;
  // An attached reader: why it is not attached now (empty while it is, and for a worker).
  std::string disconnected() const;

 private:
  Worker() = default;
  void start(embed::WorkerOptions o);
  // The source, held by the caller while it waits: close() in another thread cannot free it.
  std::shared_ptr<embed::VersionSource> live() const;
  std::shared_ptr<embed::VersionSource> w_;
  std::atomic<bool> closed_{false};
};

}  // namespace deltacast::python
