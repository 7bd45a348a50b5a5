// deltacast bench: sizes and single-core throughputs of deltacast (codec v2, and v1 alone) against
// the baselines and the conditioned entropy, all measured on the same data in the same run.
#include <spdlog/spdlog.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "commands.h"
#include "deltacast/common/units.h"
#include "deltacast/synth/gen.h"
#include "deltacast/codec/entropy.h"
#include "deltacast/codec/version.h"
#include "deltacast/common/stats.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/mapped_file.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/embed/publisher.h"
#include "deltacast/embed/worker.h"
#include "bench_series.h"
#include "file_codec.h"
#include "progress.h"
#include "svg.h"

namespace deltacast::tools {
namespace {

struct BenchOptions : SeriesOptions {
  std::size_t runs = 5;
  std::string chunk_size = "4MiB";
  bool anchor = true;
  bool end_to_end = false;
  std::string svg_path;
};

struct MethodResult {
  std::string name;
  std::uint64_t bytes = 0;          // summed over pairs
  std::vector<double> encode_gbps;  // one per run and pair
  std::vector<double> decode_gbps;
  std::vector<double> sparse_ms;    // a worker's apply in place, sparse, ms per version (deltacast only)
  bool has_timing = true;
};

void add_rates(std::vector<double>& out, const std::vector<double>& secs, std::uint64_t bytes) {
  for (double s : secs) out.push_back(static_cast<double>(bytes) / s / 1e9);
}

struct ZstdCtx {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~ZstdCtx() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

std::size_t zstd_compress(ZstdCtx& z, ByteSpan in, Bytes& out, int level) {
  out.resize(ZSTD_compressBound(in.size()));
  std::size_t n = ZSTD_compressCCtx(z.c, out.data(), out.size(), in.data(), in.size(), level);
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out.size();
}

bool zstd_decompress(ZstdCtx& z, ByteSpan in, MutableByteSpan out) {
  std::size_t n = ZSTD_decompressDCtx(z.d, out.data(), out.size(), in.data(), in.size());
  return !ZSTD_isError(n) && n == out.size();
}

// One zstd frame of `in` at `level`, compressed on `workers` threads (empty on failure).
Bytes zstd_compress_mt(ByteSpan in, int level, int workers) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(c, ZSTD_c_nbWorkers, workers);
  Bytes out(ZSTD_compressBound(in.size()));
  std::size_t n = ZSTD_compress2(c, out.data(), out.size(), in.data(), in.size());
  ZSTD_freeCCtx(c);
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out;
}

// One bench invocation: deltacast and its baselines over the same series, every method timed
// the same way, then the tables, the targets and the plot.
class Bench {
 public:
  Bench(const BenchOptions& o, Series& s, std::uint64_t chunk_bytes)
      : o_(o), s_(s), image_(s.layout.image_size), pairs_(s.images.size() - 1), out_(image_), scratch_(image_) {
    vopt_.chunk_bytes = chunk_bytes;
    v1_only_ = vopt_;
    v1_only_.chunk.delta_kinds = {ChunkKind::kDeltaV1};
    v3_ = vopt_;
    v3_.chunk.delta_kinds = {ChunkKind::kDeltaV3};
    vopt_.chunk.delta_kinds = {ChunkKind::kDeltaV1, ChunkKind::kDeltaV2};
    iv_.has_timing = false;
  }

  Status run() {
    ProgressBar bar("bench", pairs_, !o_.quiet);
    for (std::size_t p = 0; p < pairs_; ++p) {
      const ByteSpan base = s_.images[p], next = s_.images[p + 1];
      for (MethodResult* m : {&dc_, &dc1_, &dc3_}) DC_RETURN_IF_ERROR(measure_deltacast(p, base, next, *m));
      DC_ASSIGN_OR_RETURN(DeltaEntropy h, measure_delta_entropy(s_.layout.tensors, base, next));
      entropy_bytes_ += h.bytes(h.exponent);
      DC_RETURN_IF_ERROR(measure_xor_zstd(base, next));
      DC_RETURN_IF_ERROR(measure_index_value(base, next));
      bar.update(p + 1);
    }
    bar.finish();
    DC_RETURN_IF_ERROR(measure_parallel());
    print_delta_table();
    std::vector<BarPanel> panels = delta_panels();
    if (o_.anchor) DC_RETURN_IF_ERROR(measure_anchor(panels));
    if (!o_.svg_path.empty()) {
      const std::string svg = render_bar_panels("deltacast bench: " + s_.description, panels);
      DC_RETURN_IF_ERROR(write_file_atomic(o_.svg_path, std::string_view(svg)));
      std::printf("\nplot written to %s\n", o_.svg_path.c_str());
    }
    return Status::ok();
  }

