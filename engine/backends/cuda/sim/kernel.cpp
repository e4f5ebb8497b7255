// The CUDA simulator's kernel launches: every thread of a block as a fiber on one OS thread,
// __syncthreads and warp shuffles as cooperative switches, and the checks a GPU does at launch.
#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "sim_state.h"

// Note [CUDA simulator]: engine/backends/cuda is CUDA C++ that only a GPU runs, and the machines
// Keel is built and tested on mostly have none. The simulator builds the same sources (.cu files
// included as C++, sim/include first on the include path) into libkeel_cuda_sim.so, a CUDA backend
// plugin that runs on the CPU, so the cuda kernels' logic — indexing, launch plans, reductions,
// shared-memory tiling, barriers, shuffles, the runtime's error paths and the device VMM allocator
// — is tested on every machine with the same tests the GPU runs (ctest label `cudasim`). What it
// is not: a timing model, a memory model (a block's threads run one at a time, so a data race
// between them shows only when it changes a result), or the real math library (expf is glibc's,
// cuBLAS is an in-order loop), so results match a GPU's within the parity tolerances, not in bits.
// How a launch runs: blocks one after another in grid order; a block's threads are fibers, each
// run until it waits at a barrier (__syncthreads, a shuffle, __syncwarp) or returns; a barrier
// releases when every live thread of its block (warp) has arrived. Odd blocks run their threads
// in reverse order, so a missing barrier between a write and another thread's read changes some
// block's result. A kernel whose threads reach a barrier after others of the block returned (a
// divergent barrier: undefined on a GPU), shuffle in a partial warp, or deadlock fails its launch
// with a message naming the kernel, block and thread (cudaGetLastError: cudaErrorLaunchFailure).
// Shared memory (dynamic, and KEEL_SHARED arrays) starts each block as 0xFF bytes (NaN as a
// float), so a read before any write shows. Barriers are matched by count, as the hardware's
// bar.sync is: which __syncthreads call a thread waits at is not checked (a compiler may emit one
// source barrier at several addresses). Fibers switch with a few instructions (the asm below),
// not swapcontext: a gpt-mini step launches millions of threads.

namespace keel_sim {

Indices g_idx;

namespace {

// ---------------------------------------------------------------- fibers (x86-64 System V)
// keel_sim_switch(save, load): pushes the callee-saved registers and the FP control words on the
// current stack, stores its pointer in *save, switches to `load` and pops the same from there.
extern "C" void keel_sim_switch(void** save, void* load);
asm(R"(
  .pushsection .text
  .globl keel_sim_switch
  .hidden keel_sim_switch
  .type keel_sim_switch,@function
keel_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size keel_sim_switch,.-keel_sim_switch
  .popsection
)");

constexpr size_t kStack = size_t(256) << 10;  // per thread; the page below each is a guard
constexpr int kMaxThreads = 1024;

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
  void* sp = nullptr;
  uint3 tid;
  int linear = 0;
  State state = State::Ready;
};

struct Warp {
  int arrived = 0;
  int bank = 0;                // shuffles alternate between two banks of slots
  uint64_t slots[2][32] = {};  // one value per lane
};

struct Launch {
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  const void* kernel = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int current = -1;
  void* schedulerSp = nullptr;
  int threads = 0, arrived = 0, done = 0;
  std::string error;  // set by a thread that broke a rule; the launch stops
  std::vector<unsigned char> smem;
  // KEEL_SHARED arrays: an offset per declaration in one 48 KiB arena (static shared memory's
  // limit), assigned at first use.
  std::vector<unsigned char> shared = std::vector<unsigned char>(48 << 10);
  std::map<const void*, size_t> sharedAt;
  size_t sharedUsed = 0;
};

Launch* g_launch = nullptr;

// Stacks for up to kMaxThreads fibers, made once (reserved lazily: MAP_NORESERVE), reused.
char* stacks() {
  static char* base = [] {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t each = kStack + page;
    void* p = mmap(nullptr, each * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "keel cuda simulator: cannot reserve fiber stacks\n");
      std::abort();
    }
    for (int i = 0; i < kMaxThreads; ++i)
      mprotect(static_cast<char*>(p) + i * each, page, PROT_NONE);
    return static_cast<char*>(p);
  }();
  return base;
}
char* stackTop(int i) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return stacks() + size_t(i + 1) * (kStack + page);
}

