#include "deltacast/codec/backend.h"

#include <zstd.h>

#include <algorithm>
#include <memory>

#include "deltacast/codec/rans.h"

namespace deltacast {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

}  // namespace

struct StreamEncoder::State {
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx{ZSTD_createCCtx()};
  Bytes sample, trial, best;
  std::vector<std::uint16_t> rans;
};

struct StreamDecoder::State {
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx{ZSTD_createDCtx()};
};

namespace {

void encode_with(StreamEncoder::State& s, BackendChoice choice, ByteSpan raw, Bytes& out) {
  out.clear();
  switch (choice.backend) {
    case Backend::kRaw:
      out.assign(raw.begin(), raw.end());
      return;
    case Backend::kZstd: {
      out.resize(ZSTD_compressBound(raw.size()));
      std::size_t n = ZSTD_compressCCtx(s.cctx.get(), out.data(), out.size(), raw.data(), raw.size(), choice.level);
      if (ZSTD_isError(n)) {
        out.assign(raw.begin(), raw.end());  // cannot happen with a correct bound; raw still decodes
        return;
      }
      out.resize(n);
      return;
    }
    case Backend::kRans:
      rans::encode(raw, out, s.rans);
      return;
  }
}

}  // namespace

std::string backend_label(BackendChoice choice) {
  switch (choice.backend) {
    case Backend::kRaw: return "raw";
    case Backend::kZstd: return "zstd-" + std::to_string(choice.level);
    case Backend::kRans: return "rans";
  }
  return "backend-" + std::to_string(static_cast<int>(choice.backend));
}

namespace {

// Streams up to this size try every candidate in full. Larger ones (anchor streams, and the
// streams of a delta chunk whose values changed by more than about 1%) first try every
// candidate on a sample of evenly spaced slices, then encode in full only with those that came
// within kShortlistSlack of the best: at 6% changed, full trials of zstd took a third of a
// delta's encode time, and rANS wins almost every such stream.
constexpr std::size_t kFullTrialBytesMax = 16u << 10;
constexpr std::size_t kSampleSlices = 4;
// A slice is a 32nd of the stream, within these bounds.
constexpr std::size_t kSampleSliceBytesMin = 2u << 10;
constexpr std::size_t kSampleSliceBytesMax = 16u << 10;
constexpr double kShortlistSlack = 1.03;

std::vector<BackendChoice> shortlist(StreamEncoder::State& s, ByteSpan raw, const std::vector<BackendChoice>& candidates) {
  std::vector<BackendChoice> out;
  if (raw.size() <= kFullTrialBytesMax) {
    for (const auto& c : candidates)
      if (c.backend != Backend::kRaw) out.push_back(c);
    return out;
  }
  Bytes& sample = s.sample;
  Bytes& trial = s.trial;
  sample.clear();
  const std::size_t stride = raw.size() / kSampleSlices;
  const std::size_t slice = std::clamp(raw.size() / 32, kSampleSliceBytesMin, kSampleSliceBytesMax);  // under stride
  for (std::size_t k = 0; k < kSampleSlices; ++k) {
    const auto* p = raw.data() + k * stride;
    sample.insert(sample.end(), p, p + slice);
  }
  std::vector<std::pair<std::size_t, BackendChoice>> sized;
  std::size_t best = sample.size();  // raw
  for (const auto& c : candidates) {
    if (c.backend == Backend::kRaw) continue;
    encode_with(s, c, sample, trial);
    sized.emplace_back(trial.size(), c);
    best = std::min(best, trial.size());
  }
  // A candidate that did not beat raw on the sample is not worth a full run.
  for (const auto& [size, c] : sized)
    if (size < sample.size() && static_cast<double>(size) <= static_cast<double>(best) * kShortlistSlack) out.push_back(c);
  return out;
}

}  // namespace

StreamEncoder::StreamEncoder() : s_(std::make_unique<State>()) {}
StreamEncoder::~StreamEncoder() = default;
StreamEncoder::StreamEncoder(StreamEncoder&&) noexcept = default;
StreamEncoder& StreamEncoder::operator=(StreamEncoder&&) noexcept = default;

