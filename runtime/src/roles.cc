#include "roles.h"

#include "deltacast/common/check.h"
#include "scrubber.h"
#include "shard_merger.h"
#include "shard_publisher.h"

namespace deltacast::runtime {

// Workers: the reconstructor builds each version into the image, the scrubber re-hashes what it
// exposes and has a damaged image dropped.
class WorkerImage final : public Image, private Scrubber::Owner {
 public:
  WorkerImage(NodeContext& ctx, VersionCache& cache, TaskRunner* tasks, Reconstructor::Owner& owner)
      : rebuild_(ctx, cache, tasks, owner), scrubber_(ctx, tasks, *this) {}
  Status restore(std::shared_ptr<ModelVersion> version) override { return rebuild_.restore(std::move(version)); }
  std::shared_ptr<const ModelVersion> current() const override { return rebuild_.current(); }
  std::uint64_t held_version() const override { return rebuild_.held_version(); }
  std::uint64_t anchor_floor() const override { return rebuild_.anchor_floor(); }
  void hold_history_from(const RunId& run, std::uint64_t version) override { rebuild_.hold_history_from(run, version); }
  std::uint64_t deltas_after(std::uint64_t) const override { return rebuild_.need_anchor() ? 0 : rebuild_.held_version(); }
  bool wants_anchor(bool parent_in_newer_run, std::uint64_t parent_newest) const override;
  bool settled() const override { return !rebuild_.busy() && !rebuild_.need_anchor(); }
  std::vector<VersionKey> building() const override {
    std::vector<VersionKey> keys = rebuild_.chain();
    if (auto key = rebuild_.building()) keys.push_back(*key);
    return keys;
  }
  std::shared_ptr<const Manifest> held_manifest() const override { return rebuild_.held_manifest(); }
  void on_chunk(const VersionKey& key, std::uint32_t index) override { rebuild_.on_chunk(key, index); }
  void advance() override { rebuild_.advance(); }
  void tick(std::uint64_t now_ms) override;
  std::uint64_t next_duty_ms() const override { return scrubber_.next_duty_ms(rebuild_.current() != nullptr); }
  bool release() override;
  void abandon(const std::string& why) override;
  void forget() override { rebuild_.forget(); }

 private:
  void on_scrub_mismatch(const std::shared_ptr<const ModelVersion>& version, std::size_t chunk) override;

  Reconstructor rebuild_;
  Scrubber scrubber_;
};

bool WorkerImage::wants_anchor(bool parent_in_newer_run, std::uint64_t parent_newest) const {
  if (rebuild_.need_anchor()) return true;
  if (rebuild_.busy()) return false;
  return parent_in_newer_run || (rebuild_.held_version() == 0 && parent_newest > 0);
}

void WorkerImage::tick(std::uint64_t now_ms) {
  if (rebuild_.busy()) rebuild_.pump();  // in place: readers may have let go since
  rebuild_.check_fill(now_ms);
  scrubber_.tick(now_ms, rebuild_.current());
}

bool WorkerImage::release() {
  if (!rebuild_.withholding()) return false;
  rebuild_.release();
  return true;
}

void WorkerImage::abandon(const std::string& why) {
  if (auto key = rebuild_.building()) rebuild_.abandon("version " + to_string(*key) + " " + why, false);
}

void WorkerImage::on_scrub_mismatch(const std::shared_ptr<const ModelVersion>& version, std::size_t chunk) {
  rebuild_.drop_damaged(version, "scrub: chunk " + std::to_string(chunk) + " of version " + std::to_string(version->version) +
                                     " no longer matches its state hash (memory changed outside of a delta); rebuilding from an anchor");
}

std::unique_ptr<Image> make_image(NodeContext& ctx, VersionCache& cache, TaskRunner* tasks, Reconstructor::Owner& owner) {
  if (ctx.config.reconstruct) return std::make_unique<WorkerImage>(ctx, cache, tasks, owner);
  return std::make_unique<NoImage>();
}

void NoSliceOutbox::publish(const VersionKey&, SharedBytes, std::vector<SharedBytes>, const RunId&, PayloadSource) {
  DC_CHECK(false, "a slice published by a node that is not a trainer shard");
}

std::unique_ptr<SliceOutbox> make_slice_outbox(NodeContext& ctx, UpstreamLink& origin) {
  if (ctx.config.shard_count > 0) return std::make_unique<ShardPublisher>(ctx, origin);
  return std::make_unique<NoSliceOutbox>();
}

std::unique_ptr<SliceIntake> make_slice_intake(NodeContext& ctx) {
  if (ctx.config.expect_shards > 0) return std::make_unique<ShardMerger>(ctx);
  return std::make_unique<NoSliceIntake>();
}

}  // namespace deltacast::runtime
