// The op registry: each op declared once — name, input count, shape inference (which also
// validates), view construction or kernels per backend, and its backward rule. Built-in ops come
// from one table (engine/src/ops/, a file per family); users may add ops at run time (same path).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "keel/attrs.h"
#include "keel/op_ids.h"
#include "keel/tensor.h"

namespace keel {

struct TensorMeta {
  Shape shape;
  DType dtype = DType::Float32;
};

struct OpDef;

// What a kernel sees: inputs, outputs already allocated on the op's device with the inferred
// shapes and dtypes (contiguous), attributes.
struct KernelCtx {
  const OpDef& op;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  const Attrs& attrs;
};
using KernelFn = void (*)(const KernelCtx&);

// What a backward rule sees. Saved tensors are detached aliases of the forward inputs/outputs;
// gradOutputs[i] may be undefined (no gradient flowed to that output). Returns one entry per
// input; undefined where the input needs no gradient.
struct BackwardCtx {
  const OpDef& op;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  std::span<const Tensor> gradOutputs;
  const Attrs& attrs;
  std::vector<bool> needsGrad;
};
using BackwardFn = std::function<std::vector<Tensor>(const BackwardCtx&)>;
// Shape inference and view rules are given their own op (for its name in messages), so a rule
// needs no reference into the table that holds it.
using InferFn =
    std::function<std::vector<TensorMeta>(const OpDef&, std::span<const Tensor>, const Attrs&)>;
using ViewFn =
    std::function<std::vector<Tensor>(const OpDef&, std::span<const Tensor>, const Attrs&)>;
// Adds recording-only attributes to a copy of the op's attributes (see Note [Op descriptions] in
// keel/observer.h). Runs after shape inference accepted the inputs, and only for observers.
using DescribeFn = std::function<void(std::span<const Tensor>, Attrs&)>;

// Bit set of dtypes a kernel accepts.
using DTypeMask = uint32_t;
constexpr DTypeMask dtypeBit(DType t) {
  return 1u << uint32_t(t);
}
inline constexpr DTypeMask kFloatTypes = dtypeBit(DType::Float32) | dtypeBit(DType::Float64) |
                                         dtypeBit(DType::Float16) | dtypeBit(DType::BFloat16);
inline constexpr DTypeMask kIntTypes = dtypeBit(DType::Int32) | dtypeBit(DType::Int64);
inline constexpr DTypeMask kAllTypes = kFloatTypes | kIntTypes | dtypeBit(DType::Bool);

// Note [Kernel identity]: a recording says which kernel ran each op call, so that a diff of two
// runs can tell "same inputs, different kernel" from a bug. A kernel is described by its variant —
// the things that decide its numerics: the algorithm, the accumulation dtype and the reduction
// order ("float64, 8 strided lanes per 1024 block, blocks in order" for the cpu sum; see Note
// [Kernel variant vocabulary] in engine/src/kernel_table.h) — fixed where the kernel is registered,
// and by run-time parameters its params function returns for one call (vector ISA, BLAS library and
// core type, thread partition, tile sizes). Two calls ran the same kernel variant when the
// variants are equal, whatever the backend: a copy is a copy on cpu and cpu-ref. The dispatcher
// asks for the parameters only while an observer is installed (keel/observer.h, OpEvent::kernel).
using KernelParamsFn = std::string (*)(const KernelCtx&);

struct KernelEntry {
  KernelFn fn = nullptr;
  DTypeMask dtypes = 0;  // checked against the dispatch dtype (first input's, else first output's)
  std::string variant;   // Note [Kernel identity]; empty: an undescribed (user) kernel
  KernelParamsFn params = nullptr;  // null: no run-time parameters
};

// What the op reference (docs/ops.md) says of an op; `keel ops --markdown` prints it as one table
// per family, with the dtypes each backend's kernels accept (see opsMarkdown).
struct OpDoc {
  std::string inputs;      // names, and shapes where they matter: "q [B,Sq,H,D], k, v"
  std::string attributes;  // names, with meanings and defaults where not obvious
  std::string outputs;
  std::string notes;   // the semantics in a phrase; longer ones in docs/ops.md below the tables
  std::string family;  // the table it is listed in (built-in: "Elementwise", ...; empty: "Other")
};

struct OpDef {
  std::string name;
  int numInputs = 0;            // -1: variadic (at least one)
  InferFn infer;                // required unless view is set
  ViewFn view;                  // view ops build outputs over their input's buffer; no kernels
  BackwardFn backward;          // empty: not differentiable
  DescribeFn describe;          // empty: observers see the attributes as passed
  bool mutatesInputs = false;   // optimizer-style ops: write into inputs, return nothing
  uint32_t readOnlyInputs = 0;  // mutatesInputs ops: bit i set when input i is only read (so
                                // observers need not finish reading it first; onBufferWrite)
  // Whether the op writes input i in place (a mutatesInputs op's inputs past bit 31 are written).
  bool writesInput(size_t i) const {
    return mutatesInputs && !(i < 32 && (readOnlyInputs >> i) & 1u);
  }
  OpDoc doc;
  KernelEntry kernels[kNumBackends];
  int id = -1;
};

class Registry {
 public:
  static Registry& get();  // built-in ops and kernels are registered on first use
  // Adds an op; returns its id. Throws keel::Error if the name is taken.
  int add(OpDef def);
  // variant and params: see Note [Kernel identity].
  void setKernel(int opId, Backend backend, KernelFn fn, DTypeMask dtypes, std::string variant = {},
                 KernelParamsFn params = nullptr);
  const OpDef& op(int id) const;
  const OpDef& op(OpId id) const { return op(int(id)); }
  const OpDef* find(std::string_view name) const;
  int size() const { return int(ops_.size()); }

 private:
  Registry();
  std::vector<std::unique_ptr<OpDef>> ops_;
};

// The op reference of the registered ops as Markdown, between two marker lines: one table per
// family in order of first registration (ops in registration order) with the dtypes each backend
// accepts. docs/ops.md holds this text for the built-in ops (ops_doc_test compares).
std::string opsMarkdown(const Registry& r);

// Per-layer registration entry points (each fills its part of the built-in tables).
namespace detail {
void registerBuiltinOpDefs(Registry& r);
void registerCpuRefKernels(Registry& r);
void registerCpuKernels(Registry& r);
// (The cuda kernels come with the CUDA backend plugin: Note [CUDA backend plugin].)
}  // namespace detail

}  // namespace keel
