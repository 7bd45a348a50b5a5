#include "deltacast/c/worker.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "deltacast/runtime/trust.h"
#include "deltacast/embed/node_config.h"
#include "deltacast/embed/worker.h"

using namespace deltacast;

struct dc_worker {
  std::unique_ptr<embed::Worker> worker;
};

struct dc_version {
  std::shared_ptr<const runtime::ModelVersion> v;
  std::vector<std::string> dtype_names;
  std::unordered_map<std::string_view, std::size_t> by_name;  // views of v's tensor names
};

namespace {
void set_err(char* err, std::size_t len, const std::string& msg) {
  if (err && len) std::snprintf(err, len, "%s", msg.c_str());
}
dc_version* wrap(std::shared_ptr<const runtime::ModelVersion> v) {
  if (!v) return nullptr;
  auto* out = new dc_version;
  out->v = std::move(v);
  for (std::size_t i = 0; i < out->v->tensors.size(); ++i) {
    out->dtype_names.emplace_back(dtype_name(out->v->tensors[i].dtype));
    out->by_name.emplace(out->v->tensors[i].name, i);
  }
  return out;
}

// A list of C strings, each non-NULL; the error names `what` and the index.
Status strings_of(const char* const* items, std::size_t count, const char* what, std::vector<std::string>& out) {
  if (count && !items) return Status::invalid_argument(std::string(what) + " is NULL but its count is " + std::to_string(count));
  for (std::size_t i = 0; i < count; ++i) {
    if (!items[i]) return Status::invalid_argument(std::string(what) + "[" + std::to_string(i) + "] is NULL");
    out.emplace_back(items[i]);
  }
  return Status::ok();
}

// parents, split into trees by tree_parent_counts (when tree_count is not 0), into `s`; the
// parents' CURVE keys in the same shape.
Status parents_of(const dc_worker_options* o, const std::vector<std::string>& keys, embed::NodeSettings& s) {
  std::vector<std::string> parents;
  DC_RETURN_IF_ERROR(strings_of(o->parents, o->parent_count, "parents", parents));
  if (o->tree_count == 0) {
    s.parents = std::move(parents);
    s.parent_keys = keys;
    return Status::ok();
  }
  if (!o->tree_parent_counts) return Status::invalid_argument("tree_parent_counts is NULL but tree_count is " + std::to_string(o->tree_count));
  if (o->tree_count > runtime::kTreesMax) return Status::invalid_argument("trees: 2 to " + std::to_string(runtime::kTreesMax));
  std::size_t at = 0;
  for (std::size_t t = 0; t < o->tree_count; ++t) {
    const std::size_t n = o->tree_parent_counts[t];
    if (n == 0 || n > parents.size() - at)
      return Status::invalid_argument("tree_parent_counts must be 1 or more each and sum to parent_count (" + std::to_string(parents.size()) + ")");
    const auto first = static_cast<std::ptrdiff_t>(at), last = static_cast<std::ptrdiff_t>(at + n);
    s.trees.emplace_back(parents.begin() + first, parents.begin() + last);
    if (!keys.empty()) s.tree_parent_keys.emplace_back(keys.begin() + first, keys.begin() + last);
    at += n;
  }
  if (at != parents.size())
    return Status::invalid_argument("tree_parent_counts must sum to parent_count (" + std::to_string(parents.size()) + "), not " + std::to_string(at));
  return Status::ok();
}

// The options as node settings: the config file's, then settings_json over them, then the
// fields of dc_worker_options that are set. The checks are load_node's, as for every front end.
Result<embed::NodeSettings> settings_of(const dc_worker_options* o) {
  if (!o) return Status::invalid_argument("the options are NULL (node_id is required)");
  embed::NodeSettings s;
  if (o->config_path && *o->config_path) {
    DC_ASSIGN_OR_RETURN(s, embed::read_node_settings(o->config_path));
  }
  if (o->settings_json && *o->settings_json) {
    DC_ASSIGN_OR_RETURN(embed::NodeSettings given, embed::parse_node_settings(o->settings_json, "settings_json"));
    embed::overlay_node_settings(s, given);
  }
  embed::NodeSettings named;
  if (o->node_id) named.node_id = o->node_id;
  std::vector<std::string> keys;
  if (o->curve_public_key || o->curve_secret_key || o->parent_server_key_count) {
    if (!o->curve_public_key || !o->curve_secret_key)
      return Status::invalid_argument("CURVE needs curve_public_key and curve_secret_key, both");
    if (o->parent_server_key_count != o->parent_count)
      return Status::invalid_argument("CURVE needs one parent_server_keys entry per parent (" + std::to_string(o->parent_count) + ")");
    DC_RETURN_IF_ERROR(strings_of(o->parent_server_keys, o->parent_server_key_count, "parent_server_keys", keys));
    named.curve = transport::CurveKeys{o->curve_public_key, o->curve_secret_key};
  }
  if (o->parent_count) DC_RETURN_IF_ERROR(parents_of(o, keys, named));
  if (o->cache_bytes_max) named.cache_size = std::to_string(o->cache_bytes_max);
  named.in_place = o->in_place != 0;
  if (o->listen) named.listen = o->listen;
  if (o->metrics) named.metrics = o->metrics;
  DC_RETURN_IF_ERROR(strings_of(o->trust_keys, o->trust_key_count, "trust_keys", named.trust_keys));
  embed::overlay_node_settings(s, named);
  if (s.node_id.empty()) return Status::invalid_argument("node_id is required");
  if (s.parents.empty() && s.trees.empty()) return Status::invalid_argument("at least one parent is required");
  return s;
}

// The options as a WorkerOptions, or why they cannot be.
Result<embed::WorkerOptions> options_of(const dc_worker_options* o) {
  DC_ASSIGN_OR_RETURN(embed::NodeSettings s, settings_of(o));
  DC_ASSIGN_OR_RETURN(embed::LoadedNode loaded, embed::load_node(s, embed::NodeRole::kWorker));
  embed::WorkerOptions wo = embed::worker_options(std::move(loaded));
  if (o->state_dir && *o->state_dir) wo.out_dir = o->state_dir;
  wo.keep_versions = o->keep_versions ? o->keep_versions : 2;
  return wo;
}
}  // namespace

