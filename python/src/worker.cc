#include <cstring>

#include "native.h"
#include "deltacast/embed/node_config.h"
#include "deltacast/embed/share.h"
#include "deltacast/transport/wire.h"
#include "version_capsule.h"

namespace deltacast::python {

namespace py = pybind11;

std::string Version::run() const { return deltacast::to_string(v_->run); }

py::list Version::tensor_infos() const {
  py::list out;
  for (const auto& t : v_->tensors) {
    const std::size_t dims = t.shape.size();
    py::tuple shape(dims), strides(dims);
    std::uint64_t stride = 1;  // contiguous, in elements
    for (std::size_t i = dims; i-- > 0;) {
      shape[i] = t.shape[i];
      strides[i] = stride;
      stride *= t.shape[i];
    }
    out.append(py::make_tuple(t.name, std::string(dtype_name(t.dtype)), shape, t.offset, t.nbytes, strides));
  }
  return out;
}

py::buffer_info Version::buffer() const {
  const auto& image = v_->image;
  return py::buffer_info(const_cast<std::uint8_t*>(image.data()), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                         {static_cast<py::ssize_t>(image.size())}, {1}, /*readonly=*/true);
}

namespace {

// A numpy array that owns `v` (moved into a capsule: no copy), viewed as `T`.
template <typename T, typename V>
py::array_t<T> owning_array(V&& v, std::size_t count) {
  auto* owned = new V(std::forward<V>(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<V*>(p); });
  return py::array_t<T>({static_cast<py::ssize_t>(count)}, {sizeof(T)}, reinterpret_cast<const T*>(owned->data()), free_when_done);
}

}  // namespace

py::tuple Version::patch(std::size_t index, std::uint64_t since, std::uint64_t at, std::optional<std::uint64_t> values_at,
                         std::optional<py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>> keep) const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  if (keep) {
    if (keep->ndim() != 2 || keep->shape(1) != 2) throw py::value_error("keep: an array of (first, last) element ranges");
    const std::uint64_t* r = keep->data();
    ranges.reserve(static_cast<std::size_t>(keep->shape(0)));
    for (py::ssize_t i = 0; i < keep->shape(0); ++i) ranges.emplace_back(r[2 * i], r[2 * i + 1]);
    for (std::size_t i = 0; i < ranges.size(); ++i)
      if (ranges[i].first > ranges[i].second || (i > 0 && ranges[i].first < ranges[i - 1].second))
        throw py::value_error("keep: ranges must ascend and stay apart");
  }
  auto patch = [&] {
    py::gil_scoped_release release;
    return runtime::patch_between(*v_, index, since, at, values_at.value_or(at), ranges);
  }();
  if (!patch.is_ok()) throw Error(patch.status().to_string());
  const std::size_t count = patch->elements.size(), bytes = patch->values.size();
  return py::make_tuple(owning_array<std::int64_t>(std::move(patch->elements), count), owning_array<std::uint8_t>(std::move(patch->values), bytes),
                        patch->changed);
}

py::array_t<std::uint8_t> Version::tensor_at(std::size_t index, std::uint64_t at) const {
  auto bytes = [&] {
    py::gil_scoped_release release;
    return runtime::tensor_at(*v_, index, at);
  }();
  if (!bytes.is_ok()) throw Error(bytes.status().to_string());
  const std::size_t size = bytes->size();
  return owning_array<std::uint8_t>(std::move(bytes).value(), size);
}

std::uint64_t Version::checksum_at(std::uint64_t at) const {
  auto c = runtime::checksum_at(*v_, at);
  if (!c.is_ok()) throw Error(c.status().to_string());
  return *c;
}

std::uint64_t Version::changes_since() const { return runtime::changes_reach(*v_); }
std::uint64_t Version::values_since() const { return runtime::values_reach(*v_); }

py::object Version::capsule() const { return py::reinterpret_steal<py::object>(version_capsule(v_)); }

namespace {

}  // namespace

embed::NodeSettings worker_settings(const WorkerArgs& a) {
  embed::NodeSettings s;
  if (!a.config_path.empty()) s = checked(embed::read_node_settings(a.config_path));
  if (!a.settings.empty()) embed::overlay_node_settings(s, checked(embed::parse_node_settings(a.settings, "settings")));
  embed::NodeSettings named;
  named.node_id = a.id;
  named.parents = a.parents;
  named.trees = a.trees;
  named.parent_keys = a.parent_keys;
  named.tree_parent_keys = a.tree_parent_keys;
  named.trust_keys = a.trust_keys;
  named.in_place = a.in_place;
  named.share = a.share;
  named.tensors = a.tensors;
  named.listen = a.listen;
  named.metrics = a.metrics;
  named.change_history = a.change_history;
  named.change_history_bytes = a.change_history_bytes;
  named.stripes = a.stripes;
  if (a.keys) named.curve = transport::CurveKeys{a.keys->first, a.keys->second};
  embed::overlay_node_settings(s, named);
  if (s.node_id.empty()) throw Error("a worker needs an id");
  if (s.parents.empty() && s.trees.empty()) throw Error("a worker needs at least one parent endpoint");
  return s;
}

Worker::Worker(const WorkerArgs& args) {
  embed::LoadedNode loaded = checked(embed::load_node(worker_settings(args), embed::NodeRole::kWorker));
  embed::WorkerOptions o = embed::worker_options(std::move(loaded));
  o.out_dir = args.state_dir;
  start(std::move(o));
}

void Worker::start(embed::WorkerOptions o) {
  auto w = [&] {
    py::gil_scoped_release release;
    return embed::Worker::start(std::move(o));
  }();
  if (!w.is_ok()) throw Error(w.status().to_string());
  w_ = std::move(w).value();
}

