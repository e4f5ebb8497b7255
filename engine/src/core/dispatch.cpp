// The dispatcher. Order of work per call: validate arity/devices, assign a sequence number,
// notify begin, infer + allocate outputs (or build views), run the kernel, record the grad node,
// notify end. With no observers, the observer cost is one relaxed atomic load (op descriptions
// included: Note [Op descriptions]).
#include "keel/dispatch.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda_backend.h"
#include "keel/autograd.h"
#include "keel/log.h"
#include "keel/op_sequence.h"
#include "keel/registry.h"
#include "kernel_util.h"

namespace keel {
namespace {
std::atomic<uint64_t> g_seq{0};
thread_local bool t_gradEnabled = true;
thread_local Phase t_phase = Phase::Forward;
thread_local std::string t_scope;
thread_local uint64_t t_opSeq = 0;
thread_local const OpDef* t_opDef = nullptr;
thread_local uint64_t t_backwardForwardSeq = 0;

std::string describeInputs(std::span<const Tensor> in) {
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    if (!in[i].defined()) {
      s += "undefined";
      continue;
    }
    s += shapeStr(in[i].shape()) + " " + std::string(dtypeName(in[i].dtype())) + " " +
         in[i].device().name();
  }
  return s;
}

// Note [Saved tensors]
// A grad node keeps its forward op's inputs and outputs for the backward rule as aliases outside
// the graph: the same buffer, geometry and tensor id, no autograd state (a saved output holding
// its gradFn would be a reference cycle). The id is kept, unlike Tensor::detach(), because the
// alias is the same value under the same identity: cross_entropy_backward reads the logits as the
// tensor the forward matmul wrote, so a recording's (tensor id, version) pair names its producer,
// and the graph's dataflow, `keel export`'s DOT and the diff's "fed by" chains have the edge from
// the forward op into the backward op. With fresh ids (an earlier version) no saved tensor that a
// backward op read had a producer: 50 inputs per gpt-tiny step, about 96 per gpt-mini step. The
// version needs nothing: it is the buffer's, shared by every alias, and runBackward checks that
// it is unchanged.
Tensor savedAlias(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->offset = t.offset();
  impl->dtype = t.dtype();
  impl->buffer = t.buffer();
  impl->id = t.id();
  return Tensor(std::move(impl));
}

void recordNode(const OpDef& def, const std::vector<Tensor>& inputs,
                const std::vector<Tensor>& outputs, const Attrs& attrs, uint64_t seq) {
  bool any = false;
  for (auto& t : inputs) any = any || t.requiresGrad();
  if (!any) return;
  auto node = std::make_shared<Node>();
  node->opId = def.id;
  node->attrs = attrs;
  node->forwardSeq = seq;
  node->scope = t_scope;
  node->inputs.reserve(inputs.size());
  for (auto& t : inputs) {
    node->inputs.push_back(savedAlias(t));  // See Note [Saved tensors]
    node->inputVersions.push_back(t.version());
    Edge e;
    if (t.requiresGrad()) {
      if (t.gradFn()) {
        e.node = t.gradFn();
        e.outputNr = t.impl()->outputNr;
      } else {
        e.leaf = t.implPtr();
      }
    }
    node->next.push_back(std::move(e));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    node->outputs.push_back(savedAlias(o));
    node->outputVersions.push_back(o.version());
    node->outputMetas.push_back({o.shape(), o.dtype()});
  }
  node->outputHooks.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* impl = outputs[i].impl();
    if (!isFloating(impl->dtype)) continue;
    impl->requiresGrad = true;
    impl->gradFn = node;
    impl->outputNr = int(i);
  }
}

bool anyFloating(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (t.defined() && isFloating(t.dtype())) return true;
  return false;
}

// One Verbose line per op where a verbose rule matches (see keel/log.h); off the hot path.
[[gnu::noinline]] void logOpVerbose(const OpDef& def, std::span<const Tensor> inputs) {
  if (!verboseEnabled(t_scope, t_phase)) return;
  log(LogLevel::Verbose, t_scope, def.name + "(" + describeInputs(inputs) + ")");
}