 private:
  // deltacast with v1 or v2 per chunk (m = dc_), v1 chunks only (dc1_) or v3 (dc3_).
  Status measure_deltacast(std::size_t p, ByteSpan base, ByteSpan next, MethodResult& m) {
    const VersionEncodeOptions& opt = &m == &dc_ ? vopt_ : &m == &dc1_ ? v1_only_ : v3_;
    std::optional<EncodedVersion> ev;
    auto enc = time_runs(o_.runs, [&] {
      auto r = encode_version(s_.layout, p + 1, p, base, next, opt, one_core_, &encoders_);
      if (r.is_ok()) ev = std::move(r).value();
    });
    if (!ev) return Status::corruption("deltacast encode failed");
    std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
    Status dst;
    auto dec = time_runs(o_.runs, [&] { dst = decode_version(ev->manifest, payloads, base, out_, one_core_, {}, &decoders_); });
    if (!dst.is_ok()) return Status::corruption("deltacast decode failed: " + dst.to_string());
    if (std::memcmp(out_.data(), next.data(), image_) != 0) return Status::corruption("deltacast round trip is not bit-exact");
    // As a worker applies it: in place over the base, chunk by chunk, sparsely from the chunks'
    // state hashes, on one core (the base copied in untimed before each run).
    for (std::size_t r = 0; r < o_.runs; ++r) {
      std::memcpy(out_.data(), base.data(), image_);
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < ev->manifest.chunks.size() && dst.is_ok(); ++i) {
        const ChunkEntry& c = ev->manifest.chunks[i];
        const auto decoder = decoders_.acquire();
        dst = apply_chunk_sparse(ev->manifest, i, payloads[i], MutableByteSpan(out_).subspan(c.offset, c.length), c.base_hash, *decoder);
      }
      m.sparse_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!dst.is_ok()) return Status::corruption("deltacast sparse apply failed: " + dst.to_string());
    if (std::memcmp(out_.data(), next.data(), image_) != 0) return Status::corruption("deltacast sparse apply is not bit-exact");
    m.bytes += container_prefix(ev->manifest).size() + ev->manifest.payload_bytes_total();
    add_rates(m.encode_gbps, enc, image_);
    add_rates(m.decode_gbps, dec, image_);
    if (&m == &dc_) {
      changed_total_ += ev->stats.changed_values;
      bf16_total_ += ev->stats.bf16_values;
      v2_chunks_ += ev->stats.v2_chunks;
      chunks_ += ev->manifest.chunks.size();
    }
    return Status::ok();
  }

  // XOR + zstd -3 over the whole image.
  Status measure_xor_zstd(ByteSpan base, ByteSpan next) {
    Bytes xz_out;
    auto enc = time_runs(o_.runs, [&] {
      for (std::size_t i = 0; i < image_; ++i) scratch_[i] = base[i] ^ next[i];
      zstd_compress(z_, scratch_, xz_out, 3);
    });
    bool ok = true;
    auto dec = time_runs(o_.runs, [&] {
      ok = zstd_decompress(z_, xz_out, scratch_);
      for (std::size_t i = 0; i < image_; ++i) out_[i] = base[i] ^ scratch_[i];
    });
    if (!ok || std::memcmp(out_.data(), next.data(), image_) != 0) return Status::corruption("XOR+zstd round trip failed");
    xz_.bytes += xz_out.size();
    add_rates(xz_.encode_gbps, enc, image_);
    add_rates(xz_.decode_gbps, dec, image_);
    return Status::ok();
  }

