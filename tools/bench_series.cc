#include "bench_series.h"

#include <stdlib.h>
#include <sys/resource.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "deltacast/common/thread_pool.h"
#include "deltacast/common/units.h"
#include "progress.h"

namespace deltacast::tools {

Result<Series> load_series(const SeriesOptions& o) {
  Series s;
  if (!o.files.empty()) {
    if (o.files.size() < 2) return Status::invalid_argument("bench needs at least two checkpoints");
    for (const auto& f : o.files) {
      DC_ASSIGN_OR_RETURN(SafetensorsFile st, SafetensorsFile::open(f));
      if (s.images.empty()) s.layout = st.layout();
      else if (st.layout().tensors != s.layout.tensors) return Status::invalid_argument(f + ": tensor layout differs from " + o.files[0]);
      s.images.push_back(st.image());
      s.paths.push_back(f);
      s.mapped.emplace_back();
      DC_ASSIGN_OR_RETURN(s.mapped.back(), MappedFile::open(f));  // keeps the mapping alive
      s.images.back() = s.mapped.back().bytes().subspan(s.mapped.back().bytes().size() - s.layout.image_size);
    }
    s.description = std::to_string(o.files.size()) + " checkpoints from files";
    return s;
  }
  DC_ASSIGN_OR_RETURN(std::uint64_t bytes, parse_bytes(o.size));
  s.layout = synth::build_layout(synth::shape_for_bytes(bytes));
  s.owned.resize(o.steps + 1);
  std::vector<MutableByteSpan> spans;
  for (auto& b : s.owned) {
    b.resize(s.layout.image_size);
    spans.emplace_back(b);
  }
  ThreadPool pool;
  ProgressBar bar("generate", s.layout.image_size, !o.quiet);
  synth::generate_series(s.layout, o.train, spans, pool, [&](std::uint64_t d, std::uint64_t) { bar.update(d); });
  bar.finish();
  for (auto& b : s.owned) s.images.emplace_back(b);
  char desc[160];
  std::snprintf(desc, sizeof desc, "deltacast gen series: %s model, %zu steps, lr %g, seed %" PRIu64, format_bytes(static_cast<double>(s.layout.image_size)).c_str(),
                o.steps, o.train.lr, o.train.seed);
  s.description = desc;
  return s;
}

Result<ScratchDir> ScratchDir::create(const std::string& prefix) {
  std::error_code ec;
  std::string templ = (std::filesystem::temp_directory_path(ec) / (prefix + "-XXXXXX")).string();
  if (ec) return Status::io_error("no temporary directory: " + ec.message());
  if (!::mkdtemp(templ.data())) return Status::io_error("cannot create a directory from " + templ);
  return ScratchDir(templ);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

Result<std::vector<std::string>> series_files(const Series& s, const std::string& dir) {
  if (!s.paths.empty()) return s.paths;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < s.images.size(); ++i) {
    paths.push_back(dir + "/step-" + std::to_string(i) + ".safetensors");
    DC_RETURN_IF_ERROR(write_safetensors(paths.back(), s.layout, s.images[i]));
  }
  return paths;
}

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

}  // namespace deltacast::tools
