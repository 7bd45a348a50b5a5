// An in-memory network for runtime tests: every node gets a Transport whose links deliver
// through one global FIFO, a shared manual clock, and either inline or deferred decode tasks.
// Deterministic: the same calls give the same interleaving. Links can be bounded (per-link
// queue bytes; a sender whose message was refused is told when the queue is half empty
// again), and nodes can be killed (their messages vanish, nobody is told) or restarted.
// Besides whole nodes, a test may attach an endpoint of its own (a node's component under
// test, or a peer whose every message the test writes): see attach() and ScriptedPeer.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "deltacast/runtime/node.h"

namespace deltacast::test {

using namespace deltacast::runtime;

class ManualClock final : public Clock {
 public:
  std::uint64_t now_ms() const override { return now_; }
  // Wall-clock time: unknown (0) unless a test sets where it starts.
  std::uint64_t unix_us() const override { return unix_start_us ? unix_start_us + now_ * 1000 : 0; }
  void advance(std::uint64_t ms) { now_ += ms; }
  std::uint64_t unix_start_us = 0;

 private:
  std::uint64_t now_ = 1000;
};

class FakeNet;

class FakeTransport final : public Transport {
 public:
  FakeTransport(FakeNet& net, std::string name) : net_(net), name_(std::move(name)) {}
  bool send(PeerId peer, const Message& message) override;
  PeerId connect(const std::string& endpoint) override;
  void disconnect(PeerId peer) override;
  const std::string& name() const { return name_; }

 private:
  FakeNet& net_;
  std::string name_;
};

class FakeNet {
 public:
  struct Link {
    std::string from, to;   // node names
    PeerId reverse = 0;     // the id the other side uses for this link
    bool open = true;
    std::uint64_t queued_bytes = 0;
    std::uint64_t queue_bytes_max = ~0ull;
    bool refused = false;  // refused a message since it last had room: the sender is told when it drains
  };
  struct Delivery {
    PeerId link;  // sender's id; delivered to the other side as link.reverse
    Message message;
  };

  ManualClock clock;
  // Bound applied to links opened from now on, to messages queued toward `node`.
  std::map<std::string, std::uint64_t> inbound_queue_bytes_max;
  // Called on every delivery; return false to drop the message (fault injection).
  std::function<bool(const std::string& from, const std::string& to, Message&)> filter;
  // Called on every delivery; return true to hold the message back until release() (delay).
  std::function<bool(const std::string& from, const std::string& to, const Message&)> hold;
  // Delivers the held messages `which` picks (all by default), in the order they came.
  void release(const std::function<bool(const Message&)>& which = {}) {
    std::vector<Delivery> keep;
    for (auto& d : held_) {
      if (!which || which(d.message)) queue_.push_back(std::move(d));
      else keep.push_back(std::move(d));
    }
    held_ = std::move(keep);
  }

  // `restored`: a version the node holds before it starts (Node::restore).
  Node& add(NodeConfig config, bool deferred_tasks = false, std::shared_ptr<ModelVersion> restored = nullptr) {
    const std::string name = config.node_id;
    auto& slot = nodes_[name];
    slot.transport = std::make_unique<FakeTransport>(*this, name);
    slot.tasks = std::make_unique<DeferredTasks>();
    slot.config = config;
    slot.deferred = deferred_tasks;
    slot.node = std::make_unique<Node>(config, *slot.transport, clock, deferred_tasks ? slot.tasks.get() : nullptr);
    slot.alive = true;
    if (restored && !slot.node->restore(std::move(restored)).is_ok()) throw std::runtime_error("restore failed");
    slot.node->start();
    // What was sent to it before it was there arrives now, as a connection made before the
    // other side listens does.
    for (auto& d : unbound_[name]) queue_.push_back(std::move(d));
    unbound_.erase(name);
    return *slot.node;
  }
  Node& node(const std::string& name) { return *nodes_.at(name).node; }
  // An endpoint that is not a Node: `receive` gets what arrives for `name`, `writable` hears
  // when a link it was refused on has room again. Returns the transport it sends through.
  FakeTransport& attach(const std::string& name, std::function<void(PeerId, const Message&)> receive,
                        std::function<void(PeerId)> writable = {}) {
    auto& slot = nodes_[name];
    slot.transport = std::make_unique<FakeTransport>(*this, name);
    slot.tasks = std::make_unique<DeferredTasks>();
    slot.receive = std::move(receive);
    slot.writable = std::move(writable);
    slot.alive = true;
    return *slot.transport;
  }
  bool alive(const std::string& name) const { return nodes_.at(name).alive; }

