// Encoding chunks (docs/FORMAT.md, "Chunk"): the BF16 delta and anchor sections of format v1
// written here, v2's and anchor v2's through their coders (bf16_v2.cc, anchor_v2.cc), generic
// sections transposed; every kind asked for tried, the smallest kept.
#include "deltacast/codec/chunk.h"

#include <algorithm>
#include <string>

#include "anchor_v2.h"
#include "bf16_scan.h"
#include "bf16_v2.h"
#include "bf16_v3.h"
#include "chunk_common.h"
#include "deltacast/codec/hash.h"

namespace deltacast {

using namespace chunk_internal;

struct ChunkEncoder::State {
  StreamEncoder streams;
  bf16v2::EncodeScratch v2;
  bf16v3::EncodeScratch v3;
  ScratchBytes pos, val, exc, xor_bytes, shuffled, exponents, sign_mantissa;
  std::size_t bytes() const {
    std::size_t b = streams.scratch_bytes() + v2.bytes() + v3.bytes();
    for (const ScratchBytes* x : {&pos, &val, &exc, &xor_bytes, &shuffled, &exponents, &sign_mantissa}) b += x->capacity();
    return b;
  }
};

namespace {

struct SectionWriter {
  ChunkEncoder::State& s;
  Bytes& out;
  const ChunkEncodeOptions& options;
  int level;  // v2 scan kernels
  ChunkStats* stats;
  double v1_excess_bytes = 0;  // v2 sections: how much larger v1 would be (an estimate)
  // Where set, the section encoders feed them the base and new bytes, in order, as they read them.
  RangeHasher* base_hash = nullptr;
  RangeHasher* next_hash = nullptr;
  void hash(const std::uint8_t* base, const std::uint8_t* next, std::size_t bytes) {
    if (base_hash) base_hash->update(base, bytes);
    if (next_hash) next_hash->update(next, bytes);
  }
  void stream(std::string_view name, ByteSpan raw, const std::vector<BackendChoice>& backends) {
    StreamReport rep = s.streams.write(raw, backends, out);
    if (stats) stats->streams.push_back({name, rep});
  }
};

void encode_bf16_delta(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, SectionWriter& w) {
  std::uint8_t* pos = scratch(w.s.pos, n * 5 + 16);
  std::uint8_t* val = scratch(w.s.val, n + 16);
  std::uint8_t* exc = scratch(w.s.exc, n * 2 + 16);
  std::uint8_t* const pos0 = pos;
  std::uint8_t* const val0 = val;
  std::uint8_t* const exc0 = exc;
  std::uint64_t unit = 0;
  std::size_t prev_plus_one = 0;
  const auto* a = reinterpret_cast<const std::uint16_t*>(base);
  const auto* b = reinterpret_cast<const std::uint16_t*>(next);
  for_each_difference_hashed(a, b, n, w.base_hash, w.next_hash, [&](std::size_t i) {
    pos = put_varint(pos, i - prev_plus_one);
    prev_plus_one = i + 1;
    std::uint16_t x = b[i];
    std::uint16_t o = a[i];
    int d = static_cast<int>(x) - static_cast<int>(o);
    if (is_small_step(o, x)) {
      *val++ = zigzag8(d);
      unit += (d == 1 || d == -1);
    } else {
      *val++ = 0;  // escape: the new value is in the exceptions stream
      store_u16(exc, x);
      exc += 2;
    }
  });
  const std::uint64_t changes = static_cast<std::uint64_t>(val - val0);
  const std::uint64_t exceptions = static_cast<std::uint64_t>(exc - exc0) / 2;
  ByteWriter hw(w.out);
  hw.varint(changes);
  hw.varint(exceptions);
  w.stream("positions", ByteSpan(pos0, pos), w.options.delta_backends);
  w.stream("values", ByteSpan(val0, val), w.options.delta_backends);
  w.stream("exceptions", ByteSpan(exc0, exc), w.options.delta_backends);
  if (w.stats) {
    w.stats->bf16_values += n;
    w.stats->changed_values += changes;
    w.stats->small_deltas += changes - exceptions;
    w.stats->unit_deltas += unit;
    w.stats->exceptions += exceptions;
  }
}

// A v2 or v3 BF16 section's counts, into the chunk's stats.
void count_bf16_delta(ChunkStats& stats, std::size_t n, std::uint64_t changes, std::uint64_t exceptions, std::uint64_t unit) {
  stats.bf16_values += n;
  stats.changed_values += changes;
  stats.small_deltas += changes - exceptions;
  stats.unit_deltas += unit;
  stats.exceptions += exceptions;
}

void encode_bf16_delta_v2(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, SectionWriter& w) {
  const bf16v2::SectionCounts sc = bf16v2::encode(base, next, n, w.level, w.options.delta_backends, w.s.v2, w.s.streams, w.out,
                                                   w.base_hash, w.next_hash);
  w.v1_excess_bytes += sc.v1_estimate_bytes - static_cast<double>(sc.section_bytes);
  if (!w.stats) return;
  count_bf16_delta(*w.stats, n, sc.changes, sc.exceptions, sc.unit);
  w.stats->streams.push_back({"changes", StreamReport{{Backend::kRaw, 0}, 2 * n, sc.coded_bytes}, "range-coded"});
  w.stats->streams.push_back({"remainders", StreamReport{{Backend::kRaw, 0}, sc.remainder_bytes, sc.remainder_bytes}, "bits"});
  w.stats->streams.push_back({"exceptions", sc.exceptions_stream, {}});
}

// A v3 BF16 section: the blocked layout, or v1's where that comes out smaller, as it can with
// few changes (the blocked layout's twelve streams each carry a header and a table).
constexpr std::uint64_t kV3CompareChangesMax = 4096;

void encode_bf16_delta_v3(const std::uint8_t* base, const std::uint8_t* next, std::size_t n, SectionWriter& w) {
  const std::size_t start = w.out.size();
  w.out.push_back(1);
  const bf16v3::SectionCounts sc = bf16v3::encode(base, next, n, w.level, w.options.delta_backends, w.s.v3, w.s.streams, w.out, w.base_hash, w.next_hash);
  if (sc.changes <= kV3CompareChangesMax) {
    // v1's layout after it, without stats or hashes (the blocked encoder gave both).
    const std::size_t blocked = w.out.size() - start;
    w.out.push_back(0);
    SectionWriter trial{w.s, w.out, w.options, w.level, nullptr};
    encode_bf16_delta(base, next, n, trial);
    const std::size_t v1 = w.out.size() - start - blocked;
    if (v1 < blocked) w.out.erase(w.out.begin() + static_cast<std::ptrdiff_t>(start), w.out.begin() + static_cast<std::ptrdiff_t>(start + blocked));
    else w.out.resize(start + blocked);
  }
  if (!w.stats) return;
  count_bf16_delta(*w.stats, n, sc.changes, sc.exceptions, sc.unit);
  w.stats->streams.push_back({"v3 section", StreamReport{{Backend::kRaw, 0}, 2 * n, w.out.size() - start}, w.out[start] ? "blocked" : "v1 layout"});
}

void encode_generic_delta(const std::uint8_t* base, const std::uint8_t* next, std::size_t bytes, std::size_t es,
                          SectionWriter& w) {
  w.hash(base, next, bytes);
  std::uint8_t* x = scratch(w.s.xor_bytes, bytes + 1);
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    x[i] = base[i] ^ next[i];
    changed += x[i] != 0;
  }
  std::uint8_t* s = scratch(w.s.shuffled, bytes + 1);
  shuffle(x, bytes / es, es, s);
  w.stream("xor", ByteSpan(s, bytes), w.options.delta_backends);
  if (w.stats) {
    w.stats->generic_bytes += bytes;
    w.stats->generic_changed_bytes += changed;
  }
}

void encode_bf16_anchor(const std::uint8_t* next, std::size_t n, SectionWriter& w) {
  std::uint8_t* e = scratch(w.s.exponents, n + 1);
  std::uint8_t* sm = scratch(w.s.sign_mantissa, n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t x = load_u16(next + 2 * i);  // any alignment
    e[i] = static_cast<std::uint8_t>(x >> 7);
    sm[i] = static_cast<std::uint8_t>(((x >> 8) & 0x80) | (x & 0x7f));
  }
  w.stream("exponents", ByteSpan(e, n), w.options.anchor_backends);
  w.stream("sign_mantissa", ByteSpan(sm, n), w.options.anchor_backends);
  if (w.stats) w.stats->bf16_values += n;
}

// The anchor v2 BF16 section: the Huffman-coded symbols, then the low fields as a stream, which
// stays raw unless the values repeat (zstd-1 is tried on a sample).
void encode_bf16_anchor_v2(const std::uint8_t* next, std::size_t n, SectionWriter& w) {
  // Working memory shared with the other encodings: 1.5n + 64 bytes of bitstreams in `pos`
  // (5n for v1 deltas), 0.75n of low fields in `exponents` (n for v1 anchors).
  const std::size_t coded = anchorv2::encode(next, n, w.s.pos, w.s.exponents, w.out);
  static const std::vector<BackendChoice> kLowBackends = {{Backend::kRaw, 0}, {Backend::kZstd, 1}};
  w.stream("low", ByteSpan(w.s.exponents.data(), anchorv2::low_bytes(n)), kLowBackends);
  if (!w.stats) return;
  w.stats->bf16_values += n;
  w.stats->streams.push_back({"symbols", StreamReport{{Backend::kRaw, 0}, 2 * n, coded}, "huffman"});
}

void encode_generic_anchor(const std::uint8_t* next, std::size_t bytes, std::size_t es, SectionWriter& w) {
  std::uint8_t* s = scratch(w.s.shuffled, bytes + 1);
  shuffle(next, bytes / es, es, s);
  w.stream("bytes", ByteSpan(s, bytes), w.options.anchor_backends);
  if (w.stats) w.stats->generic_bytes += bytes;
}

void write_chunk_header(ChunkKind kind, std::span<const Segment> segments, Bytes& out) {
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(kind));
  w.varint(segments.size());
  for (const auto& s : segments) {
    w.u8(static_cast<std::uint8_t>(s.cls));
    w.u8(s.elem_size);
    w.varint(s.bytes);
  }
}

}  // namespace

