#include "deltacast/runtime/messages.h"

namespace deltacast::runtime {

bool valid_node_id(const std::string& id) {
  if (id.empty() || id.size() > kNodeIdBytesMax || id == "." || id == "..") return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

std::string to_string(const VersionKey& key) { return "v" + std::to_string(key.version) + (key.anchor ? "/anchor" : ""); }

const char* message_name(const Message& m) {
  static constexpr const char* kNames[] = {"hello", "welcome", "refuse", "manifest", "chunk", "need", "ready", "heartbeat", "leave"};
  return kNames[m.index()];
}

std::uint64_t message_bytes(const Message& m) {
  constexpr std::uint64_t kHeaderBytes = 64;
  if (const auto* c = std::get_if<ChunkMsg>(&m)) return kHeaderBytes + (c->payload ? c->payload->size() : 0);
  if (const auto* mm = std::get_if<ManifestMsg>(&m)) return kHeaderBytes + (mm->manifest ? mm->manifest->size() : 0);
  if (const auto* n = std::get_if<Need>(&m)) return kHeaderBytes + 4 * n->chunks.size();
  return kHeaderBytes;
}

}  // namespace deltacast::runtime
