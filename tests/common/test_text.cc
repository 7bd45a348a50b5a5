#include <catch2/catch.hpp>

#include <string>

#include "deltacast/common/text.h"

using namespace deltacast;

TEST_CASE("UTF-8 is checked as RFC 3629 defines it", "[common][text]") {
  for (const std::string& good : {std::string(""), std::string("plain"), std::string("model.layers.0.weight"), std::string("caf\xc3\xa9"),
                                 std::string("\xe2\x82\xac"), std::string("\xf0\x9f\x98\x80"), std::string("\xf4\x8f\xbf\xbf"),
                                 std::string("a\0b", 3), std::string("\x7f")})
    CHECK(is_utf8(good));
  for (const std::string& bad : {std::string("\x80"),                 // a lone continuation byte
                                std::string("\xc0\xaf"),             // overlong '/'
                                std::string("\xc1\xbf"),             // overlong
                                std::string("\xe0\x80\xaf"),         // overlong, three bytes
                                std::string("\xf0\x80\x80\xaf"),     // overlong, four bytes
                                std::string("\xed\xa0\x80"),         // a UTF-16 surrogate
                                std::string("\xf4\x90\x80\x80"),     // above U+10FFFF
                                std::string("\xf5\x80\x80\x80"),     // no such lead byte
                                std::string("caf\xc3"),              // cut off
                                std::string("\xe2\x82"),             // cut off
                                std::string("\xe2\x28\xa1")})        // a continuation that is not one
    CHECK_FALSE(is_utf8(bad));
  CHECK(utf8_sequence_bytes("\xf0\x9f\x98\x80", 0) == 4);
  CHECK(utf8_sequence_bytes("a\xc3\xa9", 1) == 2);
}
