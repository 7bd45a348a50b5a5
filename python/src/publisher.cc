#include "deltacast/runtime/trust.h"
#include "deltacast/transport/run_state.h"
#include "native.h"

namespace deltacast::python {

namespace py = pybind11;

namespace {

constexpr std::uint64_t kAnchorServeMs = 50;  // how often the anchor server looks for requests

}  // namespace

embed::NodeSettings publisher_settings(const PublisherArgs& a) {
  embed::NodeSettings s;
  if (!a.settings.empty()) s = checked(embed::parse_node_settings(a.settings, "settings"));
  embed::NodeSettings named;
  named.node_id = a.id;
  named.listen = a.listen;
  if (!a.origin.empty()) named.parents = {a.origin};
  named.shard = a.shard;
  named.expect_shards = a.expect_shards;
  named.metrics = a.metrics;
  named.allow_keys = a.allow_keys;
  if (a.keys) named.curve = transport::CurveKeys{a.keys->first, a.keys->second};
  embed::overlay_node_settings(s, named);
  return s;
}

namespace {

embed::PublisherOptions publisher_options(const PublisherArgs& a) {
  embed::LoadedNode loaded = checked(embed::load_node(publisher_settings(a), embed::NodeRole::kPublisher));
  embed::PublisherOptions o;
  o.node = std::move(loaded.node);
  o.host = std::move(loaded.host);
  if (!a.sign_key.empty()) {
    auto key = runtime::parse_signing_key(a.sign_key);
    if (!key.is_ok()) throw Error("sign_key: " + key.status().to_string());
    o.node.sign_key = std::make_shared<const runtime::SigningKey>(*key);
    o.host.run_state_path = a.run_state.empty() ? transport::default_run_state_path(key->public_key) : a.run_state;
  }
  if (a.anchor_every) o.anchor_every = *a.anchor_every;
  if (a.chunk_bytes) o.encode.chunk_bytes = *a.chunk_bytes;
  if (Status st = embed::set_delta_codec(o, a.codec, a.wan_rate, a.worker_cores, "codec", "wan_rate"); !st.is_ok())
    throw Error(st.message());
  o.threads = a.threads;
  return o;
}

}  // namespace

Publisher::Publisher(const PublisherArgs& args) {
  const embed::PublisherOptions options = publisher_options(args);
  auto p = [&] {
    py::gil_scoped_release release;
    return embed::Publisher::start(options);
  }();
  if (!p.is_ok()) throw Error(p.status().to_string());
  p_ = std::move(p).value();
  merges_ = options.node.expect_shards > 0;
  // Workers that join while the trainer trains ask for an anchor; answer without waiting for
  // the next publish().
  anchor_server_ = std::thread([this, publisher = p_] {
    while (!stopping_) {
      {
        std::lock_guard lock(mu_);
        (void)publisher->serve_anchor_request();  // a failure is logged by the node; the next request tries again
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kAnchorServeMs));
    }
  });
}

Publisher::~Publisher() { close(); }

std::shared_ptr<embed::Publisher> Publisher::live() const {
  if (!p_ || stopping_) throw Error("the publisher is closed");
  return p_;
}

std::uint64_t Publisher::publish(const std::vector<TensorRef>& tensors, std::uint64_t number) {
  const auto publisher = live();  // held while publishing: close() in another thread cannot free it
  embed::Publisher& p = *publisher;
  // One publish at a time, whichever Python thread calls (the GIL is let go while it works).
  std::unique_lock turn(publish_mu_, std::defer_lock);
  {
    py::gil_scoped_release release;
    turn.lock();
  }
  // The publisher reads the tensors a chunk at a time while it encodes, into the one image it
  // keeps (embed::Checkpoint::read): no gathered copy of the whole state dict.
  embed::Checkpoint checkpoint{layout_of(tensors), {}, nullptr, {}};
  checkpoint.read = [&tensors, layout = checkpoint.layout](std::uint64_t offset, MutableByteSpan out) {
    read_range(tensors, layout, offset, out);
    return Status::ok();
  };
  Result<std::uint64_t> version = Status::ok();
  {
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    version = p.publish(std::move(checkpoint), number);
  }
  if (!version.is_ok()) throw Error(version.status().to_string());
  return *version;
}

std::size_t Publisher::known_workers(embed::Publisher& p) {
  std::size_t n = 0;
  for (const auto& [id, e] : p.ledger()) n += e.left ? 0 : 1;
  return std::max<std::size_t>(n, 1);
}

