#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "reorder.h"

using deltacast::transport::Reorder;

TEST_CASE("a striped link's messages come out in the order sent", "[transport][reorder]") {
  Reorder<int> r(1000, 5000);
  std::vector<int> out;
  r.add(7, 3, 3, 10, 0, out);
  r.add(7, 2, 2, 10, 0, out);
  CHECK(out.empty());
  CHECK(r.held() == 2);
  CHECK(r.held_bytes() == 20);
  r.add(7, 1, 1, 10, 0, out);
  CHECK(out == std::vector<int>{1, 2, 3});
  CHECK(r.held() == 0);
  CHECK(r.held_bytes() == 0);
  r.add(7, 4, 4, 10, 0, out);
  CHECK(out.back() == 4);
  r.add(7, 6, 6, 10, 0, out);
  r.add(7, 6, 66, 10, 0, out);  // the same number twice: the first stands
  CHECK(r.held() == 1);
  r.add(7, 5, 5, 10, 0, out);
  CHECK(out == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(r.gaps_skipped() == 0);
}

TEST_CASE("a gap is given up after its timeout or when the held bytes pass the bound", "[transport][reorder]") {
  std::vector<int> out;
  Reorder<int> timed(1000, 5000);
  timed.add(1, 2, 2, 10, 100, out);
  timed.add(1, 3, 3, 10, 200, out);
  timed.expire(5099, out);
  CHECK(out.empty());
  timed.expire(5100, out);  // message 1 died with its connection
  CHECK(out == std::vector<int>{2, 3});
  CHECK(timed.gaps_skipped() == 1);
  timed.add(1, 1, 1, 10, 5200, out);  // late, not lost: delivered as it comes
  CHECK(out.back() == 1);
  timed.add(1, 4, 4, 10, 5200, out);
  CHECK(out.back() == 4);

  out.clear();
  Reorder<int> bounded(25, 60000);
  bounded.add(1, 2, 2, 10, 0, out);
  bounded.add(1, 3, 3, 10, 0, out);
  CHECK(out.empty());
  bounded.add(1, 5, 5, 10, 0, out);  // 30 bytes held: past 25, so the gap before 2 goes
  CHECK(out == std::vector<int>{2, 3});
  CHECK(bounded.held() == 1);  // 5 still waits for 4
  CHECK(bounded.held_bytes() == 10);
}

TEST_CASE("a new stream releases what the old one held and counts from 1", "[transport][reorder]") {
  std::vector<int> out;
  Reorder<int> r(1000, 5000);
  r.add(1, 1, 1, 10, 0, out);
  r.add(1, 3, 3, 10, 0, out);
  CHECK(out == std::vector<int>{1});
  r.add(2, 2, 22, 10, 0, out);  // the parent took this child again: a new stream
  CHECK(out == std::vector<int>{1, 3});
  r.add(2, 1, 21, 10, 0, out);
  CHECK(out == std::vector<int>{1, 3, 21, 22});
}
