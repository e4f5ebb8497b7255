// Registers the optimized cpu backend: its kernel table is the one list in kernels.h, checked at
// compile time to cover every op but the views exactly once (kernel_table.h).
#include "kernel_table.h"
#include "kernels.h"

namespace keel::detail {
namespace {

constexpr KernelRow kTable[] = {
#define KEEL_X_ROW(op, fn, dtypes) {OpId::op, cpu::fn, cpu::dtypes},
    KEEL_CPU_KERNELS(KEEL_X_ROW)
#undef KEEL_X_ROW
};
static_assert(KernelTableCovers<firstBadRow(kTable)>::ok);

}  // namespace

void registerCpuKernels(Registry& r) {
  registerKernelTable(r, Backend::Cpu, kTable);
}

}  // namespace keel::detail
