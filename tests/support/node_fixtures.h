// Fixtures for node tests on the in-memory network: a short training run of a small model,
// and the configs of each role.
#pragma once

#include "deltacast/common/thread_pool.h"
#include "fake_net.h"
#include "deltacast/synth/gen.h"

namespace deltacast::test {

// A short training run of a small model: images[0..steps], and the encoded versions
// (v1 = anchor of images[0], v(t+1) = delta images[t-1] -> images[t], anchors on request).
struct Series {
  ModelLayout layout;
  std::vector<Bytes> images;
  VersionEncodeOptions options;
  explicit Series(std::size_t steps, std::uint64_t seed = 1) {
    layout = synth::build_layout(synth::ModelShape{64, 2, 256, 128, true});
    images.assign(steps + 1, Bytes(layout.image_size));
    std::vector<MutableByteSpan> spans(images.begin(), images.end());
    InlineExecutor ex;
    synth::TrainOptions t;
    t.seed = seed;
    t.lr = 1e-5;
    synth::generate_series(layout, t, spans, ex);
    options.chunk_bytes = 16 << 10;  // several chunks per version
  }
  // Version v (1-based) is images[v - 1].
  EncodedVersion delta(std::uint64_t v) const {
    InlineExecutor ex;
    return *encode_version(layout, v, v - 1, images[v - 2], images[v - 1], options, ex);
  }
  EncodedVersion anchor(std::uint64_t v) const {
    InlineExecutor ex;
    return *encode_version(layout, v, 0, {}, images[v - 1], options, ex);
  }
  std::uint64_t checksum(std::uint64_t v) const { return anchor(v).manifest.version_checksum; }
};

inline NodeConfig origin_config() {
  NodeConfig c;
  c.node_id = "origin";
  c.serve_children = true;
  return c;
}
inline NodeConfig relay_config(const std::string& id, std::vector<std::string> parents) {
  NodeConfig c;
  c.node_id = id;
  c.parents = std::move(parents);
  c.serve_children = true;
  return c;
}
inline NodeConfig worker_config(const std::string& id, std::vector<std::string> parents, bool relays = false) {
  NodeConfig c;
  c.node_id = id;
  c.parents = std::move(parents);
  c.reconstruct = true;
  c.serve_children = relays;
  return c;
}
// True when every named node of `net` exposes version v.
inline bool all_at(FakeNet& net, const std::vector<std::string>& nodes, std::uint64_t v) {
  for (const auto& n : nodes)
    if (net.node(n).current_version() != v) return false;
  return true;
}
}  // namespace deltacast::test
