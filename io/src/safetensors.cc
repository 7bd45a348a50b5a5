#include "deltacast/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace deltacast {

using json = nlohmann::ordered_json;

Result<SafetensorsLayout> parse_safetensors(ByteSpan file) {
  ByteReader r(file);
  std::uint64_t header_len;
  if (!r.u64(header_len)) return Status::corruption("safetensors: file shorter than its 8-byte header length");
  if (header_len > kSafetensorsHeaderBytesMax) return Status::corruption("safetensors: header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  ByteSpan header;
  if (!r.bytes(header_len, header)) return Status::corruption("safetensors: header length " + std::to_string(header_len) + " runs past the end of the file");
  json j = json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::corruption("safetensors: header is not valid JSON");
  if (!j.is_object()) return Status::corruption("safetensors: header is not a JSON object");

  SafetensorsLayout out;
  out.data_offset = 8 + header_len;
  const std::uint64_t data_size = file.size() - out.data_offset;
  ModelLayout& m = out.model;
  m.image_size = data_size;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Status::corruption("safetensors: __metadata__ is not an object");
      for (auto mi = v.begin(); mi != v.end(); ++mi) {
        if (!mi.value().is_string()) return Status::corruption("safetensors: __metadata__ value for '" + mi.key() + "' is not a string");
        m.metadata.emplace_back(mi.key(), mi.value().get<std::string>());
      }
      continue;
    }
    const std::string where = "safetensors: tensor '" + name + "': ";
    if (!v.is_object()) return Status::corruption(where + "entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto offs = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return Status::corruption(where + "missing dtype");
    if (sh == v.end() || !sh->is_array()) return Status::corruption(where + "missing shape");
    if (offs == v.end() || !offs->is_array() || offs->size() != 2) return Status::corruption(where + "missing data_offsets");
    TensorInfo t;
    t.name = name;
    auto dtype = dtype_from_name(dt->get<std::string>());
    if (!dtype) return Status::unsupported(where + "unknown dtype " + dt->get<std::string>());
    t.dtype = *dtype;
    if (sh->size() > kTensorRankMax) return Status::corruption(where + "rank too large");
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return Status::corruption(where + "shape holds something other than a non-negative integer");
      t.shape.push_back(d.get<std::uint64_t>());
    }
    for (const auto& o : *offs)
      if (!o.is_number_unsigned()) return Status::corruption(where + "data_offsets are not non-negative integers");
    const auto begin = (*offs)[0].get<std::uint64_t>();
    const auto end = (*offs)[1].get<std::uint64_t>();
    if (begin > end) return Status::corruption(where + "data_offsets end before they begin");
    if (end > data_size) return Status::corruption(where + "data_offsets end at " + std::to_string(end) + ", past the data section (" + std::to_string(data_size) + " bytes)");
    t.offset = begin;
    t.nbytes = end - begin;
    m.tensors.push_back(std::move(t));
  }
  std::stable_sort(m.tensors.begin(), m.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  if (Status st = validate_tensors(m.tensors, data_size); !st.is_ok()) return Status::corruption("safetensors: " + st.message());
  // The format indexes the whole data section: no holes between tensors, nothing after them.
  std::uint64_t expect = 0;
  for (const auto& t : m.tensors) {
    if (t.offset != expect) return Status::corruption("safetensors: tensor '" + t.name + "' leaves a hole before it in the data section");
    expect = t.offset + t.nbytes;
  }
  if (expect != data_size) return Status::corruption("safetensors: " + std::to_string(data_size - expect) + " bytes after the last tensor");
  return out;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  DC_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  auto layout = parse_safetensors(f.file_.bytes());
  if (!layout.is_ok()) return layout.status().with_context(path);
  f.layout_ = std::move(layout).value();
  return f;
}

Bytes safetensors_header(const ModelLayout& layout) {
  json j = json::object();
  if (!layout.metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : layout.metadata) meta[k] = v;
    j["__metadata__"] = std::move(meta);
  }
  for (const auto& t : layout.tensors) {
    json e = json::object();
    e["dtype"] = std::string(dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = json::array({t.offset, t.offset + t.nbytes});
    j[t.name] = std::move(e);
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  Bytes out;
  ByteWriter w(out);
  w.u64(text.size());
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, const ModelLayout& layout) {
  Bytes header = safetensors_header(layout);
  SafetensorsWriter w;
  DC_ASSIGN_OR_RETURN(w.file_, OutputFile::create(path, header.size() + layout.image_size));
  std::memcpy(w.file_.bytes().data(), header.data(), header.size());
  w.data_offset_ = header.size();
  return w;
}

Status write_safetensors(const std::string& path, const ModelLayout& layout, ByteSpan image) {
  if (image.size() != layout.image_size) return Status::invalid_argument("image size does not match the layout");
  // The image is already in memory: written with checked writes rather than through a mapping,
  // whose pages would fault (SIGBUS) if the disk filled up under them.
  const Bytes header = safetensors_header(layout);
  const ByteSpan parts[] = {header, image};
  return write_parts_atomic(path, parts);
}

}  // namespace deltacast
