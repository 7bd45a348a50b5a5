#include "deltacast/transport/wire.h"

#include "deltacast.pb.h"
#include "deltacast/common/text.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::transport {
namespace {

using namespace deltacast::runtime;

void set_key(wire::VersionKey* out, const VersionKey& k) {
  out->set_version(k.version);
  out->set_anchor(k.anchor);
}
VersionKey get_key(const wire::VersionKey& k) { return {k.version(), k.anchor()}; }

void set_run(wire::RunId* out, const RunId& r) {
  out->set_started_us(r.started_us);
  out->set_nonce(r.nonce);
}
RunId get_run(const wire::RunId& r) { return {r.started_us(), r.nonce()}; }

// A timestamp statement is exactly kTimestampBytes (the node reads its fields); empty: none.
Result<SharedBytes> get_timestamp(const std::string& bytes) {
  if (bytes.empty()) return SharedBytes{};
  if (bytes.size() != runtime::kTimestampBytes)
    return Status::corruption("a timestamp statement of " + std::to_string(bytes.size()) + " bytes (it has " +
                              std::to_string(runtime::kTimestampBytes) + ")");
  return share(Bytes(bytes.begin(), bytes.end()));
}

// Length of the UTF-8 sequence at s[i], 0 if it is not one or is a control character: text
// that log lines, the ledger and metrics can carry as is.
std::size_t text_char_bytes(const std::string& s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7f) return 0;
  return utf8_sequence_bytes(s, i);
}

bool printable_utf8(const std::string& s) {
  for (std::size_t i = 0, n = 0; i < s.size(); i += n)
    if ((n = text_char_bytes(s, i)) == 0) return false;
  return true;
}

// What this node sends as text: control characters and broken sequences become '?', and it is
// cut at a character boundary to `max` bytes, so a receiver's check_string passes.
std::string wire_text(const std::string& s, std::size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max));
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = text_char_bytes(s, i);
    if (out.size() + std::max<std::size_t>(n, 1) > max) break;
    if (n == 0) {
      out += '?';
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

Status check_string(const std::string& s, std::size_t max, const char* what) {
  if (s.size() > max) return Status::corruption(std::string(what) + " longer than " + std::to_string(max) + " bytes");
  if (!printable_utf8(s)) return Status::corruption(std::string(what) + " is not UTF-8 text");
  return Status::ok();
}

// Node ids name files, metrics and log lines: only plain names cross the wire.
Status check_node_id(const std::string& id) {
  if (!valid_node_id(id)) return Status::corruption("node id is not 1 to 128 letters, digits, '.', '_' or '-'");
  return Status::ok();
}

// One specialisation per message type: its Envelope body, how it is written and read, and its
// payload frame. A type of Message without one stops this file from compiling.
template <class T>
struct Body {
  static_assert(sizeof(T) == 0, "deltacast: a message type has no wire body (transport/src/wire.cc)");
};
using NoPayload = std::nullptr_t;

// A subset's patterns as a peer sent them: counted and checked before they are kept.
Result<TensorSubset> get_subset(const google::protobuf::RepeatedPtrField<std::string>& patterns) {
  if (static_cast<std::size_t>(patterns.size()) > kSubsetPatternsMax)
    return Status::corruption("more than " + std::to_string(kSubsetPatternsMax) + " tensor patterns");
  TensorSubset s;
  s.patterns.assign(patterns.begin(), patterns.end());
  if (Status st = validate_subset(s); !st.is_ok()) return Status::corruption(st.message());
  s.normalize();
  return s;
}

template <>
struct Body<Hello> {
  static constexpr auto kCase = wire::Envelope::kHello;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Hello& m, const LinkFields& fields, wire::Envelope& env) {
    env.set_protocol_version(m.protocol_version);
    auto* h = env.mutable_hello();
    h->set_node_id(m.node_id);
    h->set_role(static_cast<std::uint32_t>(m.role));
    h->set_have_version(m.have_version);
    h->set_resume(m.resume);
    set_run(h->mutable_run(), m.run);
    h->set_serves_children(m.serves_children);
    h->set_link(fields.link);
    h->set_stripes(fields.stripes);
    h->set_stripes_max(fields.stripes_max);
    if (m.trees > 1) {
      h->set_tree(m.tree);
      h->set_trees(m.trees);
    }
    h->set_instance(m.instance);
    h->set_workers_below_max(m.workers_below_max);
    for (const auto& t : m.tensors.patterns) h->add_tensors(t);
  }
  // Parsed whatever the peer's protocol version, carrying it, so the node can refuse the peer
  // with a reason.
  static Result<Hello> decode(wire::Envelope& env, SharedBytes) {
    Hello h;
    h.protocol_version = env.protocol_version();
    h.node_id = env.hello().node_id();
    if (env.hello().role() > static_cast<std::uint32_t>(Role::kPublisher)) return Status::corruption("unknown role");
    h.role = static_cast<Role>(env.hello().role());
    h.have_version = env.hello().have_version();
    h.resume = env.hello().resume();
    h.run = get_run(env.hello().run());
    h.serves_children = env.hello().serves_children();
    h.trees = std::max<std::uint32_t>(1, env.hello().trees());
    h.tree = env.hello().tree();
    h.instance = env.hello().instance();
    h.workers_below_max = env.hello().workers_below_max();
    DC_ASSIGN_OR_RETURN(h.tensors, get_subset(env.hello().tensors()));
    if (!valid_tree(h.tree, h.trees))
      return Status::corruption("tree " + std::to_string(h.tree) + " of " + std::to_string(h.trees) + " (at most " + std::to_string(kTreesMax) + " trees)");
    DC_RETURN_IF_ERROR(check_node_id(h.node_id));
    return h;
  }
};

