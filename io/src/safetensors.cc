#include "deltacast/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deltacast {

using json = nlohmann::ordered_json;

namespace {

// ordered_json keeps an object's keys in a vector and finds one by scanning it, so its parser
// and its operator[] cost O(n^2) for an object of n keys: seconds for a header of tens of
// thousands of tensors. JsonObject builds the same object (keys in insertion order, a repeated
// key keeps its first place and takes the last value, as ordered_json's operator[] does)
// through a hash index; dump() of the result is unchanged.
class JsonObject {
 public:
  void set(std::string key, json value) {
    if (entries_.size() < kScanMax) {
      // Few keys (a tensor entry has three): a scan is cheaper than hashing.
      for (auto& [k, v] : entries_)
        if (k == key) {
          v = std::move(value);
          return;
        }
    } else {
      if (index_.empty())
        for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
      const auto [it, inserted] = index_.try_emplace(key, entries_.size());
      if (!inserted) {
        entries_[it->second].second = std::move(value);
        return;
      }
    }
    entries_.emplace_back(std::move(key), std::move(value));
  }
  // The object, built once: ordered_json's own vector holds const keys, so it would copy every
  // entry, values and all, each time it grew.
  json take() {
    json out = json::object();
    auto& entries = static_cast<json::object_t::Container&>(out.get_ref<json::object_t&>());
    entries.reserve(entries_.size());
    for (auto& [k, v] : entries_) entries.emplace_back(std::move(k), std::move(v));
    entries_.clear();
    index_.clear();
    return out;
  }

 private:
  static constexpr std::size_t kScanMax = 8;
  std::vector<std::pair<std::string, json>> entries_;
  std::unordered_map<std::string, std::size_t> index_;  // filled once the object has kScanMax keys
};

// A SAX handler that builds what json::parse builds (nlohmann's json_sax_dom_parser), in time
// linear in the input, except that each member of the root object goes to `member` as soon as
// its value is complete instead of into the root, which stays an empty object: a header of
// n tensors is never held as n JSON values at once.
class JsonBuilder {
 public:
  using MemberFn = std::function<void(std::string key, json value)>;
  explicit JsonBuilder(MemberFn member) : member_(std::move(member)) {}

  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return add(json(nullptr)); }
  bool boolean(bool v) { return add(json(v)); }
  bool number_integer(number_integer_t v) { return add(json(v)); }
  bool number_unsigned(number_unsigned_t v) { return add(json(v)); }
  bool number_float(number_float_t v, const string_t&) { return add(json(v)); }
  bool string(string_t& v) { return add(json(std::move(v))); }
  bool binary(binary_t& v) { return add(json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    stack_.emplace_back();
    stack_.back().object.emplace();
    return true;
  }
  bool key(string_t& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() {
    json v = stack_.back().object->take();
    stack_.pop_back();
    return add(std::move(v));
  }
  bool start_array(std::size_t) {
    stack_.emplace_back();
    stack_.back().array = json::array();
    return true;
  }
  bool end_array() {
    json v = std::move(stack_.back().array);
    stack_.pop_back();
    return add(std::move(v));
  }
  template <typename Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    return false;
  }

  const json& root() const { return root_; }

 private:
  struct Frame {
    std::optional<JsonObject> object;  // an object being read, else an array
    std::string key;                   // the key whose value comes next
    json array;
  };
  bool add(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
    } else if (Frame& f = stack_.back(); f.object && stack_.size() == 1) {
      member_(std::move(f.key), std::move(v));
    } else if (f.object) {
      f.object->set(std::move(f.key), std::move(v));
    } else {
      f.array.get_ref<json::array_t&>().push_back(std::move(v));
    }
    return true;
  }
  MemberFn member_;
  std::vector<Frame> stack_;
  json root_;
};

Status read_metadata(const json& v, std::vector<std::pair<std::string, std::string>>& out) {
  out.clear();
  if (!v.is_object()) return Status::corruption("safetensors: __metadata__ is not an object");
  for (auto mi = v.begin(); mi != v.end(); ++mi) {
    if (!mi.value().is_string()) return Status::corruption("safetensors: __metadata__ value for '" + mi.key() + "' is not a string");
    out.emplace_back(mi.key(), mi.value().get<std::string>());
  }
  return Status::ok();
}

// Fills all of `t` but its name.
Status read_tensor(const std::string& name, const json& v, std::uint64_t data_size, TensorInfo& t) {
  t.shape.clear();
  auto where = [&name] { return "safetensors: tensor '" + name + "': "; };  // only on an error
  if (!v.is_object()) return Status::corruption(where() + "entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto offs = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return Status::corruption(where() + "missing dtype");
  if (sh == v.end() || !sh->is_array()) return Status::corruption(where() + "missing shape");
  if (offs == v.end() || !offs->is_array() || offs->size() != 2) return Status::corruption(where() + "missing data_offsets");
  auto dtype = dtype_from_name(dt->get_ref<const std::string&>());
  if (!dtype) return Status::unsupported(where() + "unknown dtype " + dt->get<std::string>());
  t.dtype = *dtype;
  if (sh->size() > kTensorRankMax) return Status::corruption(where() + "rank too large");
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) return Status::corruption(where() + "shape holds something other than a non-negative integer");
    t.shape.push_back(d.get<std::uint64_t>());
  }
  for (const auto& o : *offs)
    if (!o.is_number_unsigned()) return Status::corruption(where() + "data_offsets are not non-negative integers");
  const auto begin = (*offs)[0].get<std::uint64_t>();
  const auto end = (*offs)[1].get<std::uint64_t>();
  if (begin > end) return Status::corruption(where() + "data_offsets end before they begin");
  if (end > data_size) return Status::corruption(where() + "data_offsets end at " + std::to_string(end) + ", past the data section (" + std::to_string(data_size) + " bytes)");
  t.offset = begin;
  t.nbytes = end - begin;
  return Status::ok();
}

}  // namespace

