// Decoding chunks (docs/FORMAT.md, "Chunk"): parsing and checking a chunk, its sections decoded
// (v1 here, v2 and anchor v2 through their coders) over a base or applied sparsely where values
// changed, patches between two versions of a range. Encoding is in chunk_encode.cc.
#include "deltacast/codec/chunk.h"
#include "deltacast/common/check.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "anchor_v2.h"
#include "bf16_scan.h"
#include "bf16_v2.h"
#include "bf16_v3.h"
#include "chunk_common.h"
#include "deltacast/codec/hash.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "deltacast assumes a little-endian host");

namespace deltacast {

using namespace chunk_internal;

namespace {

// ---- parsing -------------------------------------------------------------------------------

struct ParsedSection {
  Segment seg;
  bool v2 = false;  // a v2 BF16 delta section: `bf16` holds it, streams[0] its exceptions
  bf16v2::Section bf16;
  bool v3 = false;  // a v3 BF16 delta section: `b3` holds it (and its streams)
  bf16v3::Section b3;
  bool anchor_v2 = false;  // an anchor v2 BF16 section: `a2` holds it, streams[0] its low fields
  anchorv2::Section a2;
  std::uint64_t change_count = 0;
  std::uint64_t exception_count = 0;
  std::array<StreamRef, 3> streams{};
  std::array<std::string_view, 3> names{};
  int stream_count = 0;
};

struct ParsedChunk {
  ChunkKind kind = ChunkKind::kDeltaV1;
  std::vector<ParsedSection> sections;
  std::uint64_t bytes = 0;
};

Result<ParsedChunk> parse_chunk(ByteSpan payload) {
  ByteReader r(payload);
  ParsedChunk pc;
  std::uint8_t kind;
  std::uint64_t nseg;
  if (!r.u8(kind)) return Status::corruption("empty chunk payload");
  if (kind < static_cast<std::uint8_t>(ChunkKind::kDeltaV1) || kind > static_cast<std::uint8_t>(ChunkKind::kDeltaV3))
    return Status::unsupported("unknown chunk encoding " + std::to_string(kind));
  pc.kind = static_cast<ChunkKind>(kind);
  // Every segment header takes at least 3 bytes, which bounds the count by the payload size.
  if (!r.varint(nseg) || nseg > kSegmentsMax || nseg > r.remaining() / 3)
    return Status::corruption("bad segment count");
  std::vector<Segment> segs(nseg);
  for (auto& s : segs) {
    std::uint8_t cls;
    if (!r.u8(cls) || !r.u8(s.elem_size) || !r.varint(s.bytes)) return Status::corruption("truncated segment table");
    if (cls > static_cast<std::uint8_t>(SegmentClass::kBF16)) return Status::corruption("unknown segment class");
    s.cls = static_cast<SegmentClass>(cls);
    if (s.bytes > kChunkBytesMax) return Status::corruption("segment larger than a chunk");
    pc.bytes += s.bytes;
  }
  if (pc.bytes > kChunkBytesMax) return Status::corruption("chunk larger than the format allows");
  if (Status st = check_segments(segs, pc.bytes); !st.is_ok()) return Status::corruption(st.message());

  const bool delta = is_delta_kind(pc.kind);
  pc.sections.reserve(segs.size());
  for (const auto& s : segs) {
    ParsedSection sec;
    sec.seg = s;
    const std::uint64_t n = s.bytes / s.elem_size;
    auto add = [&](std::string_view name, std::uint64_t max) -> Status {
      DC_ASSIGN_OR_RETURN(StreamRef ref, read_stream(r, max));
      sec.names[sec.stream_count] = name;
      sec.streams[sec.stream_count++] = ref;
      return Status::ok();
    };
    if (pc.kind == ChunkKind::kDeltaV2 && s.cls == SegmentClass::kBF16) {
      DC_ASSIGN_OR_RETURN(sec.bf16, bf16v2::parse(r, n));
      sec.v2 = true;
      sec.change_count = sec.bf16.changes;
      sec.exception_count = sec.bf16.exceptions;
      sec.names[0] = "exceptions";
      sec.streams[0] = sec.bf16.exceptions_stream;
      sec.stream_count = 1;
    } else if (delta && s.cls == SegmentClass::kBF16) {
      // A v3 section names its layout: the blocked one, or v1's.
      std::uint8_t layout = 0;
      if (pc.kind == ChunkKind::kDeltaV3 && !r.u8(layout)) return Status::corruption("truncated section header");
      if (layout > 1) return Status::corruption("unknown v3 section layout " + std::to_string(layout));
      if (layout == 1) {
        DC_ASSIGN_OR_RETURN(sec.b3, bf16v3::parse(r, n));
        sec.v3 = true;
        sec.change_count = sec.b3.changes;
        sec.exception_count = sec.b3.exceptions;
      } else {
        if (!r.varint(sec.change_count) || !r.varint(sec.exception_count)) return Status::corruption("truncated section header");
        if (sec.change_count > n || sec.exception_count > sec.change_count) return Status::corruption("impossible change counts");
        DC_RETURN_IF_ERROR(add("positions", n * 5));
        DC_RETURN_IF_ERROR(add("values", n));
        DC_RETURN_IF_ERROR(add("exceptions", 2 * n));
        if (sec.streams[1].raw_bytes != sec.change_count || sec.streams[2].raw_bytes != 2 * sec.exception_count)
          return Status::corruption("stream sizes disagree with the change counts");
      }
    } else if (delta) {
      DC_RETURN_IF_ERROR(add("xor", s.bytes));
      if (sec.streams[0].raw_bytes != s.bytes) return Status::corruption("xor stream size mismatch");
    } else if (pc.kind == ChunkKind::kAnchorV2 && s.cls == SegmentClass::kBF16) {
      DC_ASSIGN_OR_RETURN(sec.a2, anchorv2::parse(r, n));
      sec.anchor_v2 = true;
      sec.names[0] = "low";
      sec.streams[0] = sec.a2.low;
      sec.stream_count = 1;
    } else if (s.cls == SegmentClass::kBF16) {
      DC_RETURN_IF_ERROR(add("exponents", n));
      DC_RETURN_IF_ERROR(add("sign_mantissa", n));
      if (sec.streams[0].raw_bytes != n || sec.streams[1].raw_bytes != n) return Status::corruption("anchor stream size mismatch");
    } else {
      DC_RETURN_IF_ERROR(add("bytes", s.bytes));
      if (sec.streams[0].raw_bytes != s.bytes) return Status::corruption("anchor stream size mismatch");
    }
    pc.sections.push_back(sec);
  }
  if (r.remaining() != 0) return Status::corruption("trailing bytes after the last stream");
  return pc;
}

// Decoded streams of one section, in the decoder's memory.
struct DecodedStreams {
  std::array<ByteSpan, 3> s{};
  std::span<const std::uint32_t> positions;  // a v1 BF16 delta's change positions (values), ascending
};

using SectionBuffers = std::array<Bytes, 3>;

Status decode_streams(const ParsedSection& sec, StreamDecoder& streams, SectionBuffers& bufs, DecodedStreams& d, bool anchor = false) {
  for (int k = 0; k < sec.stream_count; ++k) {
    // An anchor's readers stay inside their streams, so raw ones are read where they lie.
    if (anchor && sec.streams[k].choice.backend == Backend::kRaw) {
      d.s[k] = sec.streams[k].body;
      continue;
    }
    std::uint8_t* p = scratch(bufs[k], sec.streams[k].raw_bytes + 1);
    MutableByteSpan out(p, sec.streams[k].raw_bytes);
    if (Status st = streams.decode(sec.streams[k], out); !st.is_ok()) return st.with_context(sec.names[k]);
    d.s[k] = ByteSpan(p, out.size());
  }
  return Status::ok();
}

// Checks the positions and values streams of a BF16 delta section before anything is written,
// and decodes the positions into `positions` (d.positions then points there).
Status validate_bf16_delta(const ParsedSection& sec, DecodedStreams& d, std::vector<std::uint32_t>& positions) {
  const std::uint64_t n = sec.seg.bytes / 2;
  const std::uint8_t* p = d.s[0].data();
  const std::uint8_t* const end = p + d.s[0].size();
  positions.resize(sec.change_count);  // at most n (parse_chunk)
  std::uint32_t* out = positions.data();
  std::uint64_t next_min = 0;
  for (std::uint64_t k = 0; k < sec.change_count; ++k) {
    std::uint64_t gap;
    if (end - p >= 2 && (p[0] & p[1] & 0x80) == 0) {
      // One or two bytes (most gaps), without a branch on which: at 0.5-2% changed values
      // about as many gaps take one byte as take two.
      const std::uint64_t more = p[0] >> 7;
      gap = (p[0] & 0x7fu) | ((p[1] & 0x7fu) << 7) * more;
      p += 1 + more;
    } else {
      p = get_varint32(p, end, gap);
      if (!p) return Status::corruption("positions stream ends early or holds a malformed number");
    }
    next_min += gap;
    if (next_min >= n) return Status::corruption("change position outside the segment");
    out[k] = static_cast<std::uint32_t>(next_min);
    ++next_min;
  }
  if (p != end) return Status::corruption("positions stream longer than its change count");
  d.positions = positions;
  const auto escapes = static_cast<std::uint64_t>(std::count(d.s[1].begin(), d.s[1].end(), std::uint8_t{0}));
  if (escapes != sec.exception_count) return Status::corruption("escape count disagrees with the exception count");
  return Status::ok();
}

// Applies a validated v1 BF16 delta section to values that hold the base, in pieces of
// increasing position.
class V1Applier {
 public:
  explicit V1Applier(const DecodedStreams& d) : pos_(d.positions), val_(d.s[1].data()), exc_(d.s[2].data()) {}
  // The changes at positions before `stop`, into `v`, which holds the values from `first` on.
  void apply_before(std::uint64_t stop, std::uint16_t* v, std::uint64_t first) {
    v -= first;
    for (; k_ < pos_.size() && pos_[k_] < stop; ++k_) {
      const std::uint32_t at = pos_[k_];
      if (const std::uint8_t z = val_[k_]) {
        v[at] = static_cast<std::uint16_t>(v[at] + unzigzag8(z));
      } else {
        v[at] = load_u16(exc_);
        exc_ += 2;
      }
    }
  }

