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
  return visit_message(m, Overloaded{
                              [](const Hello&) { return "hello"; },
                              [](const Welcome&) { return "welcome"; },
                              [](const Refuse&) { return "refuse"; },
                              [](const ManifestMsg&) { return "manifest"; },
                              [](const ChunkMsg&) { return "chunk"; },
                              [](const Need&) { return "need"; },
                              [](const Ready&) { return "ready"; },
                              [](const Heartbeat&) { return "heartbeat"; },
                              [](const Leave&) { return "leave"; },
                              [](const Subscribe&) { return "subscribe"; },
                          });
}

std::uint64_t message_bytes(const Message& m) {
  constexpr std::uint64_t kHeaderBytes = 64;
  using Bytes = std::uint64_t;
  return visit_message(m, Overloaded{
                              [](const ChunkMsg& c) -> Bytes { return kHeaderBytes + (c.payload ? c.payload->size() : 0); },
                              [](const ManifestMsg& mm) -> Bytes { return kHeaderBytes + (mm.manifest ? mm.manifest->size() : 0); },
                              [](const Need& n) -> Bytes { return kHeaderBytes + 4 * n.chunks.size(); },
                              [](const Hello&) -> Bytes { return kHeaderBytes; },
                              [](const Welcome&) -> Bytes { return kHeaderBytes; },
                              [](const Refuse&) -> Bytes { return kHeaderBytes; },
                              [](const Ready&) -> Bytes { return kHeaderBytes; },
                              [](const Heartbeat&) -> Bytes { return kHeaderBytes; },
                              [](const Leave&) -> Bytes { return kHeaderBytes; },
                              [](const Subscribe& sub) -> Bytes {
                                Bytes b = kHeaderBytes;
                                for (const auto& p : sub.tensors.patterns) b += p.size() + 2;
                                return b;
                              },
                          });
}

}  // namespace deltacast::runtime