  // int32 indices of changed BF16 elements, then their new values; raw and zstd -3.
  Status measure_index_value(ByteSpan base, ByteSpan next) {
    const auto* a = reinterpret_cast<const std::uint16_t*>(base.data());
    const auto* b = reinterpret_cast<const std::uint16_t*>(next.data());
    const std::size_t elems = image_ / 2;
    Bytes packed, iv_out, unpacked;
    auto enc = time_runs(o_.runs, [&] {
      std::vector<std::uint32_t> idx;
      std::vector<std::uint16_t> val;
      for (std::size_t i = 0; i < elems; ++i)
        if (a[i] != b[i]) {
          idx.push_back(static_cast<std::uint32_t>(i));
          val.push_back(b[i]);
        }
      packed.resize(idx.size() * 6);
      std::memcpy(packed.data(), idx.data(), idx.size() * 4);
      std::memcpy(packed.data() + idx.size() * 4, val.data(), val.size() * 2);
      zstd_compress(z_, packed, iv_out, 3);
    });
    bool ok = true;
    auto dec = time_runs(o_.runs, [&] {
      unpacked.resize(packed.size());
      ok = zstd_decompress(z_, iv_out, unpacked);
      std::memcpy(out_.data(), base.data(), image_);
      const std::size_t k = unpacked.size() / 6;
      auto* o16 = reinterpret_cast<std::uint16_t*>(out_.data());
      for (std::size_t j = 0; j < k; ++j) {
        std::uint32_t i;
        std::uint16_t v;
        std::memcpy(&i, unpacked.data() + 4 * j, 4);
        std::memcpy(&v, unpacked.data() + 4 * k + 2 * j, 2);
        if (i < elems) o16[i] = v;
      }
    });
    if (!ok || std::memcmp(out_.data(), next.data(), image_) != 0) return Status::corruption("index+value round trip failed");
    iv_.bytes += packed.size();
    ivz_.bytes += iv_out.size();
    add_rates(ivz_.encode_gbps, enc, image_);
    add_rates(ivz_.decode_gbps, dec, image_);
    return Status::ok();
  }

  // The same first delta on every core, through the executor (as configured, and v1 alone).
  Status measure_parallel() {
    for (int k = 0; k < 2; ++k) {
      std::optional<EncodedVersion> ev;
      auto enc = time_runs(o_.runs, [&] {
        auto r = encode_version(s_.layout, 1, 0, s_.images[0], s_.images[1], k == 0 ? vopt_ : v1_only_, pool_, &encoders_);
        if (r.is_ok()) ev = std::move(r).value();
      });
      if (!ev) return Status::corruption("deltacast encode failed");
      std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
      Status dst;
      auto dec = time_runs(o_.runs, [&] { dst = decode_version(ev->manifest, payloads, s_.images[0], out_, pool_, {}, &decoders_); });
      if (!dst.is_ok() || std::memcmp(out_.data(), s_.images[1].data(), image_) != 0) return Status::corruption("parallel round trip failed");
      add_rates(mt_enc_[k], enc, image_);
      add_rates(mt_dec_[k], dec, image_);
    }
    return Status::ok();
  }

  void print_delta_table() const {
    const double bf16_bytes = static_cast<double>(image_) * static_cast<double>(pairs_);
    std::printf("series: %s\n", s_.description.c_str());
    std::printf("%zu deltas of %s, %.3f%% of BF16 values changed; %zu runs each, one core, chunk %s; throughput in GB/s of BF16 input, medians\n\n",
                pairs_, format_bytes(static_cast<double>(image_)).c_str(),
                bf16_total_ ? 100.0 * static_cast<double>(changed_total_) / static_cast<double>(bf16_total_) : 0.0, o_.runs, o_.chunk_size.c_str());
    std::printf("| %-42s | %12s | %13s | %11s | %11s | %14s | %8s |\n", "delta method", "size % BF16", "vs XOR+zstd-3", "encode GB/s",
                "decode GB/s", "sparse ms/vers", "vs v1");
    std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(44, '-').c_str(), std::string(14, '-').c_str(), std::string(15, '-').c_str(),
                std::string(13, '-').c_str(), std::string(13, '-').c_str(), std::string(16, '-').c_str(), std::string(10, '-').c_str());
    const double v1_sparse = median(dc1_.sparse_ms);
    for (const MethodResult* m : {&dc_, &dc1_, &dc3_, &xz_, &iv_, &ivz_}) {
      char enc[32] = "-", dec[32] = "-", sparse[32] = "-", ratio[32] = "-";
      if (m->has_timing) {
        std::snprintf(enc, sizeof enc, "%.2f", median(m->encode_gbps));
        std::snprintf(dec, sizeof dec, "%.2f", median(m->decode_gbps));
      }
      if (!m->sparse_ms.empty()) {
        std::snprintf(sparse, sizeof sparse, "%.1f", median(m->sparse_ms));
        std::snprintf(ratio, sizeof ratio, "%.2fx", median(m->sparse_ms) / v1_sparse);
      }
      std::printf("| %-42s | %11.4f%% | %12.3fx | %11s | %11s | %14s | %8s |\n", m->name.c_str(), 100.0 * static_cast<double>(m->bytes) / bf16_bytes,
                  static_cast<double>(m->bytes) / static_cast<double>(xz_.bytes), enc, dec, sparse, ratio);
    }
    std::printf("| %-42s | %11.4f%% | %12.3fx | %11s | %11s | %14s | %8s |\n", "entropy given the base exponent", 100.0 * entropy_bytes_ / bf16_bytes,
                entropy_bytes_ / static_cast<double>(xz_.bytes), "-", "-", "-", "-");
    std::printf("\nsparse: a worker's apply in place, chunk by chunk from their state hashes, on one core, ms per version (median "
                "over runs and deltas); vs v1: against v1 only, in the same run\n");
    std::printf("\ndeltacast: %" PRIu64 " of %" PRIu64 " chunks coded v2; on %zu threads: encode %.2f GB/s, decode+apply %.2f GB/s "
                "(v1 only: %.2f, %.2f)\n",
                v2_chunks_, chunks_, pool_.concurrency(), median(mt_enc_[0]), median(mt_dec_[0]), median(mt_enc_[1]), median(mt_dec_[1]));
    const double size_ratio = static_cast<double>(dc_.bytes) / static_cast<double>(xz_.bytes);
    const double to_entropy = static_cast<double>(dc_.bytes) / entropy_bytes_;
    const double dc_enc = median(dc_.encode_gbps), dc_dec = median(dc_.decode_gbps);
    std::printf("\ntargets: size <= 0.33x XOR+zstd-3: %.3fx %s; within 10%% of the conditioned entropy: %.3fx %s; encode >= 1 GB/s: %.2f %s; "
                "decode+apply >= 1.5 GB/s: %.2f %s\n",
                size_ratio, size_ratio <= 0.33 ? "met" : "MISSED", to_entropy, to_entropy <= 1.1 ? "met" : "MISSED", dc_enc,
                dc_enc >= 1 ? "met" : "MISSED", dc_dec, dc_dec >= 1.5 ? "met" : "MISSED");
  }

