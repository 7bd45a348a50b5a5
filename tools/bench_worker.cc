// deltacast bench-worker: a worker's CPU per version at several change densities, applying each
// delta only where it changes values (sparse, from the chunk states it holds) against decoding
// the whole image (dense), on one core, on the same deltas in the same run.
#include <time.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

#include "bench_series.h"
#include "commands.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/stats.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/common/units.h"
#include "deltacast/runtime/node_types.h"
#include "progress.h"
#include "svg.h"

namespace deltacast::tools {
namespace {

struct WorkerBenchOptions {
  SeriesOptions series;
  std::vector<double> lrs = {2.5e-7, 1e-6, 3.5e-6};
  std::size_t runs = 5;
  std::string chunk_size = "4MiB";
  std::string svg_path;
};

// CPU seconds of the calling thread.
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Runs fn `runs` times after prepare() each time (untimed); returns CPU milliseconds per run.
template <typename Prepare, typename F>
std::vector<double> cpu_runs(std::size_t runs, Prepare&& prepare, F&& fn) {
  std::vector<double> ms;
  for (std::size_t r = 0; r < runs; ++r) {
    prepare();
    const double t0 = thread_cpu_s();
    fn();
    ms.push_back((thread_cpu_s() - t0) * 1e3);
  }
  return ms;
}

// What one density measured, per version (medians over runs and deltas).
struct DensityResult {
  double lr = 0;
  double changed_fraction = 0;
  std::uint64_t changes_per_version = 0;
  std::vector<double> today_ms, dense_ms, dense_in_place_ms, sparse_ms, double_buffered_ms;
  // The floor under any sparse apply on this machine: the changes alone (see floor_of), and
  // the changes with the state hash kept current, which a checked apply cannot do without.
  std::vector<double> floor_ms, hashed_floor_ms;
  // Double-buffered as the worker applies a delta: a chunk whose payload is more than
  // NodeConfig::catch_up_dense_payload_per_mille of its range decoded whole from the live image,
  // the others caught up and applied sparsely; and how many chunks went whole.
  std::vector<double> worker_double_ms;
  std::uint64_t whole_chunks = 0, chunks = 0;
  // The same deltas with codec v2 tried on every chunk (publish --v2: the smaller of v1 and v2
  // per chunk): payload bytes summed over the deltas, and the sparse apply in place.
  std::uint64_t v1_bytes = 0, v2_bytes = 0, v3_bytes = 0;
  std::vector<double> v2_sparse_ms, v3_sparse_ms;  // and the same with codec v3 on every chunk
};

class WorkerBench {
 public:
  WorkerBench(const WorkerBenchOptions& o, std::uint64_t chunk_bytes) : o_(o) { vopt_.chunk_bytes = chunk_bytes; }

  Status run() {
    for (double lr : o_.lrs) {
      SeriesOptions so = o_.series;
      so.train.lr = lr;
      DC_ASSIGN_OR_RETURN(Series s, load_series(so));
      DC_ASSIGN_OR_RETURN(DensityResult r, measure(s, lr));
      results_.push_back(std::move(r));
      if (scrub_ms_.empty()) measure_scrub(s.images.back());
    }
    print();
    print_scrub();
    if (!o_.svg_path.empty()) {
      std::vector<BarPanel> panels(1);
      BarPanel& p = panels[0];
      p.title = "worker CPU per version, ms on one core";
      p.value_format = "%.1f";
      p.series = {{"before state hashes: whole image, xxh3", {}},
                  {"dense: whole image, state hashes", {}},
                  {"sparse in place", {}},
                  {"sparse double-buffered (catch-up + delta)", {}},
                  {"double-buffered as the worker applies it", {}},
                  {"floor: the changes alone, no decode, no checks", {}},
                  {"floor with the state hash kept current", {}}};
      for (const auto& r : results_) {
        char label[64];
        std::snprintf(label, sizeof label, "%.1f%% changed", 100 * r.changed_fraction);
        p.categories.push_back(label);
        p.series[0].values.push_back(median(r.today_ms));
        p.series[1].values.push_back(median(r.dense_ms));
        p.series[2].values.push_back(median(r.sparse_ms));
        p.series[3].values.push_back(r.double_buffered_ms.empty() ? 0 : median(r.double_buffered_ms));
        p.series[4].values.push_back(r.worker_double_ms.empty() ? 0 : median(r.worker_double_ms));
        p.series[5].values.push_back(median(r.floor_ms));
        p.series[6].values.push_back(median(r.hashed_floor_ms));
      }
      const std::string svg = render_bar_panels("deltacast bench-worker: " + description_, panels);
      DC_RETURN_IF_ERROR(write_file_atomic(o_.svg_path, std::string_view(svg)));
      std::printf("\nplot written to %s\n", o_.svg_path.c_str());
    }
    return Status::ok();
  }

