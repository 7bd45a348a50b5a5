// The messages nodes exchange, as plain values. transport/ maps them to Protobuf on the wire;
// the simulator passes them as they are. Payloads are shared, never copied: a relay forwards
// one buffer to all of its children.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "deltacast/common/bytes.h"
#include "deltacast/codec/manifest.h"
#include "deltacast/codec/subset.h"

namespace deltacast::runtime {

// Bumped on any incompatible change to the messages or their meaning. 2: run identity in
// Hello, Welcome, Heartbeat and Ready. 5: Hello's tree and trees (a parent that ignored them
// would send a multi-tree child every chunk on every link). 6: Hello's and Ready's instance, a
// Refuse that says the id is taken, Ready's model state (a parent that ignored the instance would
// admit two live workers under one id). 7: the timestamp statement in Welcome and Heartbeat (a
// worker that trusts keys exposes nothing without it). 8: Hello's tensors and Subscribe (a parent
// that ignored them would send a subset worker every chunk). 9: Need's fill (a parent that
// ignored it would send a worker whose tensors grew an anchor of all of them).
inline constexpr std::uint32_t kProtocolVersion = 9;

// Bounds on what a peer may send (docs/RELIABILITY.md): strings longer than these are refused.
inline constexpr std::size_t kNodeIdBytesMax = 128;
inline constexpr std::size_t kReasonBytesMax = 1024;
// Trees of a multi-tree fleet (Hello::trees, NodeConfig::tree_parents), at most.
inline constexpr std::uint32_t kTreesMax = 8;
// Whether a link in tree `tree` of `trees` (0: one tree) is in range.
inline bool valid_tree(std::uint32_t tree, std::uint32_t trees) {
  trees = std::max<std::uint32_t>(1, trees);
  return trees <= kTreesMax && tree < trees;
}
// Chunks one Need may list (a longer list is refused on the wire; ask for the whole version).
inline constexpr std::size_t kNeedChunksMax = 1u << 20;
// Parents of a node (or of one tree of it) in its config, most preferred first, at most.
inline constexpr std::size_t kParentsMax = 16;
// Node names: letters, digits, '.', '_' and '-', at most kNodeIdBytesMax, not "." or "..",
// so a name is safe as a file name and in logs and metrics.
bool valid_node_id(const std::string& id);

// Immutable bytes shared between the cache, send queues, ZeroMQ and decode tasks. The memory
// lives as long as its last holder. A Blob may own a vector (share()) or memory someone else
// allocated, such as a received ZeroMQ frame, so received payloads are never copied.
class Blob {
 public:
  virtual ~Blob() = default;
  virtual const std::uint8_t* data() const = 0;
  virtual std::size_t size() const = 0;
  ByteSpan span() const { return {data(), size()}; }
  operator ByteSpan() const { return span(); }  // NOLINT: a Blob is read as bytes everywhere
};
using SharedBytes = std::shared_ptr<const Blob>;

class OwnedBlob final : public Blob {
 public:
  explicit OwnedBlob(Bytes bytes) : bytes_(std::move(bytes)) {}
  const std::uint8_t* data() const override { return bytes_.data(); }
  std::size_t size() const override { return bytes_.size(); }