ChunkEncodeOptions ChunkEncodeOptions::defaults() {
  ChunkEncodeOptions o;
  o.delta_backends = {{Backend::kRaw, 0}, {Backend::kZstd, 1}, {Backend::kZstd, 3}, {Backend::kRans, 0}};
  o.anchor_backends = {{Backend::kRaw, 0}, {Backend::kZstd, 1}, {Backend::kRans, 0}};
  return o;
}

ChunkEncodeOptions ChunkEncodeOptions::smallest() {
  ChunkEncodeOptions o = defaults();
  o.delta_kinds = {ChunkKind::kDeltaV1, ChunkKind::kDeltaV2};
  o.anchor_kinds = {ChunkKind::kAnchorV2, ChunkKind::kAnchorV1};
  return o;
}

ChunkEncodeOptions ChunkEncodeOptions::max_effort() {
  ChunkEncodeOptions o = smallest();
  o.delta_backends.push_back({Backend::kZstd, 9});
  o.delta_backends.push_back({Backend::kZstd, 19});
  o.anchor_backends.push_back({Backend::kZstd, 3});
  o.anchor_backends.push_back({Backend::kZstd, 19});
  return o;
}

void ChunkStats::add(const ChunkStats& o) {
  bf16_values += o.bf16_values;
  changed_values += o.changed_values;
  small_deltas += o.small_deltas;
  unit_deltas += o.unit_deltas;
  exceptions += o.exceptions;
  generic_bytes += o.generic_bytes;
  generic_changed_bytes += o.generic_changed_bytes;
  streams.insert(streams.end(), o.streams.begin(), o.streams.end());
  v1_chunks += o.v1_chunks;
  v2_chunks += o.v2_chunks;
  v3_chunks += o.v3_chunks;
}

