#include "deltacast/embed/publisher.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "deltacast/common/units.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::embed {

namespace {
// Whether the options make an origin or a trainer shard that can work; the reason if not.
Status check_options(const PublisherOptions& o) {
  const runtime::NodeConfig& n = o.node;
  if (o.anchor_every < 1 || o.anchor_every > 1000000) return Status::invalid_argument("anchor_every must be 1 to 1000000");
  if (!o.encode.keep_payloads) return Status::invalid_argument("a publisher sends the payloads it encodes: keep_payloads must be set");
  DC_RETURN_IF_ERROR(o.delivery.check());
  if (n.shard_count > 0) {
    if (n.shard_index >= n.shard_count) return Status::invalid_argument("a trainer shard's index must be below the shard count");
    if (n.parents.empty()) return Status::invalid_argument("a trainer shard sends its slices to the origin: give it the origin as parent");
    if (!n.tree_parents.empty()) return Status::invalid_argument("a trainer shard sends to the origin over one link, not trees");
    if (n.expect_shards) return Status::invalid_argument("a trainer shard does not merge shards (expect_shards is the origin's)");
    return Status::ok();
  }
  if (o.host.bind_endpoint.empty()) return Status::invalid_argument("an origin needs an endpoint to listen on, for relays and workers");
  if (n.has_parents()) return Status::invalid_argument("the origin has no parent (trainer shards do: shard_index, shard_count)");
  return Status::ok();
}
}  // namespace

Publisher::Publisher(PublisherOptions options) : options_(std::move(options)), pool_(options_.threads) {}

Result<Checkpoint> open_checkpoint(const std::string& path) {
  DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  auto owner = std::make_shared<const SafetensorsFile>(std::move(file));
  return Checkpoint{owner->layout(), owner->image(), owner};
}

Status set_delta_codec(PublisherOptions& o, std::string_view codec, std::string_view wan_rate, double worker_cores,
                       std::string_view codec_name, std::string_view wan_rate_name) {
  if (!codec.empty()) {
    auto c = parse_delta_codec(codec);
    if (!c.is_ok()) return Status::invalid_argument(std::string(codec_name) + ": " + c.status().message());
    o.codec = *c;
  }
  if (!wan_rate.empty()) {
    auto wan = parse_rate(wan_rate);
    if (!wan.is_ok()) return Status::invalid_argument(std::string(wan_rate_name) + ": " + wan.status().message());
    o.delivery.wan_bytes_per_s = *wan;
  }
  if (worker_cores > 0) o.delivery.worker_cores = worker_cores;
  return Status::ok();
}

Result<std::unique_ptr<Publisher>> Publisher::start(PublisherOptions o) {
  DC_RETURN_IF_ERROR(check_options(o));
  o.node.serve_children = o.node.shard_count == 0;
  o.node.reconstruct = false;
  // Digests on the encoder pool, as each chunk is made: the loop only signs.
  if (o.node.sign_key) o.encode.payload_digest = runtime::payload_digest;
  // Codec v2 asks for the smallest deltas; its anchors try both encodings too (v1 wins on
  // highly repetitive data such as constant tensors).
  if (o.codec == DeltaCodec::kV2) o.encode.chunk.anchor_kinds = ChunkEncodeOptions::smallest().anchor_kinds;
  std::unique_ptr<Publisher> p(new Publisher(std::move(o)));
  p->host_ = std::make_unique<transport::NodeHost>(p->options_.node, p->options_.host);
  DC_RETURN_IF_ERROR(p->host_->start_thread());
  p->host_->call([q = p.get()] {
    q->host_->node().set_on_anchor_wanted([q](std::uint64_t at_least) { q->want_anchor(at_least); });
    return 0;
  });
  return p;
}

Publisher::~Publisher() { stop(); }

void Publisher::stop() {
  if (host_) host_->stop();
}

