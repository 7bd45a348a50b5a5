// An adaptive binary range coder (the construction LZMA uses: 32-bit range, 11-bit
// probabilities that move 1/32 of the way toward each coded bit, carry propagated through a
// cached byte), and a plain bit packer. Internal to the codec; docs/FORMAT.md specifies the
// bytes they produce.
#pragma once

#include <cstdint>
#include <cstring>

#include "deltacast/common/bytes.h"

namespace deltacast::rc {

inline constexpr int kProbBits = 11;
inline constexpr std::uint16_t kProbInit = 1u << (kProbBits - 1);  // one half
inline constexpr int kMoveBits = 5;
inline constexpr std::uint32_t kTop = 1u << 24;

// The probability that the next bit is 0, in units of 2^-11.
using Prob = std::uint16_t;

class Encoder {
 public:
  explicit Encoder(Bytes& out) : out_(out) {}
  void bit(Prob& p, unsigned b) {
    const std::uint32_t bound = (range_ >> kProbBits) * p;
    if (b == 0) {
      range_ = bound;
      p = static_cast<Prob>(p + (((1u << kProbBits) - p) >> kMoveBits));
    } else {
      low_ += bound;
      range_ -= bound;
      p = static_cast<Prob>(p - (p >> kMoveBits));
    }
    while (range_ < kTop) {
      range_ <<= 8;
      shift_low();
    }
  }
  // Ends the body: after this, a decoder has every byte it will read.
  void finish() {
    for (int i = 0; i < 5; ++i) shift_low();
  }

 private:
  void shift_low() {
    if (static_cast<std::uint32_t>(low_) < 0xff000000u || (low_ >> 32) != 0) {
      const auto carry = static_cast<std::uint8_t>(low_ >> 32);
      std::uint8_t byte = cache_;
      do {
        out_.push_back(static_cast<std::uint8_t>(byte + carry));
        byte = 0xff;
      } while (--pending_ != 0);
      cache_ = static_cast<std::uint8_t>(low_ >> 24);
    }
    pending_++;
    low_ = (low_ & 0x00ffffffu) << 8;
  }
  Bytes& out_;
  std::uint64_t low_ = 0;
  std::uint32_t range_ = 0xffffffffu;
  std::uint8_t cache_ = 0;
  std::uint64_t pending_ = 1;
};

// Never reads outside its span: past the end it reads zeros and remembers that it did, which
// the caller reports as corruption (overran()).
class Decoder {
 public:
  explicit Decoder(ByteSpan in) : p_(in.data()), end_(in.data() + in.size()) {
    for (int i = 0; i < 5; ++i) code_ = (code_ << 8) | next();
  }
  // Branch-free but for renormalisation: the bits coded here are often close to even odds,
  // where a branch on them mispredicts half the time.
  unsigned bit(Prob& p) {
    const std::uint32_t bound = (range_ >> kProbBits) * p;
    const unsigned b = code_ >= bound;
    const std::uint32_t ones = 0u - b;
    code_ -= bound & ones;
    range_ = ((range_ - bound) & ones) | (bound & ~ones);
    const std::uint32_t up = ((1u << kProbBits) - p) >> kMoveBits, down = p >> kMoveBits;
    p = static_cast<Prob>(p + (up & ~ones) - (down & ones));
    if (range_ < kTop) {  // one byte always suffices: range >= 2^24 before a bit, >= 2^13 after
      range_ <<= 8;
      code_ = (code_ << 8) | next();
    }
    return b;
  }
  bool overran() const { return overrun_; }
  // Bytes not read; a well-formed body is read exactly to its end.
  std::size_t unread() const { return static_cast<std::size_t>(end_ - p_); }

 private:
  std::uint32_t next() {
    if (p_ == end_) {
      overrun_ = true;
      return 0;
    }
    return *p_++;
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  std::uint32_t code_ = 0;
  std::uint32_t range_ = 0xffffffffu;
  bool overrun_ = false;
};

// Bits packed least significant first, as values of up to 32 bits.
class BitWriter {
 public:
  explicit BitWriter(Bytes& out) : out_(out) {}
  void put(std::uint32_t value, int bits) {
    if (bits == 0) return;
    acc_ |= static_cast<std::uint64_t>(value & ((std::uint64_t{1} << bits) - 1)) << fill_;
    fill_ += bits;
    while (fill_ >= 8) {
      out_.push_back(static_cast<std::uint8_t>(acc_));
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  // q zero bits, then a one.
  void unary(std::uint32_t q) {
    for (; q >= 32; q -= 32) put(0, 32);
    put(std::uint32_t{1} << q, static_cast<int>(q) + 1);
  }
  void finish() {
    if (fill_ > 0) out_.push_back(static_cast<std::uint8_t>(acc_));
    acc_ = 0;
    fill_ = 0;
  }

 private:
  Bytes& out_;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
};

// Reads past the end as zeros and remembers it (overran()).
class BitReader {
 public:
  explicit BitReader(ByteSpan in) : p_(in.data()), end_(in.data() + in.size()) {}
  std::uint32_t get(int bits) {
    if (bits == 0) return 0;
    if (fill_ < bits) {
      refill();
      while (fill_ < bits) {  // past the end
        overrun_ = true;
        fill_ += 8;
      }
    }
    const auto v = static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    fill_ -= bits;
    return v;
  }
  // Zero bits up to the next one bit (consumed too), or more than `max` of them: max + 1.
  std::uint32_t unary(std::uint32_t max) {
    std::uint32_t q = 0;
    for (;;) {
      refill();
      if (acc_ != 0) {
        const int z = __builtin_ctzll(acc_);  // below fill_: bits above it are zero
        q += static_cast<std::uint32_t>(z);
        acc_ >>= z;
        acc_ >>= 1;
        fill_ -= z + 1;
        return std::min(q, max + 1);
      }
      q += static_cast<std::uint32_t>(fill_);
      fill_ = 0;
      if (p_ == end_) {
        overrun_ = true;
        return max + 1;
      }
      if (q > max) return max + 1;
    }
  }
  bool overran() const { return overrun_; }
  // True when every byte was read and the bits left over in the last one are zero.
  bool exhausted_cleanly() const { return p_ == end_ && fill_ < 8 && acc_ == 0; }

 private:
  // Tops the buffer up to at least 56 bits, or to the end of the input: a word at a time where
  // eight bytes remain (the part of a byte that did not fit is read again next time).
  void refill() {
    if (end_ - p_ >= 8) {
      std::uint64_t word;
      std::memcpy(&word, p_, 8);
      acc_ |= word << fill_;
      p_ += (63 - fill_) >> 3;
      fill_ |= 56;
      acc_ &= ~std::uint64_t{0} >> (64 - fill_);  // nothing above fill_, as unary() expects
      return;
    }
    while (fill_ <= 56 && p_ < end_) {
      acc_ |= static_cast<std::uint64_t>(*p_++) << fill_;
      fill_ += 8;
    }
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
  std::uint64_t acc_ = 0;
  int fill_ = 0;
  bool overrun_ = false;
};

}  // namespace deltacast::rc
