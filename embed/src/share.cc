// One image per host: the sharing worker's socket server and the reader that attaches to it.
// Packets on the SOCK_SEQPACKET socket (docs/RUNTIME.md, "One image per host"):
//   worker -> reader  kVersion  u8 1, u64 lease, u64 image bytes, u64 table bytes; two
//                               descriptors: the image (read-only) and its tables (a sealed memfd)
//                     kRefused  u8 2, the reason as text
//   reader -> worker  kRelease  u8 1, u64 lease
//                     kHold     u8 2, run (u64 started_us, u64 nonce), u64 version
//                     kReport   u8 3, u8 reported, run, u64 version, failed run, u64 failed version,
//                               error (varint length, at most kErrorBytesMax, bytes)
#include "deltacast/embed/share.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "deltacast/codec/manifest.h"

namespace deltacast::embed {
namespace {

constexpr std::uint32_t kTablesMagic = 0x56534344;  // "DCSV"
constexpr std::uint8_t kTablesFormat = 2;
constexpr std::uint64_t kTensorsMax = 1u << 22;
constexpr std::uint64_t kChangeSetsMax = 1u << 16;
constexpr std::size_t kErrorBytesMax = 4096;
constexpr std::size_t kPacketBytesMax = 8192;
constexpr std::uint64_t kReconnectMsMin = 100, kReconnectMsMax = 2000;  // a reader attaching again
enum : std::uint8_t { kVersion = 1, kRefused = 2 };
enum : std::uint8_t { kRelease = 1, kHold = 2, kReport = 3 };

std::string errno_text() { return std::strerror(errno); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

Status socket_address(const std::string& path, sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status::invalid_argument("share path '" + path + "': 1 to " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  return Status::ok();
}

void put_run(ByteWriter& w, const RunId& run) {
  w.u64(run.started_us);
  w.u64(run.nonce);
}
bool get_run(ByteReader& r, RunId& run) { return r.u64(run.started_us) && r.u64(run.nonce); }

// Wakes the thread that polls an eventfd.
void wake_up(int eventfd) {
  const std::uint64_t one = 1;
  (void)!::write(eventfd, &one, sizeof one);
}

// One datagram, with up to two descriptors; false with errno set when it could not go.
bool send_packet(int fd, ByteSpan bytes, std::span<const int> fds = {}) {
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

}  // namespace

// ---- the tables --------------------------------------------------------------------------

Bytes serialize_shared_version(const runtime::ModelVersion& v) {
  Bytes out;
  ByteWriter w(out);
  w.u32(kTablesMagic);
  w.u8(kTablesFormat);
  w.u64(v.version);
  w.u64(v.base_version);
  put_run(w, v.run);
  w.u64(v.checksum);
  w.u64(v.ready_us);
  write_layout_tables(w, v.metadata, v.tensors);
  w.varint(v.chunk_states.size());
  for (const auto& c : v.chunk_states) {
    w.u64(c.offset);
    w.u64(c.length);
    w.u64(c.state);
    w.u8(c.held ? 1 : 0);
  }
  std::size_t sets = 0;
  for (const auto& set : v.changes) sets += set != nullptr;
  w.varint(sets);
  for (const auto& set : v.changes) {
    if (!set) continue;
    w.u64(set->version);
    w.u64(set->base_version);
    w.u64(set->checksum);
    w.u64(set->base_checksum);
    w.varint(set->chunks.size());
    for (const auto& c : set->chunks) {
      w.u64(c.offset);
      w.u64(c.first);
    }
    w.varint(set->positions.size());
    for (std::uint32_t p : set->positions) w.u32(p);
    w.varint(set->old_values.size());
    w.bytes(set->old_values);
    w.varint(set->tensor_old_first.size());
    for (std::uint64_t f : set->tensor_old_first) w.u64(f);
  }
  return out;
}

Result<std::unique_ptr<runtime::ModelVersion>> parse_shared_version(ByteSpan meta, Image image) {
  ByteReader r(meta);
  auto v = std::make_unique<runtime::ModelVersion>();
  auto bad = [](const std::string& what) { return Status::corruption("a shared version's tables: " + what); };
  std::uint32_t magic = 0;
  std::uint8_t format = 0;
  if (!r.u32(magic) || magic != kTablesMagic) return bad("not a version's tables");
  if (!r.u8(format) || format != kTablesFormat) return Status::unsupported("a shared version's tables in format " + std::to_string(format) + ", not " + std::to_string(kTablesFormat) + ": the worker and this reader are different builds");
  if (!r.u64(v->version) || !r.u64(v->base_version) || !get_run(r, v->run) || !r.u64(v->checksum) || !r.u64(v->ready_us)) return bad("truncated");
  DC_RETURN_IF_ERROR(read_layout_tables(r, kTensorsMax, v->metadata, v->tensors).with_context("a shared version's tables"));
  DC_RETURN_IF_ERROR(validate_names(v->tensors, v->metadata).with_context("a shared version's tables"));
  DC_RETURN_IF_ERROR(validate_tensors(v->tensors, image.size()).with_context("a shared version's tables"));
  std::uint64_t count = 0;
  if (!r.varint(count) || count > r.remaining() / 25) return bad("bad chunk state count");
  v->chunk_states.resize(count);
  std::uint64_t end = 0;
  for (auto& c : v->chunk_states) {
    std::uint8_t held = 0;
    if (!r.u64(c.offset) || !r.u64(c.length) || !r.u64(c.state) || !r.u8(held) || held > 1) return bad("truncated chunk states");
    c.held = held == 1;
    if (c.offset != end || c.length > image.size() - c.offset) return bad("chunk states that do not tile the image");
    end = c.offset + c.length;
  }
  if (!v->chunk_states.empty() && end != image.size()) return bad("chunk states that do not tile the image");
  if (!r.varint(count) || count > kChangeSetsMax || count > r.remaining() / 36) return bad("bad change set count");
  for (std::uint64_t i = 0; i < count; ++i) {
    auto set = std::make_shared<runtime::ChangeSet>();
    std::uint64_t n = 0;
    if (!r.u64(set->version) || !r.u64(set->base_version) || !r.u64(set->checksum) || !r.u64(set->base_checksum)) return bad("truncated change set");
    if (!r.varint(n) || n > r.remaining() / 16) return bad("bad change set chunk count");
    set->chunks.resize(n);
    for (auto& c : set->chunks)
      if (!r.u64(c.offset) || !r.u64(c.first)) return bad("truncated change set chunks");
    if (!r.varint(n) || n > r.remaining() / 4) return bad("bad change count");
    set->positions.resize(n);
    for (auto& p : set->positions)
      if (!r.u32(p)) return bad("truncated changes");
    ByteSpan old;
    if (!r.varint(n) || !r.bytes(n, old)) return bad("truncated old values");
    set->old_values.assign(old.begin(), old.end());
    if (!r.varint(n) || n > r.remaining() / 8 || (n != 0 && n != v->tensors.size())) return bad("bad old value table");
    set->tensor_old_first.resize(n);
    for (auto& f : set->tensor_old_first)
      if (!r.u64(f)) return bad("truncated old value table");
    v->changes.push_back(std::move(set));
  }
  if (r.remaining() != 0) return bad(std::to_string(r.remaining()) + " bytes after the tables");
  v->image = std::move(image);
  return v;
}

// ---- the worker's side -------------------------------------------------------------------

namespace {

// One version as readers get it: the version (held, so the worker writes nothing into its
// image), its image read-only and its tables, as descriptors sent to each reader.
struct SharedVersion {
  std::shared_ptr<const runtime::ModelVersion> v;
  int image_fd = -1;
  int tables_fd = -1;
  std::uint64_t tables_bytes = 0;
  ~SharedVersion() {
    close_fd(image_fd);
    close_fd(tables_fd);
  }
};

struct Reader {
  int fd = -1;
  std::map<std::uint64_t, std::shared_ptr<SharedVersion>> leases;
  std::shared_ptr<SharedVersion> sent;  // the newest it was sent
  std::optional<std::pair<RunId, std::uint64_t>> hold;
  std::optional<std::pair<runtime::ModelState, std::string>> report;
};

// The tables in a memfd sealed against every change, so a reader can trust what it maps.
Result<int> sealed_tables(const Bytes& tables) {
  int fd = memfd_create("deltacast-tables", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::io_error("memfd_create: " + errno_text());
  std::size_t done = 0;
  while (done < tables.size()) {
    const ssize_t n = ::write(fd, tables.data() + done, tables.size() - done);
    if (n <= 0) {
      close_fd(fd);
      return Status::io_error("writing a version's tables: " + errno_text());
    }
    done += static_cast<std::size_t>(n);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    close_fd(fd);
    return Status::io_error("sealing a version's tables: " + errno_text());
  }
  return fd;
}

}  // namespace

struct ImageSharer::Impl {
  std::string path;
  Callbacks callbacks;
  ShareLimits limits;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: a version offered, or stop
  std::thread thread;

  mutable std::mutex mu;
  std::shared_ptr<const runtime::ModelVersion> offered;  // guarded by mu
  bool stopping = false;                                 // guarded by mu
  Counts counts;                                         // guarded by mu
  // The sharing process's own engine, folded in with the readers' (hold_local, report_local).
  std::optional<std::pair<RunId, std::uint64_t>> local_hold;              // guarded by mu
  std::optional<std::pair<runtime::ModelState, std::string>> local_report;  // guarded by mu

  // The serving thread's own.
  std::vector<Reader> readers;
  std::shared_ptr<SharedVersion> newest;
  const runtime::ModelVersion* newest_offered = nullptr;  // what `newest` was made from (a copy, for a heap image)
  std::uint64_t next_lease = 0;
  std::optional<std::pair<RunId, std::uint64_t>> hold_sent;
  std::optional<std::pair<runtime::ModelState, std::string>> report_sent;

  ~Impl() {
    close_fd(listen_fd);
    close_fd(wake_fd);
  }

  void wake() { wake_up(wake_fd); }

  Result<std::shared_ptr<SharedVersion>> prepare(std::shared_ptr<const runtime::ModelVersion> v) {
    auto s = std::make_shared<SharedVersion>();
    if (v->image.fd() < 0) {
      // Resumed from disk, say: into a memfd once, which readers then map.
      auto copy = std::make_shared<runtime::ModelVersion>(*v);
      Image image;
      image.set_shared(true);
      try {
        image.resize(v->image.size());
      } catch (const std::bad_alloc&) {
        return Status::resource_exhausted("cannot allocate a shared image of " + std::to_string(v->image.size()) + " bytes");
      }
      if (!v->image.empty()) std::memcpy(image.data(), v->image.data(), v->image.size());
      copy->image = std::move(image);
      v = std::move(copy);
      std::lock_guard lock(mu);
      counts.copies++;
    }
    // A descriptor of its own, read-only: a reader can map it only for reading.
    const std::string self = "/proc/self/fd/" + std::to_string(v->image.fd());
    s->image_fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (s->image_fd < 0) return Status::io_error("reopening a shared image read-only: " + errno_text());
    const Bytes tables = serialize_shared_version(*v);
    if (tables.size() > limits.meta_bytes_max)
      return Status::resource_exhausted("version " + std::to_string(v->version) + "'s tables take " + std::to_string(tables.size()) +
                                        " bytes, above meta_bytes_max");
    DC_ASSIGN_OR_RETURN(s->tables_fd, sealed_tables(tables));
    s->tables_bytes = tables.size();
    s->v = std::move(v);
    return s;
  }

  void drop(std::size_t i) {
    close_fd(readers[i].fd);
    readers.erase(readers.begin() + static_cast<std::ptrdiff_t>(i));
    summarize();
  }

  // Sends the newest version unless the reader has it or holds as many as it may.
  bool push_newest(Reader& r) {
    if (!newest || r.sent == newest || r.leases.size() >= limits.leases_per_reader_max) return true;
    const std::uint64_t lease = ++next_lease;
    Bytes packet;
    ByteWriter w(packet);
    w.u8(kVersion);
    w.u64(lease);
    w.u64(newest->v->image.size());
    w.u64(newest->tables_bytes);
    const int fds[2] = {newest->image_fd, newest->tables_fd};
    if (!send_packet(r.fd, packet, fds)) return false;
    r.leases[lease] = newest;
    r.sent = newest;
    std::lock_guard lock(mu);
    counts.versions_sent++;
    counts.leases++;
    return true;
  }

  // The readers' holds and reports as one, passed on when they change.
  void summarize() {
    std::optional<std::pair<RunId, std::uint64_t>> hold;
    std::optional<std::pair<runtime::ModelState, std::string>> report;
    // History from the oldest version held in the newest run anyone holds from.
    auto fold_hold = [&](const std::optional<std::pair<RunId, std::uint64_t>>& h) {
      if (!h || h->second == 0) return;
      if (!hold || h->first > hold->first) hold = h;
      else if (h->first == hold->first) hold->second = std::min(hold->second, h->second);
    };
    // The first failed update, else the oldest version a model holds.
    auto fold_report = [&](const std::optional<std::pair<runtime::ModelState, std::string>>& r) {
      if (!r) return;
      const bool failed = r->first.failed_version != 0, chosen_failed = report && report->first.failed_version != 0;
      if (!report || (failed && !chosen_failed) || (failed == chosen_failed && r->first.version < report->first.version)) report = r;
    };
    std::uint64_t leases = 0;
    for (const Reader& r : readers) {
      leases += r.leases.size();
      fold_hold(r.hold);
      fold_report(r.report);
    }
    {
      std::lock_guard lock(mu);
      counts.readers = readers.size();
      counts.leases = leases;
      fold_hold(local_hold);
      fold_report(local_report);
    }
    if (!hold) hold = std::make_pair(RunId{}, std::uint64_t{0});
    if (hold != hold_sent && callbacks.hold_history_from) callbacks.hold_history_from(hold->first, hold->second);
    hold_sent = hold;
    if (report && report != report_sent && callbacks.report_model) callbacks.report_model(report->first, report->second);
    if (report) report_sent = report;
  }

  // One packet from a reader; false: drop it.
  bool on_packet(Reader& r, ByteSpan packet) {
    ByteReader in(packet);
    std::uint8_t type = 0;
    if (!in.u8(type)) return false;
    if (type == kRelease) {
      std::uint64_t lease = 0;
      if (!in.u64(lease) || r.leases.erase(lease) == 0) return false;
      summarize();
      return push_newest(r);
    }
    if (type == kHold) {
      std::pair<RunId, std::uint64_t> hold;
      if (!get_run(in, hold.first) || !in.u64(hold.second)) return false;
      r.hold = hold;
      summarize();
      return true;
    }
    if (type == kReport) {
      runtime::ModelState m;
      std::uint8_t reported = 0;
      std::string error;
      if (!in.u8(reported) || !get_run(in, m.run) || !in.u64(m.version) || !get_run(in, m.failed_run) || !in.u64(m.failed_version) ||
          !in.string(error, kErrorBytesMax))
        return false;
      m.reported = reported != 0;
      r.report = std::make_pair(m, error);
      summarize();
      return true;
    }
    return false;
  }

  void accept_reader() {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (readers.size() >= limits.readers_max) {
      const std::string why = "this worker serves " + std::to_string(limits.readers_max) + " readers at most";
      Bytes packet{kRefused};
      packet.insert(packet.end(), why.begin(), why.end());
      (void)send_packet(fd, packet);
      ::close(fd);
      std::lock_guard lock(mu);
      counts.readers_refused++;
      return;
    }
    readers.push_back(Reader{fd});
    summarize();
    if (!push_newest(readers.back())) drop(readers.size() - 1);
  }

  void serve() {
    std::vector<pollfd> polled;
    std::uint8_t buf[kPacketBytesMax];
    for (;;) {
      polled.assign({pollfd{listen_fd, POLLIN, 0}, pollfd{wake_fd, POLLIN, 0}});
      for (const Reader& r : readers) polled.push_back(pollfd{r.fd, POLLIN, 0});
      if (poll(polled.data(), polled.size(), -1) < 0 && errno != EINTR) {
        spdlog::error("share {}: poll failed: {}", path, errno_text());
        return;
      }
      // Readers first, by the index they had when polled, last first (dropping one shifts those after it).
      for (std::size_t i = polled.size(); i-- > 2;) {
        if (!polled[i].revents) continue;
        const std::size_t at = i - 2;
        const ssize_t n = recv(readers[at].fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0 || static_cast<std::size_t>(n) > sizeof buf || !on_packet(readers[at], ByteSpan(buf, static_cast<std::size_t>(n)))) drop(at);
      }
      if (polled[1].revents) {
        std::uint64_t n;
        (void)!::read(wake_fd, &n, sizeof n);
        std::shared_ptr<const runtime::ModelVersion> v;
        {
          std::lock_guard lock(mu);
          if (stopping) return;
          v = offered;
        }
        summarize();  // the sharing process's own hold or report may have changed
        if (v && v.get() != newest_offered) {
          newest_offered = v.get();
          auto s = prepare(std::move(v));
          if (s.is_ok()) newest = *s;
          else spdlog::error("share {}: cannot share a version: {}", path, s.status().to_string());
          for (std::size_t i = readers.size(); i-- > 0;)
            if (!push_newest(readers[i])) {
              spdlog::warn("share {}: dropped a reader that takes no more versions: {}", path, errno_text());
              drop(i);
            }
        }
      }
      if (polled[0].revents) accept_reader();
    }
  }
};

ImageSharer::ImageSharer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<ImageSharer>> ImageSharer::start(const std::string& path, Callbacks callbacks, ShareLimits limits) {
  sockaddr_un addr;
  DC_RETURN_IF_ERROR(socket_address(path, addr));
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->callbacks = std::move(callbacks);
  impl->limits = limits;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Status::invalid_argument("share path " + path + " exists and is not a socket");
    const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool served = probe >= 0 && connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    if (served) return Status::invalid_argument("share path " + path + " is served by another process");
    ::unlink(path.c_str());  // left by a worker that died
  }
  impl->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (impl->listen_fd < 0) return Status::io_error("socket: " + errno_text());
  const mode_t old_mask = umask(0117);  // 0660 from the start: the worker's user and group attach, nobody else
  const int bound = bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  umask(old_mask);
  if (bound != 0) return Status::io_error("cannot bind share socket " + path + ": " + errno_text());
  if (listen(impl->listen_fd, 64) != 0) return Status::io_error("cannot listen on " + path + ": " + errno_text());
  impl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return Status::io_error("eventfd: " + errno_text());
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->serve(); });
  return std::unique_ptr<ImageSharer>(new ImageSharer(std::move(impl)));
}

ImageSharer::~ImageSharer() { stop(); }

void ImageSharer::stop() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  for (Reader& r : impl_->readers) close_fd(r.fd);
  impl_->readers.clear();
  impl_->newest.reset();
  {
    std::lock_guard lock(impl_->mu);
    impl_->offered.reset();
  }
  ::unlink(impl_->path.c_str());
}

void ImageSharer::offer(std::shared_ptr<const runtime::ModelVersion> v) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->offered = std::move(v);
  }
  impl_->wake();
}

