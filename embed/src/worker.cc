#include "deltacast/embed/worker.h"
#include "deltacast/embed/share.h"
#include "deltacast/transport/system.h"

#include <spdlog/spdlog.h>

namespace deltacast::embed {

WorkerOptions worker_options(LoadedNode loaded) {
  WorkerOptions o;
  o.node = std::move(loaded.node);
  o.host = std::move(loaded.host);
  o.share_path = std::move(loaded.share_path);
  return o;
}

Result<std::unique_ptr<Worker>> Worker::start(WorkerOptions o) {
  if (o.node.node_id.empty()) return Status::invalid_argument("a worker needs a node id");
  if (!o.node.has_parents()) return Status::invalid_argument("a worker needs at least one parent");
  if (!o.share_path.empty()) {
    if (o.node.in_place)
      return Status::invalid_argument("a worker that shares its versions (--share) cannot update in place (--in-place): its readers hold the version they read");
    o.node.share_images = true;
  }
  DC_RETURN_IF_ERROR(runtime::check_parents(o.node));
  DC_RETURN_IF_ERROR(runtime::check_tensors(o.node));
  o.node.reconstruct = true;
  o.node.serve_children = !o.host.bind_endpoint.empty();
  std::unique_ptr<Worker> w(new Worker);
  const std::string id = o.node.node_id;
  const TensorSubset tensors = o.node.tensors;
  w->host_ = std::make_unique<transport::NodeHost>(std::move(o.node), std::move(o.host));
  if (!o.out_dir.empty()) {
    w->store_.emplace(transport::directory_version_store(o.out_dir, id, o.keep_versions));
    w->store_->set_tensors(tensors);
    // A wrong out dir is reported now, not at the first version.
    DC_RETURN_IF_ERROR(w->store_->prepare().with_context("out dir " + o.out_dir));
    // A restarted worker starts from the newest version it saved, and fetches only the deltas
    // after it (an anchor only if its parents no longer have them).
    if (std::shared_ptr<runtime::ModelVersion> saved = o.resume ? w->store_->resume() : nullptr) {
      w->resumed_ = saved;
      w->host_->restore(std::move(saved));
    }
  }
  if (!o.share_path.empty()) {
    Worker* self = w.get();
    ImageSharer::Callbacks callbacks;
    callbacks.hold_history_from = [self](const RunId& run, std::uint64_t version) { self->post_hold(run, version); };
    callbacks.report_model = [self](const runtime::ModelState& model, const std::string& error) { self->post_report(model, error); };
    DC_ASSIGN_OR_RETURN(w->sharer_, ImageSharer::start(o.share_path, std::move(callbacks)));
  }
  if (o.on_version || w->sharer_)
    w->host_->set_on_version([cb = std::move(o.on_version), host = w->host_.get(), sharer = w->sharer_.get()](std::shared_ptr<const runtime::ModelVersion> v) {
      if (sharer) sharer->offer(v);
      if (cb) cb(std::move(v), host->node());
    });
  DC_RETURN_IF_ERROR(w->host_->start_thread());
  if (w->sharer_) {
    if (auto v = w->resumed_ ? w->resumed_ : w->host_->current()) w->sharer_->offer(std::move(v));
  }
  if (w->store_) w->saver_ = std::thread([p = w.get()] { p->save_loop(); });
  return w;
}

// Saves each new version as it becomes current; a slow disk skips versions rather than hold
// images. A failed save is retried by the VersionSaver; the worker keeps serving. Between saves
// it holds no version, only run and number: an in-place worker applies the next version only
// once nobody holds its image.
void Worker::save_loop() {
  using Tag = transport::NodeHost::VersionTag;
  // Every failed save counts in the node's deltacast_save_failures_total.
  runtime::VersionSaver saver(
      *store_, transport::system_clock(), runtime::VersionSaver::kSaveRetryMsDefault,
      [host = host_.get()] { host->post([host] { host->node().count_save_failure(); }); }, transport::log_to_spdlog);
  std::optional<Tag> seen, saved;  // the newest version seen; the newest on disk
  if (resumed_) seen = saved = Tag::of(*resumed_);
  auto offer = [&](std::shared_ptr<const runtime::ModelVersion> v) {
    const Tag tag = Tag::of(*v);
    seen = tag;
    saver.offer(std::move(v));
    if (!saver.unsaved()) saved = tag;
  };
  while (!stopping_) {
    // Woken by a new version, or by stop() (NodeHost::end_waits); a failed save is retried
    // every kSaveRetryPollMs.
    if (auto v = host_->wait_for_newer(seen, saver.unsaved() ? kSaveRetryPollMs : kIdleWaitMs)) {
      saver.on_run(host_->current_run());
      offer(std::move(v));
      continue;
    }
    saver.on_run(host_->current_run());
    if (!saver.unsaved()) continue;
    // A failed save is tried again with the version current now (none while an in-place update
    // runs), which may be newer than the one seen: it is not written twice.
    if (auto current = host_->current()) {
      const Tag tag = Tag::of(*current);
      saver.retry_if_due(current);
      if (!saver.unsaved()) seen = saved = tag;
    }
  }
  if (save_current_) {
    auto v = host_->current();
    if (v && Tag::of(*v) != saved) {
      saver.on_run(host_->current_run());
      offer(std::move(v));
    }
  }
  unsaved_ = saver.unsaved();
  save_error_ = saver.last_error();
  // Asked to save, but an in-place update was overwriting the version that was ready.
  if (save_current_ && !unsaved_ && seen && seen != saved && !host_->current()) {
    unsaved_ = seen->version;
    save_error_ = "the next version was being applied in place over it";
  }
}

void Worker::report_model(const runtime::ModelState& model, const std::string& error) {
  if (sharer_) return sharer_->report_local(model, error);
  post_report(model, error);
}

void Worker::hold_history_from(const RunId& run, std::uint64_t version) {
  if (sharer_) return sharer_->hold_local(run, version);
  post_hold(run, version);
}

Status Worker::set_tensors(TensorSubset tensors) {
  return host_->call([&] { return host_->node().set_tensors(std::move(tensors)); });
}

void Worker::post_report(const runtime::ModelState& model, const std::string& error) {
  host_->post([host = host_.get(), model, error] { host->node().report_model(model, error); });
}

void Worker::post_hold(const RunId& run, std::uint64_t version) {
  host_->post([host = host_.get(), run, version] { host->node().hold_history_from(run, version); });
}

Status Worker::stop(bool save_current) {
  if (stopped_) return Status::ok();
  stopped_ = true;
  save_current_ = save_current;
  stopping_ = true;
  host_->end_waits();
  if (saver_.joinable()) saver_.join();
  if (sharer_) sharer_->stop();  // readers keep the versions they mapped
  host_->stop();
  if (unsaved_) return Status::io_error("version " + std::to_string(*unsaved_) + " is ready but not saved: " + save_error_);
  return Status::ok();
}

Worker::~Worker() {
  if (Status st = stop(); !st.is_ok()) spdlog::warn("stopping with {}", st.message());
}

}  // namespace deltacast::embed
