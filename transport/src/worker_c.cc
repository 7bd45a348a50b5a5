#include "deltacast/c/worker.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include <atomic>
#include <optional>
#include <thread>

#include "deltacast/transport/host.h"
#include "deltacast/transport/version_store.h"

using namespace deltacast;

struct dc_worker {
  std::unique_ptr<transport::NodeHost> host;
  std::optional<transport::VersionStore> store;
  std::thread saver;  // saves the newest version to `store`
  std::atomic<bool> stopping{false};
  ~dc_worker() {
    stopping = true;
    if (saver.joinable()) saver.join();
  }
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
  runtime::NodeConfig nc;
  nc.node_id = o->node_id;
  for (std::size_t i = 0; i < o->parent_count; ++i) {
    if (!o->parents[i]) {
      set_err(err, err_len, "parent endpoint is NULL");
      return nullptr;
    }
    nc.parents.emplace_back(o->parents[i]);
  }
  nc.reconstruct = true;
  nc.serve_children = o->listen && *o->listen;
  if (o->cache_bytes_max) nc.cache_bytes_max = o->cache_bytes_max;
  nc.in_place = o->in_place != 0;
  transport::HostConfig hc;
  if (nc.serve_children) hc.bind_endpoint = o->listen;
  if (o->metrics) hc.metrics_listen = o->metrics;
  auto w = std::make_unique<dc_worker>();
  const std::string id = nc.node_id;
  w->host = std::make_unique<transport::NodeHost>(std::move(nc), std::move(hc));
  std::shared_ptr<const runtime::ModelVersion> saved;
  if (o->state_dir && *o->state_dir) {
    w->store.emplace(o->state_dir, id, o->keep_versions ? o->keep_versions : 2);
    if (Status ps = w->store->prepare(); !ps.is_ok()) {
      set_err(err, err_len, ps.with_context("state_dir").to_string());
      return nullptr;
    }
    saved = w->store->resume(*w->host);
  }
  Status st = w->host->start_thread();
  if (!st.is_ok()) {
    set_err(err, err_len, st.to_string());
    return nullptr;
  }
  if (w->store) {
    // A failed save (a full disk, say) is logged and retried; the worker keeps serving.
    w->saver = std::thread([w = w.get(), saved]() mutable {
      transport::VersionSaver saver(*w->store);
      while (!w->stopping) {
        auto v = w->host->wait_for_newer(saved, 100);
        saver.on_run(w->host->current_run());
        if (!v) {
          saver.retry_if_due();
          continue;
        }
        saved = v;
        saver.offer(std::move(v));
      }
    });
  }
  return w.release();
}

void dc_worker_stop(dc_worker* worker) { delete worker; }

dc_version* dc_worker_current(dc_worker* worker) { return worker ? wrap(worker->host->current()) : nullptr; }

dc_version* dc_worker_wait(dc_worker* worker, uint64_t min_version, uint64_t timeout_ms) {
  return worker ? wrap(worker->host->wait_for_version(min_version, timeout_ms)) : nullptr;
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