void ImageSharer::hold_local(const RunId& run, std::uint64_t version) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->local_hold = std::make_pair(run, version);
  }
  impl_->wake();
}

void ImageSharer::report_local(const runtime::ModelState& model, const std::string& error) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->local_report = std::make_pair(model, error);
  }
  impl_->wake();
}

ImageSharer::Counts ImageSharer::counts() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counts;
}

// ---- the reader's side -------------------------------------------------------------------

struct Attached::State {
  std::string path;
  ShareLimits limits;
  int fd = -1;
  int wake_fd = -1;
  std::thread thread;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<const runtime::ModelVersion> current;  // guarded by mu
  std::string disconnected;                              // guarded by mu: why, while attaching again
  bool stopping = false;                                 // guarded by mu
  std::uint64_t epoch = 0;                               // guarded by mu: connections made so far, less one
  std::vector<std::uint64_t> releases;                   // guarded by mu: leases let go, to send
  std::optional<Bytes> hold, report;                     // guarded by mu: the newest of each, to send
  std::optional<Bytes> last_hold, last_report;           // guarded by mu: sent again to a worker attached to again

  ~State() {
    close_fd(fd);
    close_fd(wake_fd);
  }
  void wake() { wake_up(wake_fd); }

  // A version packet and its descriptors: mapped, parsed, current.
  Status on_version(ByteReader& in, std::span<const int> fds, const std::shared_ptr<State>& self) {
    std::uint64_t lease = 0, image_bytes = 0, tables_bytes = 0;
    if (!in.u64(lease) || !in.u64(image_bytes) || !in.u64(tables_bytes) || fds.size() != 2)
      return Status::corruption("a version packet without its lease, sizes and two descriptors");
    if (tables_bytes > limits.meta_bytes_max) return Status::resource_exhausted("a version's tables of " + std::to_string(tables_bytes) + " bytes");
    DC_ASSIGN_OR_RETURN(Image image, Image::map_read_only(fds[0], image_bytes));
    DC_ASSIGN_OR_RETURN(Image tables, Image::map_read_only(fds[1], tables_bytes));
    DC_ASSIGN_OR_RETURN(auto parsed, parse_shared_version(tables, std::move(image)));
    // Let go of the lease when the last holder of the version does.
    std::weak_ptr<State> weak = self;
    std::uint64_t given_in;
    {
      std::lock_guard lock(mu);
      given_in = epoch;
    }
    std::shared_ptr<const runtime::ModelVersion> v(parsed.release(), [weak, lease, given_in](const runtime::ModelVersion* p) {
      delete p;
      if (auto s = weak.lock()) {
        {
          std::lock_guard lock(s->mu);
          if (s->epoch == given_in) s->releases.push_back(lease);
        }
        s->wake();
      }
    });
    std::shared_ptr<const runtime::ModelVersion> old;
    {
      std::lock_guard lock(mu);
      // A worker restarted from an older saved version does not take this reader back: it keeps
      // its newer one until the worker catches up (the older one's lease goes back at once).
      if (current && current->run == v->run && current->version > v->version) return Status::ok();
      old = std::move(current);
      current = std::move(v);
      cv.notify_all();
    }
    return Status::ok();  // `old` goes here, outside the lock (its release takes it)
  }

