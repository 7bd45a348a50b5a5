#include "deltacast/runtime/trust.h"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>

namespace deltacast::runtime {
namespace {

// libsodium must be initialised once before use; sodium_init() is safe to call repeatedly and
// from several threads.
void ensure_sodium() {
  if (sodium_init() < 0) std::abort();  // no usable randomness source: nothing can be signed
}

Status parse_hex(const std::string& hex, std::span<std::uint8_t> out, const char* what) {
  std::size_t len = 0;
  if (hex.size() != out.size() * 2 ||
      sodium_hex2bin(out.data(), out.size(), hex.data(), hex.size(), nullptr, &len, nullptr) != 0 || len != out.size())
    return Status::invalid_argument(std::string(what) + " must be " + std::to_string(out.size() * 2) + " hex digits");
  return Status::ok();
}

}  // namespace

SigningKey make_signing_key() {
  ensure_sodium();
  SigningKey k;
  crypto_sign_ed25519_keypair(k.public_key.data(), k.secret.data());
  return k;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  std::string out(bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), bytes.data(), bytes.size());
  out.pop_back();
  return out;
}

Result<PublicKey> parse_public_key(const std::string& hex) {
  PublicKey k;
  DC_RETURN_IF_ERROR(parse_hex(hex, k, "an Ed25519 public key"));
  return k;
}

Result<SigningKey> parse_signing_key(const std::string& secret_hex) {
  SigningKey k;
  DC_RETURN_IF_ERROR(parse_hex(secret_hex, k.secret, "an Ed25519 secret key"));
  ensure_sodium();
  crypto_sign_ed25519_sk_to_pk(k.public_key.data(), k.secret.data());
  // The last 32 bytes are the public key of the seed in the first 32: a key whose halves
  // disagree would sign with one key and name another.
  std::array<std::uint8_t, 32> seed{};
  PublicKey derived{};
  std::array<std::uint8_t, 64> again{};
  crypto_sign_ed25519_sk_to_seed(seed.data(), k.secret.data());
  crypto_sign_ed25519_seed_keypair(derived.data(), again.data(), seed.data());
  sodium_memzero(again.data(), again.size());
  sodium_memzero(seed.data(), seed.size());
  if (derived != k.public_key) return Status::invalid_argument("an Ed25519 secret key whose last 32 bytes are not the public key of its seed");
  return k;
}

PayloadDigest payload_digest(ByteSpan payload) {
  ensure_sodium();
  PayloadDigest d;
  crypto_generichash(d.data(), d.size(), payload.data(), payload.size(), nullptr, 0);
  return d;
}

Bytes sign_manifest_with_digests(Manifest& m, const SigningKey& key) {
  ensure_sodium();
  m.is_signed = true;
  m.signer = key.public_key;
  m.signature = {};
  Bytes bytes = serialize_manifest(m);
  const ByteSpan covered = manifest_signed_bytes(bytes);
  crypto_sign_ed25519_detached(m.signature.data(), nullptr, covered.data(), covered.size(), key.secret.data());
  std::copy(m.signature.begin(), m.signature.end(), bytes.end() - static_cast<std::ptrdiff_t>(kSignatureBytes));
  return bytes;
}

Bytes sign_manifest(Manifest& m, std::span<const ByteSpan> payloads, const SigningKey& key) {
  for (std::size_t i = 0; i < m.chunks.size() && i < payloads.size(); ++i) m.chunks[i].payload_digest = payload_digest(payloads[i]);
  return sign_manifest_with_digests(m, key);
}

Status verify_manifest(ByteSpan serialized, const ManifestSeal& seal, const std::vector<PublicKey>& trusted) {
  if (!seal.is_signed) return Status::corruption("manifest of v" + std::to_string(seal.version) + " is not signed, and this node trusts only signed versions");
  if (std::find(trusted.begin(), trusted.end(), seal.signer) == trusted.end())
    return Status::corruption("manifest of v" + std::to_string(seal.version) + " is signed by key " + to_hex(seal.signer) +
                              ", which this node does not trust");
  ensure_sodium();
  if (serialized.size() < kSignatureBytes + kSignerKeyBytes) return Status::corruption("manifest of v" + std::to_string(seal.version) + " truncated");
  const ByteSpan covered = manifest_signed_bytes(serialized);
  if (crypto_sign_ed25519_verify_detached(serialized.data() + covered.size(), covered.data(), covered.size(), seal.signer.data()) != 0)
    return Status::corruption("manifest of v" + std::to_string(seal.version) + ": the signature does not verify");
  return Status::ok();
}