std::unique_ptr<Worker> Worker::attach(const std::string& path, double timeout_s) {
  auto a = [&] {
    py::gil_scoped_release release;
    return embed::Attached::attach(path, timeout_s < 0 ? UINT64_MAX : static_cast<std::uint64_t>(timeout_s * 1000));
  }();
  if (!a.is_ok()) throw Error(a.status().to_string());
  std::unique_ptr<Worker> w(new Worker);
  w->w_ = std::move(a).value();
  return w;
}

Worker::~Worker() {
  closed_ = true;
  py::gil_scoped_release release;
  w_.reset();
}

std::shared_ptr<embed::VersionSource> Worker::live() const {
  if (!w_ || closed_) throw Error("the worker is closed");
  return w_;
}

std::shared_ptr<Version> Version::stub() const {
  auto s = std::make_shared<runtime::ModelVersion>();
  s->version = v_->version;
  s->base_version = v_->base_version;
  s->run = v_->run;
  s->checksum = v_->checksum;
  return std::make_shared<Version>(std::move(s));
}

std::shared_ptr<Version> Worker::wait(std::uint64_t min_version, double timeout_s) {
  const auto w = live();
  std::shared_ptr<const runtime::ModelVersion> v;
  std::string refused;
  const bool got = wait_sliced(timeout_s, [&](std::uint64_t ms) {
    // A version that is there is given even after a refusal.
    const bool refused_before = !w->refusal().empty();
    v = closed_ ? nullptr : w->wait_for_version(std::max<std::uint64_t>(min_version, 1), refused_before ? 0 : ms);
    if (v != nullptr || closed_) return true;
    refused = w->refusal();
    return !refused.empty();
  });
  if (closed_) throw Error("the worker was closed while waiting");
  if (!v && !refused.empty()) throw Error(refused);
  if (!got) {
    PyErr_SetString(PyExc_TimeoutError, ("no version >= " + std::to_string(min_version) + " within the timeout").c_str());
    throw py::error_already_set();
  }
  return std::make_shared<Version>(std::move(v));
}

std::shared_ptr<Version> Worker::wait_newer(const std::shared_ptr<Version>& after, double timeout_s) {
  const auto w = live();
  std::optional<embed::VersionTag> base;
  if (after) base = embed::VersionTag::of(*after->get());
  std::shared_ptr<const runtime::ModelVersion> v;
  wait_sliced(timeout_s, [&](std::uint64_t ms) {
    v = closed_ ? nullptr : w->wait_for_newer(base, ms);
    return v != nullptr || closed_;
  });
  if (closed_) throw Error("the worker was closed while waiting");
  return v ? std::make_shared<Version>(std::move(v)) : nullptr;
}

namespace {

RunId run_of(const std::string& text) {
  if (text.empty()) return {};
  auto run = parse_run_id(text);
  if (!run.is_ok()) throw py::value_error(run.status().message());
  return *run;
}

}  // namespace

std::shared_ptr<Version> Worker::wait_for(const std::string& run_text, std::uint64_t version, double timeout_s) {
  const RunId run = run_of(run_text);
  const auto w = live();
  std::shared_ptr<const runtime::ModelVersion> v;
  std::string refused;
  wait_sliced(timeout_s, [&](std::uint64_t ms) {
    // A version that is there is given even after a refusal.
    const bool refused_before = !w->refusal().empty();
    v = closed_ ? nullptr : w->wait_for_run_version(run, version, refused_before ? 0 : ms);
    if (v != nullptr || closed_) return true;
    refused = w->refusal();
    return !refused.empty();
  });
  if (closed_) throw Error("the worker was closed while waiting");
  if (!v && !refused.empty()) throw Error(refused);
  return v ? std::make_shared<Version>(std::move(v)) : nullptr;
}

void Worker::set_tensors(const std::vector<std::string>& patterns) {
  TensorSubset subset{patterns};
  const auto w = live();
  Status st;
  {
    py::gil_scoped_release release;
    st = w->set_tensors(std::move(subset));
  }
  if (!st.is_ok()) throw py::value_error(st.message());
}

void Worker::hold_history_from(const std::string& run, std::uint64_t version) { live()->hold_history_from(run_of(run), version); }

void Worker::report_model(const std::string& run, std::uint64_t version, const std::string& failed_run, std::uint64_t failed_version,
                          const std::string& error) {
  runtime::ModelState model;
  model.reported = true;
  model.version = version;
  model.run = run_of(run);
  model.failed_version = failed_version;
  model.failed_run = run_of(failed_run);
  live()->report_model(model, error);
}

std::shared_ptr<Version> Worker::current() const {
  auto v = live()->current();
  return v ? std::make_shared<Version>(std::move(v)) : nullptr;
}

void Worker::close() {
  closed_ = true;
  const std::shared_ptr<embed::VersionSource> w = std::move(w_);  // waits in other threads keep their own reference
  if (!w) return;
  py::gil_scoped_release release;
  // With a state_dir, the version held is on disk when close() returns: a version that became
  // ready just before close() may not have reached the saver's thread yet.
  (void)w->stop(/*save_current=*/true);
}

std::string Worker::disconnected() const {
  auto* attached = dynamic_cast<embed::Attached*>(live().get());
  return attached ? attached->disconnected() : std::string();
}

std::string Worker::listening() const {
  auto* worker = dynamic_cast<embed::Worker*>(live().get());
  return worker ? worker->host().bound_endpoint() : std::string();
}

}  // namespace deltacast::python
