// The kernel's counters of one TCP connection that link sizing reads (TCP_INFO). Its own file:
// <linux/tcp.h>, which has them, does not go with the <netinet/tcp.h> that libuv's header brings.
#pragma once

#include <cstdint>

namespace deltacast::transport {

struct TcpCounters {
  std::uint64_t busy_us = 0;     // time the connection had data to send (tcpi_busy_time)
  std::uint64_t acked_bytes = 0; // bytes the peer acknowledged (tcpi_bytes_acked)
  std::uint32_t min_rtt_us = 0;  // the smallest round trip seen (tcpi_min_rtt)
};

// False when the descriptor is not a TCP socket, or the kernel is older than 4.10 (no
// tcpi_busy_time).
bool read_tcp_counters(int fd, TcpCounters& out);

}  // namespace deltacast::transport
