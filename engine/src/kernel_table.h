// A backend's kernel table: one row per (op, kernel, dtypes, variant, params), registered in one
// call. Every table must cover each built-in op but the views (op_ids.h: kViewOps) exactly once,
// each row with a variant; a table that does not fails to compile, naming the first op it lacks,
// repeats or leaves undescribed. The variants both cpu backends share are spelled once, below.
#pragma once
#include <span>

#include "keel/registry.h"

namespace keel::detail {

// Note [Kernel variant vocabulary]: a built-in kernel's variant (Note [Kernel identity] in
// keel/registry.h) names, in a few words, what decides its bits: the algorithm ("Cephes exp
// polynomial", "OpenBLAS sgemm", "naive"), the type it computes or accumulates in, and the order
// of its reductions ("sequential"; "8 strided lanes per 1024 block, blocks in order"; "in index
// order"; "BLAS order"). It does not repeat the op's name. Words used the same way everywhere:
//   (exact)            the result is the input values moved or chosen, or compared: no rounding.
//   correctly rounded  IEEE add, sub, mul, div, sqrt: the exact result rounded once, whatever
//                      wider type computes it (float64 holds more than twice float32's digits).
//   in float64, rounded once   computed in double, then rounded to the output dtype (16-bit
//                      floats through float32, as every store does).
//   float32            in the optimized cpu backend, the compute type: float32 for float32,
//                      float16 and bfloat16 tensors (16-bit results rounded from it once), float64
//                      for float64 tensors, where libm stands in for the float32 polynomials and
//                      dgemm for sgemm.
//   (vec_math)         the contiguous float32 loops of backends/cpu/vec_math.cpp: the same math,
//                      an AVX2 or a baseline clone picked at load time, equal bits (no FMA).
// Kernels whose code computes the same bits get the same string, whichever backend: the shared
// strings are the ones below, so they cannot drift apart. cpu-ref carries every value through
// float64 (its file's invariant), so its exact and correctly rounded claims hold for integers
// within ±2^53 and for NaNs up to their payload, and its integer arithmetic saturates where
// cpu's wraps: the variants describe the floating-point numerics and the in-range integer
// results, where the two agree.
namespace variant {
inline constexpr char kCopy[] = "copy (exact)";
inline constexpr char kGather[] = "gather (exact)";
inline constexpr char kSelect[] = "select (exact)";
inline constexpr char kCompare[] = "compare (exact)";
inline constexpr char kExactElementwise[] = "elementwise (exact)";
inline constexpr char kFirstMax[] = "first maximum, NaN largest (exact)";
inline constexpr char kStableSort[] = "stable sort, NaN largest (exact)";
inline constexpr char kCorrectlyRounded[] = "elementwise, correctly rounded";
inline constexpr char kFloat64Once[] = "elementwise in float64, rounded once";
inline constexpr char kCast[] = "cast via float64 (16-bit floats via float32), integers saturate";
inline constexpr char kFill[] = "value rounded once";
inline constexpr char kArange[] = "index rounded once";
inline constexpr char kDropout[] = "Philox4x32-10 mask, x/(1-p) in float64, rounded once";
inline constexpr char kUniform[] = "Philox4x32-10, lo+(hi-lo)*u in float64, rounded once";
inline constexpr char kNormal[] = "Philox4x32-10 Box-Muller in float64, rounded once";
inline constexpr char kIndexOrderSum[] = "float64 sum in index order, rounded once";
// Collectives that only move bytes between ranks (keel/dist.h), exact on every backend.
inline constexpr char kGatherRanks[] = "MPI all-gather (exact)";
inline constexpr char kBroadcast[] = "MPI broadcast (exact)";
inline constexpr char kAllToAll[] = "MPI all-to-all (exact)";
// cpu-ref's reductions across ranks (Note [Reference all-reduce] in dist/collective_kernels.cpp).
inline constexpr char kRankOrderReduce[] =
    "all-gather, then float64 reduction in rank order, rounded once";
}  // namespace variant

struct KernelRow {
  OpId op;
  KernelFn fn;
  DTypeMask dtypes;  // checked against the dispatch dtype (first input's, else first output's)
  const char* variant = "";         // Note [Kernel identity] in keel/registry.h; never empty here
  KernelParamsFn params = nullptr;  // run-time parameters of one call
};

inline constexpr OpId kNoOp = OpId(-1);

// The first op without exactly one row (a view op: with any row) or with an empty variant, kNoOp
// when the table is right.
template <size_t N>
constexpr OpId firstBadRow(const KernelRow (&rows)[N]) {
  int count[kNumBuiltinOps] = {};
  for (const KernelRow& r : rows) {
    if (int(r.op) < 0 || int(r.op) >= kNumBuiltinOps) return r.op;
    // (A null variant fails to compile here too: reading through it is not a constant
    // expression. No comparison with nullptr: GCC's UBSan makes that non-constant.)
    if (r.variant[0] == '\0') return r.op;
    ++count[int(r.op)];
  }
  for (int i = 0; i < kNumBuiltinOps; ++i)
    if (count[i] != (isViewOp(OpId(i)) ? 0 : 1)) return OpId(i);
  return kNoOp;
}

// static_assert(KernelTableCovers<firstBadRow(kTable)>::ok): on failure the compiler names the
// op in the instantiation ("KernelTableCovers<keel::OpId::Matmul>").
template <OpId firstBad>
struct KernelTableCovers {
  static_assert(firstBad == kNoOp,
                "this kernel table lacks, repeats or leaves undescribed the op named in this "
                "instantiation (every op but the views needs exactly one row, with a variant)");
  static constexpr bool ok = true;
};

inline void registerKernelTable(Registry& r, Backend b, std::span<const KernelRow> rows) {
  for (const KernelRow& row : rows)
    r.setKernel(int(row.op), b, row.fn, row.dtypes, row.variant, row.params);
}

}  // namespace keel::detail
