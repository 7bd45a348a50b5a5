// gen, encode, decode, inspect.
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <thread>

#include "commands.h"
#include "file_codec.h"
#include "deltacast/common/units.h"
#include "deltacast/synth/gen.h"
#include "deltacast/codec/entropy.h"
#include "deltacast/codec/hash.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"
#include "deltacast/runtime/trust.h"
#include "node_config.h"
#include "progress.h"

namespace deltacast::tools {

int fail(const std::string& message) {
  std::fprintf(stderr, "deltacast: error: %s\n", message.c_str());
  return 1;
}

namespace {

struct CommonOptions {
  std::size_t threads = 0;
  bool quiet = false;
};

void add_common(CLI::App* sub, CommonOptions& o) {
  sub->add_option("-j,--threads", o.threads, "Worker threads (default: one per core)");
  sub->add_flag("-q,--quiet", o.quiet, "No progress bar");
}

// A progress callback that starts `bar` when the work reports its total.
ProgressFn lazy_bar(const char* label, std::optional<ProgressBar>& bar, bool quiet) {
  return [label, &bar, quiet](std::uint64_t done, std::uint64_t total) {
    if (!bar) bar.emplace(label, total, !quiet);
    bar->update(done);
  };
}

std::string step_file(const std::string& dir, std::size_t step, std::size_t shard = 0, std::size_t shards = 1) {
  char name[96];
  if (shards > 1) std::snprintf(name, sizeof name, "step-%06zu.shard-%zu-of-%zu.safetensors", step, shard, shards);
  else std::snprintf(name, sizeof name, "step-%06zu.safetensors", step);
  return (std::filesystem::path(dir) / name).string();
}

// Splits a layout into `parts` runs of whole tensors of about equal bytes, each rebased to 0,
// as a sharded checkpoint stores them (one file per trainer shard).
std::vector<ModelLayout> split_layout(const ModelLayout& layout, std::size_t parts) {
  std::vector<ModelLayout> out(parts);
  const double per_part = static_cast<double>(layout.image_size) / static_cast<double>(parts);
  for (const auto& t : layout.tensors) {
    std::size_t p = std::min(parts - 1, static_cast<std::size_t>(static_cast<double>(t.offset) / per_part));
    TensorInfo r = t;
    r.offset = out[p].image_size;
    out[p].image_size += r.nbytes;
    out[p].tensors.push_back(std::move(r));
  }
  for (auto& part : out) part.metadata = layout.metadata;
  return out;
}

// ---- gen ---------------------------------------------------------------------------------------

struct GenOptions {
  CommonOptions common;
  std::string out_dir;
  std::string size = "64MB";
  std::uint64_t hidden = 0, layers = 0, vocab = 0, ffn = 0;
  std::size_t steps = 4;
  synth::TrainOptions train;
  bool fp32_norms = false;
  std::size_t shards = 1;
};

int run_gen(const GenOptions& o) {
  auto bytes = parse_bytes(o.size);
  if (!bytes.is_ok()) return fail(bytes.status().message());
  synth::ModelShape shape = synth::shape_for_bytes(*bytes);
  if (o.hidden) shape.hidden = o.hidden;
  if (o.layers) shape.layers = o.layers;
  if (o.vocab) shape.vocab = o.vocab;
  if (o.ffn) shape.ffn = o.ffn;
  shape.fp32_norms = o.fp32_norms;
  ModelLayout layout = synth::build_layout(shape);
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return fail("cannot create " + o.out_dir + ": " + ec.message());

  std::printf("model: hidden %" PRIu64 ", %" PRIu64 " layers, vocab %" PRIu64 ", ffn %" PRIu64 ", %zu tensors, %s per checkpoint\n",
              shape.hidden, shape.layers, shape.vocab, shape.ffn, layout.tensors.size(), format_bytes(static_cast<double>(layout.image_size)).c_str());
  if (o.shards < 1 || o.shards > layout.tensors.size()) return fail("--shards must be between 1 and the tensor count");
  const auto parts = o.shards > 1 ? split_layout(layout, o.shards) : std::vector<ModelLayout>{layout};
  ThreadPool pool(o.common.threads);
  ProgressBar bar("gen", layout.image_size, !o.common.quiet);
  std::uint64_t done_before = 0;
  std::vector<synth::StepStats> stats(o.steps);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    std::vector<SafetensorsWriter> writers;
    std::vector<MutableByteSpan> images;
    for (std::size_t t = 0; t <= o.steps; ++t) {
      ModelLayout l = parts[p];
      l.metadata.emplace_back("step", std::to_string(t));
      auto w = SafetensorsWriter::create(step_file(o.out_dir, t, p, parts.size()), l);
      if (!w.is_ok()) return fail(w.status().to_string());
      writers.push_back(std::move(w).value());
      images.push_back(writers.back().data());
    }
    synth::TrainOptions train = o.train;
    train.seed += 1000003 * p;  // each shard its own random streams
    auto part_stats = synth::generate_series(parts[p], train, images, pool,
                                      [&](std::uint64_t d, std::uint64_t) { bar.update(done_before + d); });
    done_before += parts[p].image_size;
    for (std::size_t t = 0; t < stats.size(); ++t) {
      stats[t].values += part_stats[t].values;
      stats[t].changed += part_stats[t].changed;
      stats[t].mantissa_only += part_stats[t].mantissa_only;
      stats[t].exponent_changed += part_stats[t].exponent_changed;
      stats[t].sign_changed += part_stats[t].sign_changed;
    }
    for (auto& w : writers)
      if (Status st = w.commit(); !st.is_ok()) return fail(st.to_string());
  }
  bar.finish();
  std::printf("%-6s %10s %12s %14s %14s %10s\n", "step", "changed", "changed %", "mantissa-only", "exponent", "sign");
  for (std::size_t t = 0; t < stats.size(); ++t) {
    const auto& s = stats[t];
    double pct = s.values ? 100.0 * static_cast<double>(s.changed) / static_cast<double>(s.values) : 0;
    double mo = s.changed ? 100.0 * static_cast<double>(s.mantissa_only) / static_cast<double>(s.changed) : 0;
    std::printf("%-6zu %10" PRIu64 " %11.3f%% %13.2f%% %14" PRIu64 " %10" PRIu64 "\n", t + 1, s.changed, pct, mo,
                s.exponent_changed, s.sign_changed);
  }
  std::printf("wrote %zu checkpoints%s to %s\n", o.steps + 1, parts.size() > 1 ? (" of " + std::to_string(parts.size()) + " shards each").c_str() : "",
              o.out_dir.c_str());
  return 0;
}

// ---- encode ------------------------------------------------------------------------------------

struct EncodeOptions {
  CommonOptions common;
  std::vector<std::string> inputs;
  std::string output;
  std::string chunk_size = "4MiB";
  std::uint64_t version = 0, base_version = 0;
  bool max_effort = false;
  bool v2 = false;      // the older spelling of --codec v2
  std::string codec = "v1";
  std::string sign_key_path;
};

int run_encode(const EncodeOptions& o) {
  FileEncodeRequest r;
  if (o.inputs.size() == 2) r.base_path = o.inputs.front();
  r.next_path = o.inputs.back();
  r.out_path = o.output;
  auto chunk = parse_bytes(o.chunk_size);
  if (!chunk.is_ok()) return fail(chunk.status().message());
  if (!o.sign_key_path.empty()) {
    auto k = read_signing_key_file(o.sign_key_path);
    if (!k.is_ok()) return fail(k.status().to_string());
    r.sign_key = *k;
  }
  r.options.chunk_bytes = *chunk;
  if (o.v2 || o.codec == "v2") r.options.chunk = ChunkEncodeOptions::smallest();
  if (o.codec == "v3") r.options.chunk.delta_kinds = {ChunkKind::kDeltaV3};
  if (o.max_effort) r.options.chunk = ChunkEncodeOptions::max_effort();
  r.version = o.version;
  r.base_version = o.base_version;
  ThreadPool pool(o.common.threads);
  std::optional<ProgressBar> bar;
  r.options.progress = lazy_bar("encode", bar, o.common.quiet);
  auto done = encode_file(r, pool);
  if (bar) bar->finish();
  if (!done.is_ok()) return fail(done.status().to_string());
  const bool anchor = r.base_path.empty();
  const double image = static_cast<double>(done->image_bytes);
  std::printf("%s version %" PRIu64 "%s%s: %zu chunks, %s -> %s (%.3f%% of the checkpoint data)\n", anchor ? "anchor" : "delta",
              done->version, anchor ? "" : (" from " + std::to_string(o.base_version)).c_str(), r.sign_key ? ", signed" : "", done->chunks,
              format_bytes(image).c_str(), format_bytes(static_cast<double>(done->file_bytes)).c_str(),
              100.0 * static_cast<double>(done->file_bytes) / image);
  return 0;
}

// ---- decode ------------------------------------------------------------------------------------

struct DecodeOptions {
  CommonOptions common;
  std::vector<std::string> inputs;
  std::string output;
  std::vector<std::string> trust_keys;
};

int run_decode(const DecodeOptions& o) {
  FileDecodeRequest r;
  if (o.inputs.size() == 2) r.base_path = o.inputs.front();
  r.in_path = o.inputs.back();
  r.out_path = o.output;
  for (const auto& k : o.trust_keys) {
    auto key = read_public_key(k);
    if (!key.is_ok()) return fail(key.status().to_string());
    r.trusted.push_back(*key);
  }
  ThreadPool pool(o.common.threads);
  std::optional<ProgressBar> bar;
  r.progress = lazy_bar("decode", bar, o.common.quiet);
  auto done = decode_file(r, pool);
  if (bar) bar->finish();
  if (!done.is_ok()) return fail(done.status().to_string());
  std::printf("version %" PRIu64 " verified%s: %zu chunks, checksum %016" PRIx64 ", wrote %s\n", done->version,
              done->signer ? (", signed by " + runtime::to_hex(*done->signer)).c_str() : "", done->chunks, done->checksum,
              o.output.c_str());
  return 0;
}

// ---- inspect -----------------------------------------------------------------------------------

struct InspectOptions {
  CommonOptions common;
  std::vector<std::string> paths;
  bool tensors = false;
  bool chunks = false;
  bool entropy = false;
  std::string prev;
};

// inspect --entropy BASE NEW: the delta's empirical entropy under models with more and more
// context, next to what the codec achieves on it.
int run_inspect_entropy(const InspectOptions& o) {
  if (o.paths.size() != 2) return fail("--entropy compares two checkpoints: deltacast inspect --entropy BASE NEW");
  auto base = SafetensorsFile::open(o.paths[0]);
  if (!base.is_ok()) return fail(base.status().to_string());
  auto next = SafetensorsFile::open(o.paths[1]);
  if (!next.is_ok()) return fail(next.status().to_string());
  if (base->layout().tensors != next->layout().tensors) return fail("the two checkpoints have different tensor layouts");
  Result<SafetensorsFile> prev = Status::not_found("none");
  if (!o.prev.empty()) {
    prev = SafetensorsFile::open(o.prev);
    if (!prev.is_ok()) return fail(prev.status().to_string());
    if (prev->layout().tensors != base->layout().tensors) return fail("--prev has a different tensor layout");
  }
  const ModelLayout& layout = next->layout();
  auto h = measure_delta_entropy(layout.tensors, base->image(), next->image(), prev.is_ok() ? prev->image() : ByteSpan());
  if (!h.is_ok()) return fail(h.status().to_string());
  ThreadPool pool(o.common.threads);
  ProgressBar bar("encode", 3 * layout.image_size, !o.common.quiet);
  std::uint64_t done = 0;
  auto encoded_bytes = [&](const ChunkEncodeOptions& chunk) -> Result<double> {
    VersionEncodeOptions opt;
    opt.chunk = chunk;
    opt.progress = [&](std::uint64_t d, std::uint64_t) { bar.update(done + d); };
    DC_ASSIGN_OR_RETURN(EncodedVersion ev, encode_version(layout, 2, 1, base->image(), next->image(), opt, pool));
    done += layout.image_size;
    return static_cast<double>(container_prefix(ev.manifest).size() + ev.manifest.payload_bytes_total());
  };
  auto v1 = encoded_bytes(ChunkEncodeOptions::defaults());
  auto best = v1.is_ok() ? encoded_bytes(ChunkEncodeOptions::smallest()) : v1;
  ChunkEncodeOptions v3_options = ChunkEncodeOptions::defaults();
  v3_options.delta_kinds = {ChunkKind::kDeltaV3};
  auto v3 = best.is_ok() ? encoded_bytes(v3_options) : best;
  bar.finish();
  if (!v3.is_ok()) return fail(v3.status().to_string());
  const double achieved = *best;
  const double image = static_cast<double>(layout.image_size);
  const double changed = static_cast<double>(std::max<std::uint64_t>(h->changed, 1));
  std::printf("delta %s -> %s: %s image, %" PRIu64 " BF16 values, %" PRIu64 " changed (%.3f%%)\n", o.paths[0].c_str(), o.paths[1].c_str(),
              format_bytes(image).c_str(), h->bf16_values, h->changed, 100.0 * static_cast<double>(h->changed) / static_cast<double>(std::max<std::uint64_t>(h->bf16_values, 1)));
  if (h->other_bytes) std::printf("  other bytes (non-BF16): %" PRIu64 ", XOR entropy %.0f bytes\n", h->other_bytes, h->other_bits / 8);
  std::printf("\n  %-46s %14s %12s %14s %13s\n", "", "bytes", "% of BF16", "bits/change", "of which pos.");
  auto row = [&](const char* name, double bytes, double positions_bits) {
    std::printf("  %-46s %14.0f %11.4f%% %14.2f", name, bytes, 100.0 * bytes / image, 8 * bytes / changed);
    if (positions_bits >= 0) std::printf(" %13.2f", positions_bits / changed);
    std::printf("\n");
  };
  row("entropy (a): positions independent", h->bytes(h->independent), h->independent.positions_bits);
  row("entropy (b): given the base exponent", h->bytes(h->exponent), h->exponent.positions_bits);
  row("entropy (b): given tensor and base exponent", h->bytes(h->tensor_exponent), h->tensor_exponent.positions_bits);
  if (h->has_history) row("entropy (c): given exponent and previous step", h->bytes(h->history), h->history.positions_bits);
  // What a decoder that reads the base only where it applies a change can use.
  row("entropy (d): positions from the changes before", h->bytes(h->sequential), h->sequential.positions_bits);
  if (h->has_history) row("entropy (e): (d) and previous step", h->bytes(h->sequential_history), h->sequential_history.positions_bits);
  row("achieved: deltacast v1 (whole file)", *v1, -1);
  row("achieved: deltacast, v2 where smaller (whole file)", achieved, -1);
  row("achieved: deltacast v3 (whole file)", *v3, -1);
  std::printf("\n  achieved / entropy (b, exponent): %.3f\n", achieved / h->bytes(h->exponent));
  return 0;
}

void print_tensors(const std::vector<TensorInfo>& tensors) {
  for (const auto& t : tensors) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    std::printf("  %-56s %-8s %-14s offset %-12" PRIu64 " %s\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                shape.c_str(), t.offset, format_bytes(static_cast<double>(t.nbytes)).c_str());
  }
}

int inspect_safetensors(const InspectOptions& o, const SafetensorsFile& f) {
  const auto& l = f.layout();
  std::map<std::string, std::uint64_t> by_dtype;
  for (const auto& t : l.tensors) by_dtype[std::string(dtype_name(t.dtype))] += t.nbytes;
  std::printf("safetensors %s: %zu tensors, %s of data\n", o.paths[0].c_str(), l.tensors.size(), format_bytes(static_cast<double>(l.image_size)).c_str());
  for (const auto& [k, v] : by_dtype) std::printf("  %-8s %s\n", k.c_str(), format_bytes(static_cast<double>(v)).c_str());
  for (const auto& [k, v] : l.metadata) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  if (o.tensors) print_tensors(l.tensors);
  return 0;
}

int run_inspect(const InspectOptions& o) {
  if (o.entropy) return run_inspect_entropy(o);
  if (o.paths.size() != 1) return fail("inspect describes one file (two only with --entropy)");
  const std::string& path = o.paths[0];
  auto file = MappedFile::open(path);
  if (!file.is_ok()) return fail(file.status().to_string());
  auto c = parse_container(file->bytes());
  if (!c.is_ok()) {
    // Not a deltacast file: perhaps a checkpoint.
    if (auto st = SafetensorsFile::open(path); st.is_ok()) return inspect_safetensors(o, *st);
    return fail(path + ": " + c.status().to_string());
  }
  const Manifest& m = c->manifest;
  const double image = static_cast<double>(m.image_size);
  const double total = static_cast<double>(file->bytes().size());
  std::printf("%s: deltacast %s, version %" PRIu64, path.c_str(), m.kind == VersionKind::kDelta ? "delta" : "anchor", m.version);
  if (m.kind == VersionKind::kDelta) std::printf(" from base %" PRIu64 " (base checksum %016" PRIx64 ")", m.base_version, m.base_checksum);
  std::printf("\n  version checksum %016" PRIx64 "\n", m.version_checksum);
  if (m.is_signed) std::printf("  signed by %s (decode --trust-key checks it)\n", runtime::to_hex(m.signer).c_str());
  if (!m.run.empty()) std::printf("  run %s\n", to_string(m.run).c_str());
  std::printf("  image %s in %zu tensors, %zu chunks; file %s = %.4f%% of the image\n", format_bytes(image).c_str(), m.tensors.size(),
              m.chunks.size(), format_bytes(total).c_str(), 100.0 * total / image);
  for (const auto& [k, v] : m.metadata) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());

