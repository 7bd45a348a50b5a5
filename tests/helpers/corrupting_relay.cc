// A relay that corrupts every Nth chunk it forwards: the fault-injecting peer for the
// multi-process tests. Usage: corrupting_relay ID LISTEN PARENT EVERY_N
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "deltacast/transport/host.h"

using namespace deltacast;

static transport::NodeHost* g_host = nullptr;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: corrupting_relay ID LISTEN PARENT EVERY_N\n");
    return 2;
  }
  runtime::NodeConfig nc;
  nc.node_id = argv[1];
  nc.parents = {argv[3]};
  nc.serve_children = true;
  transport::HostConfig hc;
  hc.bind_endpoint = argv[2];
  const long every = std::atol(argv[4]);
  long seen = 0;
  hc.outgoing_filter = [&](runtime::Message& m) {
    auto* c = std::get_if<runtime::ChunkMsg>(&m);
    if (!c || ++seen % every != 0) return;
    Bytes b(c->payload->data(), c->payload->data() + c->payload->size());
    b[b.size() / 2] ^= 0x01;
    c->payload = runtime::share(std::move(b));
    std::fprintf(stderr, "corrupted chunk %u of %s\n", c->index, runtime::to_string(c->key).c_str());
  };
  transport::NodeHost host(nc, hc);
  g_host = &host;
  std::signal(SIGTERM, [](int) { g_host->stop(); });
  std::signal(SIGINT, [](int) { g_host->stop(); });
  Status st = host.run();
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