Fiber& running() {
  return g_launch->fibers[size_t(g_launch->current)];
}

void yieldToScheduler() {
  Launch& L = *g_launch;
  keel_sim_switch(&running().sp, L.schedulerSp);
}

std::string describeThread(const Fiber& f) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "block (%u,%u,%u) thread (%u,%u,%u)", g_idx.block.x, g_idx.block.y,
                g_idx.block.z, f.tid.x, f.tid.y, f.tid.z);
  return buf;
}

// Stops the launch: the running thread never resumes.
[[noreturn]] void fail(const std::string& why) {
  Launch& L = *g_launch;
  L.error = describeThread(running()) + ": " + why;
  running().state = State::Done;
  keel_sim_switch(&running().sp, L.schedulerSp);
  __builtin_unreachable();
}

void fiberEntry() {
  Launch& L = *g_launch;
  L.body(L.arg);
  Fiber& f = running();
  f.state = State::Done;
  ++L.done;
  if (L.arrived > 0)
    L.error = describeThread(f) + ": returned while " + std::to_string(L.arrived) +
              " threads of its block wait at __syncthreads (a divergent barrier)";
  if (L.warps[size_t(f.linear / 32)].arrived > 0 && L.error.empty())
    L.error =
        describeThread(f) + ": returned while lanes of its warp wait at a shuffle or __syncwarp";
  keel_sim_switch(&f.sp, L.schedulerSp);
  __builtin_unreachable();
}

void startFiber(Fiber& f, int slot) {
  // Frame keel_sim_switch pops: FP control words, r15..rbp (zero), then fiberEntry as the return
  // address, placed so that fiberEntry starts with the stack aligned as after a call.
  auto* top = reinterpret_cast<uint64_t*>(stackTop(slot));
  uint64_t* sp = top - 9;  // (top - 72 bytes): 8 mod 16
  if (sim::guarded()) {    // the thread's locals start as NaN
    constexpr size_t kPoison = size_t(16) << 10;
    std::memset(reinterpret_cast<char*>(sp) - kPoison, 0xff, kPoison);
  }
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
  for (int i = 1; i <= 6; ++i) sp[i] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&fiberEntry);
  sp[8] = 0;
  f.sp = sp;
  f.state = State::Ready;
}

// Releases every thread waiting at a barrier of kind `s` (in warp `warp` for a warp barrier).
void release(Launch& L, State s, int warp) {
  for (Fiber& f : L.fibers)
    if (f.state == s && (warp < 0 || f.linear / 32 == warp)) f.state = State::Ready;
}

int liveLanes(const Launch& L, int warp) {
  const int lanes = std::min(32, L.threads - warp * 32);
  int live = 0;
  for (int i = 0; i < lanes; ++i)
    if (L.fibers[size_t(warp * 32 + i)].state != State::Done) ++live;
  return live;
}

// The running thread arrives at its warp's barrier; returns once every lane has.
void warpBarrier() {
  Launch& L = *g_launch;
  Fiber& f = running();
  const int w = f.linear / 32;
  Warp& W = L.warps[size_t(w)];
  const int lanes = std::min(32, L.threads - w * 32);
  if (liveLanes(L, w) != lanes) fail("a shuffle or __syncwarp after lanes of its warp returned");
  if (++W.arrived == lanes) {
    W.arrived = 0;
    W.bank ^= 1;
    release(L, State::AtWarpBarrier, w);
    return;
  }
  f.state = State::AtWarpBarrier;
  yieldToScheduler();
}