template <>
struct Body<Welcome> {
  static constexpr auto kCase = wire::Envelope::kWelcome;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Welcome& m, const LinkFields&, wire::Envelope& env) {
    env.mutable_welcome()->set_newest_version(m.newest_version);
    set_run(env.mutable_welcome()->mutable_run(), m.run);
    if (m.timestamp) env.mutable_welcome()->set_timestamp(m.timestamp->data(), m.timestamp->size());
  }
  static Result<Welcome> decode(wire::Envelope& env, SharedBytes) {
    DC_ASSIGN_OR_RETURN(SharedBytes ts, get_timestamp(env.welcome().timestamp()));
    return Welcome{env.welcome().newest_version(), get_run(env.welcome().run()), std::move(ts)};
  }
};

template <>
struct Body<Refuse> {
  static constexpr auto kCase = wire::Envelope::kRefuse;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Refuse& m, const LinkFields&, wire::Envelope& env) {
    env.mutable_refuse()->set_reason(wire_text(m.reason, kReasonBytesMax));
    env.mutable_refuse()->set_id_taken(m.id_taken);
  }
  static Result<Refuse> decode(wire::Envelope& env, SharedBytes) {
    DC_RETURN_IF_ERROR(check_string(env.refuse().reason(), kReasonBytesMax, "refusal reason"));
    return Refuse{env.refuse().reason(), env.refuse().id_taken()};
  }
};

template <>
struct Body<ManifestMsg> {
  static constexpr auto kCase = wire::Envelope::kManifest;
  static constexpr auto kPayload = &ManifestMsg::manifest;
  static void encode(const ManifestMsg& m, const LinkFields&, wire::Envelope& env) {
    auto* mm = env.mutable_manifest();
    set_key(mm->mutable_key(), m.key);
    mm->set_published_us(m.published_us);
    mm->set_shard(m.shard);
    mm->set_shards(m.shards);
  }
  static Result<ManifestMsg> decode(wire::Envelope& env, SharedBytes payload) {
    const auto& mm = env.manifest();
    if (mm.shards() > kShardsMax || (mm.shards() > 1 && mm.shard() >= mm.shards())) return Status::corruption("bad shard numbers");
    return ManifestMsg{get_key(mm.key()), std::move(payload), mm.published_us(), mm.shard(), std::max<std::uint32_t>(1, mm.shards())};
  }
};

template <>
struct Body<ChunkMsg> {
  static constexpr auto kCase = wire::Envelope::kChunk;
  static constexpr auto kPayload = &ChunkMsg::payload;
  static void encode(const ChunkMsg& m, const LinkFields&, wire::Envelope& env) {
    auto* c = env.mutable_chunk();
    set_key(c->mutable_key(), m.key);
    c->set_index(m.index);
    c->set_shard(m.shard);
  }
  static Result<ChunkMsg> decode(wire::Envelope& env, SharedBytes payload) {
    return ChunkMsg{get_key(env.chunk().key()), env.chunk().index(), std::move(payload), env.chunk().shard()};
  }
};

