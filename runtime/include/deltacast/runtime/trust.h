// End-to-end trust in versions: the origin signs every manifest with an Ed25519 key, the
// manifest vouches for every chunk payload with a BLAKE2b-256 digest, and relays and workers
// check both against the public keys they are configured to trust before they forward or apply
// anything (docs/RELIABILITY.md). Pure functions over caller-owned bytes (libsodium).
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/codec/manifest.h"
#include "deltacast/common/status.h"
#include "deltacast/runtime/interfaces.h"

namespace deltacast::runtime {

using PublicKey = std::array<std::uint8_t, kSignerKeyBytes>;

struct SigningKey {
  std::array<std::uint8_t, 64> secret{};  // libsodium's Ed25519 secret key (seed and public key)
  PublicKey public_key{};
};

// A fresh Ed25519 key pair.
SigningKey make_signing_key();
// Hex text of keys, as key files and configs hold them (64 hex digits for a public key).
std::string to_hex(std::span<const std::uint8_t> bytes);
Result<PublicKey> parse_public_key(const std::string& hex);
// InvalidArgument unless 128 hex digits whose last 32 bytes are the public key of the seed in the first.
Result<SigningKey> parse_signing_key(const std::string& secret_hex);

PayloadDigest payload_digest(ByteSpan payload);

// Fills every chunk's payload digest from `payloads` (one per chunk), marks the manifest signed
// by `key` and returns it serialized with the signature in place.
Bytes sign_manifest(Manifest& manifest, std::span<const ByteSpan> payloads, const SigningKey& key);
// The same for a manifest whose payload digests are already filled in (checked on arrival).
Bytes sign_manifest_with_digests(Manifest& manifest, const SigningKey& key);

// Checks that `serialized` (whose parse is `parsed`) is signed by one of `trusted` and that the
// signature holds. Corruption names what failed.
Status verify_manifest(ByteSpan serialized, const Manifest& parsed, const std::vector<PublicKey>& trusted);
// The same from the manifest's header alone (read_manifest_seal), before it is parsed.
Status verify_manifest(ByteSpan serialized, const ManifestSeal& seal, const std::vector<PublicKey>& trusted);

// Checks every payload of a signed manifest against its digest; Corruption names the first
// chunk that differs. The manifest's signature is verify_manifest's to check.
Status verify_payloads(const Manifest& signed_manifest, std::span<const ByteSpan> payloads);

// A fresh run identity: a start time (microseconds since the Unix epoch, the wall clock's now)
// and a nonce drawn from `random`. An origin that signs takes its start time from
// next_run_start() instead (transport/run_state.h), so that runs signed by one key stay ordered
// when its host's clock goes back.
RunId make_run_id(std::uint64_t unix_us, Random& random);

// A timestamp statement (docs/FORMAT.md, "Timestamp statement"; TUF's timestamp role): the
// origin says, signed, that `run` is the run it publishes now and `newest_version` its newest
// version, as of `issued_us` on its clock. The origin signs one every timestamp_interval_ms;
// relays pass the newest on; a worker that trusts keys exposes a version only while it holds a
// statement of that version's run no older than freshness_ms_max, so a replayed old run, a
// stale relay or a shard of another run cannot hand it weights the trainer is not publishing.
struct Timestamp {
  RunId run;
  std::uint64_t newest_version = 0;
  std::uint64_t issued_us = 0;  // microseconds since the Unix epoch, the origin's clock
  PublicKey signer{};
  std::array<std::uint8_t, kSignatureBytes> signature{};
};
inline constexpr std::size_t kTimestampBytes = 133;
// Signs `t` (setting signer and signature) and returns its 133 bytes.
Bytes sign_timestamp(Timestamp& t, const SigningKey& key);
// Reads a statement's fields; Unsupported for a format other than 1, Corruption for anything
// else but 133 well-formed bytes. Does not check the signature.
Result<Timestamp> parse_timestamp(ByteSpan bytes);
// Checks that `bytes` (whose parse is `parsed`) is signed by one of `trusted`.
Status verify_timestamp(ByteSpan bytes, const Timestamp& parsed, const std::vector<PublicKey>& trusted);

}  // namespace deltacast::runtime

#pragma GCC visibility pop
