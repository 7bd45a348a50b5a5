#include "file_codec.h"

#include <cstring>

#include "deltacast/io/mapped_file.h"
#include "deltacast/io/safetensors.h"

namespace deltacast::tools {

Result<FileEncodeResult> encode_file(const FileEncodeRequest& r, Executor& executor) {
  const bool anchor = r.base_path.empty();
  DC_ASSIGN_OR_RETURN(SafetensorsFile next, SafetensorsFile::open(r.next_path));
  std::optional<SafetensorsFile> base;
  if (!anchor) {
    DC_ASSIGN_OR_RETURN(base, SafetensorsFile::open(r.base_path));
    if (base->layout().tensors != next.layout().tensors)
      return Status::invalid_argument("base and new checkpoints have different tensor layouts; encode an anchor of the new one instead");
  }
  VersionEncodeOptions opt = r.options;
  if (r.sign_key) opt.payload_digest = runtime::payload_digest;
  const std::uint64_t version = r.version ? r.version : (anchor ? 1 : r.base_version + 1);
  DC_ASSIGN_OR_RETURN(EncodedVersion ev, encode_version(next.layout(), version, r.base_version, anchor ? ByteSpan() : base->image(),
                                                        next.image(), opt, executor));
  if (r.sign_key) runtime::sign_manifest_with_digests(ev.manifest, *r.sign_key);
  const Bytes prefix = container_prefix(ev.manifest);
  const std::uint64_t total = prefix.size() + ev.manifest.payload_bytes_total();
  DC_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(r.out_path, total));
  std::uint8_t* p = out.bytes().data();
  std::memcpy(p, prefix.data(), prefix.size());
  p += prefix.size();
  for (const auto& pl : ev.payloads) {
    std::memcpy(p, pl.data(), pl.size());
    p += pl.size();
  }
  DC_RETURN_IF_ERROR(out.commit());
  return FileEncodeResult{version, ev.manifest.chunks.size(), next.layout().image_size, total};
}

Result<FileDecodeResult> decode_file(const FileDecodeRequest& r, Executor& executor) {
  DC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(r.in_path));
  auto c = parse_container(file.bytes());
  if (!c.is_ok()) return c.status().with_context(r.in_path);
  const Manifest& m = c->manifest;
  FileDecodeResult result{m.version, m.chunks.size(), m.version_checksum, std::nullopt, m.image_size};
  if (!r.trusted.empty()) {
    Status st = runtime::verify_manifest(c->manifest_bytes, m, r.trusted);
    if (st.is_ok()) st = runtime::verify_payloads(m, c->payloads);
    if (!st.is_ok()) return st.with_context(r.in_path + ", nothing written");
    result.signer = m.signer;
  }
  std::optional<SafetensorsFile> base;
  if (m.kind == VersionKind::kDelta) {
    if (r.base_path.empty()) return Status::invalid_argument("a delta needs its base checkpoint: deltacast decode BASE.safetensors DELTA -o OUT");
    DC_ASSIGN_OR_RETURN(base, SafetensorsFile::open(r.base_path));
    if (base->layout().tensors != m.tensors) return Status::invalid_argument("the base checkpoint's tensor layout differs from the delta's");
  } else if (!r.base_path.empty()) {
    return Status::invalid_argument("an anchor decodes on its own: deltacast decode ANCHOR -o OUT");
  }
  // Written with pwrite as chunks come: a mapping of the new file would have the kernel fault
  // in and zero every page before the decoder overwrites it.
  DC_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(r.out_path, ModelLayout{m.tensors, m.metadata, m.image_size},
                                                                          OutputFile::Access::kWrites));
  const ChunkSink sink = [&writer](std::uint64_t offset, ByteSpan bytes) { return writer.write_image(offset, bytes); };
  const Status st = decode_version_to(m, c->payloads, base ? base->image() : ByteSpan(), sink, executor, r.progress);
  if (!st.is_ok()) return st.with_context("nothing written to " + r.out_path);
  DC_RETURN_IF_ERROR(writer.commit());
  return result;
}

}  // namespace deltacast::tools