 private:
  Result<DensityResult> measure(const Series& s, double lr) {
    const std::size_t image = s.layout.image_size, pairs = s.images.size() - 1;
    DensityResult r;
    r.lr = lr;
    Bytes out(image), work(image), evict(64u << 20);
    std::uint64_t changed = 0, values = 0;
    std::optional<EncodedVersion> prev;     // the delta before this one
    std::vector<ChunkPatch> prev_patches;  // and the values it wrote
    ProgressBar bar("bench lr " + std::to_string(lr), pairs, !o_.series.quiet);
    for (std::size_t p = 0; p < pairs; ++p) {
      const ByteSpan base = s.images[p], next = s.images[p + 1];
      DC_ASSIGN_OR_RETURN(EncodedVersion ev, encode_version(s.layout, p + 2, p + 1, base, next, vopt_, pool_, &encoders_));
      VersionEncodeOptions xxh3 = vopt_;
      xxh3.hash_scheme = ChunkHashScheme::kXxh3;
      DC_ASSIGN_OR_RETURN(EncodedVersion old, encode_version(s.layout, p + 2, p + 1, base, next, xxh3, pool_, &encoders_));
      changed += ev.stats.changed_values;
      values += ev.stats.bf16_values;
      const Manifest& m = ev.manifest;  // (ev moves to prev at the end: m and payloads stay valid meanwhile)
      std::vector<ByteSpan> payloads(ev.payloads.begin(), ev.payloads.end());
      // The image in memory, not in cache, as a worker finds it a version later.
      auto cold = [&](ByteSpan from, MutableByteSpan to) {
        if (!from.empty()) std::memcpy(to.data(), from.data(), image);
        std::memset(evict.data(), static_cast<int>(p), evict.size());
      };
      Status st;
      auto check = [&](ByteSpan got, const char* what) -> Status {
        if (!st.is_ok()) return Status::corruption(std::string(what) + ": " + st.to_string());
        if (std::memcmp(got.data(), next.data(), image) != 0) return Status::corruption(std::string(what) + " is not bit-exact");
        return Status::ok();
      };
      // The worker before state hashes (manifest format 1, xxh3 chunk hashes): every chunk
      // decoded into a second image, its payload, base and content hashed.
      const std::vector<ByteSpan> old_payloads(old.payloads.begin(), old.payloads.end());
      auto ms = cpu_runs(o_.runs, [&] { cold({}, out); }, [&] { st = decode_version(old.manifest, old_payloads, base, out, one_core_, {}, &decoders_); });
      DC_RETURN_IF_ERROR(check(out, "dense, format 1"));
      r.today_ms.insert(r.today_ms.end(), ms.begin(), ms.end());
      // The same with state hashes: a worker's first delta after an anchor or a restart.
      ms = cpu_runs(o_.runs, [&] { cold({}, out); }, [&] { st = decode_version(m, payloads, base, out, one_core_, {}, &decoders_); });
      DC_RETURN_IF_ERROR(check(out, "dense"));
      r.dense_ms.insert(r.dense_ms.end(), ms.begin(), ms.end());
      // The same in place: every base range hashed first, then decoded over.
      ms = cpu_runs(o_.runs, [&] { cold(base, work); }, [&] { st = decode_version(m, payloads, work, work, one_core_, {}, &decoders_); });
      DC_RETURN_IF_ERROR(check(work, "dense in place"));
      r.dense_in_place_ms.insert(r.dense_in_place_ms.end(), ms.begin(), ms.end());
      // Sparse in place, from the chunk states the worker holds (the delta's base hashes); with
      // `patches`, each chunk's patch is kept, as double-buffered workers do.
      std::vector<ChunkPatch> patches(m.chunks.size());
      auto sparse_of = [&](const Manifest& vm, std::span<const ByteSpan> vp, MutableByteSpan image, std::vector<ChunkPatch>* keep) {
        const auto decoder = decoders_.acquire();
        for (std::size_t i = 0; i < vm.chunks.size() && st.is_ok(); ++i) {
          const ChunkEntry& c = vm.chunks[i];
          st = apply_chunk_sparse(vm, i, vp[i], image.subspan(c.offset, c.length), c.base_hash, *decoder, nullptr,
                                  keep ? &(*keep)[i] : nullptr);
        }
      };
      auto sparse = [&](MutableByteSpan image, std::vector<ChunkPatch>* keep) { sparse_of(m, payloads, image, keep); };
      ms = cpu_runs(o_.runs, [&] { cold(base, work); }, [&] { sparse(work, nullptr); });
      DC_RETURN_IF_ERROR(check(work, "sparse in place"));
      r.sparse_ms.insert(r.sparse_ms.end(), ms.begin(), ms.end());
      ms = floor_of(base, next, [&] { cold(base, work); }, work, false);
      DC_RETURN_IF_ERROR(check(work, "the changes alone"));
      r.floor_ms.insert(r.floor_ms.end(), ms.begin(), ms.end());
      ms = floor_of(base, next, [&] { cold(base, work); }, work, true);
      DC_RETURN_IF_ERROR(check(work, "the changes alone, hashed"));
      r.hashed_floor_ms.insert(r.hashed_floor_ms.end(), ms.begin(), ms.end());
      // Codec v2 where it is smaller: fewer bytes, but its decoder reads every base value.
      VersionEncodeOptions v2 = vopt_;
      v2.chunk = ChunkEncodeOptions::smallest();
      DC_ASSIGN_OR_RETURN(EncodedVersion ev2, encode_version(s.layout, p + 2, p + 1, base, next, v2, pool_, &encoders_));
      const std::vector<ByteSpan> payloads2(ev2.payloads.begin(), ev2.payloads.end());
      r.v1_bytes += m.payload_bytes_total();
      r.v2_bytes += ev2.manifest.payload_bytes_total();
      ms = cpu_runs(o_.runs, [&] { cold(base, work); }, [&] { sparse_of(ev2.manifest, payloads2, work, nullptr); });
      DC_RETURN_IF_ERROR(check(work, "v2 sparse in place"));
      r.v2_sparse_ms.insert(r.v2_sparse_ms.end(), ms.begin(), ms.end());
      // Codec v3 on every chunk: its decoder reads base values only in blocks that change.
      VersionEncodeOptions v3 = vopt_;
      v3.chunk.delta_kinds = {ChunkKind::kDeltaV3};
      DC_ASSIGN_OR_RETURN(EncodedVersion ev3, encode_version(s.layout, p + 2, p + 1, base, next, v3, pool_, &encoders_));
      const std::vector<ByteSpan> payloads3(ev3.payloads.begin(), ev3.payloads.end());
      r.v3_bytes += ev3.manifest.payload_bytes_total();
      ms = cpu_runs(o_.runs, [&] { cold(base, work); }, [&] { sparse_of(ev3.manifest, payloads3, work, nullptr); });
      DC_RETURN_IF_ERROR(check(work, "v3 sparse in place"));
      r.v3_sparse_ms.insert(r.v3_sparse_ms.end(), ms.begin(), ms.end());
      // Double-buffered: the spare image holds the version before the base; each chunk catches
      // up by the previous delta's patch, then takes this one sparsely (and keeps its patch).
      if (prev) {
        const Manifest& pm = prev->manifest;
        ms = cpu_runs(o_.runs, [&] { cold(s.images[p - 1], work); }, [&] {
          const auto decoder = decoders_.acquire();
          for (std::size_t i = 0; i < m.chunks.size() && st.is_ok(); ++i) {
            const ChunkEntry& c = m.chunks[i];
            const MutableByteSpan range = MutableByteSpan(work).subspan(c.offset, c.length);
            st = decoder->apply_patch(prev_patches[i], range, pm.chunks[i].base_hash, pm.chunks[i].content_hash);
            if (st.is_ok()) st = apply_chunk_sparse(m, i, payloads[i], range, c.base_hash, *decoder, nullptr, &patches[i]);
          }
        });
        DC_RETURN_IF_ERROR(check(work, "sparse double-buffered"));
        r.double_buffered_ms.insert(r.double_buffered_ms.end(), ms.begin(), ms.end());
        const std::uint64_t per_mille = runtime::NodeConfig{}.catch_up_dense_payload_per_mille;
        auto whole = [&](const ChunkEntry& c) { return per_mille && c.payload_bytes * 1000 > c.length * per_mille; };
        std::vector<std::uint32_t> changed;
        ms = cpu_runs(o_.runs, [&] { cold(s.images[p - 1], work); }, [&] {
          const auto decoder = decoders_.acquire();
          for (std::size_t i = 0; i < m.chunks.size() && st.is_ok(); ++i) {
            const ChunkEntry& c = m.chunks[i];
            const MutableByteSpan range = MutableByteSpan(work).subspan(c.offset, c.length);
            if (whole(c)) {
              st = decode_chunk_verified(m, i, payloads[i], base.subspan(c.offset, c.length), range, *decoder, &changed);
              if (st.is_ok()) patches[i] = patch_of(segments_for_range(m.tensors, c.offset, c.length), changed, range);
              continue;
            }
            st = decoder->apply_patch(prev_patches[i], range, pm.chunks[i].base_hash, pm.chunks[i].content_hash);
            if (st.is_ok()) st = apply_chunk_sparse(m, i, payloads[i], range, c.base_hash, *decoder, nullptr, &patches[i]);
          }
        });
        DC_RETURN_IF_ERROR(check(work, "double-buffered as the worker applies it"));
        r.worker_double_ms.insert(r.worker_double_ms.end(), ms.begin(), ms.end());
        for (const ChunkEntry& c : m.chunks) r.whole_chunks += whole(c);
        r.chunks += m.chunks.size();
      } else {
        // The first delta: its patches, for the next one's catch-up (untimed).
        cold(base, work);
        sparse(work, &patches);
        DC_RETURN_IF_ERROR(check(work, "sparse with patches"));
      }
      prev = std::move(ev);
      prev_patches = std::move(patches);
      bar.update(p + 1);
    }
    bar.finish();
    r.changed_fraction = values ? static_cast<double>(changed) / static_cast<double>(values) : 0;
    r.changes_per_version = changed / pairs;
    if (description_.empty()) description_ = format_bytes(static_cast<double>(image)) + " model, " + std::to_string(pairs) + " deltas per density";
    return r;
  }