 private:
  std::span<const std::uint32_t> pos_;
  const std::uint8_t* val_;
  const std::uint8_t* exc_;
  std::size_t k_ = 0;  // the next change
};

// The element starts (bytes from the chunk's start) of every value a decoded delta changes,
// ascending: from the positions streams (v1), the decoded changes (v2) and the non-zero
// elements of the xor streams (generic segments).
void collect_changes(const ParsedChunk& pc, std::span<const DecodedStreams> decoded, std::span<const bf16v2::Changes> v2,
                     std::span<const bf16v3::Changes> v3, std::vector<std::uint32_t>& out) {
  out.clear();
  std::uint32_t at = 0;  // the section's first byte
  for (std::size_t k = 0; k < pc.sections.size(); at += static_cast<std::uint32_t>(pc.sections[k].seg.bytes), ++k) {
    const ParsedSection& sec = pc.sections[k];
    const std::size_t first = out.size();
    if (sec.v2) {
      const bf16v2::Changes& c = v2[k];
      for (std::uint64_t j = 0; j < c.starts[c.classes]; ++j) out.push_back(at + 2 * c.positions[j]);
      std::sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    } else if (sec.v3) {
      for (const std::uint32_t pos : v3[k].positions) out.push_back(at + 2 * pos);
    } else if (sec.seg.cls == SegmentClass::kBF16) {
      for (const std::uint32_t pos : decoded[k].positions) out.push_back(at + 2 * pos);
    } else {
      // Transposed: byte j of element i is at j * m + i.
      const std::size_t es = sec.seg.elem_size, m = sec.seg.bytes / es;
      const std::uint8_t* x = decoded[k].s[0].data();
      for (std::size_t i = 0; i < m; ++i) {
        bool changed = false;
        for (std::size_t j = 0; j < es && !changed; ++j) changed = x[j * m + i] != 0;
        if (changed) out.push_back(at + static_cast<std::uint32_t>(i * es));
      }
    }
  }
}

// Word j of a range as the state hash reads it: 8 bytes from 8j, zero-padded past the end.
[[gnu::always_inline]] inline std::uint64_t state_word(const std::uint8_t* range, std::size_t range_bytes, std::uint64_t j) {
  std::uint64_t w = 0;
  const std::size_t at = 8 * j;
  if (at + 8 <= range_bytes) std::memcpy(&w, range + at, 8);
  else std::memcpy(&w, range + at, range_bytes - at);
  return w;
}

// Bytes decode_chunk writes at a time: copying the base, applying the changes and hashing the
// result each find the piece in L1.
constexpr std::size_t kWriteTileBytes = 16u << 10;

constexpr std::string_view kBaseMismatch = "base bytes differ from the base this delta was made against";

// A parsed chunk against the range it is decoded into and the segments the tensor table gives.
Status check_shape(const ParsedChunk& pc, std::span<const Segment> expected_segments, std::size_t range_bytes) {
  if (pc.bytes != range_bytes) return Status::mismatch("chunk covers " + std::to_string(pc.bytes) + " bytes, range has " + std::to_string(range_bytes));
  if (!expected_segments.empty()) {
    bool same = expected_segments.size() == pc.sections.size();
    for (std::size_t i = 0; same && i < pc.sections.size(); ++i) same = pc.sections[i].seg == expected_segments[i];
    if (!same) return Status::mismatch("chunk segments do not match the tensor table");
  }
  return Status::ok();
}

// Changes ahead of the one being written whose cache line is fetched meanwhile.
constexpr std::size_t kPrefetchChanges = 64;

// Writes the changes of a sparse apply into a range as they come, ascending, and logs each word
// they touch once, as it was and as it became: the range's state hash moves by the difference of
// the logged words' mixes (mixed a batch at a time while the log is in L1, vectorised where the
// CPU allows), and undo() puts a range whose result fails its hash back from the log. Its state
// lives in scalars and plain pointers, not in containers: the compiler keeps them in registers
// across the byte stores into the range.
class SparseWriter {
 public:
  // Words a log needs room for: each change touches one word, or two when a BF16 value
  // straddles two, and no word is logged twice.
  static std::size_t log_words_max(std::size_t changes, std::size_t range_bytes) { return std::min(2 * changes, (range_bytes + 7) / 8); }
  // `log` holds room for log_words_max(changes, range.size()) words; `patch`, when set,
  // receives the `changes` values written.
  SparseWriter(MutableByteSpan range, std::size_t changes, StateWordChange* log, ChunkPatch* patch)
      : p_(range.data()), n_(range.size()), log_(log), patch_(patch), log_max_(log_words_max(changes, range.size())), changes_(changes) {
    if (patch_) {
      patch_->at.resize(changes);
      patch_->values.resize(changes);
      patch_at_ = patch_->at.data();
      patch_values_ = patch_->values.data();
    }
  }
  // The two bytes at `at`, which must not straddle two words ((at & 7) != 7), as they are now:
  // from the word they lie in, loaded for its first change.
  [[gnu::always_inline]] std::uint16_t get2(std::uint32_t at) {
    word(at >> 3);
    return static_cast<std::uint16_t>(now_ >> (8 * (at & 7)));
  }
  // `bytes` (1 or 2) bytes of `value` at `at`, beyond every earlier change.
  [[gnu::always_inline]] void put(std::uint32_t at, unsigned bytes, std::uint16_t value) {
    // Account for the words first: a two-byte value may start the next word, which must be
    // read as it was before this change writes into it.
    if (bytes == 2 && (at & 7) != 7) {
      word(at >> 3);
      const unsigned shift = 8 * (at & 7);
      now_ = (now_ & ~(std::uint64_t{0xffff} << shift)) | (std::uint64_t{value} << shift);
      store_u16(p_ + at, value);
    } else {
      for (unsigned b = 0; b < bytes; ++b) {
        const std::uint64_t pos = at + b;
        word(pos >> 3);
        const unsigned s = 8 * (pos & 7);
        now_ = (now_ & ~(std::uint64_t{0xff} << s)) | (std::uint64_t{(value >> (8 * b)) & 0xffu} << s);
      }
      if (bytes == 2) store_u16(p_ + at, value);
      else p_[at] = static_cast<std::uint8_t>(value);
    }
    if (patch_) {
      patch_at_[count_] = bytes == 1 ? at | ChunkPatch::kOneByte : at;
      patch_values_[count_] = value;
    }
    ++count_;
  }
  // The changes of a v1 BF16 section from `at`, which is even, so no value straddles two words:
  // value k at position pos[k] becomes the base plus unzigzag8(val[k]), or the next exception
  // when val[k] is 0. Not inlined: inside the caller's large frame its state spilled to the
  // stack (3-4% more CPU per version).
  [[gnu::noinline]] void put_v1_bf16(std::uint32_t at, const std::uint32_t* pos, std::size_t count, const std::uint8_t* val,
                                     const std::uint8_t* exc) {
    put_bf16_run(at, pos, count, [&](std::size_t k, std::uint16_t base) {
      if (const std::uint8_t z = val[k]) return static_cast<std::uint16_t>(base + unzigzag8(z));
      const std::uint16_t v = load_u16(exc);
      exc += 2;
      return v;
    });
  }
  // The changes of a v3 BF16 section from `at`, which is even: value k at position pos[k]
  // becomes values[k] (its decoder read the base).
  [[gnu::noinline]] void put_v3_bf16(std::uint32_t at, const std::uint32_t* pos, std::size_t count, const std::uint16_t* values) {
    put_bf16_run(at, pos, count, [&](std::size_t k, std::uint16_t) { return values[k]; });
  }

