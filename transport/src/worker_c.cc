#include "deltacast/c/worker.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "deltacast/transport/worker.h"

using namespace deltacast;

struct dc_worker {
  std::unique_ptr<transport::Worker> worker;
};

struct dc_version {
  std::shared_ptr<const runtime::ModelVersion> v;
  std::vector<std::string> dtype_names;
};

namespace {
void set_err(char* err, std::size_t len, const std::string& msg) {
  if (err && len) std::snprintf(err, len, "%s", msg.c_str());
}
dc_version* wrap(std::shared_ptr<const runtime::ModelVersion> v) {
  if (!v) return nullptr;
  auto* out = new dc_version;
  out->v = std::move(v);
  for (const auto& t : out->v->tensors) out->dtype_names.emplace_back(dtype_name(t.dtype));
  return out;
}
}  // namespace

extern "C" {

dc_worker* dc_worker_start(const dc_worker_options* o, char* err, size_t err_len) {
  if (!o || !o->node_id || !*o->node_id) {
    set_err(err, err_len, "node_id is required");
    return nullptr;
  }
  if (!o->parents || o->parent_count == 0) {
    set_err(err, err_len, "at least one parent is required");
    return nullptr;
  }
  transport::WorkerOptions wo;
  wo.node.node_id = o->node_id;
  for (std::size_t i = 0; i < o->parent_count; ++i) {
    if (!o->parents[i]) {
      set_err(err, err_len, "parent endpoint is NULL");
      return nullptr;
    }
    wo.node.parents.emplace_back(o->parents[i]);
  }
  if (o->cache_bytes_max) wo.node.cache_bytes_max = o->cache_bytes_max;
  wo.node.in_place = o->in_place != 0;
  if (o->listen && *o->listen) wo.host.bind_endpoint = o->listen;
  if (o->metrics) wo.host.metrics_listen = o->metrics;
  if (o->state_dir && *o->state_dir) wo.out_dir = o->state_dir;
  wo.keep_versions = o->keep_versions ? o->keep_versions : 2;
  auto w = transport::Worker::start(std::move(wo));
  if (!w.is_ok()) {
    set_err(err, err_len, w.status().to_string());
    return nullptr;
  }
  return new dc_worker{std::move(w).value()};
}

void dc_worker_stop(dc_worker* worker) { delete worker; }

dc_version* dc_worker_current(dc_worker* worker) { return worker ? wrap(worker->worker->current()) : nullptr; }

dc_version* dc_worker_wait(dc_worker* worker, uint64_t min_version, uint64_t timeout_ms) {
  return worker ? wrap(worker->worker->wait_for_version(min_version, timeout_ms)) : nullptr;
}

uint64_t dc_version_number(const dc_version* v) { return v ? v->v->version : 0; }
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

void dc_version_release(dc_version* v) { delete v; }

}  // extern "C"
