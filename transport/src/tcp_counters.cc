#include "tcp_counters.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace deltacast::transport {

bool read_tcp_counters(int fd, TcpCounters& out) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  if (len < offsetof(tcp_info, tcpi_busy_time) + sizeof info.tcpi_busy_time) return false;
  out.busy_us = info.tcpi_busy_time;
  out.acked_bytes = info.tcpi_bytes_acked;
  out.min_rtt_us = info.tcpi_min_rtt;
  return true;
}

}  // namespace deltacast::transport
