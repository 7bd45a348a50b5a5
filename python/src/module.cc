// deltacast._native: the library's Worker and Publisher for the Python package (python/deltacast), which adds
// the tensor views, callbacks and engine adapters on top.
#include <pybind11/stl.h>

#include "native.h"

namespace py = pybind11;
using namespace deltacast::python;

void bind_placement(py::module_& m);  // placement.cc

namespace {

// (name, dtype, shape, data pointer, nbytes) tuples, as deltacast/__init__.py makes them.
std::vector<TensorRef> tensor_refs(const py::list& items) {
  std::vector<TensorRef> out;
  out.reserve(items.size());
  for (const auto& item : items) {
    const auto t = item.cast<std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::uint64_t>>();
    out.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t)});
  }
  return out;
}

void bind_publisher(py::module_& m) {
  py::class_<Publisher>(m, "Publisher")
      .def(py::init([](std::string id, std::string listen, std::optional<std::pair<std::string, std::string>> keys,
                       std::vector<std::string> allow_keys, std::string sign_key, std::uint64_t anchor_every, std::string codec,
                       std::string wan_rate, double worker_cores, std::uint64_t chunk_bytes, std::size_t threads, std::string metrics, std::string run_state) {
             PublisherArgs a{std::move(id),       std::move(listen),   std::move(keys), std::move(allow_keys),
                             std::move(sign_key), anchor_every,        std::move(codec), std::move(wan_rate),
                             worker_cores,        chunk_bytes,         threads,          std::move(metrics), std::move(run_state)};
             return std::make_unique<Publisher>(a);
           }),
           py::arg("id"), py::arg("listen"), py::arg("keys"), py::arg("allow_keys"), py::arg("sign_key"), py::arg("anchor_every"),
           py::arg("codec"), py::arg("wan_rate"), py::arg("worker_cores"), py::arg("chunk_bytes"), py::arg("threads"), py::arg("metrics"), py::arg("run_state") = "")
      .def("publish", [](Publisher& p, const py::list& tensors) { return p.publish(tensor_refs(tensors)); })
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
      .def(py::init([](std::string id, std::vector<std::string> parents, std::optional<std::pair<std::string, std::string>> keys,
                       std::vector<std::string> parent_keys, std::vector<std::string> trust_keys, std::string state_dir, bool in_place,
                       std::string listen, std::string metrics, std::size_t change_history, std::uint64_t change_history_bytes,
                       std::uint32_t stripes, std::vector<std::vector<std::string>> trees,
                       std::vector<std::vector<std::string>> tree_parent_keys) {
             WorkerArgs a;
             a.id = std::move(id);
             a.parents = std::move(parents);
             a.keys = std::move(keys);
             a.parent_keys = std::move(parent_keys);
             a.trees = std::move(trees);
             a.tree_parent_keys = std::move(tree_parent_keys);
             a.trust_keys = std::move(trust_keys);
             a.state_dir = std::move(state_dir);
             a.in_place = in_place;
             a.listen = std::move(listen);
             a.metrics = std::move(metrics);
             a.change_history = change_history;
             a.change_history_bytes = change_history_bytes;
             a.stripes = stripes;
             return std::make_unique<Worker>(a);
           }),
           py::arg("id"), py::arg("parents"), py::arg("keys") = py::none(), py::arg("parent_keys") = std::vector<std::string>{},
           py::arg("trust_keys") = std::vector<std::string>{}, py::arg("state_dir") = "", py::arg("in_place") = false,
           py::arg("listen") = "", py::arg("metrics") = "", py::arg("change_history") = 0, py::arg("change_history_bytes") = 0,
           py::arg("stripes") = 1,
           py::arg("trees") = std::vector<std::vector<std::string>>{}, py::arg("tree_parent_keys") = std::vector<std::vector<std::string>>{})
      .def_static(
          "from_config",
          [](std::string path, std::string state_dir, std::size_t change_history, std::uint64_t change_history_bytes) {
            return std::make_unique<Worker>(path, state_dir, change_history, change_history_bytes);
          },
          py::arg("path"), py::arg("state_dir") = "", py::arg("change_history") = 0, py::arg("change_history_bytes") = 0)
      .def("wait", &Worker::wait, py::arg("min_version"), py::arg("timeout_s"))
      .def("wait_newer", &Worker::wait_newer, py::arg("after"), py::arg("timeout_s"))
      .def("current", &Worker::current)
      .def("wait_for", &Worker::wait_for, py::arg("run"), py::arg("version"), py::arg("timeout_s"))
      .def("hold_history_from", &Worker::hold_history_from, py::arg("run"), py::arg("version"))
      .def("report_model", &Worker::report_model, py::arg("run"), py::arg("version"), py::arg("failed_run"), py::arg("failed_version"),
           py::arg("error"))
      .def("listening", &Worker::listening)
      .def("close", &Worker::close);

  bind_publisher(m);
  bind_placement(m);
}
