// deltacast._native: the library's Worker for the Python package (python/deltacast), which adds
// the tensor views, callbacks and engine adapters on top.
#include <pybind11/stl.h>

#include "native.h"

namespace py = pybind11;
using namespace deltacast::python;

PYBIND11_MODULE(_native, m) {
  m.doc() = "deltacast native module: use the deltacast package instead";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<Version, std::shared_ptr<Version>>(m, "Version", py::buffer_protocol())
      .def_property_readonly("number", &Version::number)
      .def_property_readonly("base_number", &Version::base_number)
      .def_property_readonly("checksum", &Version::checksum)
      .def_property_readonly("run", &Version::run)
      .def("tensor_infos", &Version::tensor_infos)
      .def("changed_elements", &Version::changed_elements, py::arg("index"), py::arg("since"))
      .def_property_readonly("changes_since", &Version::changes_since)
      .def_buffer([](const Version& v) { return v.buffer(); });

  py::class_<Worker>(m, "Worker")
      .def(py::init([](std::string id, std::vector<std::string> parents, std::optional<std::pair<std::string, std::string>> keys,
                       std::vector<std::string> parent_keys, std::vector<std::string> trust_keys, std::string state_dir, bool in_place,
                       std::string listen, std::string metrics, std::size_t change_history) {
             WorkerArgs a{std::move(id),        std::move(parents), std::move(keys),   std::move(parent_keys), std::move(trust_keys),
                          std::move(state_dir), in_place,           std::move(listen), std::move(metrics),     change_history};
             return std::make_unique<Worker>(a);
           }),
           py::arg("id"), py::arg("parents"), py::arg("keys") = py::none(), py::arg("parent_keys") = std::vector<std::string>{},
           py::arg("trust_keys") = std::vector<std::string>{}, py::arg("state_dir") = "", py::arg("in_place") = false,
           py::arg("listen") = "", py::arg("metrics") = "", py::arg("change_history") = 0)
      .def("wait", &Worker::wait, py::arg("min_version"), py::arg("timeout_s"))
      .def("wait_newer", &Worker::wait_newer, py::arg("after"), py::arg("timeout_s"))
      .def("current", &Worker::current)
      .def("listening", &Worker::listening)
      .def("close", &Worker::close);
}