  std::vector<BarPanel> delta_panels() const {
    const double bf16_bytes = static_cast<double>(image_) * static_cast<double>(pairs_);
    BarPanel size_panel{"delta size, % of the BF16 checkpoint (smaller is better)", {}, {{"size", {}}}, "%.3f%%"};
    BarPanel speed_panel{"delta throughput, GB/s of BF16 input on one core (larger is better)", {}, {{"encode", {}}, {"decode + apply", {}}}, "%.2f"};
    for (const MethodResult* m : {&dc_, &dc1_, &dc3_, &xz_, &iv_, &ivz_}) {
      size_panel.categories.push_back(m->name);
      size_panel.series[0].values.push_back(100.0 * static_cast<double>(m->bytes) / bf16_bytes);
      if (!m->has_timing) continue;
      speed_panel.categories.push_back(m->name);
      speed_panel.series[0].values.push_back(median(m->encode_gbps));
      speed_panel.series[1].values.push_back(median(m->decode_gbps));
    }
    return {std::move(size_panel), std::move(speed_panel)};
  }

  // An anchor of the last checkpoint, as deltacast writes it (v2) and as it did before (v1),
  // against zstd -19 and -3 of the raw BF16, every decode on one core in the same run.
  Status measure_anchor(std::vector<BarPanel>& panels) {
    ByteSpan last = s_.images.back();
    struct Row {
      std::string name;
      std::uint64_t bytes = 0;
      std::vector<double> encode, decode;  // GB/s per run; encode empty: not timed
    };
    std::vector<Row> rows;
    for (ChunkKind kind : {ChunkKind::kAnchorV2, ChunkKind::kAnchorV1}) {
      VersionEncodeOptions opt = vopt_;
      opt.chunk.anchor_kinds = {kind};
      std::optional<EncodedVersion> av;
      auto enc = time_runs(o_.runs, [&] {
        auto r = encode_version(s_.layout, pairs_, 0, ByteSpan(), last, opt, one_core_, &encoders_);
        if (r.is_ok()) av = std::move(r).value();
      });
      if (!av) return Status::corruption("anchor encode failed");
      std::vector<ByteSpan> payloads(av->payloads.begin(), av->payloads.end());
      Status dst;
      auto dec = time_runs(o_.runs, [&] { dst = decode_version(av->manifest, payloads, ByteSpan(), out_, one_core_, {}, &decoders_); });
      if (!dst.is_ok() || std::memcmp(out_.data(), last.data(), image_) != 0) return Status::corruption("anchor round trip failed");
      Row row{kind == ChunkKind::kAnchorV2 ? "deltacast anchor (v2)" : "deltacast anchor v1 (before)",
              container_prefix(av->manifest).size() + av->manifest.payload_bytes_total()};
      add_rates(row.encode, enc, image_);
      add_rates(row.decode, dec, image_);
      rows.push_back(std::move(row));
    }
    std::fprintf(stderr, "measuring zstd -19 of the raw checkpoint (slow)...\n");
    for (int level : {19, 3}) {
      Row row{"zstd -" + std::to_string(level) + ", raw BF16"};
      Bytes z;
      if (level == 19) {
        z = zstd_compress_mt(last, 19, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));  // size only: hours on one core
      } else {
        add_rates(row.encode, time_runs(o_.runs, [&] { zstd_compress(z_, last, z, level); }), image_);
      }
      if (z.empty()) return Status::io_error("zstd -" + std::to_string(level) + " failed");
      row.bytes = z.size();
      bool ok = true;
      add_rates(row.decode, time_runs(o_.runs, [&] { ok &= zstd_decompress(z_, z, out_); }), image_);
      if (!ok || std::memcmp(out_.data(), last.data(), image_) != 0) return Status::corruption("zstd round trip failed");
      rows.push_back(std::move(row));
    }
    const double image = static_cast<double>(image_), z19 = static_cast<double>(rows[2].bytes);
    auto rate = [](const std::vector<double>& v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.2f", v.empty() ? 0.0 : median(v));
      return v.empty() ? std::string("(size only)") : std::string(b);
    };
    std::printf("\n| %-42s | %12s | %13s | %11s | %11s |\n", "anchor method", "size % BF16", "vs zstd-19", "encode GB/s", "decode GB/s");
    std::printf("|%s|%s|%s|%s|%s|\n", std::string(44, '-').c_str(), std::string(14, '-').c_str(), std::string(15, '-').c_str(),
                std::string(13, '-').c_str(), std::string(13, '-').c_str());
    BarPanel size_panel{"anchor size, % of the BF16 checkpoint (smaller is better)", {}, {{"size", {}}}, "%.2f%%"};
    BarPanel speed_panel{"anchor throughput, GB/s of BF16 on one core (larger is better)", {}, {{"encode", {}}, {"decode", {}}}, "%.2f"};
    for (const Row& r : rows) {
      std::printf("| %-42s | %11.3f%% | %12.3fx | %11s | %11s |\n", r.name.c_str(), 100.0 * static_cast<double>(r.bytes) / image,
                  static_cast<double>(r.bytes) / z19, rate(r.encode).c_str(), rate(r.decode).c_str());
      size_panel.categories.push_back(r.name);
      size_panel.series[0].values.push_back(100.0 * static_cast<double>(r.bytes) / image);
      speed_panel.categories.push_back(r.name);
      speed_panel.series[0].values.push_back(r.encode.empty() ? 0.0 : median(r.encode));
      speed_panel.series[1].values.push_back(median(r.decode));
    }
    panels.push_back(std::move(size_panel));
    panels.push_back(std::move(speed_panel));
    const Row& a = rows[0];
    const double ratio = static_cast<double>(a.bytes) / z19, enc = median(a.encode), dec = median(a.decode);
    std::printf("\nvs zstd -3 in this run: encode %.2fx, decode %.2fx; vs anchor v1: %.4fx the size, encode %.2fx, decode %.2fx\n",
                enc / median(rows[3].encode), dec / median(rows[3].decode), static_cast<double>(a.bytes) / static_cast<double>(rows[1].bytes),
                enc / median(rows[1].encode), dec / median(rows[1].decode));
    std::printf("targets: anchor >= 10%% smaller than zstd-19: %.1f%% smaller %s; encode >= 1 GB/s: %.2f %s; decode >= 2 GB/s: %.2f %s\n",
                100.0 * (1 - ratio), ratio <= 0.9 ? "met" : "MISSED", enc, enc >= 1 ? "met" : "MISSED", dec, dec >= 2 ? "met" : "MISSED");
    return Status::ok();
  }

  const BenchOptions& o_;
  Series& s_;
  const std::uint64_t image_;
  const std::size_t pairs_;
  InlineExecutor one_core_;
  ThreadPool pool_;
  // Kept across runs and methods, as a publisher and a worker keep theirs.
  ChunkEncoderPool encoders_;
  ChunkDecoderPool decoders_;
  VersionEncodeOptions vopt_, v1_only_, v3_;
  ZstdCtx z_;
  Bytes out_, scratch_;
  MethodResult dc_{"deltacast (v1 or v2 per chunk)"}, dc1_{"deltacast v1 only"}, dc3_{"deltacast v3 (`--codec v3`)"}, xz_{"XOR + zstd-3 (ARCv2 style)"},
      iv_{"int32 idx + bf16 values, raw (TRL draft)"}, ivz_{"int32 idx + bf16 values, zstd-3"};
  std::uint64_t changed_total_ = 0, bf16_total_ = 0, v2_chunks_ = 0, chunks_ = 0;
  double entropy_bytes_ = 0;  // conditioned on the base exponent (inspect --entropy, (b))
  std::vector<double> mt_enc_[2], mt_dec_[2];
};