template <>
struct Body<Need> {
  static constexpr auto kCase = wire::Envelope::kNeed;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Need& m, const LinkFields&, wire::Envelope& env) {
    auto* n = env.mutable_need();
    set_key(n->mutable_key(), m.key);
    for (auto i : m.chunks) n->add_chunks(i);
    n->set_want_anchor(m.want_anchor);
    n->set_again(m.again);
    n->set_fill(m.fill);
  }
  static Result<Need> decode(wire::Envelope& env, SharedBytes) {
    if (static_cast<std::size_t>(env.need().chunks_size()) > kNeedChunksMax) return Status::corruption("need lists too many chunks");
    Need n;
    n.key = get_key(env.need().key());
    n.chunks.assign(env.need().chunks().begin(), env.need().chunks().end());
    n.want_anchor = env.need().want_anchor();
    n.again = env.need().again();
    n.fill = env.need().fill();
    return n;
  }
};

template <>
struct Body<Ready> {
  static constexpr auto kCase = wire::Envelope::kReady;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Ready& m, const LinkFields&, wire::Envelope& env) {
    auto* r = env.mutable_ready();
    r->set_node_id(m.node_id);
    r->set_version(m.version);
    r->set_checksum(m.checksum);
    r->set_publish_to_ready_ms(m.publish_to_ready_ms);
    r->set_error(wire_text(m.error, kReasonBytesMax));
    set_run(r->mutable_run(), m.run);
    r->set_instance(m.instance);
    r->set_id_taken(m.id_taken);
    if (m.model.reported) {
      r->set_model_reported(true);
      r->set_model_version(m.model.version);
      set_run(r->mutable_model_run(), m.model.run);
      r->set_model_failed_version(m.model.failed_version);
      set_run(r->mutable_model_failed_run(), m.model.failed_run);
    }
  }
  static Result<Ready> decode(wire::Envelope& env, SharedBytes) {
    const auto& r = env.ready();
    DC_RETURN_IF_ERROR(check_node_id(r.node_id()));
    DC_RETURN_IF_ERROR(check_string(r.error(), kReasonBytesMax, "error text"));
    Ready ready{r.node_id(), r.version(), r.checksum(), r.publish_to_ready_ms(), r.error(), get_run(r.run()), r.instance(), {}, r.id_taken()};
    if (r.model_reported())
      ready.model = ModelState{true, r.model_version(), get_run(r.model_run()), r.model_failed_version(), get_run(r.model_failed_run())};
    return ready;
  }
};

template <>
struct Body<Heartbeat> {
  static constexpr auto kCase = wire::Envelope::kHeartbeat;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Heartbeat& m, const LinkFields&, wire::Envelope& env) {
    env.mutable_heartbeat()->set_newest_version(m.newest_version);
    set_run(env.mutable_heartbeat()->mutable_run(), m.run);
    if (m.timestamp) env.mutable_heartbeat()->set_timestamp(m.timestamp->data(), m.timestamp->size());
  }
  static Result<Heartbeat> decode(wire::Envelope& env, SharedBytes) {
    DC_ASSIGN_OR_RETURN(SharedBytes ts, get_timestamp(env.heartbeat().timestamp()));
    return Heartbeat{env.heartbeat().newest_version(), get_run(env.heartbeat().run()), std::move(ts)};
  }
};

template <>
struct Body<Leave> {
  static constexpr auto kCase = wire::Envelope::kLeave;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Leave& m, const LinkFields&, wire::Envelope& env) {
    env.mutable_leave()->set_node_id(m.node_id);
    env.mutable_leave()->set_reason(wire_text(m.reason, kReasonBytesMax));
    env.mutable_leave()->set_moved(m.moved);
  }
  static Result<Leave> decode(wire::Envelope& env, SharedBytes) {
    DC_RETURN_IF_ERROR(check_node_id(env.leave().node_id()));
    DC_RETURN_IF_ERROR(check_string(env.leave().reason(), kReasonBytesMax, "leave reason"));
    return Leave{env.leave().node_id(), env.leave().reason(), env.leave().moved()};
  }
};

template <>
struct Body<Subscribe> {
  static constexpr auto kCase = wire::Envelope::kSubscribe;
  static constexpr NoPayload kPayload = nullptr;
  static void encode(const Subscribe& m, const LinkFields&, wire::Envelope& env) {
    auto* sub = env.mutable_subscribe();
    for (const auto& t : m.tensors.patterns) sub->add_tensors(t);
  }
  static Result<Subscribe> decode(wire::Envelope& env, SharedBytes) {
    DC_ASSIGN_OR_RETURN(TensorSubset t, get_subset(env.subscribe().tensors()));
    return Subscribe{std::move(t)};
  }
};

