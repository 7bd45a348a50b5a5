// deltacast._native: the library's Worker and Publisher for the Python package (python/deltacast), which adds
// the tensor views, callbacks and engine adapters on top.
#include <pybind11/stl.h>

#include "native.h"

namespace py = pybind11;
using namespace deltacast::python;

void bind_placement(py::module_& m);  // placement.cc

namespace {

// (name, dtype, shape, data pointer, nbytes, part) tuples, as deltacast/__init__.py makes them;
// part is None, or (row_begin, rows) for a trainer shard's rows of a tensor.
std::vector<TensorRef> tensor_refs(const py::list& items) {
  std::vector<TensorRef> out;
  out.reserve(items.size());
  for (const auto& item : items) {
    const auto t = item.cast<std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::uint64_t,
                                        std::optional<std::pair<std::uint64_t, std::uint64_t>>>>();
    TensorRef r{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t), std::nullopt};
    if (const auto& part = std::get<5>(t)) r.part = deltacast::TensorPart{part->first, part->second};
    out.push_back(std::move(r));
  }
  return out;
}

// Keyword arguments into the args struct: each name once, an unknown one is a TypeError, and
// None leaves a field unset.
class Kwargs {
 public:
  explicit Kwargs(const py::kwargs& kw) : kw_(kw) {}
  template <typename T>
  Kwargs& get(const char* name, T& out) {
    seen_.emplace_back(name);
    if (kw_.contains(name) && !kw_[name].is_none()) out = kw_[name].cast<T>();
    return *this;
  }
  void done() const {
    for (const auto& item : kw_) {
      const auto key = item.first.cast<std::string>();
      if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) throw py::type_error("unexpected keyword argument '" + key + "'");
    }
  }

 private:
  const py::kwargs& kw_;
  std::vector<std::string> seen_;
};

// The settings as a config file holds them, once they check as starting would check them.
std::string checked_json(const deltacast::embed::NodeSettings& s, deltacast::embed::NodeRole role) {
  (void)checked(deltacast::embed::load_node(s, role));
  return deltacast::embed::node_settings_json(s);
}

PublisherArgs publisher_args(const py::kwargs& kw) {
  PublisherArgs a;
  Kwargs k(kw);
  k.get("id", a.id).get("listen", a.listen).get("origin", a.origin).get("shard", a.shard).get("expect_shards", a.expect_shards);
  k.get("keys", a.keys).get("allow_keys", a.allow_keys).get("sign_key", a.sign_key);
  k.get("anchor_every", a.anchor_every).get("codec", a.codec).get("wan_rate", a.wan_rate).get("worker_cores", a.worker_cores);
  k.get("chunk_bytes", a.chunk_bytes).get("threads", a.threads).get("metrics", a.metrics).get("run_state", a.run_state);
  k.get("settings", a.settings).done();
  return a;
}

WorkerArgs worker_args(const py::kwargs& kw) {
  WorkerArgs a;
  Kwargs k(kw);
  k.get("id", a.id).get("parents", a.parents).get("keys", a.keys).get("parent_keys", a.parent_keys).get("trees", a.trees);
  k.get("tree_parent_keys", a.tree_parent_keys).get("trust_keys", a.trust_keys).get("state_dir", a.state_dir).get("in_place", a.in_place);
  k.get("share", a.share).get("listen", a.listen).get("metrics", a.metrics).get("change_history", a.change_history);
  k.get("change_history_bytes", a.change_history_bytes).get("stripes", a.stripes).get("config_path", a.config_path);
  k.get("tensors", a.tensors).get("settings", a.settings).done();
  return a;
}

