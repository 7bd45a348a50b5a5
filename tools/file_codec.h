// Encoding and decoding between files, as `deltacast encode` and `deltacast decode` do it:
// safetensors checkpoints in, a container file out, and back. `deltacast bench --end-to-end`
// times the same functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deltacast/codec/version.h"
#include "deltacast/common/executor.h"
#include "deltacast/runtime/trust.h"

namespace deltacast::tools {

struct FileEncodeRequest {
  std::string base_path;  // empty: an anchor of next_path
  std::string next_path;
  std::string out_path;
  VersionEncodeOptions options;
  std::uint64_t version = 0;  // 0: base_version + 1 for a delta, 1 for an anchor
  std::uint64_t base_version = 0;
  std::optional<runtime::SigningKey> sign_key;
};

struct FileEncodeResult {
  std::uint64_t version = 0;
  std::size_t chunks = 0;
  std::uint64_t image_bytes = 0;  // the checkpoint's tensor data
  std::uint64_t file_bytes = 0;   // the container written
};

// Encodes next_path (against base_path) into out_path, which is written whole or not at all.
Result<FileEncodeResult> encode_file(const FileEncodeRequest& request, Executor& executor);

struct FileDecodeRequest {
  std::string base_path;  // a delta's base checkpoint; empty for an anchor
  std::string in_path;
  std::string out_path;
  std::vector<runtime::PublicKey> trusted;  // when set: only a file one of them signed decodes
  ProgressFn progress;
};

struct FileDecodeResult {
  std::uint64_t version = 0;
  std::size_t chunks = 0;
  std::uint64_t checksum = 0;
  std::optional<runtime::PublicKey> signer;  // when checked against trusted keys
  std::uint64_t image_bytes = 0;
};

// Decodes in_path (onto base_path) into the checkpoint out_path, every checksum verified;
// nothing is written unless all of it verifies.
Result<FileDecodeResult> decode_file(const FileDecodeRequest& request, Executor& executor);

}  // namespace deltacast::tools
