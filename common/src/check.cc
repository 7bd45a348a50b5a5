#include "deltacast/common/check.h"

#include <cstdio>
#include <cstdlib>

namespace deltacast {

void check_failed(const char* condition, const char* file, int line, const char* what) {
  std::fprintf(stderr, "deltacast: invariant broken at %s:%d: %s (%s); stopping\n", file, line, what, condition);
  std::fflush(stderr);
  std::abort();
}

}  // namespace deltacast