void bind_publisher(py::module_& m) {
  py::class_<Publisher>(m, "Publisher")
      .def(py::init([](const py::kwargs& kw) { return std::make_unique<Publisher>(publisher_args(kw)); }))
      .def_static("settings", [](const py::kwargs& kw) { return checked_json(publisher_settings(publisher_args(kw)), deltacast::embed::NodeRole::kPublisher); })
      .def("publish", [](Publisher& p, const py::list& tensors, std::uint64_t number) { return p.publish(tensor_refs(tensors), number); })
      .def("wait_ready", &Publisher::wait_ready, py::arg("version"), py::arg("workers"), py::arg("timeout_s"))
      .def("ledger", &Publisher::ledger)
      .def("version", &Publisher::version)
      .def("last_codec", &Publisher::last_codec)
      .def("run", &Publisher::run)
      .def("listening", &Publisher::listening)
      .def("close", &Publisher::close);

  m.def(
      "encode",
      [](const std::optional<py::list>& base, const py::list& next, std::uint64_t version, std::uint64_t base_version, bool v2,
         std::uint64_t chunk_bytes) {
        const std::vector<TensorRef> base_refs = base ? tensor_refs(*base) : std::vector<TensorRef>{};
        return encode_container(base ? &base_refs : nullptr, tensor_refs(next), version, base_version, v2, chunk_bytes);
      },
      py::arg("base"), py::arg("next"), py::arg("version"), py::arg("base_version"), py::arg("v2"), py::arg("chunk_bytes"));
  m.def(
      "decode",
      [](const std::optional<py::list>& base, py::buffer container) {
        const std::vector<TensorRef> base_refs = base ? tensor_refs(*base) : std::vector<TensorRef>{};
        return decode_container(std::move(container), base ? &base_refs : nullptr);
      },
      py::arg("base"), py::arg("container"));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "deltacast native module: use the deltacast package instead";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  deltacast::transport::log_to_stderr();  // a Python program's stdout is its own
  m.def("setting_names", &deltacast::embed::node_setting_names, "The fields a node config file may hold (docs/RUNTIME.md).");

  py::class_<Version, std::shared_ptr<Version>>(m, "Version", py::buffer_protocol())
      .def_property_readonly("number", &Version::number)
      .def_property_readonly("base_number", &Version::base_number)
      .def_property_readonly("checksum", &Version::checksum)
      .def_property_readonly("ready_us", &Version::ready_us)
      .def_property_readonly("run", &Version::run)
      .def("tensor_infos", &Version::tensor_infos)
      .def("stub", &Version::stub)
      .def("patch", &Version::patch, py::arg("index"), py::arg("since"), py::arg("at"), py::arg("values_at") = py::none(),
           py::arg("keep") = py::none())
      .def("tensor_at", &Version::tensor_at, py::arg("index"), py::arg("at"))
      .def("checksum_at", &Version::checksum_at, py::arg("at"))
      .def_property_readonly("changes_since", &Version::changes_since)
      .def_property_readonly("values_since", &Version::values_since)
      .def("capsule", &Version::capsule)
      .def_buffer([](const Version& v) { return v.buffer(); });

  py::class_<Worker>(m, "Worker")
      .def(py::init([](const py::kwargs& kw) { return std::make_unique<Worker>(worker_args(kw)); }))
      .def_static("settings", [](const py::kwargs& kw) { return checked_json(worker_settings(worker_args(kw)), deltacast::embed::NodeRole::kWorker); })
      .def_static("attach", &Worker::attach, py::arg("path"), py::arg("timeout_s"))
      .def("wait", &Worker::wait, py::arg("min_version"), py::arg("timeout_s"))
      .def("wait_newer", &Worker::wait_newer, py::arg("after"), py::arg("timeout_s"))
      .def("current", &Worker::current)
      .def("wait_for", &Worker::wait_for, py::arg("run"), py::arg("version"), py::arg("timeout_s"))
      .def("hold_history_from", &Worker::hold_history_from, py::arg("run"), py::arg("version"))
      .def("set_tensors", &Worker::set_tensors, py::arg("patterns"))
      .def("report_model", &Worker::report_model, py::arg("run"), py::arg("version"), py::arg("failed_run"), py::arg("failed_version"),
           py::arg("error"))
      .def("listening", &Worker::listening)
      .def("disconnected", &Worker::disconnected)
      .def("close", &Worker::close);

  bind_publisher(m);
  bind_placement(m);
}