py::tuple Publisher::wait_ready(std::uint64_t version, std::size_t workers, double timeout_s) {
  const auto publisher = live();
  embed::Publisher& p = *publisher;
  if (version == 0 || version > p.version()) throw Error("version " + std::to_string(version) + " was not published");
  embed::Delivery d;
  std::size_t wanted = workers;
  const bool reached = wait_sliced(timeout_s, [&](std::uint64_t ms) {
    if (stopping_) return true;
    if (workers == 0) wanted = known_workers(p);
    std::lock_guard lock(mu_);
    d = p.wait_for_delivery(version, wanted, ms);
    return d.workers_ready >= wanted || !d.failed.empty();
  });
  if (stopping_) throw Error("the publisher was closed while waiting");
  // Names the workers it waits for, with what they last said.
  const auto ledger = p.ledger();
  const auto named = [&](const std::string& id) {
    auto e = ledger.find(id);
    return e == ledger.end() || e->second.last_error.empty() ? id : id + " (" + e->second.last_error + ")";
  };
  if (!d.failed.empty()) {
    std::string message = "version " + std::to_string(version) + " could not be applied by ";
    for (std::size_t i = 0; i < d.failed.size(); ++i) message += (i ? "; " : "") + named(d.failed[i].first);
    throw Error(message);
  }
  if (!reached) {
    std::string message = "version " + std::to_string(version) + " is ready on " + std::to_string(d.workers_ready) + " of " +
                          std::to_string(wanted) + " workers";
    for (std::size_t i = 0; i < d.behind.size() && i < 8; ++i) message += (i ? "; " : "; not yet: ") + named(d.behind[i]);
    if (d.behind.size() > 8) message += "; and " + std::to_string(d.behind.size() - 8) + " more";
    PyErr_SetString(PyExc_TimeoutError, message.c_str());
    throw py::error_already_set();
  }
  return py::make_tuple(d.workers_ready, wanted, d.median_ms, d.max_ms);
}

py::dict Publisher::ledger() {
  py::dict out;
  for (const auto& [id, e] : live()->ledger()) {
    py::dict entry;
    entry["version"] = e.version;
    entry["run"] = deltacast::to_string(e.run);
    entry["checksum"] = e.checksum;
    entry["publish_to_ready_ms"] = e.publish_to_ready_ms;
    entry["last_error"] = e.last_error;
    entry["left"] = e.left;
    entry["duplicates"] = e.duplicates;
    if (e.model.reported) {
      py::dict model;
      model["version"] = e.model.version;
      model["run"] = deltacast::to_string(e.model.run);
      model["failed_version"] = e.model.failed_version;
      model["failed_run"] = deltacast::to_string(e.model.failed_run);
      entry["model"] = model;
    } else {
      entry["model"] = py::none();
    }
    out[py::str(id)] = entry;
  }
  return out;
}

std::uint64_t Publisher::version() const {
  const auto p = live();
  if (!merges_) return p->version();
  py::gil_scoped_release release;
  return p->newest_version();
}
std::string Publisher::run() { return deltacast::to_string(live()->run()); }

py::object Publisher::last_codec() {
  const auto publisher = live();
  std::optional<CodecDecision> d;
  {
    py::gil_scoped_release release;
    std::lock_guard turn(publish_mu_);  // publish() writes it
    d = publisher->last_codec();
  }
  if (!d) return py::none();
  py::dict r;
  r["codec"] = std::string(to_string(d->chosen));
  r["v2_tried"] = d->v2_tried;
  r["v1_wan_s"] = d->v1.wan_s;
  r["v1_worker_s"] = d->v1.worker_s;
  r["v2_wan_s"] = d->v2.wan_s;
  r["v2_worker_s"] = d->v2.worker_s;
  r["v3_tried"] = d->v3_tried;
  r["v3_wan_s"] = d->v3.wan_s;
  r["v3_worker_s"] = d->v3.worker_s;
  return r;
}
std::string Publisher::listening() { return live()->host().bound_endpoint(); }

void Publisher::close() {
  stopping_ = true;
  const std::shared_ptr<embed::Publisher> p = std::move(p_);  // callers in other threads keep their own reference
  if (!p) return;
  py::gil_scoped_release release;
  p->interrupt();  // a publish() waiting for room ends
  if (anchor_server_.joinable()) anchor_server_.join();
  p->stop();
}

}  // namespace deltacast::python