// Note [Test perturbation]: KEEL_TEST_PERTURB="<op>:<n>[:<mode>]" changes the n-th call (1-based,
// counted in this process) of op <op>. Modes: "add" (default) adds 1000 to the first element of
// output 0, or of an optimizer-style op's first written input (adamw_step's parameter; gross on
// purpose: its MD5 and its statistics both change); "nan" sets it to NaN; "fail" makes the kernel
// throw keel::Error; "skip" makes the call not happen (the op returns its first input, nothing is
// dispatched or recorded: a rank whose program skipped a collective). Tests use it to inject a
// divergence, a NaN or an op failure into one kernel of one run and check that `keel diff`, the
// studio's breakpoints and its failed-session handling find it at that op.
// KEEL_TEST_PERTURB_RANK=<r> limits it to rank r of a multi-rank run (the launcher's
// OMPI_COMM_WORLD_RANK or PMI_RANK), so one replica can be made to drift. Read once at start-up;
// when unset the cost is one predictable branch per op.
struct Perturbation {
  enum class Mode { Add, Nan, Fail, Skip };
  bool on = false;
  std::string op;
  int64_t n = 0;
  Mode mode = Mode::Add;
  std::atomic<int64_t> seen{0};
  Perturbation() {
    const char* e = std::getenv("KEEL_TEST_PERTURB");
    if (!e) return;
    std::string v(e);
    auto colon = v.find(':');
    if (colon == std::string::npos || colon == 0) return;
    op = v.substr(0, colon);
    std::string rest = v.substr(colon + 1);
    auto colon2 = rest.find(':');
    if (colon2 != std::string::npos) {
      std::string m = rest.substr(colon2 + 1);
      mode = m == "nan"    ? Mode::Nan
             : m == "fail" ? Mode::Fail
             : m == "skip" ? Mode::Skip
                           : Mode::Add;
      rest = rest.substr(0, colon2);
    }
    n = std::atoll(rest.c_str());
    on = n > 0;
    if (const char* only = std::getenv("KEEL_TEST_PERTURB_RANK")) {
      const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
      if (!rank) rank = std::getenv("PMI_RANK");
      on = on && std::string(only) == (rank ? rank : "0");
    }
  }
};
Perturbation g_perturb;

// An optimizer-style op (mutatesInputs, no outputs) has its first written input changed instead.
void maybePerturb(const OpDef& def, const std::vector<Tensor>& outputs,
                  std::span<const Tensor> inputs) {
  if (g_perturb.mode == Perturbation::Mode::Skip) return;
  if (def.name != g_perturb.op) return;
  const Tensor* target = outputs.empty() ? nullptr : &outputs[0];
  for (size_t i = 0; i < inputs.size() && !target; ++i)
    if (def.writesInput(i)) target = &inputs[i];
  if (!target || target->numel() == 0) return;
  if (g_perturb.seen.fetch_add(1) + 1 != g_perturb.n) return;
  if (g_perturb.mode == Perturbation::Mode::Fail)
    throw Error("op '" + def.name + "': injected failure (KEEL_TEST_PERTURB)");
  const bool nan = g_perturb.mode == Perturbation::Mode::Nan;
  const Tensor& out = *target;
  visitDType(out.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      // Element 0, read and written back through the host for a device output.
      T v;
      const bool dev = !out.device().isHost();
      if (dev)
        detail::cudaApiFor(out.device())
            .copy(out.device().index, &v, false, out.data(), true, sizeof(T));
      else
        v = out.data<T>()[0];
      if constexpr (std::is_same_v<T, double>)
        v = nan ? std::nan("") : v + 1000.0;
      else
        v = T(nan ? std::nanf("") : float(v) + 1000.0f);
      if (dev)
        detail::cudaApiFor(out.device())
            .copy(out.device().index, out.data(), true, &v, false, sizeof(T));
      else
        out.data<T>()[0] = v;
    }
  });
}

}  // namespace

bool gradEnabled() {
  return t_gradEnabled;
}
NoGradGuard::NoGradGuard() : prev_(t_gradEnabled) {
  t_gradEnabled = false;
}
NoGradGuard::~NoGradGuard() {
  t_gradEnabled = prev_;
}

