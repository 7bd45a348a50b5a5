// decode_rate: how fast one worker process decodes and applies a delta on this machine while
// others do the same, for the simulator's validation (scripts/validate_sim.sh, docs/SIM.md). It
// encodes BASE -> NEXT as `deltacast publish` does by default (codec v1, 4 MiB chunks), then
// decodes the whole version into a second image on one thread, as a worker's decode does,
// again and again for --seconds, and prints the median rate in bytes of image per second.
//   decode_rate BASE.safetensors NEXT.safetensors [--seconds 3] [--barrier FILE]
// With --barrier, it prints "armed" once encoded and starts decoding only when FILE exists, so
// that copies started together decode at the same time (what W workers on one machine do).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "deltacast/codec/version.h"
#include "deltacast/common/executor.h"
#include "deltacast/common/stats.h"
#include "deltacast/common/thread_pool.h"
#include "deltacast/io/safetensors.h"

int main(int argc, char** argv) {
  CLI::App app{"Median rate of decoding and applying one delta on one thread"};
  std::string base_path, next_path, barrier;
  double seconds = 3;
  unsigned threads = 1;
  std::string chunk_size = "4MiB";
  app.add_option("base", base_path, "Base checkpoint")->required()->check(CLI::ExistingFile);
  app.add_option("next", next_path, "Next checkpoint")->required()->check(CLI::ExistingFile);
  app.add_option("--seconds", seconds, "How long to decode, again and again")->capture_default_str()->check(CLI::Range(0.1, 600.0));
  app.add_option("--threads", threads, "Decode threads (a worker has libuv's 4)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--barrier", barrier, "Start decoding only once this file exists");
  CLI11_PARSE(app, argc, argv);
  using namespace deltacast;
  auto base = SafetensorsFile::open(base_path);
  auto next = SafetensorsFile::open(next_path);
  for (const Status& st : {base.status(), next.status()}) {
    if (!st.is_ok()) {
      std::fprintf(stderr, "decode_rate: %s\n", st.to_string().c_str());
      return 1;
    }
  }
  if (base->layout().tensors != next->layout().tensors) {
    std::fprintf(stderr, "decode_rate: the two checkpoints differ in layout\n");
    return 1;
  }
  InlineExecutor one_thread;
  VersionEncodeOptions options;  // publish's defaults
  auto ev = encode_version(next->layout(), 2, 1, base->image(), next->image(), options, one_thread);
  if (!ev.is_ok()) {
    std::fprintf(stderr, "decode_rate: encode: %s\n", ev.status().to_string().c_str());
    return 1;
  }
  // Private copies, as a worker holds its images in its own memory (not the files' page cache).
  const std::vector<std::uint8_t> image(base->image().begin(), base->image().end());
  std::vector<std::uint8_t> out(image.size());
  const std::vector<ByteSpan> payloads(ev->payloads.begin(), ev->payloads.end());
  if (!barrier.empty()) {
    std::printf("armed\n");
    std::fflush(stdout);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (!std::filesystem::exists(barrier)) {
      if (std::chrono::steady_clock::now() > give_up) {
        std::fprintf(stderr, "decode_rate: %s did not appear within 10 minutes\n", barrier.c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ThreadPool pool(threads);
  std::vector<double> rates;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = decode_version(ev->manifest, payloads, image, out, pool); !st.is_ok()) {
      std::fprintf(stderr, "decode_rate: decode: %s\n", st.to_string().c_str());
      return 1;
    }
    rates.push_back(static_cast<double>(image.size()) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } while (std::chrono::steady_clock::now() < end);
  if (!std::equal(out.begin(), out.end(), next->image().begin())) {
    std::fprintf(stderr, "decode_rate: the decoded image differs from NEXT\n");
    return 1;
  }
  std::printf("%.0f bytes/s median of %zu decodes\n", median(rates), rates.size());
  return 0;
}