Status Publisher::publish_encoded(Result<EncodedVersion> ev, runtime::PayloadSource remake, bool* anchor_instead) {
  if (!ev.is_ok()) return ev.status();
  auto shared = std::make_shared<EncodedVersion>(std::move(ev).value());
  const std::uint64_t version = shared->manifest.version;
  for (;;) {
    Status st = host_->call([&] {
      return remake ? host_->node().publish(std::move(*shared), remake) : host_->node().publish(std::move(*shared));
    });
    // A trainer shard's previous slice may still be on its way to the origin; a refused
    // publish leaves the version as it was, for the next try.
    if (st.code() != StatusCode::kResourceExhausted || interrupted_) return st;
    // Waiting for the origin to merge older slices while it asks for an anchor: it may be
    // waiting for that anchor to merge them (a shard that restarted sent one of an older
    // version). An anchor of this version needs no older slice: it goes instead.
    if (anchor_instead && take_anchor_request(version)) {
      *anchor_instead = true;
      return Status::ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Publisher::want_anchor(std::uint64_t at_least) {
  std::lock_guard lock(anchor_mu_);
  anchor_wanted_ = std::max(anchor_wanted_.value_or(0), at_least);
}

bool Publisher::take_anchor_request(std::uint64_t version) {
  std::lock_guard lock(anchor_mu_);
  if (!anchor_wanted_ || version < *anchor_wanted_) return false;
  anchor_wanted_.reset();
  return true;
}

Status Publisher::publish_anchor() {
  // An anchor published answers the requests made before it that it is new enough for.
  (void)take_anchor_request(version_);
  return publish_anchor_of(prev_->layout, prev_->image, version_);
}

Status Publisher::publish_anchor_of(const ModelLayout& layout, ByteSpan image, std::uint64_t version) {
  if (remakes_anchors() && image.data() == own_->bytes.data() && own_->version == version) {
    // Only this thread writes the image: read without the lock.
    auto ev = encode_version(layout, version, 0, {}, image, own_anchor_options(), pool_, encoders_.get());
    if (!ev.is_ok()) return ev.status();
    runtime::PayloadSource remake = remake_from_own_image(ev->manifest);
    return publish_encoded(std::move(ev), std::move(remake));
  }
  return publish_encoded(encode_version(layout, version, 0, {}, image, options_.encode, pool_, encoders_.get()));
}

VersionEncodeOptions Publisher::own_anchor_options() const {
  VersionEncodeOptions o = options_.encode;
  o.keep_payloads = !remakes_anchors();
  return o;
}

runtime::PayloadSource Publisher::remake_from_own_image(const Manifest& manifest) const {
  return [own = own_, manifest = std::make_shared<const Manifest>(manifest), options = own_anchor_options(),
          encoders = encoders_](std::uint32_t index) -> Result<runtime::SharedBytes> {
    // On the loop thread, which must not wait for a version being written.
    std::shared_lock read(own->mu, std::try_to_lock);
    if (!read.owns_lock() || own->version != manifest->version)
      return Status::mismatch("the publisher's image no longer holds version " + std::to_string(manifest->version));
    DC_ASSIGN_OR_RETURN(Bytes payload, encode_anchor_chunk(*manifest, index, own->bytes, options, *encoders->acquire()));
    return runtime::share(std::move(payload));
  };
}

Status Publisher::wait_payloads_made() {
  if (!remakes_anchors()) return Status::ok();
  while (host_->call([&] { return host_->node().payloads_to_make(); })) {
    if (interrupted_) return Status::resource_exhausted("interrupted while the previous slice was still being sent");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::ok();
}

Result<std::uint64_t> Publisher::publish(Checkpoint next, std::uint64_t number) {
  if (options_.node.expect_shards) return Status::invalid_argument("an origin merging trainer shards publishes nothing itself");
  if (number != 0 && number <= version_)
    return Status::invalid_argument("version " + std::to_string(number) + ": versions move forward, and " + std::to_string(version_) +
                                    " was published");
  const std::uint64_t version = number ? number : version_ + 1;
  // Deltas go from one version to the next: a version that skips numbers starts a new chain.
  const bool same_layout = prev_ && prev_->layout.tensors == next.layout.tensors && prev_->layout.parts == next.layout.parts &&
                           version == version_ + 1;
  if (next.read && options_.codec == DeltaCodec::kAuto) {
    // Codec auto encodes a version twice: the image is read whole first.
    auto whole = std::make_shared<Bytes>(next.layout.image_size);
    constexpr std::uint64_t kPieceBytes = 1u << 20;
    std::mutex mu;
    Status read_status;
    pool_.parallel_for((whole->size() + kPieceBytes - 1) / kPieceBytes, [&](std::size_t i) {
      const std::uint64_t off = i * kPieceBytes, len = std::min<std::uint64_t>(kPieceBytes, whole->size() - off);
      if (Status st = next.read(off, MutableByteSpan(whole->data() + off, len)); !st.is_ok()) {
        std::lock_guard lock(mu);
        read_status = st;
      }
    });
    DC_RETURN_IF_ERROR(read_status);
    next = Checkpoint{std::move(next.layout), ByteSpan(*whole), whole, {}};
  }
  Status st;
  if (next.read) {
    // An anchor slice made as it goes out reads the image until all of it was made.
    DC_RETURN_IF_ERROR(wait_payloads_made());
    if (!same_layout) (void)take_anchor_request(version);
    st = encode_in_place(next, version, same_layout);
    if (!st.is_ok()) {
      prev_.reset();  // the image holds parts of two versions: the next one is an anchor
      return st;
    }
    next = Checkpoint{std::move(next.layout), ByteSpan(own_->bytes), own_, {}};
  } else if (!same_layout) {
    // The first checkpoint, the model changed shape, or numbers were skipped: a new chain
    // starts with an anchor.
    (void)take_anchor_request(version);
    st = publish_encoded(encode_version(next.layout, version, 0, {}, next.image, options_.encode, pool_, encoders_.get()));
    if (st.is_ok()) last_codec_.reset();
  } else {
    CodecDecision codec;
    bool anchor_instead = false;
    st = publish_encoded(encode_delta(options_.codec, options_.delivery, next.layout, version, version_, prev_->image, next.image,
                                      options_.encode, pool_, encoders_.get(), &codec),
                         {}, &anchor_instead);
    if (st.is_ok() && anchor_instead) st = publish_anchor_of(next.layout, next.image, version);
    if (st.is_ok()) last_codec_ = anchor_instead ? std::nullopt : std::optional<CodecDecision>(codec);
  }
  if (!st.is_ok()) return st;
  version_ = version;
  prev_ = std::move(next);
  if (same_layout && (version % options_.anchor_every == 0 || take_anchor_request(version))) DC_RETURN_IF_ERROR(publish_anchor());
  return version;
}

Status Publisher::encode_in_place(const Checkpoint& next, std::uint64_t version, bool delta) {
  std::unique_lock write(own_->mu);
  own_->version = 0;
  if (!delta) {
    own_->bytes.resize(next.layout.image_size);
    auto ev = encode_version_into(next.layout, version, 0, own_->bytes, next.read, own_anchor_options(), pool_, encoders_.get());
    if (!ev.is_ok()) return ev.status();
    own_->version = version;
    write.unlock();
    runtime::PayloadSource remake = remakes_anchors() ? remake_from_own_image(ev->manifest) : runtime::PayloadSource{};
    Status st = publish_encoded(std::move(ev), std::move(remake));
    if (st.is_ok()) last_codec_.reset();
    return st;
  }
  // The base is the previous version: in this image unless that one was given whole.
  if (prev_->image.data() != own_->bytes.data()) own_->bytes.assign(prev_->image.begin(), prev_->image.end());
  auto ev = encode_version_into(next.layout, version, version_, own_->bytes, next.read, with_delta_codec(options_.encode, options_.codec),
                                pool_, encoders_.get());
  if (!ev.is_ok()) return ev.status();
  own_->version = version;
  write.unlock();
  DC_ASSIGN_OR_RETURN(CodecDecision codec, fixed_codec_decision(*ev, options_.codec, options_.delivery));
  bool anchor_instead = false;
  DC_RETURN_IF_ERROR(publish_encoded(std::move(ev), {}, &anchor_instead));
  if (anchor_instead) {
    last_codec_.reset();
    return publish_anchor_of(next.layout, own_->bytes, version);
  }
  last_codec_ = codec;
  return Status::ok();
}

Status Publisher::serve_anchor_request() {
  if (!prev_ || !take_anchor_request(version_)) return Status::ok();
  return publish_anchor().with_context("anchor of version " + std::to_string(version_));
}

Delivery Publisher::delivery(std::uint64_t version) {
  return host_->call([&] {
    Delivery d;
    std::vector<std::uint64_t> times;
    const RunId& run = host_->node().run();
    for (const auto& [id, e] : host_->node().ledger()) {
      // A worker counts only for versions of this run: another run's v5 is not this run's v5.
      // One in an engine counts once its model applied the version.
      const bool holds = e.model.reported ? e.model.run == run && e.model.version >= version : e.run == run && e.version >= version;
      if (!holds) {
        if (e.model.reported && e.model.failed_run == run && e.model.failed_version >= version) d.failed.emplace_back(id, e.last_error);
        else if (!e.left) d.behind.push_back(id);
        continue;
      }
      d.workers_ready++;
      if (e.version == version && e.run == run) times.push_back(e.publish_to_ready_ms);
    }
    if (!times.empty()) {
      std::sort(times.begin(), times.end());
      d.max_ms = times.back();
      d.median_ms = times[times.size() / 2];
    }
    return d;
  });
}

Delivery Publisher::wait_for_delivery(std::uint64_t version, std::size_t workers, std::uint64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Delivery d;
  while (!interrupted_) {
    (void)serve_anchor_request();  // a failure is the node's to log; the next request tries again
    d = delivery(version);
    if (d.workers_ready >= workers || !d.failed.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return d;
}

std::uint64_t Publisher::newest_version() {
  return host_->call([&] { return host_->node().cache().newest_version(); });
}

RunId Publisher::run() {
  return host_->call([&] { return host_->node().run(); });
}

std::map<std::string, runtime::LedgerEntry> Publisher::ledger() {
  return host_->call([&] { return host_->node().ledger(); });
}

std::string CheckpointDirectory::next() {
  std::vector<std::string> ready;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    if (taken_.count(e.path().string())) continue;
    if (now - e.last_write_time() < std::chrono::seconds(1)) continue;
    ready.push_back(e.path().string());
  }
  if (ready.empty()) return {};
  const std::string first = *std::min_element(ready.begin(), ready.end());
  taken_.insert(first);
  return first;
}

}  // namespace deltacast::embed