 private:
  // The changes at positions pos[0..count) of a BF16 section from `at`, which is even, so no
  // value straddles two words: value_of(k, base value) gives change k's new value. One tight
  // loop, its state in locals (put() is the general case).
  template <typename ValueOf>
  [[gnu::always_inline]] void put_bf16_run(std::uint32_t at, const std::uint32_t* pos, std::size_t count, ValueOf&& value_of) {
    std::uint8_t* const p = p_;
    std::uint64_t j = j_, was = was_, now = now_;
    for (std::size_t k = 0; k < count; ++k) {
      if (k + kPrefetchChanges < count) __builtin_prefetch(p + at + 2 * std::size_t{pos[k + kPrefetchChanges]}, 1);
      const std::uint32_t off = at + 2 * pos[k];
      if (const std::uint64_t wj = off >> 3; wj != j) {
        if (j != kNone) {
          log_[logged_++] = {j, was, now};
          if (logged_ - mixed_ == kMixBatch) mix(kMixBatch);
        }
        j = wj;
        was = now = state_word(p, n_, wj);
      }
      const unsigned shift = 8 * (off & 7);
      const std::uint16_t v = value_of(k, static_cast<std::uint16_t>(now >> shift));
      now = (now & ~(std::uint64_t{0xffff} << shift)) | (std::uint64_t{v} << shift);
      store_u16(p + off, v);
      if (patch_) {
        patch_at_[count_ + k] = off;
        patch_values_[count_ + k] = v;
      }
    }
    count_ += count;
    j_ = j;
    was_ = was;
    now_ = now;
  }