extern "C" {

dc_worker* dc_worker_start(const dc_worker_options* o, char* err, size_t err_len) {
  auto options = options_of(o);
  if (!options.is_ok()) {
    set_err(err, err_len, options.status().message());
    return nullptr;
  }
  auto w = embed::Worker::start(std::move(options).value());
  if (!w.is_ok()) {
    set_err(err, err_len, w.status().to_string());
    return nullptr;
  }
  return new dc_worker{std::move(w).value()};
}

long dc_worker_settings(const dc_worker_options* options, char* out, size_t out_len, char* err, size_t err_len) {
  auto s = settings_of(options);
  if (s.is_ok()) {
    // Checked as dc_worker_start would check them.
    if (auto loaded = embed::load_node(*s, embed::NodeRole::kWorker); !loaded.is_ok()) s = loaded.status();
  }
  if (!s.is_ok()) {
    set_err(err, err_len, s.status().message());
    return -1;
  }
  const std::string json = embed::node_settings_json(*s);
  if (out && out_len) std::snprintf(out, out_len, "%s", json.c_str());
  return static_cast<long>(json.size());
}

void dc_worker_stop(dc_worker* worker) { delete worker; }

dc_version* dc_worker_current(dc_worker* worker) { return worker ? wrap(worker->worker->current()) : nullptr; }

dc_version* dc_worker_wait(dc_worker* worker, uint64_t min_version, uint64_t timeout_ms) {
  return worker ? wrap(worker->worker->wait_for_version(min_version, timeout_ms)) : nullptr;
}

uint64_t dc_version_number(const dc_version* v) { return v ? v->v->version : 0; }
uint64_t dc_version_base(const dc_version* v) { return v ? v->v->base_version : 0; }
uint64_t dc_version_checksum(const dc_version* v) { return v ? v->v->checksum : 0; }

const uint8_t* dc_version_image(const dc_version* v, size_t* size) {
  if (!v) return nullptr;
  if (size) *size = v->v->image.size();
  return v->v->image.data();
}

size_t dc_version_tensor_count(const dc_version* v) { return v ? v->v->tensors.size() : 0; }

int dc_version_tensor(const dc_version* v, size_t i, const char** name, const char** dtype, uint64_t* offset, uint64_t* nbytes) {
  if (!v || i >= v->v->tensors.size()) return -1;
  const auto& t = v->v->tensors[i];
  if (name) *name = t.name.c_str();
  if (dtype) *dtype = v->dtype_names[i].c_str();
  if (offset) *offset = t.offset;
  if (nbytes) *nbytes = t.nbytes;
  return 0;
}

long dc_version_find_tensor(const dc_version* v, const char* name) {
  if (!v || !name) return -1;
  auto it = v->by_name.find(name);
  return it == v->by_name.end() ? -1 : static_cast<long>(it->second);
}

void dc_version_release(dc_version* v) { delete v; }

}  // extern "C"