Phase currentPhase() {
  return t_phase;
}
PhaseGuard::PhaseGuard(Phase p) : prev_(t_phase) {
  t_phase = p;
}
PhaseGuard::~PhaseGuard() {
  t_phase = prev_;
}

const std::string& currentScope() {
  return t_scope;
}
ScopeGuard::ScopeGuard(const std::string& name, bool absolute) : prev_(t_scope) {
  if (absolute || t_scope.empty())
    t_scope = name;
  else if (!name.empty())
    t_scope = t_scope + "." + name;
}
ScopeGuard::~ScopeGuard() {
  t_scope = std::move(prev_);
}

uint64_t currentOpSeq() {
  return t_opSeq;
}
std::string_view currentOpName() {
  return t_opDef ? std::string_view(t_opDef->name) : std::string_view();
}
uint64_t lastOpSeq() {
  return g_seq.load(std::memory_order_relaxed);
}

// See Note [Op numbers per run] (keel/op_sequence.h).
void detail::restartOpSequence() {
  g_seq.store(0, std::memory_order_relaxed);
}

namespace detail {
void setBackwardForwardSeq(uint64_t seq) {
  t_backwardForwardSeq = seq;
}
uint64_t backwardForwardSeq() {
  return t_backwardForwardSeq;
}
}  // namespace detail

