// deltacast._torch_views: a verified version's tensors as torch views, made in C++. Python's
// `as_strided` costs 2.5-6 us a tensor (argument parsing, then the dispatcher); made here through
// libtorch it costs about 1 us, which keeps a 10,000-tensor model under the 2 us a tensor that
// a rollout engine's reload can spend. Built only with libtorch's headers (Debian: libtorch-dev),
// and loaded by deltacast/__init__.py only under the torch it was built against: a process
// running another torch falls back to the Python path.
#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "deltacast/runtime/node_types.h"
#include "version_capsule.h"

namespace py = pybind11;

namespace deltacast::python {
namespace {

// The torch type that views a safetensors dtype bit for bit, as deltacast/__init__.py maps them:
// unsigned types wider than 8 bits as the signed type of their width, float8 as uint8 on a torch
// without float8 types (before 2.1).
at::ScalarType scalar_type(DType d) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  constexpr at::ScalarType kF8E4M3 = at::kFloat8_e4m3fn, kF8E5M2 = at::kFloat8_e5m2;
#else
  constexpr at::ScalarType kF8E4M3 = at::kByte, kF8E5M2 = at::kByte;
#endif
  switch (d) {
    case DType::kBool: return at::kBool;
    case DType::kU8: return at::kByte;
    case DType::kI8: return at::kChar;
    case DType::kF8E4M3: return kF8E4M3;
    case DType::kF8E5M2: return kF8E5M2;
    case DType::kU16: return at::kShort;
    case DType::kI16: return at::kShort;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kU32: return at::kInt;
    case DType::kI32: return at::kInt;
    case DType::kF32: return at::kFloat;
    case DType::kU64: return at::kLong;
    case DType::kI64: return at::kLong;
    case DType::kF64: return at::kDouble;
  }
  throw std::invalid_argument("unknown dtype");
}

// (name, tensor) for the tensors at `indices` (all of them, in image order, when absent). Each
// tensor is made directly over the image's one storage, whose deleter holds the version alive (a
// view outlives the Worker): the same tensor `as_strided` would make, without the trip through
// the dispatcher and autograd's view tracking, which cost more than the rest together.
// CPU storage over `bytes` bytes at `data`, inside version `v`'s image, that holds `v` alive.
c10::Storage storage_in(const VersionRef& v, std::uint8_t* data, std::size_t bytes) {
  auto* owner = new VersionRef(v);
  c10::DataPtr ptr(data, owner, [](void* p) { delete static_cast<VersionRef*>(p); }, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), /*allocator=*/nullptr, /*resizable=*/false);
}

py::list views(const py::capsule& capsule, const std::optional<std::vector<std::size_t>>& indices) {
  const VersionRef v = version_from_capsule(capsule.ptr());
  const auto& tensors = v->tensors;
  auto* const base = const_cast<std::uint8_t*>(v->image.data());
  const c10::Storage storage = storage_in(v, base, v->image.size());
  const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
  std::vector<std::int64_t> shape, strides;

  const std::size_t count = indices ? indices->size() : tensors.size();
  py::list out(count);
  // No cyclic garbage collection while the list fills: its tuples and tensors would set off a
  // collection every 700 objects, each walking every tracked object of the process (half the
  // time of a 10,000-tensor model). Nothing made here forms a cycle.
  struct GcPause {
    const int was_enabled = PyGC_Disable();
    ~GcPause() {
      if (was_enabled) PyGC_Enable();
    }
  } gc_pause;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t i = indices ? (*indices)[k] : k;
    if (i >= tensors.size()) throw py::index_error("tensor index " + std::to_string(i) + " out of range");
    const TensorInfo& t = tensors[i];
    const at::ScalarType st = scalar_type(t.dtype);
    const auto es = static_cast<std::int64_t>(c10::elementSize(st));
    shape.assign(t.shape.begin(), t.shape.end());
    strides.resize(shape.size());
    std::int64_t stride = 1;  // contiguous, in elements
    for (std::size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= shape[d];
    }
    const auto offset = static_cast<std::int64_t>(t.offset);
    const bool aligned = offset % es == 0;  // else the file placed it off its alignment: its own storage
    auto impl = c10::make_intrusive<c10::TensorImpl>(aligned ? c10::Storage(storage) : storage_in(v, base + offset, t.nbytes), cpu,
                                                     c10::scalarTypeToTypeMeta(st));
    impl->set_sizes_and_strides(shape, strides);
    if (aligned) impl->set_storage_offset(offset / es);
    PyObject* tensor = THPVariable_Wrap(at::Tensor(std::move(impl)));
    if (tensor == nullptr) throw py::error_already_set();
    out[k] = py::make_tuple(py::str(t.name), py::reinterpret_steal<py::object>(tensor));
  }
  return out;
}

}  // namespace
}  // namespace deltacast::python

PYBIND11_MODULE(_torch_views, m) {
  m.doc() = "A verified version's tensors as torch views, made in C++ (see deltacast.Version.tensors).";
  m.def("views", &deltacast::python::views, py::arg("version"), py::arg("indices") = std::nullopt);
}