  // Sends what waits to be sent; false when the connection broke.
  bool flush() {
    std::vector<Bytes> out;
    {
      std::lock_guard lock(mu);
      for (std::uint64_t lease : releases) {
        Bytes p;
        ByteWriter w(p);
        w.u8(kRelease);
        w.u64(lease);
        out.push_back(std::move(p));
      }
      releases.clear();
      if (hold) out.push_back(std::move(*hold));
      if (report) out.push_back(std::move(*report));
      hold.reset();
      report.reset();
    }
    for (const Bytes& p : out)
      if (!send_packet(fd, p)) return false;
    return true;
  }

  // Serves one connection until it ends: the reason, or empty when stopping.
  std::string serve(const std::shared_ptr<State>& self) {
    std::uint8_t buf[kPacketBytesMax];
    for (;;) {
      pollfd polled[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      if (poll(polled, 2, -1) < 0 && errno != EINTR) return "poll: " + errno_text();
      if (polled[1].revents) {
        std::uint64_t n;
        (void)!::read(wake_fd, &n, sizeof n);
        {
          std::lock_guard lock(mu);
          if (stopping) return {};
        }
        if (!flush()) return "the worker sharing " + path + " went away: " + errno_text();
      }
      if (!polled[0].revents) continue;
      iovec iov{buf, sizeof buf};
      alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      std::vector<int> fds;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
          for (std::size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++k) {
            int received;
            std::memcpy(&received, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
            fds.push_back(received);
          }
      auto close_all = [&] {
        for (int& f : fds) close_fd(f);
      };
      if (n <= 0) {
        close_all();
        return "the worker sharing " + path + " went away" + (n == 0 ? std::string() : ": " + errno_text());
      }
      if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        close_all();
        return "a packet from " + path + " larger than this reader takes";
      }
      ByteReader in(ByteSpan(buf, static_cast<std::size_t>(n)));
      std::uint8_t type = 0;
      (void)in.u8(type);
      Status st = type == kVersion ? on_version(in, fds, self)
                  : type == kRefused ? Status::io_error(std::string(reinterpret_cast<const char*>(buf) + 1, static_cast<std::size_t>(n) - 1))
                                     : Status::corruption("a packet of unknown type " + std::to_string(type));
      close_all();  // the mappings keep what they map
      if (!st.is_ok()) return "the worker sharing " + path + ": " + st.message();
    }
  }

  // Connects to the path; false with errno set.
  bool connect_now() {
    sockaddr_un addr;
    if (!socket_address(path, addr).is_ok()) return false;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return true;
    const int err = errno;
    close_fd(fd);
    errno = err;
    return false;
  }

  // Serves connection after connection: a worker that restarts (a unit's Restart=) is attached
  // to again, the versions held here staying mapped meanwhile.
  void run(const std::shared_ptr<State>& self) {
    std::uint64_t backoff_ms = kReconnectMsMin;
    for (;;) {
      const std::string why = serve(self);
      if (why.empty()) return;
      close_fd(fd);
      {
        std::lock_guard lock(mu);
        disconnected = why;
        epoch++;  // leases of the connection gone are nobody's to release
        releases.clear();
        cv.notify_all();
      }
      spdlog::warn("{}; attaching again", why);
      for (;;) {
        pollfd stop{wake_fd, POLLIN, 0};
        (void)poll(&stop, 1, static_cast<int>(backoff_ms));
        {
          std::lock_guard lock(mu);
          if (stopping) return;
        }
        if (stop.revents) {
          std::uint64_t n;
          (void)!::read(wake_fd, &n, sizeof n);
        }
        backoff_ms = std::min(2 * backoff_ms, kReconnectMsMax);
        if (!connect_now()) continue;
        std::lock_guard lock(mu);
        disconnected.clear();
        // The new worker learns what the ranks hold and keep, as the old one knew it.
        if (last_hold) hold = last_hold;
        if (last_report) report = last_report;
        break;
      }
      backoff_ms = kReconnectMsMin;
      wake();
    }
  }

  std::shared_ptr<const runtime::ModelVersion> wait(const std::function<bool(const runtime::ModelVersion&)>& wanted, std::uint64_t timeout_ms) {
    std::unique_lock lock(mu);
    std::shared_ptr<const runtime::ModelVersion> v;
    cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      if (current && wanted(*current)) v = current;
      return v != nullptr || stopping;  // after a refusal too: the caller asks refusal(), a wait in a loop does not spin
    });
    return v;
  }
};