 public:
  // The range's state hash, which was `held`, with every change written.
  [[gnu::always_inline]] std::uint64_t finish(std::uint64_t held) {
    flush();
    // The payload's count of changes sized the log and the patch; more would have written past them.
    DC_CHECK(logged_ <= log_max_ && count_ <= changes_, "a sparse apply wrote more changes than its payload declared");
    mix(logged_ - mixed_);
    if (patch_) {
      patch_->at.resize(count_);
      patch_->values.resize(count_);
    }
    return held + state_;
  }
  // Writes back every word as it was before the first change.
  [[gnu::always_inline]] void undo() {
    for (std::size_t k = 0; k < logged_; ++k) {
      const std::size_t at = 8 * log_[k].j;
      std::memcpy(p_ + at, &log_[k].was, std::min<std::size_t>(8, n_ - at));
    }
    if (patch_) patch_->clear();
  }

 private:
  static constexpr std::size_t kMixBatch = 64;
  [[gnu::always_inline]] void word(std::uint64_t j) {
    if (j == j_) return;
    flush();
    j_ = j;
    was_ = now_ = state_word(p_, n_, j);
  }
  [[gnu::always_inline]] void flush() {
    if (j_ == kNone) return;
    log_[logged_++] = {j_, was_, now_};
    if (logged_ - mixed_ == kMixBatch) mix(kMixBatch);
  }
  [[gnu::always_inline]] void mix(std::size_t words) {
    state_ += state_mix_delta(std::span<const StateWordChange>(log_ + mixed_, words));
    mixed_ += words;
  }
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint8_t* p_;
  std::size_t n_;
  std::uint64_t state_ = 0;  // the mixes' difference so far
  std::uint64_t j_ = kNone, was_ = 0, now_ = 0;
  StateWordChange* log_;
  std::size_t logged_ = 0, mixed_ = 0;
  ChunkPatch* patch_;
  std::uint32_t* patch_at_ = nullptr;
  std::uint16_t* patch_values_ = nullptr;
  std::size_t count_ = 0;
  std::size_t log_max_, changes_;
};

// The changes a decoded delta writes: v1, v2 and v3 BF16 changes, and generic bytes whose xor
// is not zero.
std::size_t sparse_change_count(const ParsedChunk& pc, std::span<const DecodedStreams> decoded, std::span<const bf16v2::Changes> v2,
                                std::span<const bf16v3::Changes> v3) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < pc.sections.size(); ++k) {
    const ParsedSection& sec = pc.sections[k];
    if (sec.v2) n += v2[k].starts[v2[k].classes];
    else if (sec.v3) n += v3[k].positions.size();
    else if (sec.seg.cls == SegmentClass::kBF16) n += sec.change_count;
    else n += sec.seg.bytes - static_cast<std::size_t>(std::count(decoded[k].s[0].begin(), decoded[k].s[0].end(), std::uint8_t{0}));
  }
  return n;
}

