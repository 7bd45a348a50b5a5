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

// Checks every payload of a signed manifest against its digest; Corruption names the first
// chunk that differs. The manifest's signature is verify_manifest's to check.
Status verify_payloads(const Manifest& signed_manifest, std::span<const ByteSpan> payloads);

// A fresh run identity: the current wall-clock time and a random nonce.
RunId make_run_id();

}  // namespace deltacast::runtime

#pragma GCC visibility pop
