// A backend's kernel table: one row per (op, kernel, dtypes), registered in one call. Every
// table must cover each built-in op but the views (op_ids.h: kViewOps) exactly once; a table
// that does not fails to compile, naming the first op it lacks or repeats.
#pragma once
#include <span>

#include "keel/registry.h"

namespace keel::detail {

struct KernelRow {
  OpId op;
  KernelFn fn;
  DTypeMask dtypes;  // checked against the dispatch dtype (first input's, else first output's)
  const char* variant = "";         // Note [Kernel identity] in keel/registry.h
  KernelParamsFn params = nullptr;  // run-time parameters of one call
};

inline constexpr OpId kNoOp = OpId(-1);

// The first op without exactly one row (a view op: with any row), kNoOp when the table is right.
template <size_t N>
constexpr OpId firstBadRow(const KernelRow (&rows)[N]) {
  int count[kNumBuiltinOps] = {};
  for (const KernelRow& r : rows) {
    if (int(r.op) < 0 || int(r.op) >= kNumBuiltinOps) return r.op;
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
                "this kernel table lacks or repeats the op named in this instantiation "
                "(every op but the views needs exactly one row)");
  static constexpr bool ok = true;
};

inline void registerKernelTable(Registry& r, Backend b, std::span<const KernelRow> rows) {
  for (const KernelRow& row : rows)
    r.setKernel(int(row.op), b, row.fn, row.dtypes, row.variant, row.params);
}

}  // namespace keel::detail