// Writes every change of a decoded delta into `range`, ascending: v1 BF16 changes from their
// positions (each reads its one base value), v2 and v3 changes as decoded, generic bytes where
// the xor is not zero.
[[gnu::always_inline]] inline void write_sparse(const ParsedChunk& pc, std::span<const DecodedStreams> decoded, std::span<const bf16v2::Changes> v2,
                                                std::span<const bf16v3::Changes> v3, std::uint8_t* range, SparseWriter& w) {
  std::uint32_t at = 0;  // the section's first byte
  for (std::size_t k = 0; k < pc.sections.size(); at += static_cast<std::uint32_t>(pc.sections[k].seg.bytes), ++k) {
    const ParsedSection& sec = pc.sections[k];
    const DecodedStreams& d = decoded[k];
    if (sec.v2) {
      // Class by class as decoded: put in position order (a change's offset and value in one key).
      const bf16v2::Changes& c = v2[k];
      std::vector<std::uint64_t> keyed(c.starts[c.classes]);
      for (std::uint64_t j = 0; j < keyed.size(); ++j) keyed[j] = std::uint64_t{at + 2 * c.positions[j]} << 16 | c.values[j];
      std::sort(keyed.begin(), keyed.end());
      for (const std::uint64_t key : keyed) w.put(static_cast<std::uint32_t>(key >> 16), 2, static_cast<std::uint16_t>(key));
    } else if (sec.v3) {
      // Decoded in position order, each value from the base its decoder read.
      const bf16v3::Changes& c = v3[k];
      if (at % 2 == 0) {
        w.put_v3_bf16(at, c.positions.data(), c.positions.size(), c.values.data());
      } else {
        for (std::size_t j = 0; j < c.positions.size(); ++j) w.put(at + 2 * c.positions[j], 2, c.values[j]);
      }
    } else if (sec.seg.cls == SegmentClass::kBF16 && at % 2 == 0) {
      w.put_v1_bf16(at, d.positions.data(), d.positions.size(), d.s[1].data(), d.s[2].data());
    } else if (sec.seg.cls == SegmentClass::kBF16) {
      // Each base value's line is fetched kPrefetchChanges changes ahead of its use.
      const std::uint32_t* const pos = d.positions.data();
      const std::size_t count = d.positions.size();
      const std::uint8_t* const section = range + at;
      const std::uint8_t* val = d.s[1].data();
      const std::uint8_t* exc = d.s[2].data();
      for (std::size_t j = 0; j < count; ++j) {
        if (j + kPrefetchChanges < count) __builtin_prefetch(section + 2 * pos[j + kPrefetchChanges], 1);
        const std::uint32_t off = at + 2 * pos[j];
        const std::uint16_t b = (off & 7) != 7 ? w.get2(off) : load_u16(range + off);
        std::uint16_t v;
        if (const std::uint8_t z = val[j]) {
          v = static_cast<std::uint16_t>(b + unzigzag8(z));
        } else {
          v = load_u16(exc);
          exc += 2;
        }
        w.put(off, 2, v);
      }
    } else {
      // Transposed: byte j of element i is at j * m + i.
      const std::size_t es = sec.seg.elem_size, m = sec.seg.bytes / es;
      const std::uint8_t* x = d.s[0].data();
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < es; ++j)
          if (const std::uint8_t b = x[j * m + i]) {
            const std::uint32_t off = at + static_cast<std::uint32_t>(i * es + j);
            w.put(off, 1, static_cast<std::uint8_t>(range[off] ^ b));
          }
    }
  }
}

}  // namespace

ChunkPatch patch_of(std::span<const Segment> segments, std::span<const std::uint32_t> changed, ByteSpan range) {
  ChunkPatch patch;
  patch.at.reserve(changed.size());
  patch.values.reserve(changed.size());
  std::size_t seg = 0;
  std::uint64_t seg_end = segments.empty() ? 0 : segments[0].bytes;
  for (const std::uint32_t at : changed) {
    while (seg + 1 < segments.size() && at >= seg_end) seg_end += segments[++seg].bytes;
    const Segment& s = segments[seg];
    if (s.cls == SegmentClass::kBF16) {
      patch.at.push_back(at);
      patch.values.push_back(load_u16(range.data() + at));
      continue;
    }
    for (std::uint32_t b = 0; b < s.elem_size; ++b) {
      patch.at.push_back((at + b) | ChunkPatch::kOneByte);
      patch.values.push_back(range[at + b]);
    }
  }
  return patch;
}

Bytes gather_elements(std::span<const Segment> segments, std::span<const std::uint32_t> changed, ByteSpan range) {
  Bytes out;
  out.reserve(changed.size() * 2);
  std::size_t seg = 0;
  std::uint64_t seg_end = segments.empty() ? 0 : segments[0].bytes;
  for (const std::uint32_t at : changed) {
    while (seg + 1 < segments.size() && at >= seg_end) seg_end += segments[++seg].bytes;
    const std::uint32_t size = segments.empty() ? 1 : segments[seg].elem_size;
    if (std::uint64_t{at} + size > range.size()) break;  // not an element of this range: the caller sees fewer
    out.insert(out.end(), range.begin() + at, range.begin() + at + size);
  }
  return out;
}

Status base_mismatch(std::optional<std::uint64_t> base_version) {
  std::string message(kBaseMismatch);
  if (base_version) message += " (version " + std::to_string(*base_version) + ")";
  return Status::mismatch(std::move(message));
}

bool is_base_mismatch(const Status& status) {
  return status.code() == StatusCode::kMismatch && status.message().starts_with(kBaseMismatch);
}

struct ChunkDecoder::State {
  StreamDecoder streams;
  std::vector<SectionBuffers> sections;  // decoded streams, per section of the chunk
  std::vector<bf16v2::Changes> v2;       // v2 sections' changes
  std::vector<std::uint32_t> gaps;       // v2 decoder's working memory
  std::vector<bf16v3::Changes> v3;       // v3 sections' changes
  bf16v3::DecodeScratch v3_streams;      // a v3 section's decoded streams
  std::vector<std::vector<std::uint32_t>> positions;  // v1 BF16 delta sections' change positions
  std::vector<StateWordChange> words;                 // apply_sparse: the words it changed
  anchorv2::DecodeTables huffman;                     // anchor v2 decoding tables
  alignas(64) std::array<std::uint8_t, kWriteTileBytes> tile;
  std::size_t bytes() const {
    std::size_t b = streams.scratch_bytes() + sizeof(State) + gaps.capacity() * 4;
    b += sections.capacity() * sizeof(SectionBuffers) + v2.capacity() * sizeof(bf16v2::Changes);
    for (const auto& sec : sections)
      for (const auto& x : sec) b += x.capacity();
    for (const auto& c : v2) b += c.positions.capacity() * 4 + c.values.capacity() * 2;
    b += v3.capacity() * sizeof(bf16v3::Changes) + v3_streams.bytes();
    for (const auto& c : v3) b += c.bytes();
    for (const auto& p : positions) b += p.capacity() * 4;
    b += positions.capacity() * sizeof(positions[0]) + words.capacity() * sizeof(StateWordChange);
    return b;
  }
};