  // The floor under any sparse apply of base -> next into `work` (which holds the base after
  // cold()): each changed 2-byte value written at its place, from arrays of places and values
  // made beforehand, untimed, with the 8-byte word it lies in read and mixed, as a state hash
  // update needs. No payload is decoded and nothing is checked: what is left is the memory
  // traffic of touching the changed lines. With `hashed`, each touched word's state_mix before
  // and after its changes also moves a sum, as a sparse apply must to check its result (words
  // counted from the image's start rather than each chunk's: the same work). CPU ms per run.
  std::vector<double> floor_of(ByteSpan base, ByteSpan next, const std::function<void()>& cold, MutableByteSpan work, bool hashed) {
    std::vector<std::uint64_t> at;  // 2-byte value index
    std::vector<std::uint16_t> to;
    const std::size_t image = base.size();
    for (std::size_t i = 0; i + 2 <= image; i += 2)
      if (load_u16(base.data() + i) != load_u16(next.data() + i)) {
        at.push_back(i / 2);
        to.push_back(load_u16(next.data() + i));
      }
    if (hashed)
      return cpu_runs(o_.runs, cold, [&] {
        floor_sink_ += hashed_floor(at, to, work);
        if (image % 2) work[image - 1] = next[image - 1];
      });
    return cpu_runs(o_.runs, cold, [&] {
      std::uint8_t* const w = work.data();
      const std::size_t n = at.size();
      std::uint64_t mixed = 0;
      for (std::size_t k = 0; k < n; ++k) {
        if (k + 64 < n) __builtin_prefetch(w + 2 * at[k + 64], 1);
        const std::size_t off = 2 * at[k];
        std::uint64_t word = 0;
        std::memcpy(&word, w + (image >= 8 ? std::min(off & ~std::size_t{7}, image - 8) : 0), std::min<std::size_t>(8, image));
        mixed += word * 0x9e3779b97f4a7c15u;
        store_u16(w + off, to[k]);
      }
      floor_sink_ += mixed;
      if (image % 2) work[image - 1] = next[image - 1];
    });
  }

