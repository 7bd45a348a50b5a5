#include "deltacast/common/status.h"

namespace deltacast {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "Invalid argument";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kMismatch: return "Mismatch";
    case StatusCode::kIOError: return "IO error";
    case StatusCode::kNotFound: return "Not found";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kResourceExhausted: return "Resource exhausted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

}  // namespace deltacast