// The file I/O a decode from files cannot avoid, through the page cache: the base file mapped
// and each of its pages read, and as many bytes as the image written to a new file with
// pwrite, then fsync'd, as OutputFile's kWrites access does. No decoding.
Status io_alone(const std::string& base_path, std::uint64_t image, const std::string& out_path) {
  DC_ASSIGN_OR_RETURN(MappedFile base, MappedFile::open(base_path));
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < base.bytes().size(); i += 4096) sum += base.bytes()[i];
  DC_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(out_path, image, OutputFile::Access::kWrites));
  Bytes block(4u << 20, static_cast<std::uint8_t>(sum));
  for (std::uint64_t at = 0; at < image; at += block.size())
    DC_RETURN_IF_ERROR(out.write_at(at, ByteSpan(block).first(std::min<std::uint64_t>(block.size(), image - at))));
  return out.commit();
}

// The file I/O a worker that saves its versions cannot avoid: `runs` images written whole from
// memory to new files, as VersionStore::save writes them (past the page cache, fsync, rename),
// each run removing the file written two runs before (the worker keeps 2). CPU seconds per run.
Result<std::vector<double>> save_io_alone(std::size_t runs, ByteSpan image, const std::string& dir) {
  std::vector<double> secs;
  auto path = [&](std::size_t r) { return dir + "/save-io-" + std::to_string(r); };
  for (std::size_t r = 0; r < runs; ++r) {
    const double t0 = process_cpu_s();
    const ByteSpan parts[] = {image};
    DC_RETURN_IF_ERROR(write_parts_atomic(path(r), parts, /*uncached=*/true));
    if (r >= 2) std::filesystem::remove(path(r - 2));
    secs.push_back(process_cpu_s() - t0);
  }
  for (std::size_t r = 0; r < runs; ++r) std::filesystem::remove(path(r));
  return secs;
}