// The payload field of a message (a manifest's or a chunk's bytes), null for a type without one.
template <class M>
auto* payload_field(M& m) {
  using T = std::remove_const_t<M>;
  using Field = std::conditional_t<std::is_const_v<M>, const SharedBytes, SharedBytes>;
  if constexpr (std::is_null_pointer_v<std::remove_const_t<decltype(Body<T>::kPayload)>>)
    return static_cast<Field*>(nullptr);
  else
    return &(m.*Body<T>::kPayload);
}

// Whether messages with this body carry a payload frame.
template <std::size_t I = 0>
bool body_has_payload(wire::Envelope::BodyCase body) {
  if constexpr (I == std::variant_size_v<Message>) {
    return body == wire::Envelope::kPart;
  } else {
    using T = std::variant_alternative_t<I, Message>;
    if (body == Body<T>::kCase) return !std::is_null_pointer_v<std::remove_const_t<decltype(Body<T>::kPayload)>>;
    return body_has_payload<I + 1>(body);
  }
}

// The message of the Envelope's body, through the Body of the type that has it.
template <std::size_t I = 0>
Result<Message> decode_body(wire::Envelope& env, SharedBytes payload) {
  if constexpr (I == std::variant_size_v<Message>) {
    return Status::corruption("message has no body");
  } else {
    using T = std::variant_alternative_t<I, Message>;
    if (env.body_case() != Body<T>::kCase) return decode_body<I + 1>(env, std::move(payload));
    DC_ASSIGN_OR_RETURN(T m, Body<T>::decode(env, std::move(payload)));
    return Message{std::move(m)};
  }
}

}  // namespace

Frames encode_message(const Message& message, const LinkFields& fields) {
  wire::Envelope env;
  env.set_protocol_version(kProtocolVersion);
  env.set_stream(fields.stream);
  env.set_seq(fields.seq);
  env.set_payload_bytes(fields.payload_bytes);
  env.set_stripes_wanted(fields.stripes_wanted);
  Frames f;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        Body<T>::encode(m, fields, env);
        if (const SharedBytes* payload = payload_field(m)) f.payload = *payload;
      },
      message);
  f.header = env.SerializeAsString();
  return f;
}

namespace {

class SliceBlob final : public runtime::Blob {
 public:
  SliceBlob(SharedBytes whole, std::size_t offset, std::size_t bytes) : whole_(std::move(whole)), offset_(offset), bytes_(bytes) {}
  const std::uint8_t* data() const override { return whole_->data() + offset_; }
  std::size_t size() const override { return bytes_; }

 private:
  SharedBytes whole_;
  std::size_t offset_, bytes_;
};

}  // namespace

const SharedBytes* payload_of(const Message& m) {
  return std::visit([](const auto& msg) -> const SharedBytes* { return payload_field(msg); }, m);
}

std::size_t payload_bytes(const Message& m) {
  const SharedBytes* p = payload_of(m);
  return p && *p ? (*p)->size() : 0;
}

bool set_payload(Message& m, SharedBytes payload) {
  SharedBytes* field = std::visit([](auto& msg) -> SharedBytes* { return payload_field(msg); }, m);
  if (!field) return false;
  *field = std::move(payload);
  return true;
}

SharedBytes slice(const SharedBytes& whole, std::size_t offset, std::size_t bytes) { return std::make_shared<const SliceBlob>(whole, offset, bytes); }

std::vector<Frames> encode_in_parts(const Message& message, LinkFields fields, std::size_t part_bytes) {
  const std::size_t total = payload_bytes(message);
  if (part_bytes == 0 || total <= part_bytes) return {encode_message(message, fields)};
  fields.payload_bytes = total;
  std::vector<Frames> out;
  out.push_back(encode_message(message, fields));
  const SharedBytes whole = out.front().payload;
  out.front().payload = slice(whole, 0, part_bytes);
  for (std::size_t offset = part_bytes; offset < total; offset += part_bytes)
    out.push_back(encode_part(fields.stream, fields.seq + out.size(), slice(whole, offset, std::min(part_bytes, total - offset))));
  return out;
}

Frames encode_part(std::uint64_t stream, std::uint64_t seq, SharedBytes bytes) {
  wire::Envelope env;
  env.set_protocol_version(kProtocolVersion);
  env.set_stream(stream);
  env.set_seq(seq);
  env.mutable_part();
  return Frames{env.SerializeAsString(), std::move(bytes)};
}