ChunkEncoder::ChunkEncoder(std::size_t scratch_bytes_max) : scratch_bytes_max_(scratch_bytes_max), s_(std::make_unique<State>()) {}
ChunkEncoder::~ChunkEncoder() = default;
ChunkEncoder::ChunkEncoder(ChunkEncoder&&) noexcept = default;
ChunkEncoder& ChunkEncoder::operator=(ChunkEncoder&&) noexcept = default;

std::size_t ChunkEncoder::scratch_bytes() const { return s_->bytes(); }

void ChunkEncoder::trim() {
  if (s_->bytes() > scratch_bytes_max_) s_ = std::make_unique<State>();
}

Result<Bytes> ChunkEncoder::encode_delta(std::span<const Segment> segments, ByteSpan base, ByteSpan next,
                                         const ChunkEncodeOptions& options, ChunkStats* stats, ChunkHashes* hashes) {
  if (base.size() != next.size()) return Status::invalid_argument("base and new ranges differ in size");
  DC_RETURN_IF_ERROR(check_segments(segments, next.size()));
  if (options.delta_kinds.empty()) return Status::invalid_argument("no delta encoding to try");
  Bytes best;
  ChunkStats best_stats;
  // v2 goes first: when it comes out smaller than v1's estimated size (the order-0 entropy of
  // v1's streams, which v1's rANS reaches and rarely beats), v1 is not tried.
  std::vector<ChunkKind> kinds = options.delta_kinds;
  std::stable_partition(kinds.begin(), kinds.end(), [](ChunkKind k) { return k == ChunkKind::kDeltaV2; });
  bool v1_cannot_win = false;
  std::optional<RangeHasher> base_hash, next_hash;  // fed by the first encoding tried
  if (hashes) {
    base_hash.emplace(hashes->scheme);
    next_hash.emplace(hashes->scheme);
  }
  for (ChunkKind kind : kinds) {
    if (!is_delta_kind(kind)) return Status::invalid_argument("not a delta chunk encoding");
    if (kind == ChunkKind::kDeltaV1 && v1_cannot_win) continue;
    Bytes out;
    out.reserve(64 + next.size() / 32);
    ChunkStats st;
    write_chunk_header(kind, segments, out);
    SectionWriter w{*s_, out, options, scan_level_for(options.scan_level), stats ? &st : nullptr};
    if (kind == kinds.front() && hashes) {
      w.base_hash = &*base_hash;
      w.next_hash = &*next_hash;
    }
    std::size_t off = 0;
    for (const auto& s : segments) {
      if (s.cls != SegmentClass::kBF16) encode_generic_delta(base.data() + off, next.data() + off, s.bytes, s.elem_size, w);
      else if (kind == ChunkKind::kDeltaV2) encode_bf16_delta_v2(base.data() + off, next.data() + off, s.bytes / 2, w);
      else if (kind == ChunkKind::kDeltaV3) encode_bf16_delta_v3(base.data() + off, next.data() + off, s.bytes / 2, w);
      else encode_bf16_delta(base.data() + off, next.data() + off, s.bytes / 2, w);
      off += s.bytes;
    }
    if (kind == ChunkKind::kDeltaV2) v1_cannot_win = w.v1_excess_bytes > 0;
    if (!best.empty() && out.size() >= best.size()) continue;
    best = std::move(out);
    best_stats = std::move(st);
    best_stats.v1_chunks = kind == ChunkKind::kDeltaV1;
    best_stats.v2_chunks = kind == ChunkKind::kDeltaV2;
    best_stats.v3_chunks = kind == ChunkKind::kDeltaV3;
  }
  if (stats) stats->add(best_stats);
  if (hashes) {
    hashes->base = base_hash->digest();
    hashes->content = next_hash->digest();
  }
  trim();
  // Payloads are kept (a publisher's until they are sent, a cache's for catch-up): not the room
  // reserved for them.
  if (best.capacity() - best.size() > best.size() / 4 + 4096) best.shrink_to_fit();
  return best;
}

