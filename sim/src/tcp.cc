#include "tcp.h"

#include <algorithm>
#include <cmath>

namespace deltacast::sim {

void TcpModel::grow(TcpConnection& c, double acked, double window, double t_us) const {
  const TcpOptions& o = opt_;
  const double mss = packet_bytes_;
  if (o.congestion_control == TcpOptions::Cc::kBbr) {
    c.cwnd += acked * 1.885;  // startup: 2/ln 2 the delivery rate each round trip
  } else if (c.cwnd < c.ssthresh) {
    c.cwnd = std::min(c.cwnd + acked, std::max(c.ssthresh, c.cwnd));  // slow start: doubles each round trip
  } else if (o.congestion_control == TcpOptions::Cc::kReno) {
    c.cwnd += mss * acked / window;  // a packet per round trip
  } else {
    // CUBIC (RFC 8312): W(t) = C (t - K)^3 + W_max in packets, C = 0.4, beta = 0.7; never
    // slower than Reno would be.
    const double w_max = c.cubic_w_max / mss;
    const double k = std::cbrt(w_max * (1 - 0.7) / 0.4);
    const double t = (t_us - c.cubic_epoch_us) / 1e6 - k;
    const double target = (0.4 * t * t * t + w_max) * mss;
    c.cwnd = std::max(c.cwnd + mss * acked / window, std::min(target, 1.5 * c.cwnd));
  }
  c.cwnd = std::min(c.cwnd, std::max(o.window_bytes, mss));  // past the window it would not grow
}

void TcpModel::loss(TcpConnection& c, double t_us) {
  const double floor_bytes = 2.0 * packet_bytes_;
  switch (opt_.congestion_control) {
    case TcpOptions::Cc::kReno:
      c.cwnd = c.ssthresh = std::max(c.cwnd / 2, floor_bytes);
      break;
    case TcpOptions::Cc::kCubic:
      c.cubic_w_max = c.cwnd;
      c.cubic_epoch_us = t_us;
      c.cwnd = c.ssthresh = std::max(0.7 * c.cwnd, floor_bytes);
      break;
    case TcpOptions::Cc::kBbr:
      return;  // BBR (v1) holds its rate through random loss
  }
  stats_.window_reductions++;
}

TcpPass TcpModel::send(TcpConnection& c, double bytes, double now, double rtt_us, double loss_rate) {
  const TcpOptions& o = opt_;
  const double mss = packet_bytes_;
  const double window_max = std::max(o.window_bytes, mss);
  const double initial = std::min(window_max, o.initial_window_packets * mss);
  TcpPass pass;
  double t = std::max(now, c.free_us);
  pass.start_us = t;
  if (c.cwnd == 0) {
    c.cwnd = initial;
    c.full_us = t;
  }
  // Not filled for a retransmission timeout or more: the window halves per timeout, down to
  // the initial one, and slow start takes it back to where it was (Linux's
  // tcp_cwnd_restart and tcp_cwnd_application_limited).
  const double rto_us = rtt_us + o.rto_min_ms * 1e3;
  if (o.slow_start_after_idle && o.congestion_control != TcpOptions::Cc::kBbr && t - c.full_us >= rto_us && c.cwnd > initial) {
    c.ssthresh = std::max(c.ssthresh, 0.75 * c.cwnd);
    c.cwnd = std::max(initial, c.cwnd / std::exp2(std::min(64.0, std::floor((t - c.full_us) / rto_us))));
    stats_.idle_restarts++;
  }
  const bool backlog = now < c.free_us || bytes >= std::min(c.cwnd, window_max);
  double left = bytes;
  while (left > 0) {
    const double window = std::min(c.cwnd, window_max);
    if (loss_rate == 0 && window >= window_max) {  // steady: the rest at the window's rate
      t += rtt_us * left / window;
      break;
    }
    const double sent = std::min(left, window);
    if (loss_rate > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < 1 - std::pow(1 - loss_rate, std::ceil(sent / mss))) {
      pass.lost = true;
      loss(c, t);
    }
    t += rtt_us * sent / window;
    left -= sent;
    grow(c, sent, window, t);
  }
  c.free_us = pass.end_us = t;
  if (backlog) c.full_us = t;
  return pass;
}

}  // namespace deltacast::sim
