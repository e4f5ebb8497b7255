// The run record of the benchmarks' synthetic recordings (bench_storage, bench_diff,
// bench_studio): what a run says about itself is no part of what they measure, so one will do.
#pragma once

#include "keel/storage/records.h"

namespace keel::bench {

inline storage::RunInfo benchRunInfo() {
  storage::RunInfo r;
  r.backend = "cpu";
  r.device = "cpu";
  r.host = "bench";
  r.configJson = "{}";
  r.engineVersion = "bench";
  return r;
}

}  // namespace keel::bench