namespace {

// Pass 1 of a decode: every section's streams into the decoder's memory, checked, and v2
// sections' changes decoded against the base (which they read). `base_hash`, when set, is fed
// the base of every section. Writes nothing to `out` but anchor v2 sections (where `out` is
// 2-byte aligned).
Status decode_sections(const ParsedChunk& pc, const std::uint8_t* base, int level, ChunkDecoder::State& s,
                       std::vector<DecodedStreams>& decoded, RangeHasher* base_hash, std::uint8_t* out = nullptr) {
  const bool delta = is_delta_kind(pc.kind);
  if (s.sections.size() < pc.sections.size()) s.sections.resize(pc.sections.size());
  if (s.v2.size() < pc.sections.size()) s.v2.resize(pc.sections.size());
  if (s.v3.size() < pc.sections.size()) s.v3.resize(pc.sections.size());
  if (s.positions.size() < pc.sections.size()) s.positions.resize(pc.sections.size());
  decoded.assign(pc.sections.size(), {});
  for (std::size_t k = 0, at = 0; k < pc.sections.size(); at += pc.sections[k].seg.bytes, ++k) {
    const auto& sec = pc.sections[k];
    if (Status st = decode_streams(sec, s.streams, s.sections[k], decoded[k], !delta); !st.is_ok())
      return st.with_context("segment " + std::to_string(k));
    Status st;
    if (sec.v2) {
      st = bf16v2::decode(sec.bf16, base + at, decoded[k].s[0], level, s.gaps, s.v2[k], base_hash);
    } else if (sec.v3) {
      if (base_hash) base_hash->update(base + at, sec.seg.bytes);
      st = bf16v3::decode(sec.b3, base + at, level, s.streams, s.v3_streams, s.v3[k]);
    } else if (sec.anchor_v2) {
      // Straight into the output where it is aligned for 16-bit values (an anchor has no base
      // to keep; pass 2 only hashes it), else into the decoder's memory (the buffer a v1
      // delta's exceptions take, as large) for pass 2 to copy.
      if (!out) return Status::invalid_argument("an anchor section needs its output");
      std::uint8_t* to = reinterpret_cast<std::uintptr_t>(out + at) % 2 ? scratch(s.sections[k][2], sec.seg.bytes + 1) : out + at;
      st = anchorv2::decode(sec.a2, decoded[k].s[0], reinterpret_cast<std::uint16_t*>(to), s.huffman);
      decoded[k].s[2] = ByteSpan(to, sec.seg.bytes);
    } else {
      if (base_hash) base_hash->update(base + at, sec.seg.bytes);
      if (delta && sec.seg.cls == SegmentClass::kBF16) st = validate_bf16_delta(sec, decoded[k], s.positions[k]);
    }
    if (!st.is_ok()) return st.with_context("segment " + std::to_string(k));
  }
  return Status::ok();
}

}  // namespace

ChunkDecoder::ChunkDecoder(ChunkDecodeOptions options) : options_(options), s_(std::make_unique<State>()) {
  options_.scan_level = scan_level_for(options_.scan_level);
}
ChunkDecoder::~ChunkDecoder() = default;
ChunkDecoder::ChunkDecoder(ChunkDecoder&&) noexcept = default;
ChunkDecoder& ChunkDecoder::operator=(ChunkDecoder&&) noexcept = default;

std::size_t ChunkDecoder::scratch_bytes() const { return s_->bytes(); }

void ChunkDecoder::trim() {
  if (s_->bytes() > options_.scratch_bytes_max) s_ = std::make_unique<State>();
}

Status ChunkDecoder::decode(ByteSpan payload, std::span<const Segment> expected_segments, ByteSpan base, MutableByteSpan out,
                            const ChunkHashes* expect, std::vector<std::uint32_t>* changed) {
  Status st = decode_checked(payload, expected_segments, base, out, expect, changed);
  trim();
  return st;
}