// What a version costs from a trainer's file to a worker's: the series published from its
// files by a Publisher and received by a Worker that saves each version to an --out-dir, in
// this process over loopback TCP, as `deltacast publish` and `deltacast worker --out-dir` run
// them (encoding on one thread). Each timed version runs from opening its checkpoint until the
// worker's file of it is saved; the whole process's CPU time, every thread. Per run a new
// publisher and worker: the anchor and the first delta untimed (a double-buffered worker's spare
// image copies the whole image for it), every later delta timed. Each saved file is compared
// with its checkpoint.
Result<std::vector<double>> publish_to_worker_runs(const BenchOptions& o, const Series& s, std::uint64_t chunk_bytes,
                                                   const std::vector<std::string>& files, const std::string& dir, bool in_place) {
  // Their warnings (unsigned versions, no trust key) are the same every run: not shown.
  const spdlog::level::level_enum level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);
  struct Restore {
    spdlog::level::level_enum level;
    ~Restore() { spdlog::set_level(level); }
  } restore{level};
  std::vector<double> secs;
  for (std::size_t r = 0; r < o.runs; ++r) {
    embed::PublisherOptions po;
    po.node.node_id = "origin";
    po.host.bind_endpoint = "tcp://127.0.0.1:*";
    po.encode.chunk_bytes = chunk_bytes;
    po.threads = 1;
    DC_ASSIGN_OR_RETURN(auto pub, embed::Publisher::start(po));
    embed::WorkerOptions wo;
    wo.node.node_id = "worker";
    wo.node.parents = {pub->host().bound_endpoint()};
    wo.node.in_place = in_place;
    wo.out_dir = dir + "/worker";
    wo.resume = false;
    DC_ASSIGN_OR_RETURN(auto worker, embed::Worker::start(std::move(wo)));
    const runtime::VersionStore store = transport::directory_version_store(dir + "/worker", "worker");
    for (std::size_t p = 0; p < files.size(); ++p) {
      const double t0 = process_cpu_s();
      DC_ASSIGN_OR_RETURN(embed::Checkpoint next, embed::open_checkpoint(files[p]));
      DC_ASSIGN_OR_RETURN(const std::uint64_t version, pub->publish(std::move(next)));
      // Saved: its JSON record, written last (version_store.h).
      const std::string record = std::filesystem::path(store.path_of(version)).replace_extension(".json").string();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (!std::filesystem::exists(record)) {
        if (std::chrono::steady_clock::now() > deadline) return Status::io_error("the worker did not save version " + std::to_string(version) + " within 120 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (p >= 2) secs.push_back(process_cpu_s() - t0);
      DC_ASSIGN_OR_RETURN(SafetensorsFile saved, SafetensorsFile::open(store.path_of(version)));
      if (saved.image().size() != s.images[p].size() || std::memcmp(saved.image().data(), s.images[p].data(), s.images[p].size()) != 0)
        return Status::corruption("the worker's file of version " + std::to_string(version) + " is not bit-exact");
    }
    DC_RETURN_IF_ERROR(worker->stop());
    pub->stop();
    std::filesystem::remove_all(dir + "/worker");
  }
  return secs;
}

// Files in, files out: encode_file and decode_file on one core, as `deltacast encode -j 1` and
// `deltacast decode -j 1` run them, against encode_version and decode_version in memory on the
// same pairs in the same run (the output a buffer written before), and against the file I/O
// alone (io_alone). Each file run writes a file that does not exist yet, as decoding version
// after version does: the previous run's output is removed first, untimed. All timed by the
// process's CPU time, user and system, as /usr/bin/time counts it.
Status run_end_to_end(const BenchOptions& o, const Series& s, std::uint64_t chunk_bytes) {
  DC_ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::create("deltacast-bench"));
  DC_ASSIGN_OR_RETURN(std::vector<std::string> files, series_files(s, dir.path()));
  const std::size_t pairs = s.images.size() - 1;
  const std::uint64_t image = s.layout.image_size;
  InlineExecutor one_core;
  ChunkEncoderPool encoders;  // kept across runs in memory, as a publisher keeps them
  ChunkDecoderPool decoders;
  VersionEncodeOptions opt;  // as deltacast encode without options
  opt.chunk_bytes = chunk_bytes;
  Bytes out(image);
  std::vector<double> mem_enc, mem_dec, file_enc, file_dec, io;  // CPU seconds per run and pair
  std::string written;  // the file a timed run writes
  auto cpu_runs = [&](std::vector<double>& into, auto&& fn) -> Status {
    for (std::size_t r = 0; r < o.runs; ++r) {
      if (!written.empty()) std::filesystem::remove(written);
      const double t0 = process_cpu_s();
      DC_RETURN_IF_ERROR(fn());
      into.push_back(process_cpu_s() - t0);
    }
    return Status::ok();
  };
  ProgressBar bar("end to end", pairs, !o.quiet);
  for (std::size_t p = 0; p < pairs; ++p) {
    const ByteSpan base = s.images[p], next = s.images[p + 1];
    std::optional<EncodedVersion> ev;
    DC_RETURN_IF_ERROR(cpu_runs(mem_enc, [&]() -> Status {
      DC_ASSIGN_OR_RETURN(ev, encode_version(s.layout, p + 1, p, base, next, opt, one_core, &encoders));
      return Status::ok();
    }));
    const std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
    DC_RETURN_IF_ERROR(cpu_runs(mem_dec, [&] { return decode_version(ev->manifest, payloads, base, out, one_core, {}, &decoders); }));
    if (std::memcmp(out.data(), next.data(), image) != 0) return Status::corruption("in-memory round trip is not bit-exact");
    FileEncodeRequest enc;
    enc.base_path = files[p];
    enc.next_path = files[p + 1];
    enc.out_path = dir.path() + "/delta.dcd";
    enc.options = opt;
    enc.base_version = p;
    written = enc.out_path;
    DC_RETURN_IF_ERROR(cpu_runs(file_enc, [&] { return encode_file(enc, one_core).status(); }));
    FileDecodeRequest dec;
    dec.base_path = files[p];
    dec.in_path = enc.out_path;
    dec.out_path = written = dir.path() + "/out.safetensors";
    DC_RETURN_IF_ERROR(cpu_runs(file_dec, [&] { return decode_file(dec, one_core).status(); }));
    const std::string io_path = written = dir.path() + "/io-alone";
    DC_RETURN_IF_ERROR(cpu_runs(io, [&] { return io_alone(files[p], image, io_path); }));
    written.clear();
    std::filesystem::remove(io_path);
    DC_ASSIGN_OR_RETURN(SafetensorsFile decoded_file, SafetensorsFile::open(dec.out_path));
    if (decoded_file.image().size() != image || std::memcmp(decoded_file.image().data(), next.data(), image) != 0)
      return Status::corruption("the decoded file is not bit-exact");
    bar.update(p + 1);
  }
  // Publish and worker --out-dir: the later deltas of the series (see publish_to_worker_runs).
  std::vector<double> double_buffered, in_place, save_io;
  if (pairs >= 2) {
    DC_ASSIGN_OR_RETURN(save_io, save_io_alone(o.runs, s.images.back(), dir.path()));
    DC_ASSIGN_OR_RETURN(double_buffered, publish_to_worker_runs(o, s, chunk_bytes, files, dir.path(), false));
    DC_ASSIGN_OR_RETURN(in_place, publish_to_worker_runs(o, s, chunk_bytes, files, dir.path(), true));
  }
  bar.finish();
  auto gbps = [&](const std::vector<double>& secs) { return static_cast<double>(image) / median(secs) / 1e9; };
  std::printf("end to end: %s, %zu pairs, %zu runs each; one core, CPU time (user + system) per version, median\n\n", s.description.c_str(),
              pairs, o.runs);
  std::printf("| path | in memory | files in, files out | files / in memory |\n|---|---|---|---|\n");
  bool met = true;
  for (const auto& [name, mem, file] : {std::tuple{"encode", &mem_enc, &file_enc}, std::tuple{"decode", &mem_dec, &file_dec}}) {
    const double ratio = median(*file) / median(*mem);
    met = met && ratio <= 1.5;
    std::printf("| %s | %.1f ms (%.2f GB/s) | %.1f ms (%.2f GB/s) | **%.2fx** |\n", name, 1e3 * median(*mem), gbps(*mem), 1e3 * median(*file),
                gbps(*file), ratio);
  }
  const double both = median(mem_enc) + median(mem_dec);
  for (const auto& [name, secs] : {std::pair{"publish -> worker --out-dir", &double_buffered}, std::pair{"publish -> worker --out-dir --in-place", &in_place}}) {
    if (secs->empty()) continue;
    const double ratio = median(*secs) / both;
    met = met && ratio <= 1.5;
    std::printf("| %s | %.1f ms (encode + decode) | %.1f ms | **%.2fx** |\n", name, 1e3 * both, 1e3 * median(*secs), ratio);
  }
  if (pairs < 2) std::printf("(publish -> worker --out-dir needs 2 steps or more: the first delta after the anchor is not timed)\n");
  if (!save_io.empty()) {
    const double saved = both + median(save_io);
    std::printf("\na worker's save alone (the image written from memory to a new file past the page cache, fsync'd, the one from "
                "two versions before removed): %.1f ms; encode + decode in memory plus that: %.1f ms; publish -> worker --out-dir / that: **%.2fx**, "
                "--in-place: **%.2fx**\n",
                1e3 * median(save_io), 1e3 * saved, median(double_buffered) / saved, median(in_place) / saved);
  }
  const double floor = median(mem_dec) + median(io);
  std::printf("\ndecode's file I/O alone (the base mapped and read, the image written to a new file with pwrite and fsync'd): %.1f ms; "
              "in memory plus that: %.1f ms, %.2fx in memory; decode from files / (in memory + I/O alone): **%.2fx**\n",
              1e3 * median(io), 1e3 * floor, floor / median(mem_dec), median(file_dec) / floor);
  std::printf("\ntarget: files within 1.5x of in memory, CPU per version: %s\n", met ? "met" : "MISSED");
  return Status::ok();
}