// The kernel's name from the symbol tables (libdw: kernels have internal linkage, so dladdr,
// which reads only the dynamic symbols, does not know them).
std::string kernelName(const void* k) {
  static char* debuginfoPath = nullptr;
  static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, dwfl_standard_find_debuginfo,
                                           nullptr, &debuginfoPath};
  std::string name = "a kernel";
  Dwfl* d = dwfl_begin(&callbacks);
  if (!d) return name;
  if (dwfl_linux_proc_report(d, getpid()) == 0 && dwfl_report_end(d, nullptr, nullptr) == 0) {
    const auto a = reinterpret_cast<Dwarf_Addr>(k);
    if (Dwfl_Module* m = dwfl_addrmodule(d, a))
      if (const char* s = dwfl_module_addrname(m, a)) {
        int status = 0;
        std::unique_ptr<char, void (*)(void*)> dm(abi::__cxa_demangle(s, nullptr, nullptr, &status),
                                                  std::free);
        name = status == 0 && dm ? std::string(dm.get()) : std::string(s);
      }
  }
  dwfl_end(d);
  return name;
}

std::mutex g_attrMutex;
std::map<const void*, int> g_maxDynamicShared;  // cudaFuncAttributeMaxDynamicSharedMemorySize

}  // namespace

void syncThreads() {
  Launch& L = *g_launch;
  Fiber& f = running();
  if (L.done > 0)
    fail("__syncthreads after " + std::to_string(L.done) +
         " threads of its block returned (a divergent barrier)");
  if (++L.arrived == L.threads) {
    L.arrived = 0;
    release(L, State::AtBlockBarrier, -1);
    return;
  }
  f.state = State::AtBlockBarrier;
  yieldToScheduler();
}

void syncWarp(unsigned mask) {
  Launch& L = *g_launch;
  const int w = running().linear / 32;
  const int lanes = std::min(32, L.threads - w * 32);
  const unsigned all = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
  if (mask != all) fail("__syncwarp with a mask other than the whole warp (not simulated)");
  warpBarrier();
}

uint64_t shuffleXor(unsigned mask, uint64_t bits, int laneMask, int width) {
  Launch& L = *g_launch;
  Fiber& f = running();
  const int w = f.linear / 32, lane = f.linear % 32;
  if (mask != 0xffffffffu) fail("a shuffle with a partial mask (not simulated)");
  if (L.threads - w * 32 < 32) fail("a full-mask shuffle in a warp of fewer than 32 threads");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    fail("a shuffle width that is not a power of two up to 32");
  Warp& W = L.warps[size_t(w)];
  const int bank = W.bank;
  W.slots[bank][lane] = bits;
  warpBarrier();  // all lanes wrote; the next shuffle uses the other bank
  // PTX shfl.bfly: a lane may read its own or an earlier group of `width` lanes; from a later
  // group it gets its own value.
  const int src = lane ^ (laneMask & 31);
  return W.slots[bank][src / width > lane / width ? lane : src];
}

void* dynamicShared() {
  return g_launch->smem.data();
}

void* staticShared(const void* site, size_t bytes, size_t align) {
  Launch& L = *g_launch;
  auto it = L.sharedAt.find(site);
  if (it == L.sharedAt.end()) {
    const size_t at = (L.sharedUsed + align - 1) / align * align;
    if (at + bytes > L.shared.size()) fail("more than 48 KiB of static shared memory");
    std::fill(L.shared.begin() + ptrdiff_t(at), L.shared.begin() + ptrdiff_t(at + bytes),
              static_cast<unsigned char>(0xff));
    L.sharedUsed = at + bytes;
    it = L.sharedAt.emplace(site, at).first;
  }
  return L.shared.data() + it->second;
}

