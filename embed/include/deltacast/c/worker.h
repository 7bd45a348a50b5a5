/* deltacast worker library, C ABI.
 *
 * Embeds a deltacast worker in a rollout process: it joins a relay (or another worker),
 * rebuilds every published version in the background, verifies it, and hands out read-only
 * views of the newest verified version. A view stays valid, and its bytes unchanged, until it
 * is released, whatever versions arrive meanwhile.
 *
 * Thread safety: every function may be called from any thread, except that a worker must not
 * be used after dc_worker_stop returns.
 *
 * Errors: dc_worker_start returns NULL and writes why to err (truncated to err_len). The other
 * functions return NULL, 0 or -1 for a NULL argument or an index or name that does not exist,
 * as each says; they fail in no other way.
 *
 * Options: zero-initialise the struct (dc_worker_options o = {0};) and set what you need;
 * fields added later are zero for "the default".
 */
#ifndef DELTACAST_C_WORKER_H
#define DELTACAST_C_WORKER_H

#pragma GCC visibility push(default) /* exported from libdeltacast */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dc_worker dc_worker;
typedef struct dc_version dc_version;

typedef struct dc_worker_options {
  const char* node_id;          /* unique name in the fleet (required) */
  const char* const* parents;   /* parent endpoints, most preferred first (required) */
  size_t parent_count;
  const char* listen;           /* serve other workers here (peer to peer), or NULL */
  const char* metrics;          /* "host:port" for GET /metrics, or NULL */
  uint64_t cache_bytes_max;     /* 0: default */
  int in_place;                 /* nonzero: one image; dc_worker_current returns NULL while a
                                   version is applied, which waits until every view is released */
  const char* state_dir;        /* or NULL. Each verified version is saved here (safetensors + a
                                   small JSON record, written by a background thread that skips
                                   versions arriving while it writes), and a restarted worker
                                   resumes from the newest saved one: dc_worker_current returns
                                   it at once and only the deltas after it are fetched */
  size_t keep_versions;         /* versions kept in state_dir; 0: 2 */
  /* Signed versions: accept only versions signed by one of these Ed25519 public keys (64 hex
     digits each, `deltacast keygen --sign` prints one). None: any version is accepted, and the
     worker logs that it is unauthenticated. */
  const char* const* trust_keys;
  size_t trust_key_count;
  /* CURVE (encrypted, authenticated links; `deltacast keygen` makes a key pair, Z85, 40
     characters each): this worker's own key pair, and each parent's public key, one per
     parent in the same order. Set all or none. */
  const char* curve_public_key;
  const char* curve_secret_key;
  const char* const* parent_server_keys;
  size_t parent_server_key_count;
  /* Multi-tree fleets (`deltacast fleet-init --trees N`): parents holds every tree's parents,
     one tree after another, each most preferred first, and tree_parent_counts[t] says how many
     are tree t's (2 to 8 trees, tree_count of them, summing to parent_count).
     parent_server_keys follows the order of parents. */
  const size_t* tree_parent_counts;
  size_t tree_count;
  /* A node config file (the JSON of `deltacast worker --config`, docs/RUNTIME.md; `deltacast
     fleet-init` writes one per node): its id, parents or trees, key files, trust keys, limits,
     listen, metrics, stripes, in_place and scrub rate. Then node_id, parents (or trees),
     listen, metrics, cache_bytes_max, in_place, trust keys and the CURVE keys, where set here,
     replace the file's. */
  const char* config_path;
  /* Any setting a config file holds, as a JSON object of its fields (docs/RUNTIME.md, "Config
     files": limits, timing, stripes, cache_size, scrub_rate, change_history, ...), over
     config_path's and under the fields above. */
  const char* settings_json;
} dc_worker_options;

/* The version of libdeltacast this program runs with, e.g. "0.1.0". */
const char* dc_library_version(void);

/* Starts a worker. Returns NULL on failure and writes the reason to err (if not NULL). */
dc_worker* dc_worker_start(const dc_worker_options* options, char* err, size_t err_len);

/* The settings the options amount to (config_path, settings_json and the fields above), as
   the JSON object of a config file, checked as dc_worker_start checks them. Writes it to out
   (truncated to out_len, NUL-terminated) and returns its length, or returns -1 and writes why
   to err. */
long dc_worker_settings(const dc_worker_options* options, char* out, size_t out_len, char* err, size_t err_len);

/* Stops the worker and frees it. Views acquired from it remain valid until released. */
void dc_worker_stop(dc_worker* worker);

/* The newest verified version, or NULL if none yet. Release it with dc_version_release. */
dc_version* dc_worker_current(dc_worker* worker);

/* Blocks until a version >= min_version is verified or timeout_ms passes.
 * Returns it (release it) or NULL on timeout. */
dc_version* dc_worker_wait(dc_worker* worker, uint64_t min_version, uint64_t timeout_ms);

uint64_t dc_version_number(const dc_version* version);
/* The version this one was rebuilt from as a delta, or 0 when it came whole (an anchor, or
 * from state_dir): a reader holding the base version can take only what changed. */
uint64_t dc_version_base(const dc_version* version);
uint64_t dc_version_checksum(const dc_version* version);
/* The whole model image (the safetensors data section). */
const uint8_t* dc_version_image(const dc_version* version, size_t* size);
size_t dc_version_tensor_count(const dc_version* version);
/* Tensor i: its name (valid while the view is held), dtype name ("BF16", ...), byte offset in
 * the image and byte size. Returns 0, or -1 if i is out of range. */
int dc_version_tensor(const dc_version* version, size_t i, const char** name, const char** dtype, uint64_t* offset,
                      uint64_t* nbytes);
/* The index of the tensor called `name` (for dc_version_tensor), or -1 if there is none. */
long dc_version_find_tensor(const dc_version* version, const char* name);
void dc_version_release(dc_version* version);

#ifdef __cplusplus
}
#endif

#pragma GCC visibility pop

#endif /* DELTACAST_C_WORKER_H */