std::size_t StreamEncoder::scratch_bytes() const {
  return ZSTD_sizeof_CCtx(s_->cctx.get()) + s_->sample.capacity() + s_->trial.capacity() + s_->best.capacity() +
         s_->rans.capacity() * sizeof(std::uint16_t);
}

void StreamEncoder::release() {
  s_ = std::make_unique<State>();
}

StreamReport StreamEncoder::write(ByteSpan raw, const std::vector<BackendChoice>& candidates, Bytes& out) {
  Bytes& best = s_->best;
  Bytes& trial = s_->trial;
  BackendChoice best_choice{Backend::kRaw, 0};
  ByteSpan best_bytes = raw;
  if (!raw.empty()) {
    for (const auto& c : shortlist(*s_, raw, candidates)) {
      encode_with(*s_, c, raw, trial);
      if (trial.size() < best_bytes.size()) {
        best.swap(trial);
        best_bytes = best;
        best_choice = c;
      }
    }
  }
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(best_choice.backend));
  w.u8(static_cast<std::uint8_t>(best_choice.backend == Backend::kZstd ? best_choice.level : 0));
  w.varint(raw.size());
  w.varint(best_bytes.size());
  w.bytes(best_bytes);
  return StreamReport{best_choice, raw.size(), best_bytes.size()};
}

Result<StreamRef> read_stream(ByteReader& r, std::uint64_t raw_bytes_max) {
  std::uint8_t backend, level;
  std::uint64_t raw_len, enc_len;
  StreamRef ref;
  if (!r.u8(backend) || !r.u8(level) || !r.varint(raw_len) || !r.varint(enc_len)) {
    return Status::corruption("truncated stream header");
  }
  if (backend > static_cast<std::uint8_t>(Backend::kRans)) {
    return Status::corruption("unknown backend " + std::to_string(backend));
  }
  if (raw_len > raw_bytes_max) return Status::corruption("stream claims more bytes than its chunk can hold");
  if (!r.bytes(enc_len, ref.body)) return Status::corruption("truncated stream body");
  ref.choice = BackendChoice{static_cast<Backend>(backend), static_cast<int8_t>(level)};
  ref.raw_bytes = raw_len;
  if (ref.choice.backend == Backend::kRaw && enc_len != raw_len) {
    return Status::corruption("raw stream length mismatch");
  }
  return ref;
}

StreamDecoder::StreamDecoder() : s_(std::make_unique<State>()) {}
StreamDecoder::~StreamDecoder() = default;
StreamDecoder::StreamDecoder(StreamDecoder&&) noexcept = default;
StreamDecoder& StreamDecoder::operator=(StreamDecoder&&) noexcept = default;

std::size_t StreamDecoder::scratch_bytes() const { return ZSTD_sizeof_DCtx(s_->dctx.get()); }

Status StreamDecoder::decode(const StreamRef& ref, MutableByteSpan out) {
  if (out.size() != ref.raw_bytes) return Status::invalid_argument("decode_stream: output size mismatch");
  switch (ref.choice.backend) {
    case Backend::kRaw:
      if (!out.empty()) std::memcpy(out.data(), ref.body.data(), out.size());
      return Status::ok();
    case Backend::kZstd: {
      if (ZSTD_getFrameContentSize(ref.body.data(), ref.body.size()) != out.size()) {
        return Status::corruption("zstd frame size does not match the stream header");
      }
      std::size_t n = ZSTD_decompressDCtx(s_->dctx.get(), out.data(), out.size(), ref.body.data(), ref.body.size());
      if (ZSTD_isError(n)) return Status::corruption(std::string("zstd: ") + ZSTD_getErrorName(n));
      if (n != out.size()) return Status::corruption("zstd frame decodes to the wrong size");
      return Status::ok();
    }
    case Backend::kRans:
      return rans::decode(ref.body, out);
  }
  return Status::corruption("unknown backend");
}

}  // namespace deltacast