  ChunkStats all;
  struct Usage {
    std::uint64_t streams = 0, raw = 0, encoded = 0;
  };
  std::map<std::string, std::map<std::string, Usage>> usage;  // stream name -> backend -> usage
  if (o.chunks) std::printf("\n  %-6s %-14s %-12s %-12s %-18s\n", "chunk", "offset", "length", "payload", "payload hash");
  ChunkDecoder decoder;
  for (std::size_t i = 0; i < m.chunks.size(); ++i) {
    auto st = decoder.describe(c->payloads[i]);
    if (!st.is_ok()) return fail(path + ": chunk " + std::to_string(i) + ": " + st.status().to_string());
    for (const auto& s : st->streams) {
      auto& u = usage[std::string(s.name)][s.coder.empty() ? backend_label(s.report.choice) : std::string(s.coder)];
      u.streams++;
      u.raw += s.report.raw_bytes;
      u.encoded += s.report.encoded_bytes;
    }
    all.add(*st);
    if (o.chunks) {
      const auto& e = m.chunks[i];
      std::printf("  %-6zu %-14" PRIu64 " %-12" PRIu64 " %-12" PRIu64 " %016" PRIx64 "\n", i, e.offset, e.length, e.payload_bytes, e.payload_hash);
    }
  }
  std::printf("\n  %-14s %-9s %8s %14s %14s %9s\n", "stream", "backend", "chunks", "raw bytes", "encoded", "ratio");
  for (const auto& [name, per_backend] : usage)
    for (const auto& [label, u] : per_backend)
      std::printf("  %-14s %-9s %8" PRIu64 " %14" PRIu64 " %14" PRIu64 " %8.3fx\n", name.c_str(), label.c_str(), u.streams, u.raw,
                  u.encoded, u.encoded ? static_cast<double>(u.raw) / static_cast<double>(u.encoded) : 0.0);
  if (m.kind == VersionKind::kDelta) {
    auto pct = [](std::uint64_t a, std::uint64_t b) { return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; };
    std::printf("\n  BF16 values %" PRIu64 ", changed %" PRIu64 " (%.3f%%)\n", all.bf16_values, all.changed_values,
                pct(all.changed_values, all.bf16_values));
    std::printf("    small integer steps %" PRIu64 " (%.2f%% of changes)", all.small_deltas, pct(all.small_deltas, all.changed_values));
    if (all.v2_chunks == 0 && all.v3_chunks == 0)  // v2 and v3 code steps by their base's exponent
      std::printf(", of which +-1 ulp %" PRIu64 " (%.2f%%)", all.unit_deltas, pct(all.unit_deltas, all.changed_values));
    std::printf("\n    chunks coded v1 %" PRIu64 ", v2 %" PRIu64 ", v3 %" PRIu64 " (docs/FORMAT.md)\n", all.v1_chunks, all.v2_chunks,
                all.v3_chunks);
    std::printf("    exceptions (sign flips, exponent jumps) %" PRIu64 " (%.3f%% of changes)\n", all.exceptions,
                pct(all.exceptions, all.changed_values));
    std::printf("    bits per changed value %.2f\n", all.changed_values ? 8.0 * total / static_cast<double>(all.changed_values) : 0.0);
    if (all.generic_bytes)
      std::printf("  other dtypes: %" PRIu64 " bytes, %" PRIu64 " changed (%.2f%%)\n", all.generic_bytes, all.generic_changed_bytes,
                  pct(all.generic_changed_bytes, all.generic_bytes));
  }
  if (o.tensors) {
    std::printf("\n");
    print_tensors(m.tensors);
  }
  return 0;
}

}  // namespace

