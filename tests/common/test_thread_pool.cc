#include <catch2/catch.hpp>

#include <atomic>
#include <vector>

#include "deltacast/common/thread_pool.h"

using namespace deltacast;

TEST_CASE("thread pool runs every index exactly once, call after call", "[common][pool]") {
  ThreadPool pool(4);
  CHECK(pool.concurrency() == 4);
  for (std::size_t count : {0, 1, 2, 3, 17, 1000}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::atomic<int>> hits(count);
      pool.parallel_for(count, [&](std::size_t i) { hits[i].fetch_add(1); });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
  }
}

TEST_CASE("inline executor runs in order", "[common][pool]") {
  InlineExecutor ex;
  std::vector<std::size_t> order;
  ex.parallel_for(5, [&](std::size_t i) { order.push_back(i); });
  CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4});
}