  // The node stops: its queued and future messages vanish; peers find out by timeout.
  void kill(const std::string& name) {
    auto& s = nodes_.at(name);
    s.alive = false;
    for (auto& [id, link] : links_)
      if (link.from == name || link.to == name) link.open = false;
  }
  // Every link of the node breaks (the node lives on); peers find out by timeout.
  void cut(const std::string& name) {
    for (auto& [id, link] : links_)
      if (link.from == name || link.to == name) link.open = false;
  }
  // A fresh process with the same config (state lost), as after a crash and restart.
  Node& restart(const std::string& name) {
    NodeConfig c = nodes_.at(name).config;
    bool deferred = nodes_.at(name).deferred;
    return add(c, deferred);
  }

  // Delivers queued messages (and runs deferred tasks) until nothing is left or max_steps.
  std::size_t run(std::size_t max_steps = 10'000'000) {
    std::size_t steps = 0;
    while (steps < max_steps) {
      bool progressed = false;
      if (!queue_.empty()) {
        Delivery d = std::move(queue_.front());
        queue_.pop_front();
        deliver(d);
        progressed = true;
      }
      for (auto& [name, s] : nodes_) {
        if (s.alive && s.tasks->run_one()) progressed = true;
      }
      if (!progressed) break;
      ++steps;
    }
    return steps;
  }
  // Advances time in `step_ms` steps, ticking every live node and delivering in between.
  void run_for(std::uint64_t ms, std::uint64_t step_ms = 50) {
    for (std::uint64_t t = 0; t < ms; t += step_ms) {
      clock.advance(step_ms);
      for (auto& [name, s] : nodes_)
        if (s.alive && s.node) s.node->tick();
      run();
    }
  }
  // Runs until pred() holds or `limit_ms` of simulated time passed. Returns pred(). pred()
  // is called once per step, so it may act (publish, say) and report whether that worked.
  bool run_until(const std::function<bool()>& pred, std::uint64_t limit_ms = 60000) {
    run();
    for (std::uint64_t t = 0;; t += 50) {
      if (pred()) return true;
      if (t >= limit_ms) return false;
      run_for(50);
    }
  }

  std::uint64_t bytes_sent_to(const std::string& name) const {
    auto it = bytes_to_.find(name);
    return it == bytes_to_.end() ? 0 : it->second;
  }

  // Runs tasks one at a time when told (a node added with deferred_tasks, or a test's own).
  class DeferredTasks final : public TaskRunner {
   public:
    void run(std::unique_ptr<Task> task, TaskCost) override { q_.push_back(std::move(task)); }
    std::size_t size() const { return q_.size(); }
    bool run_one() {
      if (q_.empty()) return false;
      std::unique_ptr<Task> t = std::move(q_.front());
      q_.pop_front();
      t->work();
      t->done();
      return true;
    }

   private:
    std::deque<std::unique_ptr<Task>> q_;
  };

 private:
  friend class FakeTransport;

  struct Slot {
    NodeConfig config;
    std::unique_ptr<FakeTransport> transport;
    std::unique_ptr<DeferredTasks> tasks;
    std::unique_ptr<Node> node;
    std::function<void(PeerId, const Message&)> receive;  // an attached endpoint, when node is null
    std::function<void(PeerId)> writable;
    bool alive = false;
    bool deferred = false;
  };

