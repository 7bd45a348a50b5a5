/* Uses the worker library through its C ABI only: join a publisher, wait for versions,
 * read the image and the tensor table, check the version against an expected checksum.
 * With STATE_DIR: the worker saves its versions there; a second worker started on the same
 * directory must hold the saved version at once, before hearing from its parent.
 * With DC_TRUST_KEY (hex): only versions signed by that key are taken, and a second worker
 * trusting another key must get nothing. With DC_CURVE_PUBLIC, DC_CURVE_SECRET and
 * DC_PARENT_KEY (Z85): the links are CURVE. A worker over two trees (both from the same parent)
 * must get the version too. With DC_CONFIG: a worker started from that config file alone must
 * get it as well.
 * Usage: c_worker_test PARENT_ENDPOINT VERSION EXPECTED_CHECKSUM_HEX [STATE_DIR]
 *    or: c_worker_test --settings NODE_ID PARENT SETTINGS_JSON
 *        prints the settings dc_worker_settings makes of those options (empty: unset; or the
 *        error, exit 1),
 *        for python/tests/test_settings.py. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deltacast/c/worker.h"

/* The settings dc_worker_settings makes of a node id, one parent and settings_json. */
static int print_settings(const char* node_id, const char* parent, const char* settings_json) {
  const char* parents[] = {parent};
  dc_worker_options o = {0};
  if (*node_id) o.node_id = node_id;
  if (*parent) {
    o.parents = parents;
    o.parent_count = 1;
  }
  o.settings_json = settings_json;
  char err[512];
  const long n = dc_worker_settings(&o, NULL, 0, err, sizeof err);
  if (n < 0) {
    printf("error: %s\n", err);
    return 1;
  }
  char* out = malloc((size_t)n + 1);
  if (!out || dc_worker_settings(&o, out, (size_t)n + 1, err, sizeof err) != n) {
    fprintf(stderr, "dc_worker_settings gave another length the second time\n");
    return 2;
  }
  printf("%s\n", out);
  free(out);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "--settings") == 0) return print_settings(argv[2], argv[3], argv[4]);
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: c_worker_test PARENT VERSION CHECKSUM [STATE_DIR]\n");
    return 2;
  }
  const char* state_dir = argc == 5 ? argv[4] : NULL;
  const uint64_t want = strtoull(argv[2], NULL, 10);
  const uint64_t checksum = strtoull(argv[3], NULL, 16);
  char err[256];
  dc_worker_options bad = {0};
  if (dc_worker_start(&bad, err, sizeof err) != NULL || strstr(err, "node_id") == NULL) {
    fprintf(stderr, "a worker without a name must be refused with a reason\n");
    return 1;
  }
  const char* parents[] = {argv[1]};
  dc_worker_options o = {0};
  o.node_id = "c-worker";
  o.parents = parents;
  o.parent_count = 1;
  o.state_dir = state_dir;
  const char* trust[] = {getenv("DC_TRUST_KEY")};
  if (trust[0]) {
    o.trust_keys = trust;
    o.trust_key_count = 1;
  }
  const char* parent_keys[] = {getenv("DC_PARENT_KEY")};
  if (parent_keys[0]) {
    o.curve_public_key = getenv("DC_CURVE_PUBLIC");
    o.curve_secret_key = getenv("DC_CURVE_SECRET");
    o.parent_server_keys = parent_keys;
    o.parent_server_key_count = 1;
  }
  /* Options that cannot work are refused, each with a reason. */
  const char* bad_key[] = {"not-a-key"};
  dc_worker_options bad_trust = o;
  bad_trust.trust_keys = bad_key;
  bad_trust.trust_key_count = 1;
  dc_worker_options half_curve = o;
  half_curve.curve_public_key = "0123456789012345678901234567890123456789";
  half_curve.curve_secret_key = NULL;
  if (dc_worker_start(&bad_trust, err, sizeof err) != NULL || strstr(err, "trust_keys[0]") == NULL ||
      dc_worker_start(&half_curve, err, sizeof err) != NULL || strstr(err, "CURVE") == NULL) {
    fprintf(stderr, "a bad trust key or half a CURVE key pair must be refused with a reason (last: %s)\n", err);
    return 1;
  }
  dc_worker* w = dc_worker_start(&o, err, sizeof err);
  if (!w) {
    fprintf(stderr, "start: %s\n", err);
    return 1;
  }
  dc_version* v = dc_worker_wait(w, want, 60000);
  if (!v) {
    fprintf(stderr, "version %" PRIu64 " never arrived\n", want);
    dc_worker_stop(w);
    return 1;
  }
  size_t size = 0;
  const uint8_t* image = dc_version_image(v, &size);
  const char* name;
  const char* dtype;
  uint64_t offset, nbytes, covered = 0;
  for (size_t i = 0; i < dc_version_tensor_count(v); ++i) {
    if (dc_version_tensor(v, i, &name, &dtype, &offset, &nbytes) != 0) return 1;
    covered += nbytes;
  }
  int ok = image != NULL && covered == size && dc_version_number(v) >= want && dc_version_checksum(v) == checksum &&
           dc_version_tensor(v, dc_version_tensor_count(v), &name, &dtype, &offset, &nbytes) == -1;
  /* Tensors by name: every name finds its own index; an unknown one finds nothing. */
  for (size_t i = 0; ok && i < dc_version_tensor_count(v); ++i) {
    dc_version_tensor(v, i, &name, &dtype, &offset, &nbytes);
    ok = dc_version_find_tensor(v, name) == (long)i;
  }
  ok = ok && dc_version_find_tensor(v, "no.such.tensor") == -1 && dc_version_find_tensor(v, NULL) == -1;
  /* From an anchor (0) or a delta from an earlier version. */
  ok = ok && (dc_version_base(v) == 0 || dc_version_base(v) < dc_version_number(v));
  printf("version %" PRIu64 ", %zu bytes, %zu tensors, checksum %016" PRIx64 ": %s\n", dc_version_number(v), size,
         dc_version_tensor_count(v), dc_version_checksum(v), ok ? "ok" : "WRONG");
  const uint64_t got = dc_version_number(v);
  dc_version_release(v);
  if (ok) {
    /* Two trees, each of one parent: chunk i comes down link i mod 2. */
    const char* tree_parents[] = {argv[1], argv[1]};
    const char* tree_keys[] = {parent_keys[0], parent_keys[0]};
    const size_t counts[] = {1, 1}, wrong_counts[] = {1, 2};
    dc_worker_options t = o;
    t.node_id = "c-trees";
    t.state_dir = NULL;
    t.parents = tree_parents;
    t.parent_count = 2;
    t.tree_parent_counts = wrong_counts;
    t.tree_count = 2;
    if (parent_keys[0]) {
      t.parent_server_keys = tree_keys;
      t.parent_server_key_count = 2;
    }
    ok = dc_worker_start(&t, err, sizeof err) == NULL && strstr(err, "tree_parent_counts") != NULL;
    t.tree_parent_counts = counts;
    dc_worker* trees = ok ? dc_worker_start(&t, err, sizeof err) : NULL;
    dc_version* tv = trees ? dc_worker_wait(trees, want, 60000) : NULL;
    ok = tv != NULL && dc_version_checksum(tv) == checksum;
    printf("over two trees: %s%s\n", ok ? "ok" : "WRONG ", ok ? "" : err);
    if (tv) dc_version_release(tv);
    if (trees) dc_worker_stop(trees);
  }
  const char* config = getenv("DC_CONFIG");
  if (ok && config) {
    dc_worker_options c = {0};
    c.config_path = config;
    dc_worker* from_config = dc_worker_start(&c, err, sizeof err);
    dc_version* cv = from_config ? dc_worker_wait(from_config, want, 60000) : NULL;
    ok = cv != NULL && dc_version_checksum(cv) == checksum;
    printf("from its config file alone: %s%s\n", ok ? "ok" : "WRONG ", ok ? "" : err);
    if (cv) dc_version_release(cv);
    if (from_config) dc_worker_stop(from_config);
  }
  if (ok && trust[0]) {
    /* The same trust key with its last digit changed: another key, so nothing verifies. */
    char other[65];
    snprintf(other, sizeof other, "%s", trust[0]);
    other[63] = other[63] == '0' ? '1' : '0';
    const char* other_trust[] = {other};
    dc_worker_options u = o;
    u.node_id = "c-untrusting";
    u.trust_keys = other_trust;
    u.state_dir = NULL;
    dc_worker* untrusting = dc_worker_start(&u, err, sizeof err);
    dc_version* none = untrusting ? dc_worker_wait(untrusting, 1, 3000) : NULL;
    ok = untrusting != NULL && none == NULL;
    printf("a worker trusting another key holds nothing: %s\n", ok ? "ok" : "WRONG");
    if (none) dc_version_release(none);
    if (untrusting) dc_worker_stop(untrusting);
  }
  if (ok && state_dir) {
    /* Wait until the background saver has written the version, then restart on the directory. */
    char record[4096];
    snprintf(record, sizeof record, "%s/c-worker-v%" PRIu64 ".json", state_dir, got);
    int saved = 0;
    for (int i = 0; i < 300 && !saved; ++i) {
      FILE* f = fopen(record, "r");
      if (f) {
        fclose(f);
        saved = 1;
      } else {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
    }
    dc_worker_stop(w);
    w = NULL;
    if (!saved) {
      fprintf(stderr, "version %" PRIu64 " was never saved to %s\n", got, state_dir);
      return 1;
    }
    dc_worker* again = dc_worker_start(&o, err, sizeof err);
    if (!again) {
      fprintf(stderr, "restart: %s\n", err);
      return 1;
    }
    /* It resumes from the saved version, exposed once its parent's timestamp statement says
       the run is still current (a trust key is set). */
    dc_version* r = dc_worker_wait(again, got, 30000);
    ok = r != NULL && dc_version_number(r) == got && (got != want || dc_version_checksum(r) == checksum);
    printf("restarted: holds version %" PRIu64 " once its parent vouched for the run: %s\n", r ? dc_version_number(r) : 0, ok ? "ok" : "WRONG");
    if (r) dc_version_release(r);
    dc_worker_stop(again);
  }
  if (w) dc_worker_stop(w);
  return ok ? 0 : 1;
}
