// TCP on one connection (TcpOptions, docs/SIM.md "TCP"): its window, grown by slow start and
// its congestion control (Reno, CUBIC, BBR's startup), cut on loss, decayed after idle; and
// what sending a message on it takes, round trip by round trip.
#pragma once

#include <limits>
#include <random>

#include "deltacast/sim/network.h"

namespace deltacast::sim {

// One connection's sending side.
struct TcpConnection {
  double cwnd = 0;  // bytes; 0 until first used
  double ssthresh = std::numeric_limits<double>::infinity();
  double free_us = 0;  // when what it was given is all sent
  double full_us = 0;  // when it last had a window's worth or more to send
  double cubic_w_max = 0, cubic_epoch_us = 0;  // the window at the last loss, and when
};

struct TcpPass {
  double start_us = 0, end_us = 0;  // when the connection began and finished sending it
  bool lost = false;                 // a packet of it was lost (and retransmitted)
};

class TcpModel {
 public:
  // Loss is drawn from `rng`; window cuts and idle restarts are counted in `stats`.
  TcpModel(const TcpOptions& options, double packet_bytes, std::mt19937_64& rng, Network::Stats& stats)
      : opt_(options), packet_bytes_(packet_bytes), rng_(rng), stats_(stats) {}
  // Sends `bytes` on connection c once what it was given before is sent: rounds of a round
  // trip each carrying its window, the window growing and shrinking as its congestion control
  // does; each round loses a packet with the chance `loss_rate` per packet gives.
  TcpPass send(TcpConnection& c, double bytes, double now, double rtt_us, double loss_rate);

 private:
  void grow(TcpConnection& c, double acked, double window, double t_us) const;
  void loss(TcpConnection& c, double t_us);

  const TcpOptions& opt_;
  double packet_bytes_;
  std::mt19937_64& rng_;
  Network::Stats& stats_;
};

}  // namespace deltacast::sim
