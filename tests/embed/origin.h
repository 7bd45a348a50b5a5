// An origin on loopback for the embed tests: a NodeHost that publishes what a test encodes.
#pragma once

#include <catch2/catch.hpp>

#include "deltacast/codec/version.h"
#include "deltacast/transport/host.h"

namespace deltacast::test {

struct Origin {
  transport::NodeHost host;
  explicit Origin(runtime::NodeConfig c) : host(std::move(c), listener()) { REQUIRE(host.start_thread().is_ok()); }
  Origin() : Origin(config()) {}
  static transport::HostConfig listener() {
    transport::HostConfig h;
    h.bind_endpoint = "tcp://127.0.0.1:*";
    return h;
  }
  static runtime::NodeConfig config() {
    runtime::NodeConfig c;
    c.node_id = "origin";
    c.serve_children = true;
    return c;
  }
  ~Origin() { host.stop(); }
};

}  // namespace deltacast::test
