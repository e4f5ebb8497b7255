// Observer registry and notification. Observers are copied into an immutable list on change so
// notification takes no lock on the hot path beyond one shared_ptr load.
#include "keel/observer.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "keel/dispatch.h"

namespace keel {
namespace detail {
std::atomic<uint32_t> g_instrumentation{0};  // Note [One load per op]
std::atomic<bool> g_wantOpDescriptions{false};
}  // namespace detail

namespace {
using ObserverList = std::vector<std::shared_ptr<Observer>>;
std::mutex g_obsMu;
std::shared_ptr<const ObserverList> g_observers = std::make_shared<ObserverList>();
std::atomic<uint64_t> g_generation{1};  // bumped on every change of g_observers

// Publishes a new list (caller holds g_obsMu).
void publish(std::shared_ptr<const ObserverList> next) {
  bool want = false;
  for (const auto& o : *next) want = want || o->wantsOpDescriptions();
  const bool any = !next->empty();
  g_observers = std::move(next);
  g_generation.fetch_add(1, std::memory_order_release);
  detail::g_wantOpDescriptions.store(want);
  if (any)
    detail::g_instrumentation.fetch_or(detail::kObserversBit);
  else
    detail::g_instrumentation.fetch_and(~detail::kObserversBit);
}

// Each thread caches the list and refreshes it (under the lock) only when the generation moved,
// so notification takes no lock on the hot path.
std::shared_ptr<const ObserverList> snapshot() {
  thread_local std::shared_ptr<const ObserverList> cached;
  thread_local uint64_t seenGeneration = 0;
  uint64_t g = g_generation.load(std::memory_order_acquire);
  if (g != seenGeneration) {
    std::lock_guard<std::mutex> lk(g_obsMu);
    cached = g_observers;
    seenGeneration = g_generation.load(std::memory_order_relaxed);
  }
  return cached;  // a copy: safe if a callback changes the observers while we iterate
}
}  // namespace

namespace {
thread_local MemTag t_memTag = MemTag::None;
thread_local detail::AllocContext t_allocContext;
}  // namespace

MemTagScope::MemTagScope(MemTag t) : prev_(t_memTag) {
  t_memTag = t;
}
MemTagScope::~MemTagScope() {
  t_memTag = prev_;
}

void addObserver(std::shared_ptr<Observer> obs) {
  std::lock_guard<std::mutex> lk(g_obsMu);
  auto next = std::make_shared<std::vector<std::shared_ptr<Observer>>>(*g_observers);
  next->push_back(std::move(obs));
  publish(std::move(next));
}

void removeObserver(const std::shared_ptr<Observer>& obs) {
  std::lock_guard<std::mutex> lk(g_obsMu);
  auto next = std::make_shared<std::vector<std::shared_ptr<Observer>>>(*g_observers);
  next->erase(std::remove(next->begin(), next->end(), obs), next->end());
  publish(std::move(next));
}

void beforeBufferWrite(const Tensor& t) {
  if (detail::hasObservers() && t.defined()) [[unlikely]]
    detail::notifyBufferWrite(*t.buffer());
}

namespace detail {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

MemTag currentMemTag() {
  return t_memTag;
}
AllocContext& allocContext() {
  return t_allocContext;
}

void notifyMemory(MemEvent e) {
  e.opSeq = currentOpSeq();
  e.timeNs = nowNs();
  if (e.kind == MemEventKind::Alloc || e.kind == MemEventKind::Free) {
    if (!e.bufferId) e.bufferId = t_allocContext.bufferId;
    if (e.kind == MemEventKind::Alloc) e.tag = t_memTag;
  }
  for (auto& o : *snapshot()) o->onMemory(e);
}
void notifyOpBegin(const OpEvent& e) {
  for (auto& o : *snapshot()) o->onOpBegin(e);
}
void notifyOpEnd(const OpEvent& e) {
  for (auto& o : *snapshot()) o->onOpEnd(e);
}
void notifyOpError(const OpEvent& e, std::string_view message) {
  for (auto& o : *snapshot()) o->onOpError(e, message);
}
void notifyBufferWrite(const Buffer& b) {
  for (auto& o : *snapshot()) o->onBufferWrite(b);
}
void notifyStep(StepEvent e) {
  if (!hasObservers()) return;
  e.timeNs = nowNs();
  for (auto& o : *snapshot()) o->onStep(e);
}
void notifyLog(const LogEvent& e) {
  if (!hasObservers()) return;
  for (auto& o : *snapshot()) o->onLog(e);
}

}  // namespace detail
}  // namespace keel