int run_bench(const BenchOptions& o) {
  auto series = load_series(o);
  if (!series.is_ok()) return fail(series.status().to_string());
  auto chunk = parse_bytes(o.chunk_size);
  if (!chunk.is_ok()) return fail(chunk.status().message());
  const Status st = o.end_to_end ? run_end_to_end(o, *series, *chunk) : Bench(o, *series, *chunk).run();
  return st.is_ok() ? 0 : fail(st.message());
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Compare deltacast with XOR+zstd and index+value baselines on a checkpoint series");
  sub->add_option("files", o->files, "Consecutive checkpoints (default: generate a series)")->check(CLI::ExistingFile);
  sub->add_option("--size", o->size, "Generated checkpoint size")->capture_default_str();
  sub->add_option("--steps", o->steps, "Generated steps")->capture_default_str();
  sub->add_option("--lr", o->train.lr, "Generated learning rate")->capture_default_str();
  sub->add_option("--seed", o->train.seed, "Generator seed")->capture_default_str();
  sub->add_option("--runs", o->runs, "Timed runs per measurement (median reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--chunk-size", o->chunk_size, "Chunk size")->capture_default_str();
  sub->add_flag("!--no-anchor", o->anchor, "Skip the anchor comparison");
  sub->add_flag("--end-to-end", o->end_to_end,
                "Instead: encode and decode from files to files on one core, as the encode and decode commands do, against in memory");
  sub->add_option("--svg", o->svg_path, "Also write the results as an SVG bar chart");
  sub->add_flag("-q,--quiet", o->quiet, "No progress bar");
  return {sub, [o] { return run_bench(*o); }};
}

}  // namespace deltacast::tools
