#include "deltacast/codec/codec_choice.h"

#include <cmath>
#include <optional>
#include <string>

namespace deltacast {

Result<DeltaCodec> parse_delta_codec(std::string_view name) {
  if (name == "v1") return DeltaCodec::kV1;
  if (name == "v2") return DeltaCodec::kV2;
  if (name == "v3") return DeltaCodec::kV3;
  if (name == "auto") return DeltaCodec::kAuto;
  return Status::invalid_argument("unknown delta codec '" + std::string(name) + "' (v1, v2, v3 or auto)");
}

std::string_view to_string(DeltaCodec codec) {
  switch (codec) {
    case DeltaCodec::kV1: return "v1";
    case DeltaCodec::kV2: return "v2";
    case DeltaCodec::kV3: return "v3";
    case DeltaCodec::kAuto: return "auto";
  }
  return "?";
}

Status DeliveryModel::check() const {
  const std::pair<const char*, double> fields[] = {
      {"WAN rate", wan_bytes_per_s},
      {"worker cores", worker_cores},
      {"v1 apply rate", v1_payload_bytes_per_core_s},
      {"v2 apply rate", v2_payload_bytes_per_core_s},
      {"v3 apply rate", v3_payload_bytes_per_core_s},
      {"anchor decode rate", anchor_image_bytes_per_core_s},
  };
  for (const auto& [name, v] : fields)
    if (!(v > 0) || !std::isfinite(v)) return Status::invalid_argument(std::string("delivery model: ") + name + " must be positive");
  return Status::ok();
}

Result<DeliveryCost> delivery_cost(const EncodedVersion& version, const DeliveryModel& model) {
  DC_RETURN_IF_ERROR(model.check());
  const Manifest& m = version.manifest;
  if (version.payloads.size() != m.chunks.size()) return Status::invalid_argument("payload count does not match the manifest");
  double bytes = 0, core_s = 0;
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    const double payload = static_cast<double>(version.payloads[i].size());
    DC_ASSIGN_OR_RETURN(ChunkKind kind, chunk_kind(version.payloads[i]));
    bytes += payload;
    switch (kind) {
      case ChunkKind::kDeltaV1: core_s += payload / model.v1_payload_bytes_per_core_s; break;
      case ChunkKind::kDeltaV2: core_s += payload / model.v2_payload_bytes_per_core_s; break;
      case ChunkKind::kDeltaV3: core_s += payload / model.v3_payload_bytes_per_core_s; break;
      case ChunkKind::kAnchorV1:
      case ChunkKind::kAnchorV2: core_s += static_cast<double>(m.chunks[i].length) / model.anchor_image_bytes_per_core_s; break;
    }
  }
  return DeliveryCost{bytes / model.wan_bytes_per_s, core_s / model.worker_cores};
}

VersionEncodeOptions with_delta_codec(VersionEncodeOptions o, DeltaCodec codec) {
  o.chunk.delta_kinds = {ChunkKind::kDeltaV1};
  if (codec == DeltaCodec::kV2) o.chunk.delta_kinds.push_back(ChunkKind::kDeltaV2);
  if (codec == DeltaCodec::kV3) o.chunk.delta_kinds = {ChunkKind::kDeltaV3};
  return o;
}

Result<CodecDecision> fixed_codec_decision(const EncodedVersion& delta, DeltaCodec codec, const DeliveryModel& model) {
  CodecDecision d;
  d.chosen = codec;
  d.v2_tried = codec == DeltaCodec::kV2;
  d.v3_tried = codec == DeltaCodec::kV3;
  DC_ASSIGN_OR_RETURN(DeliveryCost cost, delivery_cost(delta, model));
  (d.v2_tried ? d.v2 : d.v3_tried ? d.v3 : d.v1) = cost;
  return d;
}

Result<EncodedVersion> encode_delta(DeltaCodec codec, const DeliveryModel& model, const ModelLayout& layout, std::uint64_t version,
                                    std::uint64_t base_version, ByteSpan base, ByteSpan next, VersionEncodeOptions options,
                                    Executor& executor, ChunkEncoderPool* encoders, CodecDecision* decision) {
  if (base.empty()) return Status::invalid_argument("encode_delta needs a base image");
  auto encode = [&](DeltaCodec c) {
    return encode_version(layout, version, base_version, base, next, with_delta_codec(options, c), executor, encoders);
  };
  CodecDecision d;
  if (codec != DeltaCodec::kAuto) {
    auto ev = encode(codec);
    if (ev.is_ok() && decision) {
      DC_ASSIGN_OR_RETURN(*decision, fixed_codec_decision(*ev, codec, model));
    }
    return ev;
  }
  DC_ASSIGN_OR_RETURN(EncodedVersion best, encode(DeltaCodec::kV1));
  DC_ASSIGN_OR_RETURN(d.v1, delivery_cost(best, model));
  DeliveryCost best_cost = d.v1, last = d.v1;
  // Each candidate sends fewer bytes than the one before and costs the workers more CPU.
  for (const DeltaCodec c : {DeltaCodec::kV3, DeltaCodec::kV2}) {
    if (last.wan_s <= last.worker_s) break;
    DC_ASSIGN_OR_RETURN(EncodedVersion ev, encode(c));
    DC_ASSIGN_OR_RETURN(last, delivery_cost(ev, model));
    (c == DeltaCodec::kV3 ? d.v3_tried : d.v2_tried) = true;
    (c == DeltaCodec::kV3 ? d.v3 : d.v2) = last;
    if (last.bound_s() < best_cost.bound_s()) {
      d.chosen = c;
      best_cost = last;
      best = std::move(ev);
    }
  }
  if (decision) *decision = d;
  return best;
}

}  // namespace deltacast