Command add_gen_command(CLI::App& app) {
  auto o = std::make_shared<GenOptions>();
  CLI::App* sub = app.add_subcommand("gen", "Write a series of synthetic RL checkpoints (safetensors, BF16)");
  sub->add_option("-o,--out", o->out_dir, "Output directory (files step-000000.safetensors, ...)")->required();
  sub->add_option("--size", o->size, "Approximate checkpoint size, e.g. 64MB, 10GB")->capture_default_str();
  sub->add_option("--steps", o->steps, "Training steps after the initial checkpoint")->capture_default_str();
  sub->add_option("--lr", o->train.lr, "Adam learning rate")->capture_default_str();
  sub->add_option("--seed", o->train.seed, "Random seed")->capture_default_str();
  sub->add_option("--hidden", o->hidden, "Hidden size (overrides --size)");
  sub->add_option("--layers", o->layers, "Transformer layers (overrides --size)");
  sub->add_option("--vocab", o->vocab, "Vocabulary size (overrides --size)");
  sub->add_option("--ffn", o->ffn, "MLP width (overrides --size)");
  sub->add_flag("--fp32-norms", o->fp32_norms, "Store norm weights as F32");
  sub->add_option("--shards", o->shards, "Split each checkpoint into this many files of whole tensors, as trainer shards write them")
      ->capture_default_str();
  add_common(sub, o->common);
  return {sub, [o] { return run_gen(*o); }};
}