  // floor_of's changes written into `work` with each touched word's mix moved in a sum, which
  // it returns. An odd image's last byte is the caller's.
  static std::uint64_t hashed_floor(std::span<const std::uint64_t> at, std::span<const std::uint16_t> to, MutableByteSpan work) {
    constexpr std::uint64_t kNone = ~std::uint64_t{0};
    std::uint8_t* const w = work.data();
    const std::size_t n = at.size(), image = work.size();
    std::uint64_t sum = 0, j = kNone, was = 0, now = 0;
    auto read_word = [&](std::uint64_t wj) {
      std::uint64_t word = 0;
      std::memcpy(&word, w + 8 * wj, std::min<std::size_t>(8, image - 8 * wj));
      return word;
    };
    for (std::size_t k = 0; k < n; ++k) {
      if (k + 64 < n) __builtin_prefetch(w + 2 * at[k + 64], 1);
      const std::size_t off = 2 * at[k];
      if (const std::uint64_t wj = off / 8; wj != j) {
        if (j != kNone) sum += state_mix(j, now) - state_mix(j, was);
        j = wj;
        was = now = read_word(wj);
      }
      const unsigned shift = 8 * (off % 8);
      now = (now & ~(std::uint64_t{0xffff} << shift)) | (std::uint64_t{to[k]} << shift);
      store_u16(w + off, to[k]);
    }
    if (j != kNone) sum += state_mix(j, now) - state_mix(j, was);
    return sum;
  }

