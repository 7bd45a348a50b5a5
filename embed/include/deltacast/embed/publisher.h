// The publishing side as a trainer process embeds it: an origin (or a trainer shard) on a
// NodeHost, the anchor policy, the encoder pool, back-pressure, and the fleet's delivery as
// the ledger reports it. The CLI's `deltacast publish` and the Python package are front ends
// of this class.
//
// Policy: the first checkpoint, any checkpoint whose tensor table differs from the one before,
// and one numbered past the next version (publish's `number`), is published as an anchor; the others as a delta from the one before. After every
// `anchor_every` versions, and whenever a relay or worker asked for one, an anchor of the
// newest version follows its delta.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <atomic>
#include <filesystem>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "deltacast/codec/codec_choice.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/transport/host.h"

namespace deltacast::embed {

// A checkpoint to publish: its tensor table and image. `owner` keeps the image's bytes alive
// (a mapped file, a buffer): the publisher holds it until the next checkpoint, which it
// encodes against this one.
//
// Or, instead of `image`, `read`: the image's bytes read a chunk at a time (from a trainer's
// tensors, say), during publish() only. The publisher then keeps one image of its own, which each
// version is encoded against and written over in place (codec::encode_version_into): about one
// image besides the caller's tensors, where checkpoints held whole need two. Codec auto encodes
// a version twice, so it reads the whole image first and needs the second.
struct Checkpoint {
  ModelLayout layout;
  ByteSpan image;
  std::shared_ptr<const void> owner;
  ImageReader read;
};

// A safetensors checkpoint file as a Checkpoint: mapped, not copied.
Result<Checkpoint> open_checkpoint(const std::string& path);

struct PublisherOptions {
  // An origin: host.bind_endpoint set, no parents; expect_shards > 0 to merge what trainer
  // shards send instead of publishing itself. A trainer shard: shard_index and shard_count
  // set, parents = {the origin}.
  runtime::NodeConfig node;
  transport::HostConfig host;
  std::uint64_t anchor_every = runtime::kAnchorEveryDefault;  // 1 to 10^6
  VersionEncodeOptions encode;      // chunk size, anchor codec; digests are added when node.sign_key is set
  std::size_t threads = 0;          // encoder threads; 0: one per core
  // The deltas' codec (it sets encode.chunk.delta_kinds): v1, v2 where smaller, or per version
  // whichever `delivery` says workers hold sooner (deltacast/codec/codec_choice.h).
  DeltaCodec codec = DeltaCodec::kV1;
  DeliveryModel delivery;
};

// Sets o.codec and o.delivery from a front end's text forms: `codec` "v1", "v2", "v3" or "auto", the
// WAN rate as parse_rate reads it ("10Gbit", "1.2GB/s"), and the cores a worker applies on;
// empty (or cores not above 0) keeps o's. An
// error starts with the name the front end gives the option (`codec_name`, `wan_rate_name`).
Status set_delta_codec(PublisherOptions& o, std::string_view codec, std::string_view wan_rate, double worker_cores,
                       std::string_view codec_name, std::string_view wan_rate_name);

// How far a version has got: workers of this run that hold it (or newer), and its publish to
// ready times among those that reported this very version. A worker embedded in an engine that
// reports its model (runtime::ModelState) holds a version once its model applied it; one whose
// model could not apply it (or a newer one) is `failed`, with its last error.
struct Delivery {
  std::size_t workers_ready = 0;
  std::uint64_t median_ms = 0;
  std::uint64_t max_ms = 0;
  std::vector<std::string> behind;  // workers that have not left and do not hold it yet
  std::vector<std::pair<std::string, std::string>> failed;  // (worker, its last error)
};

class Publisher {
 public:
  // Checks the options (the error names what is wrong) and starts the host.
  static Result<std::unique_ptr<Publisher>> start(PublisherOptions options);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Publishes `next` (see the policy above) as version `number`, or with 0 as the one after the
  // last, and returns its number; a number at or below the last is refused. Trainer shards give
  // each step the same number (the training step, say): a shard process that restarted resumes
  // at its step with an anchor slice, and the origin asks the other shards for anchors
  // (docs/RUNTIME.md, "Trainer shards"). A trainer shard waits while its previous slices are
  // still on their way to the origin; interrupt() ends that wait with ResourceExhausted. A
  // version that fails is not counted: its number may be published again.
  Result<std::uint64_t> publish(Checkpoint next, std::uint64_t number = 0);
  // Publishes an anchor of the newest version if a relay or worker asked for one since the last
  // anchor; call it while idle. OK when there was nothing to do.
  Status serve_anchor_request();
  // Waits until `workers` workers of this run hold `version`, or one failed to apply it, serving
  // anchor requests meanwhile, or until timeout_ms passes or interrupt(); returns the delivery
  // reached.
  Delivery wait_for_delivery(std::uint64_t version, std::size_t workers, std::uint64_t timeout_ms);
  Delivery delivery(std::uint64_t version);

