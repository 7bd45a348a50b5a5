// Errors are values: every fallible operation returns a Status or a Result<T>.
// The code tells the caller what to do; the message tells a person what went wrong.
#pragma once
// Exported from libdeltacast, as everything the installed headers declare.
#pragma GCC visibility push(default)

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace deltacast {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller asked for something malformed: fix the call
  kCorruption,       // data failed a check: fetch it again, never use it
  kMismatch,         // data is intact but belongs to another version or base
  kIOError,          // the operating system refused: retry or report
  kNotFound,
  kUnsupported,      // a format or protocol version this build does not speak
  kResourceExhausted,// a bound was hit
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status mismatch(std::string msg) { return {StatusCode::kMismatch, std::move(msg)}; }
  static Status io_error(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  static Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status resource_exhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: chunk 3: payload hash mismatch"
  std::string to_string() const;
  // Prefixes the message with context, keeping the code: "chunk 3: " + message.
  Status with_context(std::string_view context) const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).is_ok()); }  // NOLINT

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { assert(is_ok()); return std::get<T>(v_); }
  const T& value() const& { assert(is_ok()); return std::get<T>(v_); }
  T&& value() && { assert(is_ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace deltacast

// Propagates a non-ok Status from an expression returning Status.
#define DC_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::deltacast::Status dc_status_ = (expr);         \
    if (!dc_status_.is_ok()) return dc_status_;      \
  } while (0)

#define DC_CONCAT_INNER(a, b) a##b
#define DC_CONCAT(a, b) DC_CONCAT_INNER(a, b)
// Declares `lhs` from a Result-returning expression, or returns its error.
#define DC_ASSIGN_OR_RETURN(lhs, expr) DC_ASSIGN_OR_RETURN_IMPL(DC_CONCAT(dc_result_, __LINE__), lhs, expr)
#define DC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#pragma GCC visibility pop