Result<Bytes> ChunkEncoder::encode_anchor(std::span<const Segment> segments, ByteSpan next, const ChunkEncodeOptions& options,
                                          ChunkStats* stats) {
  DC_RETURN_IF_ERROR(check_segments(segments, next.size()));
  if (options.anchor_kinds.empty()) return Status::invalid_argument("no anchor encoding to try");
  Bytes best;
  ChunkStats best_stats;
  for (ChunkKind kind : options.anchor_kinds) {
    if (kind != ChunkKind::kAnchorV1 && kind != ChunkKind::kAnchorV2) return Status::invalid_argument("not an anchor chunk encoding");
    Bytes out;
    out.reserve(64 + next.size());
    ChunkStats st;
    write_chunk_header(kind, segments, out);
    SectionWriter w{*s_, out, options, scan_level_for(options.scan_level), stats ? &st : nullptr};
    std::size_t off = 0;
    for (const auto& s : segments) {
      if (s.cls != SegmentClass::kBF16) encode_generic_anchor(next.data() + off, s.bytes, s.elem_size, w);
      else if (kind == ChunkKind::kAnchorV2) encode_bf16_anchor_v2(next.data() + off, s.bytes / 2, w);
      else encode_bf16_anchor(next.data() + off, s.bytes / 2, w);
      off += s.bytes;
    }
    if (!best.empty() && out.size() >= best.size()) continue;
    best = std::move(out);
    best_stats = std::move(st);
  }
  if (stats) stats->add(best_stats);
  trim();
  return best;
}

}  // namespace deltacast
