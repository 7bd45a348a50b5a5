// The CPU model (NetworkOptions::cores_per_host, docs/SIM.md "Host CPU"): each node has three queues
// of work (decoding, receiving, sending), each done in order; the head of every non-empty queue
// on a host is in progress, all of them sharing the host's cores equally (processor sharing).
// Work that finishes goes back to the owner (the Network), which runs a decode task, delivers a
// received message, or does nothing for a send.
#pragma once

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "deltacast/sim/network.h"

namespace deltacast::sim {

class CpuModel final : public EventQueue::Target {
 public:
  enum Queue : int { kDecode = 0, kReceive = 1, kSend = 2 };
  struct Work {
    double left_us = 0;                   // of one core's time
    std::unique_ptr<runtime::Task> task;  // a decode: run when done
    runtime::PeerId deliver_from = 0;     // a receive: the message goes to the node when done
    std::uint64_t generation = 0;         // of the receiver when the message was sent
    runtime::Message message;
  };
  class Owner {
   public:
    virtual ~Owner() = default;
    // Node `node`'s work `w` is done (in the order it finished).
    virtual void on_work_done(int node, Work& w) = 0;
  };

  CpuModel(EventQueue& events, double cores_per_host, Owner& owner) : events_(events), cores_per_host_(cores_per_host), owner_(owner) {}
  // The cores of the host numbered `host` (-1: a new host of its own), for node `node` (added
  // in order, 0 first).
  int host_of(int node, int host);
  // Queues work for node `node` on host `cpu`.
  void add(int node, int cpu, Queue q, Work w);
  // Node `node` on host `cpu` stopped: its work goes.
  void drop(int node, int cpu);

 private:
  struct HostCpu {
    double cores = 1;
    std::vector<std::pair<int, Queue>> busy;  // queues with work, their heads in progress
    double updated_us = 0;                    // when the heads' work left was last brought up to date
    std::uint64_t schedule = 0;               // the scheduled end; a later one replaces it
  };
  double share(const HostCpu& c) const { return std::min(1.0, c.cores / static_cast<double>(c.busy.size())); }
  // Brings the work in progress on a host up to now.
  void advance(HostCpu& c);
  // Schedules the end of the first piece of work in progress on host h to finish.
  void schedule(int h);
  // A scheduled end (host, schedule number in one word): what is done leaves, then runs.
  void fire(std::uint64_t key) override;

  EventQueue& events_;
  double cores_per_host_;
  Owner& owner_;
  std::vector<HostCpu> cpus_;
  std::deque<std::array<std::deque<Work>, 3>> work_;  // by node, then Queue
  std::map<int, int> shared_;                         // host_of's host -> index in cpus_
  std::vector<std::pair<int, Work>> finished_;        // fire()'s scratch, kept to spare an allocation per event
};

}  // namespace deltacast::sim