Status ChunkDecoder::decode_checked(ByteSpan payload, std::span<const Segment> expected_segments, ByteSpan base, MutableByteSpan out,
                                    const ChunkHashes* expect, std::vector<std::uint32_t>* changed) {
  DC_ASSIGN_OR_RETURN(ParsedChunk pc, parse_chunk(payload));
  DC_RETURN_IF_ERROR(check_shape(pc, expected_segments, out.size()));
  const bool delta = is_delta_kind(pc.kind);
  if (delta && base.size() != out.size()) return Status::invalid_argument("delta chunk needs base bytes of the same range");
  const bool in_place = delta && base.data() == out.data();
  if (delta && !in_place && base.data() < out.data() + out.size() && out.data() < base.data() + base.size())
    return Status::invalid_argument("base and output overlap without being the same memory");
  const bool check_base = delta && expect && expect->base.has_value();
  std::optional<RangeHasher> base_hash, out_hash;
  if (check_base) base_hash.emplace(expect->scheme);
  if (expect && expect->content.has_value()) out_hash.emplace(expect->scheme);

  // Pass 1: decode and check every section into the decoder's memory, and hash the base (v2
  // sections as their decoder walks it). Nothing is written to `out` yet, but anchor v2
  // sections (decode_sections).
  std::vector<DecodedStreams> decoded;
  if (Status st = decode_sections(pc, base.data(), options_.scan_level, *s_, decoded, base_hash ? &*base_hash : nullptr, out.data());
      !st.is_ok()) {
    // Decoded against a base that is not the one the delta was made against: say so.
    if (check_base && chunk_hash(expect->scheme, base) != *expect->base) return base_mismatch();
    return st;
  }
  if (check_base && base_hash->digest() != *expect->base) return base_mismatch();

  // Pass 2: write, a tile at a time: into L1 scratch where the output is separate memory
  // (streamed out from there), else in place.
  auto& scratch = s_->tile;
  std::size_t off = 0;
  for (std::size_t k = 0; k < pc.sections.size(); ++k) {
    const auto& sec = pc.sections[k];
    const DecodedStreams& d = decoded[k];
    std::uint8_t* const o = out.data() + off;
    const std::uint8_t* const b = base.data() + off;
    const std::size_t es = sec.seg.elem_size, count = sec.seg.bytes / es;
    const std::size_t tile = kWriteTileBytes / es;  // elements
    std::optional<V1Applier> v1;
    if (delta && sec.seg.cls == SegmentClass::kBF16 && !sec.v2 && !sec.v3) v1.emplace(d);
    const bf16v3::Changes& c3 = s_->v3[k];
    std::size_t next_v3 = 0;
    const bf16v2::Changes& c2 = s_->v2[k];
    std::array<std::uint64_t, bf16v2::kClassesMax> next_change;  // v2: per class
    std::copy_n(c2.starts.begin(), bf16v2::kClassesMax, next_change.begin());
    const bool decoded_in_out = sec.anchor_v2 && d.s[2].data() == o;  // pass 1 wrote it to `out`
    for (std::size_t i0 = 0; i0 < count; i0 += tile) {
      const std::size_t i1 = std::min(count, i0 + tile), bytes = (i1 - i0) * es;
      // Element i0: in place, or where pass 1 decoded an anchor v2 section, or L1 scratch.
      std::uint8_t* const t = in_place || decoded_in_out ? o + i0 * es
                              : sec.anchor_v2            ? s_->sections[k][2].data() + i0 * es
                                                         : scratch.data();
      auto* const tv = reinterpret_cast<std::uint16_t*>(t);
      if (delta) {
        if (!in_place) std::memcpy(t, b + i0 * es, bytes);
        if (sec.v2) {
          for (int c = 0; c < c2.classes; ++c)
            for (auto& j = next_change[c]; j < c2.starts[c + 1] && c2.positions[j] < i1; ++j) tv[c2.positions[j] - i0] = c2.values[j];
        } else if (sec.v3) {
          for (; next_v3 < c3.positions.size() && c3.positions[next_v3] < i1; ++next_v3) tv[c3.positions[next_v3] - i0] = c3.values[next_v3];
        } else if (v1) {
          v1->apply_before(i1, tv, i0);
        } else {
          unshuffle<true>(d.s[0].data(), count, es, i0, i1, t);
        }
      } else if (sec.anchor_v2) {
        // Decoded in pass 1.
      } else if (sec.seg.cls == SegmentClass::kBF16) {
        const std::uint8_t* e = d.s[0].data();
        const std::uint8_t* sm = d.s[1].data();
        for (std::size_t i = i0; i < i1; ++i)
          tv[i - i0] = static_cast<std::uint16_t>(((sm[i] & 0x80) << 8) | (e[i] << 7) | (sm[i] & 0x7f));
      } else {
        unshuffle<false>(d.s[0].data(), count, es, i0, i1, t);
      }
      if (out_hash) out_hash->update(t, bytes);
      if (!in_place && !decoded_in_out) stream_copy(o + i0 * es, t, bytes);
    }
    off += sec.seg.bytes;
  }
  if (!in_place) stream_fence();
  if (out_hash && out_hash->digest() != *expect->content) return Status::corruption("reconstructed bytes fail their checksum");
  if (changed) {
    if (delta) collect_changes(pc, decoded, s_->v2, s_->v3, *changed);
    else changed->clear();
  }
  return Status::ok();
}

Status ChunkDecoder::apply_sparse(ByteSpan payload, std::span<const Segment> expected_segments, MutableByteSpan range,
                                  std::uint64_t held_state, const ChunkHashes& expect, std::vector<std::uint32_t>* changed,
                                  ChunkPatch* patch) {
  Status st = apply_sparse_checked(payload, expected_segments, range, held_state, expect, changed, patch);
  trim();
  return st;
}

Status ChunkDecoder::apply_sparse_checked(ByteSpan payload, std::span<const Segment> expected_segments, MutableByteSpan range,
                                          std::uint64_t held_state, const ChunkHashes& expect, std::vector<std::uint32_t>* changed,
                                          ChunkPatch* patch) {
  if (expect.scheme != ChunkHashScheme::kState || !expect.base || !expect.content)
    return Status::invalid_argument("a sparse apply needs the state hashes of the base and of the result");
  if (held_state != *expect.base) return base_mismatch();
  DC_ASSIGN_OR_RETURN(ParsedChunk pc, parse_chunk(payload));
  if (!is_delta_kind(pc.kind)) return Status::corruption("an anchor chunk where a delta chunk belongs");
  DC_RETURN_IF_ERROR(check_shape(pc, expected_segments, range.size()));
  std::vector<DecodedStreams> decoded;
  DC_RETURN_IF_ERROR(decode_sections(pc, range.data(), options_.scan_level, *s_, decoded, nullptr));
  // Written as they come, the state kept current; put back if the result fails its hash.
  const std::size_t changes = sparse_change_count(pc, decoded, s_->v2, s_->v3);
  const std::size_t words = SparseWriter::log_words_max(changes, range.size());
  if (s_->words.size() < words) s_->words.resize(words);
  SparseWriter w(range, changes, s_->words.data(), patch);
  write_sparse(pc, decoded, s_->v2, s_->v3, range.data(), w);
  if (w.finish(held_state) != *expect.content) {
    w.undo();
    return Status::corruption("reconstructed bytes fail their checksum");
  }
  if (changed) collect_changes(pc, decoded, s_->v2, s_->v3, *changed);
  return Status::ok();
}

