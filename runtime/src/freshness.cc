#include "freshness.h"

#include "deltacast/common/check.h"

#include <algorithm>
#include <cstring>

namespace deltacast::runtime {

bool Freshness::verifying() const {
  const NodeConfig& c = ctx_.config;
  return !c.trust_keys.empty() && !c.virtual_payloads && c.shard_count == 0;
}

void Freshness::issue(const RunId& run, std::uint64_t newest_version) {
  const NodeConfig& c = ctx_.config;
  if (c.has_parents() || !c.sign_key || c.virtual_payloads || run.empty()) return;
  Timestamp t;
  t.run = run;
  t.newest_version = newest_version;
  t.issued_us = ctx_.clock.unix_us();
  held_bytes_ = share(sign_timestamp(t, *c.sign_key));
  held_ = t;
  issued_ms_ = ctx_.now_ms();
}

std::int64_t Freshness::age_ms(const Timestamp& t) const {
  const std::uint64_t now_us = ctx_.clock.unix_us();
  if (now_us == 0) return 0;  // no wall clock (a simulation without one): age unknown, taken as new
  constexpr std::uint64_t kFarMs = std::uint64_t{1} << 60;
  if (t.issued_us <= now_us) return static_cast<std::int64_t>(std::min((now_us - t.issued_us) / 1000, kFarMs));
  return -static_cast<std::int64_t>(std::min((t.issued_us - now_us) / 1000, kFarMs));
}

bool Freshness::within_bound(const Timestamp& t) const {
  const std::int64_t age = age_ms(t), bound = static_cast<std::int64_t>(ctx_.config.freshness_ms_max);
  return age <= bound && -age <= bound;
}

bool Freshness::fresh_for(const RunId& run) const {
  if (!verifying()) return true;
  return held_ && held_->run == run && within_bound(*held_);
}

std::string Freshness::held_age() const {
  if (!held_) return "none";
  const std::int64_t age = age_ms(*held_);
  return age >= 0 ? std::to_string(age / 1000) + " s old" : std::to_string(-age / 1000) + " s in the future";
}

Freshness::Taken Freshness::take(const SharedBytes& bytes, const RunId& known_run) {
  Taken out;
  auto t = parse_timestamp(bytes->span());
  if (!t.is_ok()) {
    out.verdict = Taken::Verdict::kMalformed;
    out.why = t.status().to_string();
    return out;
  }
  if (verifying()) {
    // A parent sends the same statement with every heartbeat until the origin issues the next:
    // the bytes this node already verified and keeps are not verified again.
    const bool verified_before = held_bytes_ && held_bytes_->size() == bytes->size() &&
                                 std::memcmp(held_bytes_->data(), bytes->data(), bytes->size()) == 0;
    if (Status st = verified_before ? Status::ok() : verify_timestamp(bytes->span(), *t, ctx_.config.trust_keys); !st.is_ok()) {
      out.verdict = Taken::Verdict::kUntrusted;
      out.why = st.to_string() + " (is this node's trust key the publisher's?)";
      return out;
    }
    const RunId& known = held_ && held_->run > known_run ? held_->run : known_run;
    if (t->run < known) {
      out.verdict = Taken::Verdict::kReplay;
      out.why = "its timestamp statement names run " + to_string(t->run) + ", older than run " + to_string(known) +
                " this node knows of: a replay, or a parent left from an earlier run";
      return out;
    }
  }
  // Checked statements are ordered by run, then issue time; a node that does not check keeps
  // the last one its parent sent (a forged one from the far future must not hide the real ones).
  if (!verifying() || !held_ || t->run > held_->run || (t->run == held_->run && t->issued_us > held_->issued_us)) {
    held_ = *t;
    held_bytes_ = bytes;
  }
  DC_CHECK(!verifying() || held_->run >= t->run, "a node that checks statements holds one older than one it took");
  out.fresh = verifying() && within_bound(*t);
  out.statement = *t;
  return out;
}

}  // namespace deltacast::runtime