Command add_encode_command(CLI::App& app) {
  auto o = std::make_shared<EncodeOptions>();
  CLI::App* sub = app.add_subcommand("encode", "Encode BASE NEW into a delta, or NEW alone into an anchor");
  sub->add_option("inputs", o->inputs, "[BASE.safetensors] NEW.safetensors")->required()->expected(1, 2)->check(CLI::ExistingFile);
  sub->add_option("-o,--out", o->output, "Output file")->required();
  sub->add_option("--chunk-size", o->chunk_size, "Target chunk size")->capture_default_str();
  sub->add_option("--version", o->version, "Version number to record (default: base version + 1)");
  sub->add_option("--base-version", o->base_version, "Version number of BASE")->capture_default_str();
  sub->add_option("--codec", o->codec,
                  "Delta codec: v1; v2 where smaller per chunk (about 30% fewer bytes, 3-4x the CPU to apply); v3 on every chunk "
                  "(about 18% fewer bytes than v1, about 2x the CPU to apply; docs/FORMAT.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"v1", "v2", "v3"}));
  sub->add_flag("--v2", o->v2, "Same as --codec v2")->excludes("--codec");
  sub->add_flag("--max-effort", o->max_effort, "Also try codec v2 and zstd -19 on every stream (smallest, slowest)");
  sub->add_option("--sign-key", o->sign_key_path, "Sign the file with this Ed25519 key file (deltacast keygen --sign); decode --trust-key checks it");
  add_common(sub, o->common);
  return {sub, [o] { return run_encode(*o); }};
}

Command add_decode_command(CLI::App& app) {
  auto o = std::make_shared<DecodeOptions>();
  CLI::App* sub = app.add_subcommand("decode", "Rebuild a checkpoint from BASE and a delta, or from an anchor, verifying every checksum");
  sub->add_option("inputs", o->inputs, "[BASE.safetensors] DELTA")->required()->expected(1, 2)->check(CLI::ExistingFile);
  sub->add_option("-o,--out", o->output, "Output safetensors file (written only if everything verifies)")->required();
  sub->add_option("--trust-key", o->trust_keys,
                  "Decode only a file signed by this Ed25519 public key (hex, or a key file from keygen --sign); repeatable")
      ->allow_extra_args(false);
  add_common(sub, o->common);
  return {sub, [o] { return run_decode(*o); }};
}

Command add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe a delta, an anchor or a safetensors checkpoint");
  sub->add_option("files", o->paths, "File to describe (a delta, an anchor or a checkpoint); with --entropy, BASE NEW checkpoints")
      ->required()
      ->expected(1, 2)
      ->check(CLI::ExistingFile);
  sub->add_flag("--tensors", o->tensors, "List every tensor");
  sub->add_flag("--chunks", o->chunks, "List every chunk");
  sub->add_flag("--entropy", o->entropy, "Empirical entropy of the delta BASE -> NEW, next to the size the codec achieves");
  sub->add_option("--prev", o->prev, "With --entropy: the checkpoint before BASE, for the history model")->check(CLI::ExistingFile);
  add_common(sub, o->common);
  return {sub, [o] { return run_inspect(*o); }};
}

}  // namespace deltacast::tools
