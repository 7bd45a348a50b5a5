#include "node_config.h"

#include "deltacast/transport/wire.h"

namespace deltacast::tools {

// Repeatable options take one value each time (--allow-key K ckpt.safetensors: the checkpoint
// is not a second key).
void add_node_options(CLI::App* sub, NodeOptions& o, bool worker) {
  sub->add_option("--config", o.config_path, "JSON config file (docs/RUNTIME.md); flags override it")->check(CLI::ExistingFile);
  sub->add_option("--id", o.node_id, "Node name, unique in the fleet");
  sub->add_option("--listen", o.listen, worker ? "Serve other workers on this endpoint (peer to peer)" : "Endpoint to serve children on, e.g. tcp://0.0.0.0:7100");
  sub->add_option("--parent", o.parents, "Parent endpoint; repeat for fallbacks, most preferred first")->allow_extra_args(false);
  sub->add_option("--cache-size", o.cache_size, "Version cache bound, e.g. 8GB");
  sub->add_option("--queue-size", o.queue_size, "Send queue bound per peer, e.g. 256MB");
  sub->add_option("--stripes", o.stripes,
                  "TCP connections per parent link at most, chunks spread over them, to fill a link longer than one window reaches: "
                  "a link starts with one and its parent asks for more while they add throughput (docs/RUNTIME.md, \"Links that size "
                  "themselves\"); default 64")
      ->check(CLI::Range(1u, transport::kStripesMax));
  sub->add_option("--stripes-start", o.stripes_start,
                  "Connections a parent link opens with (1 to --stripes; default 1): --stripes N --stripes-start N keeps N")
      ->check(CLI::Range(1u, transport::kStripesMax));
  sub->add_option("--congestion-control", o.congestion_control,
                  "TCP congestion control of the connections children open to this node: auto (BBR where the kernel allows it: "
                  "exempt from slow start after idle; else the host's), host (the host's default), or a name such as cubic; "
                  "default auto");
  sub->add_option("--keys", o.keys_path, "This node's CURVE key file (deltacast keygen); turns encryption on");
  sub->add_option("--parent-key", o.parent_keys, "Public key of each --parent, in order")->allow_extra_args(false);
  sub->add_option("--allow-key", o.allow_keys, "Public key of a child allowed to connect (repeat); none: any child with our key")->allow_extra_args(false);
  sub->add_option("--metrics", o.metrics, "Serve Prometheus metrics on host:port (GET /metrics; deltacast status reads it)");
  if (worker) sub->add_flag("--in-place", o.in_place, "Apply versions into the one image (half the memory; readers pause during updates)");
  if (worker)
    sub->add_option("--share", o.share,
                    "Share each verified version with this host's processes: they attach to this Unix socket path "
                    "(deltacast.attach) and map the images read-only (docs/RUNTIME.md, \"One image per host\")");
  if (worker)
    sub->add_option("--tensors", o.tensors,
                    "Serve only the tensors whose names match this glob (repeat; * matches dots too): receive, verify, hold and save "
                    "only their chunks (docs/RUNTIME.md, \"Hosts that hold only what they serve\")")
        ->allow_extra_args(false);
  if (worker)
    sub->add_option("--scrub-rate", o.scrub_rate,
                    "Re-hash the exposed image against its chunk state hashes at most this many bytes a second, to find memory that "
                    "changed outside of a delta (0: off); default 48MiB");
  sub->add_option("--sign-key", o.sign_key_path, "Sign every version with this Ed25519 key file (deltacast keygen --sign): origin, trainer shards")
      ->check(CLI::ExistingFile);
  sub->add_option("--trust-key", o.trust_keys,
                  "Forward and apply only versions signed by this publisher key (64 hex digits or a key file; repeat)")
      ->allow_extra_args(false);
  sub->add_option("--log-level", o.log_level, "trace, debug, info (default), warn, error, critical, off");
  sub->add_flag("--print-settings", o.print_settings,
                "Print the node's settings (the config file's, the flags over them) as a config file holds them, once they check, and exit");
}

Result<LoadedNode> load_node_options(const NodeOptions& flags, embed::NodeRole role, bool* printed) {
  embed::NodeSettings s;  // file first, then flags on top
  if (!flags.config_path.empty()) {
    DC_ASSIGN_OR_RETURN(s, embed::read_node_settings(flags.config_path));
  }
  embed::overlay_node_settings(s, flags);
  auto loaded = embed::load_node(s, role);
  if (loaded.is_ok() && flags.print_settings && printed) {
    std::printf("%s\n", embed::node_settings_json(s).c_str());
    *printed = true;
  }
  return loaded;
}

}  // namespace deltacast::tools
