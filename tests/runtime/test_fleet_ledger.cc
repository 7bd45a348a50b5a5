// The origin's fleet ledger (runtime/fleet_ledger.h) on its own: newer versions replace older
// ones, another run replaces any, errors are kept short, leaving is marked, and the number of
// workers is bounded.
#include <catch2/catch.hpp>

#include "deltacast/runtime/fleet_ledger.h"

using namespace deltacast;
using namespace deltacast::runtime;

TEST_CASE("the fleet ledger keeps each worker's newest report within its bounds", "[runtime][ledger]") {
  FleetLedger ledger(2);
  const RunId run{100, 1}, next_run{200, 2};
  REQUIRE(ledger.record({"w1", run, 5, 0x55, 40, ""}, 1000));
  CHECK(ledger.entries().at("w1").version == 5);
  CHECK(ledger.entries().at("w1").publish_to_ready_ms == 40);
  // An older version of the same run does not replace it (reports can overtake each other).
  REQUIRE(ledger.record({"w1", run, 4, 0x44, 30, ""}, 1100));
  CHECK(ledger.entries().at("w1").version == 5);
  CHECK(ledger.entries().at("w1").checksum == 0x55);
  CHECK(ledger.entries().at("w1").updated_ms == 1100);
  // A restarted trainer's run counts from 1 again: any version of another run replaces it.
  REQUIRE(ledger.record({"w1", next_run, 1, 0x11, 20, ""}, 1200));
  CHECK(ledger.entries().at("w1").version == 1);
  CHECK(ledger.entries().at("w1").run == next_run);
  // Errors are kept, short; a report without one leaves the last in place.
  REQUIRE(ledger.record({"w1", next_run, 2, 0x22, 20, std::string(1000, 'e')}, 1300));
  CHECK(ledger.entries().at("w1").last_error.size() == FleetLedger::kErrorBytesMax);
  REQUIRE(ledger.record({"w1", next_run, 3, 0x33, 20, ""}, 1400));
  CHECK(ledger.entries().at("w1").last_error.size() == FleetLedger::kErrorBytesMax);
  // Leaving is marked until the worker reports again; unknown workers are not added.
  ledger.mark_left("w1", 1500);
  CHECK(ledger.entries().at("w1").left);
  ledger.mark_left("nobody", 1500);
  CHECK(ledger.entries().count("nobody") == 0);
  REQUIRE(ledger.record({"w1", next_run, 3, 0x33, 20, ""}, 1600));
  CHECK_FALSE(ledger.entries().at("w1").left);
  // At most entries_max workers.
  CHECK(ledger.record({"w2", run, 1, 1, 1, ""}, 1700));
  CHECK_FALSE(ledger.record({"w3", run, 1, 1, 1, ""}, 1800));
  CHECK(ledger.entries().size() == 2);
  CHECK(ledger.record({"w2", run, 2, 2, 1, ""}, 1900));  // those in it still report
}

TEST_CASE("the fleet ledger names ids that two live processes claim, and what engines' models hold", "[runtime][ledger]") {
  FleetLedger ledger(4);
  const RunId run{100, 1};
  // A restart: a new instance, never the old one again. Not a duplicate.
  REQUIRE(ledger.record({"w", run, 1, 0x11, 5, "", 0xa}, 1000));
  REQUIRE(ledger.record({"w", run, 2, 0x22, 5, "", 0xb}, 1100));
  REQUIRE(ledger.record({"w", run, 3, 0x33, 5, "", 0xb}, 1200));
  CHECK(ledger.entries().at("w").duplicates == 0);
  CHECK(ledger.entries().at("w").instance == 0xb);
  // Two live processes reporting in turns through different parents: each turn back counts.
  REQUIRE(ledger.record({"w", run, 3, 0x33, 5, "", 0xc}, 1300));
  REQUIRE(ledger.record({"w", run, 3, 0x33, 5, "", 0xb}, 1400));
  CHECK(ledger.entries().at("w").duplicates == 1);
  CHECK(ledger.entries().at("w").last_error.find("two live processes report as w") != std::string::npos);
  // A relay refused a second process: counted, its words kept, the version untouched.
  FleetLedger::Report taken{"w", {}, 0, 0, 0, "node id w is held by another live process at relay-eu"};
  taken.id_taken = true;
  REQUIRE(ledger.record(taken, 1500));
  CHECK(ledger.entries().at("w").duplicates == 2);
  CHECK(ledger.entries().at("w").version == 3);
  CHECK(ledger.entries().at("w").run == run);
  CHECK(ledger.entries().at("w").last_error.find("relay-eu") != std::string::npos);
  // An engine's model state replaces the last one; a report with no version held yet (0)
  // carries it without touching the version.
  const ModelState failed{true, 2, run, 3, run};
  REQUIRE(ledger.record({"w", run, 3, 0x33, 5, "rank 1 could not apply it", 0xb, failed}, 1600));
  CHECK(ledger.entries().at("w").model == failed);
  REQUIRE(ledger.record({"fresh", {}, 0, 0, 0, "version 1 did not verify within 600 s", 0xd, ModelState{true, 0, {}, 1, run}}, 1700));
  CHECK(ledger.entries().at("fresh").version == 0);
  CHECK(ledger.entries().at("fresh").model.failed_version == 1);
  CHECK(ledger.entries().at("fresh").last_error.find("did not verify") != std::string::npos);
  // A second process refused before the holder first reported: the entry is kept as recent by
  // the next eviction, and the holder's report then finds the duplicate counted.
  FleetLedger::Report early = taken;
  early.node_id = "early";
  REQUIRE(ledger.record(early, 100000));
  ledger.evict(100500, 60000);  // the workers above, silent since about 1700, go
  CHECK(ledger.entries().count("early") == 1);
  REQUIRE(ledger.record({"early", run, 1, 0x11, 5, "", 0xe}, 101000));
  CHECK(ledger.entries().at("early").duplicates == 1);
}

TEST_CASE("the fleet ledger evicts workers gone longer than its bounds, making room for new ones", "[runtime][ledger]") {
  FleetLedger ledger(2);
  const RunId run{100, 1};
  REQUIRE(ledger.record({"left", run, 1, 1, 1, ""}, 0));
  REQUIRE(ledger.record({"silent", run, 1, 1, 1, ""}, 0));
  CHECK_FALSE(ledger.record({"new", run, 1, 1, 1, ""}, 10));  // full
  ledger.mark_left("left", 1000);
  CHECK(ledger.evict(1000 + FleetLedger::kLeftKeptMs, 3'600'000) == 0);  // not yet
  CHECK(ledger.evict(1001 + FleetLedger::kLeftKeptMs, 3'600'000) == 1);
  CHECK(ledger.entries().count("left") == 0);
  REQUIRE(ledger.record({"new", run, 1, 1, 1, ""}, 700'000));
  CHECK(ledger.evict(3'600'001, 3'600'000) == 1);  // "silent" never reported again
  CHECK(ledger.entries().count("silent") == 0);
  CHECK(ledger.entries().count("new") == 1);
}