  // Makes a waiting publish() or wait_for_delivery() return soon. Only sets a flag: safe from
  // a signal handler.
  void interrupt() { interrupted_ = true; }
  bool interrupted() const { return interrupted_; }

  std::uint64_t version() const { return version_; }  // the newest published, 0 before any
  // The codec the newest version went out in as a delta, and what each candidate would cost
  // (codec_choice.h); empty when it went out as an anchor.
  const std::optional<CodecDecision>& last_codec() const { return last_codec_; }
  // The newest version the node holds: at an origin merging shards, the newest merged.
  std::uint64_t newest_version();
  RunId run();
  std::map<std::string, runtime::LedgerEntry> ledger();
  transport::NodeHost& host() { return *host_; }
  void stop();

 private:
  explicit Publisher(PublisherOptions options);
  // `remake`: the version's payloads are not kept but made as they go (a trainer shard's anchor).
  // `anchor_instead` (a delta's): set, and nothing published, when a trainer shard waiting for
  // room is asked for an anchor of this version meanwhile; the caller publishes that instead.
  Status publish_encoded(Result<EncodedVersion> version, runtime::PayloadSource remake = {}, bool* anchor_instead = nullptr);
  Status publish_anchor();
  Status publish_anchor_of(const ModelLayout& layout, ByteSpan image, std::uint64_t version);

  PublisherOptions options_;
  std::unique_ptr<transport::NodeHost> host_;
  ThreadPool pool_;
  // One per pool thread, kept between versions; a trainer shard's loop thread leases one to make
  // an anchor slice's payloads again.
  std::shared_ptr<ChunkEncoderPool> encoders_ = std::make_shared<ChunkEncoderPool>();
  std::optional<Checkpoint> prev_;
  // The image checkpoints given by a reader are written over, version by version; prev_ points
  // into it then. A trainer shard does not keep its anchor slices' payloads (most of an image
  // more): the loop thread makes each again from this image as it goes out, and again if the
  // origin asks. It reads under a shared lock taken without waiting, and only while the image
  // still holds `version` whole (0 while it is written, which waits until the outbox is sent).
  struct OwnImage {
    std::shared_mutex mu;
    Bytes bytes;
    std::uint64_t version = 0;
  };
  std::shared_ptr<OwnImage> own_ = std::make_shared<OwnImage>();
  Status encode_in_place(const Checkpoint& next, std::uint64_t version, bool delta);
  bool remakes_anchors() const { return options_.node.shard_count > 0; }
  // The encode options of an anchor of the own image: without its payloads when they are made again.
  VersionEncodeOptions own_anchor_options() const;
  // Makes the payloads of `manifest`, an anchor of the own image, as they go out.
  runtime::PayloadSource remake_from_own_image(const Manifest& manifest) const;
  // A trainer shard: waits until every payload its outbox is to make from the own image was made
  // (or interrupt()), before the image is written.
  Status wait_payloads_made();
  std::uint64_t version_ = 0;
  std::optional<CodecDecision> last_codec_;
  // An anchor asked for by the node (of this version or newer; 0: the newest), until one is
  // published. Set on the loop thread, taken by publish() and serve_anchor_request().
  std::mutex anchor_mu_;
  std::optional<std::uint64_t> anchor_wanted_;
  void want_anchor(std::uint64_t at_least);
  // Whether an anchor of `version` answers what was asked; if so the request is taken.
  bool take_anchor_request(std::uint64_t version);
  std::atomic<bool> interrupted_{false};
};

// New checkpoints in a directory a trainer writes to: *.safetensors files untouched for a
// second (so not being written), oldest name first, each once.
class CheckpointDirectory {
 public:
  explicit CheckpointDirectory(std::filesystem::path dir) : dir_(std::move(dir)) {}
  // The next file to publish, or empty when none is ready; marks it taken.
  std::string next();
  void mark_taken(const std::string& path) { taken_.insert(path); }

 private:
  std::filesystem::path dir_;
  std::set<std::string> taken_;
};

}  // namespace deltacast::embed

#pragma GCC visibility pop