Result<SafetensorsLayout> parse_safetensors(ByteSpan file) {
  ByteReader r(file);
  std::uint64_t header_len;
  if (!r.u64(header_len)) return Status::corruption("safetensors: file shorter than its 8-byte header length");
  if (header_len > kSafetensorsHeaderBytesMax) return Status::corruption("safetensors: header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  ByteSpan header;
  if (!r.bytes(header_len, header)) return Status::corruption("safetensors: header length " + std::to_string(header_len) + " runs past the end of the file");
  SafetensorsLayout out;
  out.data_offset = 8 + header_len;
  const std::uint64_t data_size = file.size() - out.data_offset;
  ModelLayout& m = out.model;
  m.image_size = data_size;

  // Each entry of the header is read as soon as the parser has its value; its error, if any,
  // waits until the whole header is known to be JSON. A repeated key keeps its first place and
  // takes its last value, as json::parse into an ordered_json would have it.
  struct Entry {
    TensorInfo tensor;  // its name is the key (also "__metadata__")
    Status status;
  };
  std::deque<Entry> entries;                                  // header order; never moves an entry
  std::unordered_map<std::string_view, std::size_t> by_name;  // views of entries' names
  by_name.reserve(header.size() / 64);  // an entry takes 64 bytes or more, as deltacast writes them
  std::optional<std::size_t> metadata_at;
  JsonBuilder builder([&](std::string name, json value) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      entries.emplace_back().tensor.name = std::move(name);
      it = by_name.emplace(entries.back().tensor.name, entries.size() - 1).first;
    }
    Entry& e = entries[it->second];
    if (e.tensor.name == "__metadata__") {
      metadata_at = it->second;
      e.status = read_metadata(value, m.metadata);
    } else {
      e.status = read_tensor(e.tensor.name, value, data_size, e.tensor);
    }
  });
  if (!json::sax_parse(header.begin(), header.end(), &builder)) return Status::corruption("safetensors: header is not valid JSON");
  if (!builder.root().is_object()) return Status::corruption("safetensors: header is not a JSON object");
  by_name.clear();
  m.tensors.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].status.is_ok()) return entries[i].status;
    if (i != metadata_at) m.tensors.push_back(std::move(entries[i].tensor));
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

namespace {
// Appends `s` as a JSON string, byte for byte as ordered_json::dump() writes it.
void append_json_string(std::string& out, std::string_view s) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f && c != '"' && c != '\\';
  });
  if (!plain) {
    out += json(std::string(s)).dump();  // escapes, and checks UTF-8
    return;
  }
  out += '"';
  out += s;
  out += '"';
}
}  // namespace

// Writes the text ordered_json would dump for an object with "__metadata__" and then each
// tensor set in order (a name set twice keeps its first place and takes its last entry, as
// operator[] does), without building that object.
Bytes safetensors_header(const ModelLayout& layout) {
  constexpr std::size_t kMetadata = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> keys;  // in header order: the tensor whose entry each key holds, or kMetadata
  keys.reserve(layout.tensors.size() + 1);
  std::unordered_map<std::string_view, std::size_t> key_of;
  key_of.reserve(layout.tensors.size() + 1);
  auto set = [&](std::string_view name, std::size_t source) {
    const auto [it, inserted] = key_of.try_emplace(name, keys.size());
    if (inserted) keys.push_back(source);
    else keys[it->second] = source;
  };
  if (!layout.metadata.empty()) set("__metadata__", kMetadata);
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) set(layout.tensors[i].name, i);

  std::string text = "{";
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (k > 0) text += ',';
    if (keys[k] == kMetadata) {
      JsonObject meta;
      for (const auto& [key, value] : layout.metadata) meta.set(key, value);
      append_json_string(text, "__metadata__");
      text += ':';
      text += meta.take().dump();
      continue;
    }
    const TensorInfo& t = layout.tensors[keys[k]];
    append_json_string(text, t.name);
    text += ":{\"dtype\":";
    append_json_string(text, dtype_name(t.dtype));
    text += ",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) text += ',';
      text += std::to_string(t.shape[d]);
    }
    text += "],\"data_offsets\":[";
    text += std::to_string(t.offset);
    text += ',';
    text += std::to_string(t.offset + t.nbytes);
    text += "]}";
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  Bytes out;
  ByteWriter w(out);
  w.u64(text.size());
  out.insert(out.end(), text.begin(), text.end());
  return out;
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, const ModelLayout& layout, OutputFile::Access access) {
  Bytes header = safetensors_header(layout);
  SafetensorsWriter w;
  DC_ASSIGN_OR_RETURN(w.file_, OutputFile::create(path, header.size() + layout.image_size, access));
  if (access == OutputFile::Access::kMapped) std::memcpy(w.file_.bytes().data(), header.data(), header.size());
  else DC_RETURN_IF_ERROR(w.file_.write_at(0, header));
  w.data_offset_ = header.size();
  return w;
}

Status write_safetensors(const std::string& path, const ModelLayout& layout, ByteSpan image, bool uncached) {
  if (image.size() != layout.image_size) return Status::invalid_argument("image size does not match the layout");
  // The image is already in memory: written with checked writes rather than through a mapping,
  // whose pages would fault (SIGBUS) if the disk filled up under them.
  const Bytes header = safetensors_header(layout);
  const ByteSpan parts[] = {header, image};
  return write_parts_atomic(path, parts, uncached);
}

}  // namespace deltacast