  // A scrub's cost: the state hash over the whole image, cold, against xxh3 over the same bytes.
  void measure_scrub(ByteSpan image) {
    Bytes evict(64u << 20);
    std::uint64_t sink = 0;
    auto cold = [&] { std::memset(evict.data(), static_cast<int>(sink & 0xff), evict.size()); };
    scrub_ms_ = cpu_runs(o_.runs, cold, [&] { sink += state_hash(image); });
    xxh3_ms_ = cpu_runs(o_.runs, cold, [&] { sink += hash64(image); });
    scrub_bytes_ = image.size();
  }

  void print_scrub() const {
    const double gbps = static_cast<double>(scrub_bytes_) / median(scrub_ms_) / 1e6;
    const double xxh3 = static_cast<double>(scrub_bytes_) / median(xxh3_ms_) / 1e6;
    const double rate = static_cast<double>(runtime::NodeConfig{}.scrub_bytes_per_s);
    std::printf("\nscrub (state hash of the whole image, one core, cold): %.2f GB/s, %.0f ms of CPU per GB; xxh3 of the same bytes: "
                "%.2f GB/s (state hash %.2fx its speed)\n",
                gbps, 1e3 / gbps, xxh3, gbps / xxh3);
    std::printf("at the default %s/s: %.1f%% of a core; the whole %s image every %.1f s (a flipped bit is found within that, "
                "half of it on average)\n",
                format_bytes(rate).c_str(), 100 * rate / (gbps * 1e9), format_bytes(static_cast<double>(scrub_bytes_)).c_str(),
                static_cast<double>(scrub_bytes_) / rate);
  }