Attached::Attached(std::shared_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<Attached>> Attached::attach(const std::string& path, std::uint64_t timeout_ms, ShareLimits limits) {
  sockaddr_un addr;
  DC_RETURN_IF_ERROR(socket_address(path, addr));
  auto s = std::make_shared<State>();
  s->path = path;
  s->limits = limits;
  // Capped (at 35 years) so that "no limit" cannot overflow the clock.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::min<std::uint64_t>(timeout_ms, 1ull << 40));
  while (!s->connect_now()) {
    const int err = errno;
    if ((err != ENOENT && err != ECONNREFUSED) || std::chrono::steady_clock::now() >= deadline)
      return Status::io_error("cannot attach to " + path + ": " + std::strerror(err) + " (is a worker sharing it? deltacast worker --share)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd < 0) return Status::io_error("eventfd: " + errno_text());
  s->thread = std::thread([s] { s->run(s); });
  return std::unique_ptr<Attached>(new Attached(std::move(s)));
}

Attached::~Attached() { (void)stop(); }

Status Attached::stop(bool) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->stopping) return Status::ok();
    state_->stopping = true;
    state_->cv.notify_all();
  }
  state_->wake();
  if (state_->thread.joinable()) state_->thread.join();
  // The connection closes with the state; versions still held keep their mappings, and the
  // worker, seeing the connection gone, lets go of their leases.
  shutdown(state_->fd, SHUT_RDWR);
  std::shared_ptr<const runtime::ModelVersion> held;
  {
    std::lock_guard lock(state_->mu);
    held = std::move(state_->current);
  }
  return Status::ok();
}

