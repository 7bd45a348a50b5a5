// Encoding and decoding whole versions: chunk planning, parallel per-chunk coding on a
// caller-supplied Executor, and every checksum check in order.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "deltacast/codec/chunk.h"
#include "deltacast/codec/manifest.h"
#include "deltacast/common/executor.h"
#include "deltacast/common/object_pool.h"

namespace deltacast {

inline constexpr std::uint64_t kDefaultChunkBytes = 4u << 20;

// Encoders and decoders kept between versions by their owner (a publisher, a node): each task
// an executor runs at once leases one.
using ChunkEncoderPool = ObjectPool<ChunkEncoder>;
using ChunkDecoderPool = ObjectPool<ChunkDecoder>;

// Called from executor threads with the number of image bytes done so far; must be thread-safe.
using ProgressFn = std::function<void(std::uint64_t done_bytes, std::uint64_t total_bytes)>;

struct VersionEncodeOptions {
  std::uint64_t chunk_bytes = kDefaultChunkBytes;
  // Every tensor of at least a quarter of chunk_bytes starts and ends chunks of its own, so that a
  // worker serving some tensors only (codec/subset.h) takes few bytes of its neighbours; small
  // tensors still share chunks.
  bool tensor_cuts = true;
  ChunkEncodeOptions chunk = ChunkEncodeOptions::defaults();
  // The chunk hashes: state hashes (manifest format 3), or xxh3 (formats 1 and 2, as deltacast
  // wrote before state hashes; for comparisons and for readers that know only those).
  ChunkHashScheme hash_scheme = ChunkHashScheme::kState;
  ProgressFn progress;
  // When set, fills every chunk's payload_digest as its payload is made, on the executor's
  // threads (runtime::payload_digest, for a publisher that signs): signing then hashes nothing.
  std::function<PayloadDigest(ByteSpan payload)> payload_digest;
  // False: each payload is hashed (and digested) as it is made, then let go; EncodedVersion's
  // payloads stay empty. For a holder that makes an anchor's payloads again when it sends them
  // (encode_anchor_chunk) instead of keeping most of an image's worth of them.
  bool keep_payloads = true;
};

struct ModelLayout {
  std::vector<TensorInfo> tensors;  // in image order
  std::vector<std::pair<std::string, std::string>> metadata;
  std::uint64_t image_size = 0;
  // A trainer shard's slice: where each tensor lies in the merged version's tensor of its name
  // (one per tensor; empty otherwise). Chunks then end wherever a tensor that is not whole
  // begins or ends, so that merge_shards can place them.
  std::vector<TensorPart> parts;
};

struct EncodedVersion {
  Manifest manifest;
  std::vector<Bytes> payloads;  // one per manifest chunk
  ChunkStats stats;             // summed over chunks
  bool payload_digests = false; // every chunk's payload_digest is filled in (options.payload_digest)
};

// A delta from `base` to `next` (same layout), or an anchor of `next` when base is empty.
// Returns InvalidArgument for inconsistent inputs.
// `encoders`: where the executor's tasks lease encoders (null: a pool for this call alone).
Result<EncodedVersion> encode_version(const ModelLayout& layout, std::uint64_t version, std::uint64_t base_version,
                                      ByteSpan base, ByteSpan next, const VersionEncodeOptions& options, Executor& executor,
                                      ChunkEncoderPool* encoders = nullptr);

// Makes payload `index` of the anchor `manifest` again, from the image it was made of and with
// the options it was made with (an encode with keep_payloads false, say). Corruption when the
// payload made is not the one the manifest names: the image is no longer that version's.
Result<Bytes> encode_anchor_chunk(const Manifest& manifest, std::size_t index, ByteSpan image, const VersionEncodeOptions& options,
                                  ChunkEncoder& encoder);

// Writes the new image's bytes [offset, offset + out.size()) into `out`; called from the
// executor's threads, for disjoint ranges.
using ImageReader = std::function<Status(std::uint64_t offset, MutableByteSpan out)>;

// encode_version with the new image read through `read_next` a chunk at a time instead of held
// whole, and written over `image` as each chunk is encoded: a delta from the version `image`
// holds (base_version > 0), or an anchor (base_version 0; `image` is only written). `image` then
// holds the new version; after a failure it holds parts of both and is no one's base. Memory:
// `image` and a chunk per task running at once, where encode_version needs two images.
Result<EncodedVersion> encode_version_into(const ModelLayout& layout, std::uint64_t version, std::uint64_t base_version,
                                           MutableByteSpan image, const ImageReader& read_next, const VersionEncodeOptions& options,
                                           Executor& executor, ChunkEncoderPool* encoders = nullptr);

// Checks and decodes chunk `index` of `manifest`:
//   payload size and hash -> segments -> decode, hashing the base bytes (deltas) -> base hash
//   -> write, hashing the result -> content hash.
// `base_range` holds the base bytes of the chunk's range (deltas; may be out_range itself for
// in-place apply), `out_range` receives the new bytes. Any failure names the chunk; until the
// content hash check every failure of a delta leaves out_range untouched (an anchor's may leave
// it written: ChunkDecoder::decode). `changed`: as ChunkDecoder::decode.
Status decode_chunk_verified(const Manifest& manifest, std::size_t index, ByteSpan payload, ByteSpan base_range,
                             MutableByteSpan out_range, ChunkDecoder& decoder, std::vector<std::uint32_t>* changed = nullptr);

// Checks and applies delta chunk `index` of `manifest` (state hashes, format 3) to `range`,
// which holds the base and whose state hash its holder tracks as `held_state`: payload size
// and hash, then ChunkDecoder::apply_sparse, which writes only the values that change and
// nothing at all on any failure. base_mismatch() when held_state is not the chunk's base hash.
// `changed` and `patch`: as ChunkDecoder::apply_sparse.
Status apply_chunk_sparse(const Manifest& manifest, std::size_t index, ByteSpan payload, MutableByteSpan range,
                          std::uint64_t held_state, ChunkDecoder& decoder, std::vector<std::uint32_t>* changed = nullptr,
                          ChunkPatch* patch = nullptr);

// Decodes every chunk into `out` (image_size bytes) in parallel, then checks the version
// checksum. `base` is the whole base image for deltas (may be `out` itself for in-place apply).
// A delta's payload hashes are all checked before anything is written, so corrupt or truncated
// input leaves `out` untouched. Base hashes are checked before anything is written in place
// (the live base stays as it was), and chunk by chunk into separate memory: a mismatched base
// may leave `out` partly written, never `base`. An anchor's payloads are checked chunk by chunk
// as they decode (each read once, from cache): a corrupt anchor may leave `out` partly written
// (unless `base` is `out`: then all are checked first, as for a delta in place).
// Returns the first failure by chunk order. `decoders`: where the executor's tasks lease
// decoders (null: a pool for this call alone).
Status decode_version(const Manifest& manifest, std::span<const ByteSpan> payloads, ByteSpan base, MutableByteSpan out,
                      Executor& executor, const ProgressFn& progress = {}, ChunkDecoderPool* decoders = nullptr);

// Where decode_version_to hands each decoded chunk: its offset in the image and its bytes,
// valid during the call. Called from the executor's threads, concurrently, once per chunk.
using ChunkSink = std::function<Status(std::uint64_t offset, ByteSpan bytes)>;

// decode_version into a sink instead of an image in memory (a file written with pwrite, whose
// pages then need not be faulted in and zeroed first): each chunk is decoded into a buffer of
// its own and handed over. The same checks, so an anchor's chunks before a corrupt one may have
// been handed over (a file is committed only on success). A failure of the sink is returned.
// Never in place.
Status decode_version_to(const Manifest& manifest, std::span<const ByteSpan> payloads, ByteSpan base, const ChunkSink& sink,
                         Executor& executor, const ProgressFn& progress = {}, ChunkDecoderPool* decoders = nullptr);

// Merges the slices of one version that several trainer shards encoded separately into one
// version. Chunks and payloads are reused as they are; tensor and chunk offsets move, the
// checksums are recomputed. Fails if the slices disagree on version, base or kind.
//   - Slices without parts (each a disjoint set of whole tensors, its own image): the merged
//     image is the shards' images back to back in order. Fails if two share a tensor name.
//   - Slices with parts (Manifest::parts; a shard may hold rows of a tensor): each tensor of the
//     merged version is whole under its name, made of the parts of that name, which must cover
//     its rows exactly once with one dtype and the same other dims; tensors in the order they
//     first appear (slice 0's first). Fails if a chunk spans tensors that are apart in the
//     merged image (the slice was not encoded with its parts in its ModelLayout).
Result<EncodedVersion> merge_shards(std::vector<EncodedVersion> shards);

// The on-disk container: header, manifest, payloads. Layout: docs/FORMAT.md, "container".
inline constexpr std::uint32_t kContainerFormatVersion = 1;
inline constexpr std::uint64_t kManifestBytesMax = 1ull << 32;
// Header and manifest; the payloads follow in chunk order.
Bytes container_prefix(const Manifest& manifest);
// A whole container in memory: the prefix, then every payload.
Bytes container_bytes(const EncodedVersion& version);
struct ContainerView {
  Manifest manifest;
  ByteSpan manifest_bytes;         // the manifest as serialized (what a signature covers)
  std::vector<ByteSpan> payloads;  // point into the parsed buffer
};
Result<ContainerView> parse_container(ByteSpan file);

}  // namespace deltacast

#pragma GCC visibility pop