void runKernel(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               void (*body)(void*), void* arg) {
  (void)stream;
  std::lock_guard<std::recursive_mutex> lock(sim::deviceMutex());
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > kMaxThreads ||
      block.x > 1024 || block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu) {
    sim::setLaunchError(cudaErrorInvalidConfiguration,
                        kernelName(kernel) + ": grid (" + std::to_string(grid.x) + "," +
                            std::to_string(grid.y) + "," + std::to_string(grid.z) + ") block (" +
                            std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                            std::to_string(block.z) + ")");
    return;
  }
  int allowed = 48 << 10;
  {
    std::lock_guard<std::mutex> l(g_attrMutex);
    if (auto it = g_maxDynamicShared.find(kernel); it != g_maxDynamicShared.end())
      allowed = it->second;
  }
  if (smem > size_t(allowed)) {
    sim::setLaunchError(cudaErrorInvalidValue,
                        kernelName(kernel) + ": " + std::to_string(smem) +
                            " bytes of dynamic shared memory, more than the " +
                            std::to_string(allowed) + " its attribute allows");
    return;
  }

  Launch L;
  L.body = body;
  L.arg = arg;
  L.kernel = kernel;
  L.threads = int(threads);
  L.fibers.resize(threads);
  L.warps.resize((threads + 31) / 32);
  L.smem.resize(smem + 16);
  Launch* outer = g_launch;  // a launch from host code inside a kernel does not happen; be safe
  const Indices saved = g_idx;
  g_launch = &L;
  g_idx.blockSize = block;
  g_idx.gridSize = grid;
  uint64_t blockNo = 0;
  for (unsigned bz = 0; bz < grid.z && L.error.empty(); ++bz)
    for (unsigned by = 0; by < grid.y && L.error.empty(); ++by)
      for (unsigned bx = 0; bx < grid.x && L.error.empty(); ++bx, ++blockNo) {
        g_idx.block = {bx, by, bz};
        L.arrived = L.done = 0;
        for (Warp& w : L.warps) w = Warp{};
        std::fill(L.smem.begin(), L.smem.end(), static_cast<unsigned char>(0xff));
        std::fill(L.shared.begin(), L.shared.begin() + ptrdiff_t(L.sharedUsed),
                  static_cast<unsigned char>(0xff));
        int i = 0;
        for (unsigned z = 0; z < block.z; ++z)
          for (unsigned y = 0; y < block.y; ++y)
            for (unsigned x = 0; x < block.x; ++x, ++i) {
              Fiber& f = L.fibers[size_t(i)];
              f.tid = {x, y, z};
              f.linear = i;
              startFiber(f, i);
            }
        const bool reverse = (blockNo & 1) != 0;
        while (L.done < L.threads && L.error.empty()) {
          bool progress = false;
          for (int k = 0; k < L.threads && L.error.empty(); ++k) {
            const int j = reverse ? L.threads - 1 - k : k;
            Fiber& f = L.fibers[size_t(j)];
            if (f.state != State::Ready) continue;
            progress = true;
            L.current = j;
            g_idx.thread = f.tid;
            keel_sim_switch(&L.schedulerSp, f.sp);
          }
          if (!progress && L.error.empty()) {
            int atBlock = 0, atWarp = 0;
            for (const Fiber& f : L.fibers) {
              atBlock += f.state == State::AtBlockBarrier;
              atWarp += f.state == State::AtWarpBarrier;
            }
            char buf[200];
            std::snprintf(buf, sizeof buf,
                          "block (%u,%u,%u): deadlock: %d threads at __syncthreads, %d at warp "
                          "barriers, %d returned",
                          bx, by, bz, atBlock, atWarp, L.done);
            L.error = buf;
          }
        }
      }
  g_launch = outer;
  g_idx = saved;
  if (!L.error.empty())
    sim::setLaunchError(cudaErrorLaunchFailure, kernelName(kernel) + ": " + L.error);
}

}  // namespace keel_sim

cudaError_t keelSimFuncSetAttribute(const void* f, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 232448)
    return sim::setError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(keel_sim::g_attrMutex);
  keel_sim::g_maxDynamicShared[f] = value;
  return cudaSuccess;
}