std::vector<Tensor> dispatch(int opId, std::vector<Tensor> inputs, const Attrs& attrs) {
  const OpDef& def = Registry::get().op(opId);
  if (def.numInputs >= 0)
    KEEL_CHECK(int(inputs.size()) == def.numInputs, "op '", def.name, "' expects ", def.numInputs,
               " inputs, got ", inputs.size());
  else
    KEEL_CHECK(!inputs.empty(), "op '", def.name, "' expects at least one input");
  for (size_t i = 0; i < inputs.size(); ++i)
    KEEL_CHECK(inputs[i].defined(), "op '", def.name, "': input ", i, " is undefined");

  Device dev = inputs.empty() ? Device(attrs.getString("device")) : inputs[0].device();
  for (size_t i = 1; i < inputs.size(); ++i)
    KEEL_CHECK(inputs[i].device() == dev, "op '", def.name, "': inputs on different devices (",
               describeInputs(inputs), ")");

  if (g_perturb.on && g_perturb.mode == Perturbation::Mode::Skip) [[unlikely]]
    if (def.name == g_perturb.op && g_perturb.seen.fetch_add(1) + 1 == g_perturb.n)
      return {inputs.at(0)};  // See Note [Test perturbation]

  uint64_t seq = g_seq.fetch_add(1, std::memory_order_relaxed) + 1;
  uint64_t prevSeq = t_opSeq;
  t_opSeq = seq;
  const OpDef* prevDef = t_opDef;
  t_opDef = &def;
  struct RestoreDef {
    const OpDef* v;
    ~RestoreDef() { t_opDef = v; }
  } restoreDef{prevDef};
  struct Restore {
    uint64_t& slot;
    uint64_t v;
    ~Restore() { slot = v; }
  } restore{t_opSeq, prevSeq};
  // Observers and verbose rules from one relaxed load: Note [One load per op] (keel/observer.h).
  const uint32_t instrumented = detail::instrumentation();
  if (detail::verboseIn(instrumented)) [[unlikely]]
    logOpVerbose(def, inputs);

  const bool observe = detail::observersIn(instrumented);
  OpEvent ev;
  if (observe) {
    ev.seq = seq;
    ev.forwardSeq = t_phase == Phase::Backward ? t_backwardForwardSeq : 0;
    ev.op = &def;
    ev.attrs = &attrs;
    ev.inputs = inputs;
    ev.phase = t_phase;
    ev.scope = t_scope;
    ev.beginNs = detail::nowNs();
    detail::notifyOpBegin(ev);
  }

  std::vector<Tensor> outputs;
  Attrs described;  // See Note [Op descriptions]
  KernelIdentity kernelId;
  std::string kernelParams;
  auto run = [&] {
    if (def.view) {
      outputs = def.view(def, inputs, attrs);
    } else {
      std::vector<TensorMeta> metas = def.infer(def, inputs, attrs);
      if (observe && def.describe && detail::observersWantOpDescriptions()) {
        described = attrs;
        def.describe(inputs, described);
        ev.attrs = &described;
      }
      Device outDev = opId == int(OpId::CopyTo) ? Device(attrs.getString("device")) : dev;
      // A copy to or from a cuda device runs the cuda kernel, which moves bytes between the host
      // and the device; any op on a cuda device loads the CUDA backend first (Note [CUDA backend
      // plugin]) and fails here, naming the device, where it cannot run.
      const Backend kb = outDev.isHost() ? dev.backend : Backend::Cuda;
      if (kb == Backend::Cuda) detail::cudaApiFor(outDev.isHost() ? dev : outDev);
      const KernelEntry& k = def.kernels[int(kb)];
      KEEL_CHECK(k.fn != nullptr, "op '", def.name, "' has no kernel for backend '",
                 backendName(kb), "' (inputs: ", describeInputs(inputs), ")");
      DType kdt = inputs.empty() ? metas.at(0).dtype : inputs[0].dtype();
      KEEL_CHECK(k.dtypes & dtypeBit(kdt), "op '", def.name, "' on backend '", backendName(kb),
                 "' does not support dtype ", dtypeName(kdt), " (inputs: ", describeInputs(inputs),
                 ")");
      outputs.reserve(metas.size());
      {
        // Top-level outputs are allocated at a safe point (Note [Buffer move]).
        detail::AllocContext& ac = detail::allocContext();
        const bool saved = ac.safePoint;
        ac.safePoint = prevSeq == 0;
        struct RestoreSafe {
          detail::AllocContext& c;
          bool v;
          ~RestoreSafe() { c.safePoint = v; }
        } restoreSafe{ac, saved};
        for (auto& m : metas) outputs.push_back(makeTensor(m.shape, m.dtype, outDev));
      }
      const KernelCtx kctx{def, inputs, outputs, attrs};
      if (observe) {
        // See Note [Kernel identity]; a mutating op's inputs are read by observers first.
        kernelId.backend = kb;
        kernelId.variant = k.variant;
        if (k.params) {
          kernelParams = k.params(kctx);
          kernelId.params = kernelParams;
        }
        ev.kernel = &kernelId;
        if (def.mutatesInputs)
          for (size_t i = 0; i < inputs.size(); ++i)
            if (def.writesInput(i)) detail::notifyBufferWrite(*inputs[i].buffer());
      }
      k.fn(kctx);
      if (g_perturb.on) [[unlikely]]
        maybePerturb(def, outputs, inputs);  // See Note [Test perturbation]
      if (def.mutatesInputs)
        for (auto& t : inputs) t.bumpVersion();
    }
  };
  if (!observe) {
    run();
  } else {
    // Observers hear about a failing op (a debugger shows it with its stack), then the error
    // propagates unchanged.
    try {
      run();
    } catch (const std::exception& e) {
      ev.endNs = detail::nowNs();
      detail::notifyOpError(ev, e.what());
      throw;
    }
  }

  // Note [No backward rule]: an op without a backward rule whose floating-point output is
  // computed from a tensor that requires grad still gets a node, which fails the backward pass
  // if a gradient reaches it (as PyTorch's "derivative for X is not implemented"): without it the
  // gradient stopped there in silence, and the parameters before it never trained. An op that
  // writes its inputs (an optimizer's) gets none: its outputs are those inputs.
  if (t_gradEnabled && (def.backward || (!def.mutatesInputs && anyFloating(outputs))))
    recordNode(def, inputs, outputs, attrs, seq);

  if (observe) {
    ev.outputs = outputs;
    ev.endNs = detail::nowNs();
    detail::notifyOpEnd(ev);
  }
  return outputs;
}

Tensor dispatch1(OpId id, std::vector<Tensor> inputs, const Attrs& attrs) {
  auto outs = dispatch(id, std::move(inputs), attrs);
  return outs.at(0);
}

}  // namespace keel