  void deliver(Delivery& d) {
    Link& link = links_.at(d.link);
    link.queued_bytes -= message_bytes(d.message);
    if (link.refused && link.queued_bytes <= link.queue_bytes_max / 2) {
      link.refused = false;
      if (auto from = nodes_.find(link.from); from != nodes_.end() && from->second.alive && link.open) {
        if (from->second.node) from->second.node->on_writable(d.link);
        else if (from->second.writable) from->second.writable(d.link);
      }
    }
    if (!link.open) return;
    auto it = nodes_.find(link.to);
    if (it == nodes_.end()) {
      // Not started yet: held until it is (add()).
      link.queued_bytes += message_bytes(d.message);
      unbound_[link.to].push_back(std::move(d));
      return;
    }
    if (!it->second.alive) return;
    if (hold && hold(link.from, link.to, d.message)) {
      link.queued_bytes += message_bytes(d.message);
      held_.push_back(std::move(d));
      return;
    }
    if (filter && !filter(link.from, link.to, d.message)) return;
    bytes_to_[link.to] += message_bytes(d.message);
    // The receiver gets bytes of its own, as over a wire: the sender's buffer is let go once
    // sent (which is what a trainer shard's window counts on).
    if (auto* c = std::get_if<ChunkMsg>(&d.message); c && c->payload && c->payload->data())
      c->payload = share(Bytes(c->payload->data(), c->payload->data() + c->payload->size()));
    if (it->second.node) it->second.node->on_message(link.reverse, d.message);
    else it->second.receive(link.reverse, d.message);
  }

  std::map<std::string, Slot> nodes_;
  std::map<PeerId, Link> links_;
  std::deque<Delivery> queue_;
  std::map<std::string, std::vector<Delivery>> unbound_;  // to nodes not added yet
  std::vector<Delivery> held_;                            // by `hold`
  std::map<std::string, std::uint64_t> bytes_to_;
  PeerId next_id_ = 1;
};

inline bool FakeTransport::send(PeerId peer, const Message& message) {
  auto it = net_.links_.find(peer);
  if (it == net_.links_.end() || !it->second.open || it->second.from != name_) return false;
  const std::uint64_t bytes = message_bytes(message);
  if (it->second.queued_bytes > 0 && it->second.queued_bytes + bytes > it->second.queue_bytes_max) {
    it->second.refused = true;
    return false;
  }
  it->second.queued_bytes += bytes;
  net_.queue_.push_back({peer, message});
  return true;
}

inline PeerId FakeTransport::connect(const std::string& endpoint) {
  const PeerId up = net_.next_id_++, down = net_.next_id_++;
  FakeNet::Link a{name_, endpoint, down}, b{endpoint, name_, up};
  if (auto it = net_.inbound_queue_bytes_max.find(endpoint); it != net_.inbound_queue_bytes_max.end()) a.queue_bytes_max = it->second;
  if (auto it = net_.inbound_queue_bytes_max.find(name_); it != net_.inbound_queue_bytes_max.end()) b.queue_bytes_max = it->second;
  net_.links_[up] = a;
  net_.links_[down] = b;
  return up;
}

inline void FakeTransport::disconnect(PeerId peer) {
  auto it = net_.links_.find(peer);
  if (it == net_.links_.end()) return;
  it->second.open = false;
  net_.links_[it->second.reverse].open = false;
}

// A peer whose every message the test writes: it keeps what arrives, and may answer each
// message as it comes (a Welcome to every Hello, say).
class ScriptedPeer {
 public:
  ScriptedPeer(FakeNet& net, const std::string& name)
      : transport(net.attach(name, [this](PeerId from, const Message& m) {
          inbox.emplace_back(from, m);
          if (answer) answer(from, m);
        })) {}
  // Messages of type T that arrived, in order.
  template <typename T>
  std::vector<T> received() const {
    std::vector<T> out;
    for (const auto& [from, m] : inbox)
      if (const auto* t = std::get_if<T>(&m)) out.push_back(*t);
    return out;
  }
  // The link the last message of type T came on (0 if none did).
  template <typename T>
  PeerId link_of() const {
    for (auto it = inbox.rbegin(); it != inbox.rend(); ++it)
      if (std::holds_alternative<T>(it->second)) return it->first;
    return 0;
  }

  FakeTransport& transport;
  std::vector<std::pair<PeerId, Message>> inbox;
  std::function<void(PeerId, const Message&)> answer;
};

}  // namespace deltacast::test