Status ChunkDecoder::apply_patch(const ChunkPatch& patch, MutableByteSpan range, std::uint64_t held_state, std::uint64_t expect_state) {
  Status st = apply_patch_checked(patch, range, held_state, expect_state);
  trim();
  return st;
}

Status ChunkDecoder::apply_patch_checked(const ChunkPatch& patch, MutableByteSpan range, std::uint64_t held_state, std::uint64_t expect_state) {
  if (patch.at.size() != patch.values.size()) return Status::invalid_argument("a patch with more offsets than values");
  std::uint64_t end = 0;  // past the last byte written so far: offsets must ascend
  for (const std::uint32_t a : patch.at) {
    const std::uint64_t at = a & ~ChunkPatch::kOneByte, bytes = (a & ChunkPatch::kOneByte) ? 1 : 2;
    if (at < end || at + bytes > range.size()) return Status::invalid_argument("patch offsets out of order or outside the range");
    end = at + bytes;
  }
  const std::size_t words = SparseWriter::log_words_max(patch.size(), range.size());
  if (s_->words.size() < words) s_->words.resize(words);
  SparseWriter w(range, patch.size(), s_->words.data(), nullptr);
  std::uint8_t* const p = range.data();
  for (std::size_t k = 0; k < patch.size(); ++k) {
    if (k + kPrefetchChanges < patch.size()) __builtin_prefetch(p + (patch.at[k + kPrefetchChanges] & ~ChunkPatch::kOneByte), 1);
    const std::uint32_t at = patch.at[k] & ~ChunkPatch::kOneByte;
    if (patch.at[k] & ChunkPatch::kOneByte) w.put(at, 1, patch.values[k] & 0xff);
    else w.put(at, 2, patch.values[k]);
  }
  if (w.finish(held_state) != expect_state) {
    w.undo();
    return Status::corruption("reconstructed bytes fail their checksum");
  }
  return Status::ok();
}

Result<ChunkStats> ChunkDecoder::describe(ByteSpan payload, ChunkKind* kind) {
  auto st = describe_checked(payload, kind);
  trim();
  return st;
}

Result<ChunkStats> ChunkDecoder::describe_checked(ByteSpan payload, ChunkKind* kind) {
  DC_ASSIGN_OR_RETURN(ParsedChunk pc, parse_chunk(payload));
  if (kind) *kind = pc.kind;
  ChunkStats st;
  st.v1_chunks = pc.kind == ChunkKind::kDeltaV1;
  st.v2_chunks = pc.kind == ChunkKind::kDeltaV2;
  st.v3_chunks = pc.kind == ChunkKind::kDeltaV3;
  for (const auto& sec : pc.sections) {
    if (sec.v3) {
      // Its streams are reported whole: which context a value went to depends on the base.
      const bf16v3::Section& b = sec.b3;
      const std::pair<std::string_view, const StreamRef*> named[] = {{"blocks", &b.blocks_stream}, {"first", &b.first_stream},
                                                                     {"next", &b.next_stream}, {"exceptions", &b.exceptions_stream}};
      if (b.changes)
        for (const auto& [name, ref] : named) st.streams.push_back({name, StreamReport{ref->choice, ref->raw_bytes, ref->body.size()}});
      if (b.changes)
        for (const StreamRef& ref : b.value_streams) st.streams.push_back({"values", StreamReport{ref.choice, ref.raw_bytes, ref.body.size()}});
      st.bf16_values += sec.seg.bytes / 2;
      st.changed_values += sec.change_count;
      st.exceptions += sec.exception_count;
      st.small_deltas += sec.change_count - sec.exception_count;
      continue;
    }
    if (sec.v2) {
      // The classes of its values come from the base, which a description does not have:
      // counts come from the header, and +-1 steps are not counted.
      st.streams.push_back({"changes", StreamReport{{Backend::kRaw, 0}, sec.seg.bytes, sec.bf16.coded.size()}, "range-coded"});
      st.streams.push_back({"remainders", StreamReport{{Backend::kRaw, 0}, sec.bf16.remainders.size(), sec.bf16.remainders.size()}, "bits"});
    }
    if (sec.anchor_v2) st.streams.push_back({"symbols", StreamReport{{Backend::kRaw, 0}, sec.seg.bytes, sec.a2.coded_bytes}, "huffman"});
    for (int k = 0; k < sec.stream_count; ++k) {
      st.streams.push_back({sec.names[k], StreamReport{sec.streams[k].choice, sec.streams[k].raw_bytes, sec.streams[k].body.size()}});
    }
    if (sec.seg.cls == SegmentClass::kBF16) {
      st.bf16_values += sec.seg.bytes / 2;
    } else {
      st.generic_bytes += sec.seg.bytes;
    }
    if (sec.v2) {
      st.changed_values += sec.change_count;
      st.exceptions += sec.exception_count;
      st.small_deltas += sec.change_count - sec.exception_count;
      continue;
    }
    if (!is_delta_kind(pc.kind)) continue;
    if (s_->sections.empty()) s_->sections.resize(1);
    if (s_->positions.empty()) s_->positions.resize(1);
    DecodedStreams d;
    DC_RETURN_IF_ERROR(decode_streams(sec, s_->streams, s_->sections[0], d));
    if (sec.seg.cls == SegmentClass::kBF16) {
      DC_RETURN_IF_ERROR(validate_bf16_delta(sec, d, s_->positions[0]));
      st.changed_values += sec.change_count;
      st.exceptions += sec.exception_count;
      st.small_deltas += sec.change_count - sec.exception_count;
      for (auto z : d.s[1]) st.unit_deltas += (z == 1 || z == 2);
    } else {
      for (auto b : d.s[0]) st.generic_changed_bytes += b != 0;
    }
  }
  return st;
}

Result<ChunkKind> chunk_kind(ByteSpan payload) {
  if (payload.empty()) return Status::corruption("empty chunk payload");
  return static_cast<ChunkKind>(payload[0]);
}

}  // namespace deltacast
