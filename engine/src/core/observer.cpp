// Observer registry and notification. Observers are copied into an immutable list on change so
// notification takes no lock on the hot path beyond one shared_ptr load.
#include "keel/observer.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "keel/dispatch.h"
#include "keel/step.h"

namespace keel {
namespace detail {
std::atomic<uint32_t> g_instrumentation{0};  // Note [One load per op]
std::atomic<bool> g_wantOpDescriptions{false};
}  // namespace detail

namespace {
using ObserverList = std::vector<std::shared_ptr<Observer>>;
std::mutex g_obsMu;
ObserverList g_installed;               // every observer (g_obsMu)
std::vector<const Observer*> g_paused;  // those paused (g_obsMu); See Note [Paused observers]
struct Lists {
  ObserverList all, active;  // all hear steps; active (not paused) hear everything else
};
std::shared_ptr<const Lists> g_lists = std::make_shared<Lists>();
std::atomic<uint64_t> g_generation{1};  // bumped on every change of g_lists
std::atomic<bool> g_anyInstalled{false};

// Publishes the lists for g_installed and g_paused (caller holds g_obsMu).
void publish() {
  auto next = std::make_shared<Lists>();
  next->all = g_installed;
  bool want = false;
  for (const auto& o : g_installed)
    if (std::find(g_paused.begin(), g_paused.end(), o.get()) == g_paused.end()) {
      next->active.push_back(o);
      want = want || o->wantsOpDescriptions();
    }
  const bool active = !next->active.empty();
  g_anyInstalled.store(!g_installed.empty());
  g_lists = std::move(next);
  g_generation.fetch_add(1, std::memory_order_release);
  detail::g_wantOpDescriptions.store(want);
  if (active)
    detail::g_instrumentation.fetch_or(detail::kObserversBit);
  else
    detail::g_instrumentation.fetch_and(~detail::kObserversBit);
}

// Each thread caches the lists and refreshes them (under the lock) only when the generation
// moved, so notification takes no lock on the hot path.
std::shared_ptr<const Lists> snapshotLists() {
  thread_local std::shared_ptr<const Lists> cached;
  thread_local uint64_t seenGeneration = 0;
  uint64_t g = g_generation.load(std::memory_order_acquire);
  if (g != seenGeneration) {
    std::lock_guard<std::mutex> lk(g_obsMu);
    cached = g_lists;
    seenGeneration = g_generation.load(std::memory_order_relaxed);
  }
  return cached;  // a copy: safe if a callback changes the observers while we iterate
}
// The observers that are not paused, held alive while the caller iterates.
struct Active {
  std::shared_ptr<const Lists> lists = snapshotLists();
  auto begin() const { return lists->active.begin(); }
  auto end() const { return lists->active.end(); }
};
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
  g_installed.push_back(std::move(obs));
  publish();
  detail::restartStepNumbering();  // a new recording numbers its steps from 1
}

namespace detail {
bool anyObserverInstalled() {
  return g_anyInstalled.load(std::memory_order_relaxed);
}
}  // namespace detail

void removeObserver(const std::shared_ptr<Observer>& obs) {
  std::lock_guard<std::mutex> lk(g_obsMu);
  g_installed.erase(std::remove(g_installed.begin(), g_installed.end(), obs), g_installed.end());
  g_paused.erase(std::remove(g_paused.begin(), g_paused.end(), obs.get()), g_paused.end());
  publish();
}

void setObserverPaused(const std::shared_ptr<Observer>& obs, bool paused) {
  std::lock_guard<std::mutex> lk(g_obsMu);
  if (std::find(g_installed.begin(), g_installed.end(), obs) == g_installed.end()) return;
  const auto it = std::find(g_paused.begin(), g_paused.end(), obs.get());
  if (paused == (it != g_paused.end())) return;  // already so: nothing to publish
  if (paused)
    g_paused.push_back(obs.get());
  else
    g_paused.erase(it);
  publish();
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
  for (auto& o : Active{}) o->onMemory(e);
}
void notifyOpBegin(const OpEvent& e) {
  for (auto& o : Active{}) o->onOpBegin(e);
}
void notifyOpEnd(const OpEvent& e) {
  for (auto& o : Active{}) o->onOpEnd(e);
}
void notifyOpError(const OpEvent& e, std::string_view message) {
  for (auto& o : Active{}) o->onOpError(e, message);
}
void notifyBufferWrite(const Buffer& b) {
  for (auto& o : Active{}) o->onBufferWrite(b);
}
void notifyStep(StepEvent e) {
  // Paused observers too: a step is where they decide to resume (Note [Paused observers]).
  if (!g_anyInstalled.load(std::memory_order_relaxed)) return;
  e.timeNs = nowNs();
  const auto lists = snapshotLists();
  for (auto& o : lists->all) o->onStep(e);
}
void notifyLog(const LogEvent& e) {
  if (!hasObservers()) return;
  for (auto& o : Active{}) o->onLog(e);
}

}  // namespace detail
}  // namespace keel