Status verify_manifest(ByteSpan serialized, const Manifest& parsed, const std::vector<PublicKey>& trusted) {
  return verify_manifest(serialized, ManifestSeal{parsed.version, parsed.is_signed, parsed.signer}, trusted);
}

Status verify_payloads(const Manifest& m, std::span<const ByteSpan> payloads) {
  if (!m.is_signed) return Status::corruption("manifest of v" + std::to_string(m.version) + " is not signed: its payloads have no digests");
  if (payloads.size() != m.chunks.size())
    return Status::corruption(std::to_string(payloads.size()) + " payloads for " + std::to_string(m.chunks.size()) + " chunks");
  for (std::size_t i = 0; i < payloads.size(); ++i)
    if (payload_digest(payloads[i]) != m.chunks[i].payload_digest)
      return Status::corruption("chunk " + std::to_string(i) + " of v" + std::to_string(m.version) + " does not match the digest its signed manifest gives");
  return Status::ok();
}

namespace {
constexpr std::uint32_t kTimestampMagic = 0x53544344;  // "DCTS" little-endian
constexpr std::uint8_t kTimestampFormat = 1;
constexpr std::size_t kTimestampSignedBytes = kTimestampBytes - kSignatureBytes;
}  // namespace

Bytes sign_timestamp(Timestamp& t, const SigningKey& key) {
  ensure_sodium();
  t.signer = key.public_key;
  Bytes out;
  ByteWriter w(out);
  w.u32(kTimestampMagic);
  w.u8(kTimestampFormat);
  w.u64(t.run.started_us);
  w.u64(t.run.nonce);
  w.u64(t.newest_version);
  w.u64(t.issued_us);
  w.bytes(t.signer);
  crypto_sign_ed25519_detached(t.signature.data(), nullptr, out.data(), out.size(), key.secret.data());
  w.bytes(t.signature);
  return out;
}

Result<Timestamp> parse_timestamp(ByteSpan bytes) {
  if (bytes.size() != kTimestampBytes)
    return Status::corruption("a timestamp statement is " + std::to_string(kTimestampBytes) + " bytes, not " + std::to_string(bytes.size()));
  ByteReader r(bytes);
  std::uint32_t magic = 0;
  std::uint8_t format = 0;
  Timestamp t;
  ByteSpan signer, signature;
  if (!r.u32(magic) || magic != kTimestampMagic) return Status::corruption("not a timestamp statement (bad magic)");
  if (!r.u8(format)) return Status::corruption("timestamp statement truncated");
  if (format != kTimestampFormat) return Status::unsupported("timestamp statement format " + std::to_string(format) + ", this build reads 1");
  if (!r.u64(t.run.started_us) || !r.u64(t.run.nonce) || !r.u64(t.newest_version) || !r.u64(t.issued_us) ||
      !r.bytes(t.signer.size(), signer) || !r.bytes(t.signature.size(), signature))
    return Status::corruption("timestamp statement truncated");
  std::copy(signer.begin(), signer.end(), t.signer.begin());
  std::copy(signature.begin(), signature.end(), t.signature.begin());
  if (t.run.empty()) return Status::corruption("timestamp statement names no run");
  return t;
}

Status verify_timestamp(ByteSpan bytes, const Timestamp& t, const std::vector<PublicKey>& trusted) {
  if (std::find(trusted.begin(), trusted.end(), t.signer) == trusted.end())
    return Status::corruption("timestamp statement of run " + to_string(t.run) + " is signed by key " + to_hex(t.signer) +
                              ", which this node does not trust");
  ensure_sodium();
  if (bytes.size() != kTimestampBytes ||
      crypto_sign_ed25519_verify_detached(bytes.data() + kTimestampSignedBytes, bytes.data(), kTimestampSignedBytes, t.signer.data()) != 0)
    return Status::corruption("timestamp statement of run " + to_string(t.run) + ": the signature does not verify");
  return Status::ok();
}

RunId make_run_id(std::uint64_t unix_us, Random& random) {
  RunId r;
  r.started_us = unix_us;
  r.nonce = random.nonzero_u64();
  return r;
}

}  // namespace deltacast::runtime