 private:
  Bytes bytes_;
};
inline SharedBytes share(Bytes b) { return std::make_shared<const OwnedBlob>(std::move(b)); }
// Takes every buffer of `payloads` over (leaving them empty), shared.
inline std::vector<SharedBytes> share_payloads(std::vector<Bytes>& payloads) {
  std::vector<SharedBytes> out;
  out.reserve(payloads.size());
  for (auto& p : payloads) out.push_back(share(std::move(p)));
  return out;
}
// Makes payload `index` of a version whose payloads are not kept (Node::publish).
using PayloadSource = std::function<Result<SharedBytes>(std::uint32_t index)>;

// A version travels as a delta (from version - 1) or as an anchor (full snapshot).
struct VersionKey {
  std::uint64_t version = 0;
  bool anchor = false;
  auto operator<=>(const VersionKey&) const = default;
};
std::string to_string(const VersionKey& key);  // "v12" or "v12/anchor"

enum class Role : std::uint8_t { kRelay = 0, kWorker = 1, kPublisher = 2 };

// child -> parent: the first message on a link.
struct Hello {
  std::uint32_t protocol_version = kProtocolVersion;
  std::string node_id;
  Role role = Role::kWorker;
  std::uint64_t have_version = 0;  // newest complete version the child holds, 0 for none
  RunId run;                       // the run that version belongs to
  bool serves_children = false;    // it relays: it passes up Ready messages of the nodes below it
  // The child already holds part of what it needs (it is re-attaching after a failover or a
  // restart): the parent sends nothing unasked and the child pulls exactly what it misses.
  bool resume = false;
  // A multi-tree fleet (NodeConfig::tree_parents): this link is the child's in tree `tree` of
  // `trees`, and carries only the chunks i with i mod trees == tree (manifests all). 1 tree:
  // every chunk.
  std::uint32_t tree = 0, trees = 1;
  // The child process's own number, drawn when it starts (0: none given): two live processes
  // that claim one node id differ in it, a restarted one has a new one.
  std::uint64_t instance = 0;
  // A child that relays: how many workers below it it may report for (0: as many as its parent
  // allows a child, NodeConfig::child_workers_max). A child that does not relay reports for itself.
  std::uint32_t workers_below_max = 0;
  // The tensors whose chunks the child takes (codec/subset.h; all: every chunk): a worker's own,
  // a relay's the union of its children's. Subscribe changes it.
  TensorSubset tensors;
};
// child -> parent: from now on the link carries only the chunks of these tensors (a relay whose
// children's union changed). Chunks it lacks of cached versions it asks for with Need.
struct Subscribe {
  TensorSubset tensors;
};
// parent -> child: accepted.
struct Welcome {
  std::uint64_t newest_version = 0;
  RunId run;  // the run the parent serves; newest_version counts in it
  // The newest timestamp statement the parent holds (runtime::Timestamp, kTimestampBytes), null
  // for none: the origin's signed word that `run` is current.
  SharedBytes timestamp;
};
// parent -> child: refused (protocol version, identity); the link is closed after it.
struct Refuse {
  std::string reason;
  // The child's node id is held by another live process: no parent will take it, and the
  // child stops trying (Node::refusal).
  bool id_taken = false;
};
// A version's manifest (docs/FORMAT.md "manifest"), sent before any of its chunks.
struct ManifestMsg {
  VersionKey key;
  SharedBytes manifest;
  std::uint64_t published_us = 0;  // when the origin published it, origin clock (us)
  // Trainer shard -> origin only: this is slice `shard` of `shards` of the version.
  std::uint32_t shard = 0;
  std::uint32_t shards = 1;
  // In-process transports only (the simulator, tests): the sender's parsed `manifest`, which
  // the receiver shares instead of parsing its own copy (10,000 simulated nodes, one copy).
  // Never on the wire: a message decoded from bytes has none.
  std::shared_ptr<const Manifest> parsed;
};
struct ChunkMsg {
  VersionKey key;
  std::uint32_t index = 0;
  SharedBytes payload;
  std::uint32_t shard = 0;  // trainer shard -> origin only
};
// child -> parent: send these chunks again (all of them if `chunks` is empty), or, with
// want_anchor, the newest anchor and the deltas after it.
// A parent does not send a chunk again that it already handed to the link to this child (it is
// on its way: TCP delivers it or the connection breaks, and a new connection starts afresh),
// unless `again` says the copy that came was damaged, or that it never came (the child's
// transport gave up a gap of a striped link, which loses messages without closing:
// Node::on_messages_lost). With want_anchor, `again` says the child
// threw away versions the link carried (a dropped image, an eviction); without it (a request
// repeated while the answer is on its way, or sent while an unasked anchor crosses), only what
// was not sent yet goes.
struct Need {
  VersionKey key;
  std::vector<std::uint32_t> chunks;
  bool want_anchor = false;
  bool again = false;
  // With want_anchor: a worker whose tensors grew holds version key.version and lacks `chunks`
  // of it; it asks for those chunks of the parent's newest anchor and of the deltas after it
  // (Reconstructor, "fill"), not for an anchor of all its tensors.
  bool fill = false;
};
// What the model of an engine that embeds a worker holds (Node::report_model): the version it
// applied, and the one its last update could not apply.
struct ModelState {
  bool reported = false;  // an engine reports (false: a worker without one)
  std::uint64_t version = 0;  // 0: none deltacast gave it
  RunId run;
  std::uint64_t failed_version = 0;  // 0: its last update applied
  RunId failed_run;
  bool operator==(const ModelState&) const = default;
};

// worker -> origin, forwarded up the tree: a version verified and exposed (0: none yet), what
// the engine embedding the worker made of it, or an error. With id_taken, a relay says it
// refused a second process claiming node_id.
struct Ready {
  std::string node_id;
  std::uint64_t version = 0;
  std::uint64_t checksum = 0;
  std::uint64_t publish_to_ready_ms = 0;
  std::string error;  // last error, if any
  RunId run;          // the run `version` belongs to
  std::uint64_t instance = 0;  // Hello::instance of the worker that reports
  ModelState model;
  bool id_taken = false;
};
// Liveness and the sender's newest version: to children every heartbeat_ms, to parents every
// max(heartbeat_ms, child_timeout_ms / 8) (Node::up_heartbeat_ms).
struct Heartbeat {
  std::uint64_t newest_version = 0;
  RunId run;
  SharedBytes timestamp;  // as in Welcome (parent -> child only)
};
// both ways, when a node stops on purpose: its children move to their next parent at once and
// its parent drops it at once, neither waiting for a timeout. Relays pass a child's Leave up
// to the origin, whose fleet ledger marks the node as gone. A child moving back to its
// preferred parent says Leave with `moved` to the one it leaves: dropped there, not passed up.
struct Leave {
  std::string node_id;
  std::string reason;
  bool moved = false;
};

#ifdef DELTACAST_UNHANDLED_MESSAGE_TEST
// Only in the negative compile test (tests/CMakeLists.txt, "unhandled message"): a message type
// that nothing handles, which must stop every file that dispatches messages from compiling.
struct UnhandledForTest {};
#define DELTACAST_TEST_MESSAGE , UnhandledForTest
#else
#define DELTACAST_TEST_MESSAGE
#endif
using Message = std::variant<Hello, Welcome, Refuse, ManifestMsg, ChunkMsg, Need, Ready, Heartbeat, Leave, Subscribe DELTACAST_TEST_MESSAGE>;
#undef DELTACAST_TEST_MESSAGE

// Dispatch that cannot miss a message type. `visit_message(m, handler)` calls the handler's
// overload for m's type. The handler must name every type of Message, and may not catch all (a
// generic lambda, an `auto` parameter): so adding a type to Message stops every dispatch that
// does not handle it from compiling, instead of it being dropped at run time.
template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

namespace detail {
struct NotAMessage {};
template <class Handler, class Arg, class Variant>
struct HandlesAll;
template <class Handler, class Arg, class... Ts>
struct HandlesAll<Handler, Arg, std::variant<Ts...>>
    : std::bool_constant<(std::is_invocable_v<Handler, std::conditional_t<std::is_const_v<Arg>, const Ts&, Ts&>> && ...)> {};
}  // namespace detail

template <class M, class Handler>
decltype(auto) visit_message(M& message, Handler&& handler) {
  static_assert(!std::is_invocable_v<Handler, const detail::NotAMessage&>,
                "deltacast: a message handler must name each message type, not catch all");
  constexpr bool kHandlesAll = detail::HandlesAll<Handler, M, std::remove_const_t<M>>::value;
  static_assert(kHandlesAll, "deltacast: a message type has no handler");
  if constexpr (kHandlesAll) return std::visit(std::forward<Handler>(handler), message);
}

const char* message_name(const Message& m);
// Bytes a message occupies on a link (payloads and manifests; headers count as 64).
std::uint64_t message_bytes(const Message& m);

}  // namespace deltacast::runtime

#pragma GCC visibility pop