Frames encode_stripe(std::uint64_t link, std::uint32_t index, std::uint32_t stripes_wanted) {
  wire::Envelope env;
  env.set_protocol_version(kProtocolVersion);
  env.set_stripes_wanted(stripes_wanted);
  env.mutable_stripe()->set_link(link);
  env.mutable_stripe()->set_index(index);
  return Frames{env.SerializeAsString(), nullptr};
}

Result<Decoded> decode_frames(const void* header, std::size_t header_bytes, SharedBytes payload) {
  if (header_bytes > kHeaderBytesMax) return Status::corruption("message header larger than " + std::to_string(kHeaderBytesMax) + " bytes");
  wire::Envelope env;
  if (!env.ParseFromArray(header, static_cast<int>(header_bytes))) return Status::corruption("message header is not a valid Envelope");
  const bool has_payload = body_has_payload(env.body_case());
  if (has_payload != static_cast<bool>(payload)) return Status::corruption("payload frame missing or unexpected");
  Decoded d;
  d.fields.stream = env.stream();
  d.fields.seq = env.seq();
  d.fields.payload_bytes = env.payload_bytes();
  d.fields.stripes_wanted = env.stripes_wanted();
  if (d.fields.stripes_wanted > kStripesMax) return Status::corruption("a parent asks for more than " + std::to_string(kStripesMax) + " connections");
  if (d.fields.stripes_wanted != 0 && env.body_case() != wire::Envelope::kStripe) return Status::corruption("a link's size on a message other than a Stripe");
  if ((d.fields.stream == 0) != (d.fields.seq == 0)) return Status::corruption("a sequence number without its stream, or the reverse");
  if (d.fields.payload_bytes != 0 && (d.fields.seq == 0 || !payload || payload->size() >= d.fields.payload_bytes))
    return Status::corruption("a payload in parts outside a striped stream, or its first part not smaller than the whole");
  if (env.body_case() == wire::Envelope::kPart) {
    if (env.protocol_version() != kProtocolVersion) return Status::unsupported("part of another protocol version");
    if (d.fields.seq == 0 || payload->size() == 0) return Status::corruption("a payload part outside a striped stream, or empty");
    d.part = std::move(payload);
    return d;
  }
  if (env.body_case() == wire::Envelope::kStripe) {
    if (env.protocol_version() != kProtocolVersion) return Status::unsupported("stripe announcement of another protocol version");
    if (env.stripe().link() == 0 || env.stripe().index() >= kStripesMax || (env.stripe().index() == 0) != (d.fields.stripes_wanted != 0) ||
        (d.fields.stripes_wanted != 0 && (d.fields.stream != 0 || d.fields.payload_bytes != 0)))
      return Status::corruption("stripe announcement without a link, with an index above " + std::to_string(kStripesMax - 1) +
                                ", or a parent's word on a link's size with an index");
    d.fields.link = env.stripe().link();
    d.stripe_index = env.stripe().index();
    return d;
  }
  if (env.body_case() == wire::Envelope::kHello) {
    d.fields.link = env.hello().link();
    d.fields.stripes = env.hello().stripes();
    d.fields.stripes_max = env.hello().stripes_max();
    if (d.fields.stripes > kStripesMax || d.fields.stripes_max > kStripesMax || (d.fields.stripes_max != 0 && d.fields.stripes_max < d.fields.stripes) ||
        (std::max(d.fields.stripes, d.fields.stripes_max) > 1 && d.fields.link == 0))
      return Status::corruption("Hello asks for more than " + std::to_string(kStripesMax) + " stripes, for a ceiling below its stripes, or "
                                "for stripes without a link");
  }
  if (env.body_case() != wire::Envelope::kHello && env.protocol_version() != kProtocolVersion)
    return Status::unsupported("peer speaks protocol version " + std::to_string(env.protocol_version()) + ", this node " +
                               std::to_string(kProtocolVersion));
  auto m = decode_body(env, std::move(payload));
  if (!m.is_ok()) return m.status();
  d.message = std::move(m).value();
  return d;
}

Result<Message> decode_message(const void* header, std::size_t header_bytes, SharedBytes payload) {
  auto d = decode_frames(header, header_bytes, std::move(payload));
  if (!d.is_ok()) return d.status();
  if (!d->message) return Status::corruption("a stripe announcement or a payload part is not a node message");
  return std::move(*d->message);
}

}  // namespace deltacast::transport
