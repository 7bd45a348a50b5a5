// Checkpoints from Python tensors, and the plain encode and decode functions.
#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include <unistd.h>

#include "deltacast/common/thread_pool.h"
#include "deltacast/common/units.h"
#include "native.h"

namespace deltacast::python {

namespace py = pybind11;

namespace {

// Bytes a tensor of `dtype` and `shape` takes, or nullopt past 2^63 (a shape no image holds).
std::optional<std::uint64_t> tensor_bytes(DType dtype, const std::vector<std::uint64_t>& shape) {
  constexpr std::uint64_t kMax = std::uint64_t{1} << 63;
  std::uint64_t bytes = dtype_size(dtype);
  for (const std::uint64_t d : shape) {
    if (d != 0 && bytes > kMax / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

}  // namespace

ModelLayout layout_of(const std::vector<TensorRef>& tensors) {
  ModelLayout layout;
  layout.tensors.reserve(tensors.size());
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name.empty()) throw Error("a tensor has an empty name");
    if (!names.insert(t.name).second) throw Error("tensor " + t.name + " is given twice");
    const auto dtype = dtype_from_name(t.dtype);
    if (!dtype) throw Error("tensor " + t.name + ": unknown dtype " + t.dtype);
    const auto bytes = tensor_bytes(*dtype, t.shape);
    if (!bytes || *bytes != t.nbytes) throw Error("tensor " + t.name + ": its size disagrees with its shape and dtype");
    if (t.nbytes > 0 && t.data == 0) throw Error("tensor " + t.name + " has no data");
    TensorInfo info;
    info.name = t.name;
    info.dtype = *dtype;
    info.shape = t.shape;
    info.offset = layout.image_size;
    info.nbytes = t.nbytes;
    layout.image_size += t.nbytes;
    layout.tensors.push_back(std::move(info));
  }
  if (std::any_of(tensors.begin(), tensors.end(), [](const TensorRef& t) { return t.part.has_value(); })) {
    for (std::size_t i = 0; i < tensors.size(); ++i) layout.parts.push_back(tensors[i].part.value_or(whole_part(layout.tensors[i])));
    if (Status st = validate_parts(layout.tensors, layout.parts, UINT64_MAX); !st.is_ok()) throw Error(st.message());
  }
  return layout;
}

void read_range(const std::vector<TensorRef>& tensors, const ModelLayout& layout, std::uint64_t offset, MutableByteSpan out) {
  const std::uint64_t end = offset + out.size();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t lo = std::max(offset, layout.tensors[i].offset), hi = std::min(end, layout.tensors[i].offset + tensors[i].nbytes);
    if (lo >= hi) continue;
    std::memcpy(out.data() + (lo - offset), reinterpret_cast<const std::uint8_t*>(tensors[i].data) + (lo - layout.tensors[i].offset), hi - lo);
  }
}

void gather(const std::vector<TensorRef>& tensors, const ModelLayout& layout, Bytes& image) {
  py::gil_scoped_release release;
  image.resize(layout.image_size);
  // The image in one piece per core, each cut at 1 MiB: copying is bound by memory bandwidth,
  // which one core does not fill.
  constexpr std::uint64_t kPieceBytes = 1u << 20;
  const std::uint64_t pieces = (layout.image_size + kPieceBytes - 1) / kPieceBytes;
  const unsigned threads = static_cast<unsigned>(std::clamp<std::uint64_t>(pieces, 1, std::max(1u, std::thread::hardware_concurrency())));
  auto copy_range = [&](std::uint64_t begin, std::uint64_t end) {  // image bytes [begin, end)
    if (begin < end) read_range(tensors, layout, begin, MutableByteSpan(image.data() + begin, end - begin));
  };
  const std::uint64_t share = (pieces + threads - 1) / threads * kPieceBytes;
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(copy_range, t * share, std::min(layout.image_size, (t + 1) * share));
  copy_range(0, std::min(layout.image_size, share));
  for (auto& h : helpers) h.join();
}

py::bytes encode_container(const std::vector<TensorRef>* base, const std::vector<TensorRef>& next, std::uint64_t version,
                           std::uint64_t base_version, bool v2, std::uint64_t chunk_bytes) {
  const ModelLayout layout = layout_of(next);
  Bytes base_image, next_image;
  if (base) {
    if (layout_of(*base).tensors != layout.tensors)
      throw Error("base and new tensors differ in names, dtypes, shapes or order; encode an anchor of the new ones instead");
    if (base_version == 0 || version <= base_version) throw Error("a delta needs base_version >= 1 and version > base_version");
    gather(*base, layout, base_image);
  } else if (version == 0) {
    throw Error("versions count from 1");
  }
  gather(next, layout, next_image);
  Result<Bytes> container = Status::ok();
  {
    py::gil_scoped_release release;
    VersionEncodeOptions options;
    options.chunk_bytes = chunk_bytes;
    if (v2) options.chunk = ChunkEncodeOptions::smallest();
    ThreadPool pool(0);
    auto ev = encode_version(layout, version, base ? base_version : 0, base_image, next_image, options, pool);
    container = ev.is_ok() ? Result<Bytes>(container_bytes(*ev)) : Result<Bytes>(ev.status());
  }
  if (!container.is_ok()) throw Error(container.status().to_string());
  return py::bytes(reinterpret_cast<const char*>(container->data()), container->size());
}

std::shared_ptr<Version> decode_container(py::buffer container, const std::vector<TensorRef>* base) {
  const py::buffer_info info = container.request();
  const ByteSpan file(static_cast<const std::uint8_t*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize));
  auto view = parse_container(file);
  if (!view.is_ok()) throw Error(view.status().to_string());
  const Manifest& m = view->manifest;
  // The container says how large the version is. Refuse more than this host's memory before
  // allocating, the bound a worker's NodeHost applies: zero-filling that much would get the
  // process killed rather than raise bad_alloc.
  if (const std::uint64_t memory = physical_memory_bytes(); memory > 0 && m.image_size > memory)
    throw Error("version " + std::to_string(m.version) + " needs " + std::to_string(m.image_size) + " bytes, more than this host's memory");
  const bool delta = m.kind == VersionKind::kDelta;
  Bytes base_image;
  if (delta) {
    if (!base) throw Error("version " + std::to_string(m.version) + " is a delta: give the tensors of version " + std::to_string(m.base_version));
    const ModelLayout layout = layout_of(*base);
    if (layout.tensors != m.tensors) throw Error("the base tensors differ in names, dtypes, shapes or order from the delta's");
    gather(*base, layout, base_image);
  }
  auto version = std::make_shared<runtime::ModelVersion>();
  version->version = m.version;
  version->base_version = delta ? m.base_version : 0;
  version->run = m.run;
  version->checksum = m.version_checksum;
  version->tensors = m.tensors;
  version->metadata = m.metadata;
  Status st;
  {
    py::gil_scoped_release release;
    try {
      version->image.resize(m.image_size);
    } catch (const std::bad_alloc&) {
      st = Status::resource_exhausted("cannot allocate " + std::to_string(m.image_size) + " bytes for the version");
    }
    ThreadPool pool(0);
    if (st.is_ok()) st = decode_version(m, view->payloads, base_image, version->image, pool);
  }
  if (!st.is_ok()) throw Error(st.to_string());
  return std::make_shared<Version>(std::move(version));
}

}  // namespace deltacast::python