std::shared_ptr<const runtime::ModelVersion> Attached::current() const {
  std::lock_guard lock(state_->mu);
  return state_->current;
}

std::shared_ptr<const runtime::ModelVersion> Attached::wait_for_version(std::uint64_t min_version, std::uint64_t timeout_ms) {
  return state_->wait([&](const runtime::ModelVersion& v) { return v.version >= min_version; }, timeout_ms);
}

std::shared_ptr<const runtime::ModelVersion> Attached::wait_for_run_version(const RunId& run, std::uint64_t version, std::uint64_t timeout_ms) {
  return state_->wait([&](const runtime::ModelVersion& v) { return run.empty() || v.run == run ? v.version >= version : v.run > run; }, timeout_ms);
}

std::shared_ptr<const runtime::ModelVersion> Attached::wait_for_newer(const std::optional<VersionTag>& after, std::uint64_t timeout_ms) {
  return state_->wait(
      [&](const runtime::ModelVersion& v) { return !after || v.run > after->run || (v.run == after->run && v.version > after->version); }, timeout_ms);
}

void Attached::hold_history_from(const RunId& run, std::uint64_t version) {
  Bytes p;
  ByteWriter w(p);
  w.u8(kHold);
  put_run(w, run);
  w.u64(version);
  {
    std::lock_guard lock(state_->mu);
    state_->last_hold = p;
    state_->hold = std::move(p);
  }
  state_->wake();
}

void Attached::report_model(const runtime::ModelState& model, const std::string& error) {
  Bytes p;
  ByteWriter w(p);
  w.u8(kReport);
  w.u8(model.reported ? 1 : 0);
  put_run(w, model.run);
  w.u64(model.version);
  put_run(w, model.failed_run);
  w.u64(model.failed_version);
  w.string(error.substr(0, kErrorBytesMax));
  {
    std::lock_guard lock(state_->mu);
    state_->last_report = p;
    state_->report = std::move(p);
  }
  state_->wake();
}

std::string Attached::refusal() const { return {}; }

std::string Attached::disconnected() const {
  std::lock_guard lock(state_->mu);
  return state_->disconnected;
}

}  // namespace deltacast::embed
