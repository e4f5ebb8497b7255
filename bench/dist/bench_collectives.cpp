// keel_bench_collectives: Keel's all_reduce op against a direct MPI_Allreduce of the same bytes,
// in one run under mpirun (scripts/bench-dist runs it at 2 ranks). Not Google Benchmark: its
// adaptive iteration counts would differ between ranks and a collective needs every rank to make
// the same calls, so each size runs a fixed number of rounds, alternating the two, each round
// timed on every rank after a barrier and the slowest rank's time kept; the figure per size is the
// median round. ratio = MPI time / Keel time (goal: ≥ 0.95, Keel's dispatch, output allocation
// and bookkeeping costing at most 5%).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "keel/dist.h"
#include "keel/ops.h"
#include "keel/tensor.h"

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One round's time on the slowest rank (a collective ends when its last rank leaves).
template <typename F>
double round(F&& f, int calls) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = seconds();
  for (int i = 0; i < calls; ++i) f();
  double mine = seconds() - t0, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  const int world = keel::dist::launcherWorldSize();
  keel::dist::init({world, 1});
  const int rank = keel::dist::worldRank();
  const int rounds =
      std::getenv("KEEL_BENCH_ROUNDS") ? std::atoi(std::getenv("KEEL_BENCH_ROUNDS")) : 15;
  if (rank == 0)
    std::printf(
        "all_reduce sum, float32, %d ranks: Keel op vs MPI_Allreduce (median of %d rounds, "
        "slowest rank)\n%10s %12s %12s %8s\n",
        world, rounds, "bytes", "keel (us)", "mpi (us)", "ratio");
  for (int64_t bytes : {int64_t(4) << 10, int64_t(64) << 10, int64_t(1) << 20, int64_t(16) << 20,
                        int64_t(64) << 20}) {
    const int64_t n = bytes / 4;
    const keel::Tensor x = keel::ops::fill({n}, 1.0 + rank);
    std::vector<float> in(size_t(n), 1.0f + float(rank));
    std::vector<float> out(static_cast<size_t>(n));
    // Enough calls per round for ~20 ms of work at the larger sizes, more at the small ones.
    const int calls = bytes <= (64 << 10)   ? 200
                      : bytes <= (1 << 20)  ? 40
                      : bytes <= (16 << 20) ? 6
                                            : 2;
    auto keelCall = [&] {
      const keel::Tensor y = keel::ops::allReduce(x, "sum", "world");
      (void)y;
    };
    auto mpiCall = [&] {
      MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    keelCall();  // warm: first touch of the output buffers and MPI's paths
    mpiCall();
    std::vector<double> tk, tm;
    for (int r = 0; r < rounds; ++r) {
      tk.push_back(round(keelCall, calls));
      tm.push_back(round(mpiCall, calls));
    }
    const double k = median(tk), m = median(tm);
    if (rank == 0)
      std::printf("%10lld %12.1f %12.1f %8.3f\n", static_cast<long long>(bytes), k * 1e6, m * 1e6,
                  m / k);
  }
  keel::dist::finalize();
  return 0;
}