  void print() const {
    std::printf("worker CPU per version: %s; %zu runs per delta, one core, chunk %s; medians in ms\n\n", description_.c_str(), o_.runs,
                o_.chunk_size.c_str());
    std::printf("| lr | changed | changes/version | before: dense, xxh3 | dense | dense in place | sparse in place | sparse double-buffered | "
                "double-buffered (worker) | floor: changes alone | floor + state hash | before / in place | before / double-buffered (worker) | "
                "before / floor | before / (floor + state hash) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : results_) {
      const double today = median(r.today_ms), sparse = median(r.sparse_ms);
      const double twice = r.double_buffered_ms.empty() ? 0 : median(r.double_buffered_ms);
      const double worker = r.worker_double_ms.empty() ? 0 : median(r.worker_double_ms);
      const double floor = median(r.floor_ms), hashed = median(r.hashed_floor_ms);
      std::printf("| %g | %.2f%% | %" PRIu64 " | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | **%.1fx** | **%.1fx** | %.1fx | %.1fx |\n",
                  r.lr, 100 * r.changed_fraction, r.changes_per_version, today, median(r.dense_ms), median(r.dense_in_place_ms), sparse, twice,
                  worker, floor, hashed, today / sparse, worker > 0 ? today / worker : 0.0, today / floor, today / hashed);
    }
    std::printf("\nfloor: each changed value stored at its place from arrays made beforehand, the word it lies in read and mixed; no "
                "payload decoded, nothing checked. before / floor is the most any sparse apply could save on this machine.\n");
    std::printf("floor + state hash: the same, with each touched word's state_mix before and after moving a sum, as a checked sparse apply "
                "must; still nothing decoded. before / (floor + state hash) is the most a checked sparse apply could save.\n");
    std::printf("\ndouble-buffered (worker): a chunk whose payload is more than %u/1000 of its range decoded whole from the live image "
                "(NodeConfig::catch_up_dense_payload_per_mille), the others caught up and applied sparsely:",
                runtime::NodeConfig{}.catch_up_dense_payload_per_mille);
    for (const auto& r : results_) std::printf(" %.2f%% changed: %" PRIu64 " of %" PRIu64 " chunks whole;", 100 * r.changed_fraction, r.whole_chunks, r.chunks);
    std::printf("\n");
    std::printf("\ncodecs v2 and v3 at the worker (publish --codec v2: v1 or v2 per chunk, the smaller; --codec v3: v3 on every chunk): "
                "payload per version, and sparse in place\n\n");
    std::printf("| changed | v1 payload | v2 / v1 bytes | v3 / v1 bytes | v1 sparse in place | v2 sparse in place | v3 sparse in place | "
                "v2 / v1 CPU | v3 / v1 CPU |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : results_) {
      const double pairs = static_cast<double>(r.sparse_ms.size()) / static_cast<double>(o_.runs);
      const double v1 = static_cast<double>(r.v1_bytes) / pairs, v2 = static_cast<double>(r.v2_bytes) / pairs;
      const double v3 = static_cast<double>(r.v3_bytes) / pairs;
      const double cpu1 = median(r.sparse_ms), cpu2 = median(r.v2_sparse_ms), cpu3 = median(r.v3_sparse_ms);
      std::printf("| %.2f%% | %s | %.3f | %.3f | %.1f ms | %.1f ms | %.1f ms | %.2fx | **%.2fx** |\n", 100 * r.changed_fraction,
                  format_bytes(v1).c_str(), v2 / v1, v3 / v1, cpu1, cpu2, cpu3, cpu2 / cpu1, cpu3 / cpu1);
    }
  }

  const WorkerBenchOptions& o_;
  VersionEncodeOptions vopt_;
  std::uint64_t floor_sink_ = 0;  // floor_of's mixes, kept so the loads are not optimised away
  ThreadPool pool_;
  InlineExecutor one_core_;
  ChunkEncoderPool encoders_;
  ChunkDecoderPool decoders_;
  std::vector<DensityResult> results_;
  std::string description_;
  std::vector<double> scrub_ms_, xxh3_ms_;
  std::uint64_t scrub_bytes_ = 0;
};

}  // namespace

Command add_bench_worker_command(CLI::App& app) {
  auto o = std::make_shared<WorkerBenchOptions>();
  o->series.size = "512MB";
  o->series.steps = 2;
  CLI::App* sub = app.add_subcommand("bench-worker", "A worker's CPU per version, sparse against dense, at several change densities");
  sub->add_option("--size", o->series.size, "Generated checkpoint size")->capture_default_str();
  sub->add_option("--steps", o->series.steps, "Deltas per density (double-buffered figures need 2 or more)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  sub->add_option("--lr", o->lrs, "Learning rates of the generated series, one density each")->capture_default_str()->delimiter(',');
  sub->add_option("--seed", o->series.train.seed, "Generator seed")->capture_default_str();
  sub->add_option("--runs", o->runs, "Timed runs per delta (median reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--chunk-size", o->chunk_size, "Chunk size")->capture_default_str();
  sub->add_option("--svg", o->svg_path, "Also write the results as an SVG bar chart");
  sub->add_flag("-q,--quiet", o->series.quiet, "No progress bar");
  return {sub, [o] {
            auto chunk = parse_bytes(o->chunk_size);
            if (!chunk.is_ok()) return fail(chunk.status().message());
            const Status st = WorkerBench(*o, *chunk).run();
            return st.is_ok() ? 0 : fail(st.message());
          }};
}

}  // namespace deltacast::tools
