// keel_torch's C++ half: Keel's own recording writer (storage::Writer) and tensor hasher
// (capture::tensorMd5, capture::tensorStats) for Python, so a PyTorch run's recording is written
// by the same code as a Keel run's — every Keel tool opens it — and its MD5s equal Keel's for the
// same bytes. The Python half (keel_torch/__init__.py) decides what to record.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <zstd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/capture/md5_multi.h"
#include "keel/dtype.h"
#include "keel/storage/torch_memory.h"
#include "keel/storage/writer.h"
#include "keel/tensor.h"
#include "keel/version.h"

namespace py = pybind11;

namespace {

using namespace keel;

// A PyTorch dtype name ("float32", "bfloat16", ...) as Keel's, or nullopt for one Keel has no
// dtype for (its tensors are recorded without MD5 and statistics).
std::optional<DType> keelDType(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtypeName(DType(i)) == name) return DType(i);
  return std::nullopt;
}

Phase parsePhase(const std::string& p) {
  if (p == "backward") return Phase::Backward;
  if (p == "optimizer") return Phase::Optimizer;
  return Phase::Forward;
}

int64_t nowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What is computed of each tensor's bytes.
struct Hashing {
  bool md5 = false, stats = false;
  int roundedDigits = 0;  // 1..17; 0: none
  bool any() const { return md5 || stats || roundedDigits > 0; }
};

void checkDigits(int digits) {
  if (digits < 0 || digits > 17)
    throw std::invalid_argument("keel_torch: rounded MD5 digits must be in 1..17, got " +
                                std::to_string(digits));
}

// The bytes of a contiguous `dtype` buffer of `shape` copied into a host tensor Keel can hash;
// undefined for a dtype Keel lacks (its tensors get no MD5 or statistics).
Tensor hostCopy(const py::buffer& data, const std::string& dtype,
                const std::vector<int64_t>& shape) {
  const std::optional<DType> t = keelDType(dtype);
  if (!t) return Tensor();
  const py::buffer_info info = data.request();
  Tensor host = Tensor::empty(shape, *t, Device(Backend::Cpu));
  const size_t bytes = size_t(host.nbytes());
  if (size_t(info.size * info.itemsize) != bytes)
    throw std::invalid_argument("keel_torch: " + std::to_string(info.size * info.itemsize) +
                                " bytes for a " + dtype + " tensor of " + std::to_string(bytes) +
                                " bytes");
  if (bytes) std::memcpy(host.data(), info.ptr, bytes);
  return host;
}

// MD5, rounded MD5 and statistics of `host` into `r`, exactly as Keel hashes its own tensors.
void hashInto(storage::TensorRecord& r, const Tensor& host, const Hashing& h) {
  if (h.md5) r.md5 = capture::tensorMd5(host);
  if (h.roundedDigits > 0 && isFloating(host.dtype()))
    r.md5Rounded = capture::tensorMd5Rounded(host, h.roundedDigits);
  if (h.stats && isFloating(host.dtype())) {
    r.hasStats = true;
    r.stats = capture::tensorStats(host);
  }
}

// keel_torch.hash_tensor: (md5, stats dict or None, rounded md5) of a contiguous buffer; all
// empty for a dtype Keel lacks.
py::tuple hashTensor(py::buffer data, const std::string& dtype, const std::vector<int64_t>& shape,
                     bool md5, bool stats, int roundedDigits) {
  checkDigits(roundedDigits);
  const Tensor host = hostCopy(data, dtype, shape);
  if (!host.defined()) return py::make_tuple(std::string(), py::none(), std::string());
  storage::TensorRecord r;
  hashInto(r, host, {md5, stats, roundedDigits});
  py::object st = py::none();
  if (r.hasStats) {
    py::dict d;
    d["min"] = r.stats.min;
    d["max"] = r.stats.max;
    d["mean"] = r.stats.mean;
    d["std"] = r.stats.std;
    d["abs_max"] = r.stats.absMax;
    d["nan"] = r.stats.nanCount;
    d["inf"] = r.stats.infCount;
    d["zero"] = r.stats.zeroCount;
    st = d;
  }
  return py::make_tuple(r.md5, st, r.md5Rounded);
}

// One tensor from keel_torch's tuple: (output, index, id, version, buffer, shape, strides,
// offset, dtype, device, bytes, data): data is the contiguous bytes to hash (a buffer), or None.
storage::TensorRecord tensorRecord(const py::tuple& d) {
  if (d.size() != 12) throw std::invalid_argument("keel_torch: a tensor record has 12 fields");
  storage::TensorRecord t;
  t.role = d[0].cast<bool>() ? storage::Role::Output : storage::Role::Input;
  t.index = d[1].cast<int32_t>();
  t.tensorId = d[2].cast<uint64_t>();
  t.version = d[3].cast<uint64_t>();
  t.bufferId = d[4].cast<uint64_t>();
  t.shape = d[5].cast<std::vector<int64_t>>();
  t.strides = d[6].cast<std::vector<int64_t>>();
  t.offset = d[7].cast<int64_t>();
  t.dtype = d[8].cast<std::string>();
  t.device = d[9].cast<std::string>();
  t.bytes = d[10].cast<int64_t>();
  return t;
}

// Note [keel_torch hashing off the Python thread]: an op's tensors are copied (under the GIL:
// PyTorch may change them right after) and hashed by worker threads while Python runs on; the
// op's record is written once its hashes are done, in op order, by the thread that calls op()
// (the writer is single-threaded). At most kMaxPendingBytes of copies wait; past that op() waits
// (without the GIL) for the oldest. step() and close() wait for all. The copies are made and
// freed on the calling thread; the workers only read them.
class HashQueue {
 public:
  static constexpr size_t kMaxPendingBytes = size_t(256) << 20;
  struct Pending {
    storage::OpRecord op;
    std::vector<std::pair<size_t, Tensor>> work;  // (tensor index, its bytes)
    size_t bytes = 0;
    int left = 0;  // hashes not done (guarded by mu_)
  };
  HashQueue(Hashing h, int threads) : h_(h) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~HashQueue() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  // Queues an op (waiting while too many copies are pending); adds the records now ready to
  // `ready`, in order.
  void push(std::unique_ptr<Pending> p, std::vector<storage::OpRecord>& ready) {
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        drain(ready);
        if (pendingBytes_ + p->bytes <= kMaxPendingBytes || ops_.empty()) break;
        done_.wait(lk);
      }
      pendingBytes_ += p->bytes;
      p->left = int(p->work.size());
      for (size_t k = 0; k < p->work.size(); ++k) jobs_.push_back({p.get(), k});
      ops_.push_back(std::move(p));
      drain(ready);
    }
    wake_.notify_all();
  }
  // Every queued op's record, in order, once its hashes are done.
  void finish(std::vector<storage::OpRecord>& ready) {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lk(mu_);
    for (drain(ready); !ops_.empty(); drain(ready)) done_.wait(lk);
  }

 private:
  // The finished ops at the front, moved to `ready` (mu_ held).
  void drain(std::vector<storage::OpRecord>& ready) {
    while (!ops_.empty() && ops_.front()->left == 0) {
      pendingBytes_ -= ops_.front()->bytes;
      ready.push_back(std::move(ops_.front()->op));
      ops_.pop_front();
    }
  }

  // A worker takes up to kBatch waiting tensors at once and hashes their MD5s together in SIMD
  // lanes (capture::md5Many, the hasher keel record uses), then each one's statistics and
  // rounded MD5.
  static constexpr size_t kBatch = 16;
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    std::vector<std::pair<Pending*, size_t>> batch;
    for (;;) {
      wake_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      batch.clear();
      while (!jobs_.empty() && batch.size() < kBatch) {
        batch.push_back(jobs_.front());
        jobs_.pop_front();
      }
      lk.unlock();
      hashBatch(batch);
      lk.lock();
      for (const auto& [p, k] : batch)
        if (--p->left == 0) done_.notify_all();
    }
  }

  void hashBatch(const std::vector<std::pair<Pending*, size_t>>& batch) const {
    if (h_.md5) {
      std::vector<std::string> trailers;
      std::vector<capture::Md5Message> msgs;
      trailers.reserve(batch.size());
      for (const auto& [p, k] : batch) {
        const Tensor& t = p->work[k].second;
        trailers.push_back(capture::hashTrailer(t.dtype(), t.shape()));
        capture::Md5Message m;
        m.parts.emplace_back(static_cast<const uint8_t*>(t.data()), size_t(t.nbytes()));
        m.parts.emplace_back(reinterpret_cast<const uint8_t*>(trailers.back().data()),
                             trailers.back().size());
        msgs.push_back(std::move(m));
      }
      std::vector<capture::Md5Digest> digests(msgs.size());
      capture::md5Many(msgs, digests);
      for (size_t i = 0; i < batch.size(); ++i)
        batch[i].first->op.tensors[batch[i].first->work[batch[i].second].first].md5 =
            capture::toHex(digests[i].data(), digests[i].size());
    }
    Hashing rest = h_;
    rest.md5 = false;
    if (rest.any())
      for (const auto& [p, k] : batch)
        hashInto(p->op.tensors[p->work[k].first], p->work[k].second, rest);
  }

  Hashing h_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<std::pair<Pending*, size_t>> jobs_;
  std::deque<std::unique_ptr<Pending>> ops_;
  size_t pendingBytes_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// An output's values as the recording's dumps table holds them (zstd, as keel record --dumps).
storage::DumpRecord dumpRecord(uint64_t seq, const storage::TensorRecord& r, const Tensor& host) {
  storage::DumpRecord d;
  d.opSeq = seq;
  d.role = storage::Role::Output;
  d.index = r.index;
  d.dtype = r.dtype;
  d.shape = r.shape;
  const size_t n = size_t(host.nbytes());
  d.rawBytes = int64_t(n);
  d.data.resize(ZSTD_compressBound(n));
  const size_t z = ZSTD_compress(d.data.data(), d.data.size(), host.data(), n, 3);
  if (ZSTD_isError(z))
    throw std::runtime_error(std::string("keel_torch: zstd compression failed: ") +
                             ZSTD_getErrorName(z));
  d.data.resize(z);
  d.codec = "zstd";
  return d;
}

// One recording being written. Records arrive in order; commit() ends a batch (a step).
class Recording {
 public:
  Recording(const std::string& path, const std::string& device, const std::string& host,
            const std::string& configJson, uint64_t seed, const std::string& optionsJson,
            const std::string& frameworkVersion) {
    storage::RunInfo run;
    run.backend = "torch";
    run.device = device;
    run.host = host;
    run.configJson = configJson.empty() ? "{}" : configJson;
    run.seed = seed;
    run.engineVersion = "torch " + frameworkVersion + ", keel " + KEEL_VERSION_STRING;
    run.startTimeUnixNs = nowUnixNs();
    run.captureOptionsJson = optionsJson;
    writer_ = storage::Writer::create(path, run);
  }
  // dumpOutputs: the outputs' values are stored too (zstd), for element-by-element diffs.
  void op(uint64_t seq, int64_t step, const std::string& phase, const std::string& name,
          const std::string& scope, const std::string& attrsJson, int64_t beginNs, int64_t endNs,
          uint64_t forwardSeq, int64_t stackId, const py::list& tensors, bool dumpOutputs) {
    storage::OpRecord op;
    op.seq = seq;
    op.step = step;
    op.phase = parsePhase(phase);
    op.name = name;
    op.scope = scope;
    op.attrsJson = attrsJson.empty() ? "{}" : attrsJson;
    op.beginNs = beginNs;
    op.endNs = endNs;
    op.forwardSeq = forwardSeq;
    op.stackId = stackId;
    auto p = std::make_unique<HashQueue::Pending>();
    for (const py::handle& h : tensors) {
      const py::tuple t = h.cast<py::tuple>();
      op.tensors.push_back(tensorRecord(t));
      const storage::TensorRecord& r = op.tensors.back();
      const bool dump = dumpOutputs && r.role == storage::Role::Output;
      if ((!hashing_.any() && !dump) || t[11].is_none()) continue;
      Tensor host = hostCopy(t[11].cast<py::buffer>(), r.dtype, r.shape);
      if (!host.defined()) continue;
      if (dump) live().writeDump(dumpRecord(seq, r, host));
      if (!hashing_.any()) continue;
      p->bytes += size_t(host.nbytes());
      p->work.emplace_back(op.tensors.size() - 1, std::move(host));
    }
    storage::Writer& w = live();
    if (!queue_) return w.writeOp(op);
    p->op = std::move(op);  // an op with nothing to hash still waits its turn (op order)
    std::vector<storage::OpRecord> ready;
    queue_->push(std::move(p), ready);
    for (const storage::OpRecord& r : ready) w.writeOp(r);
  }
  // What op() computes of each tensor's bytes, on `threads` worker threads (Note [keel_torch
  // hashing off the Python thread]).
  void hashing(bool md5, bool stats, int roundedDigits, int threads) {
    checkDigits(roundedDigits);
    flush();
    queue_.reset();
    hashing_ = {md5, stats, roundedDigits};
    if (hashing_.any()) queue_ = std::make_unique<HashQueue>(hashing_, std::max(1, threads));
  }
  void stack(int64_t id, const std::vector<std::tuple<std::string, std::string, int32_t>>& frames) {
    storage::StackRecord s;
    s.id = id;
    for (const auto& [function, file, line] : frames) s.frames.push_back({0, function, file, line});
    live().writeStack(s);
  }
  void step(int64_t step, int64_t beginNs, int64_t endNs, double loss) {
    flush();
    storage::StepRecord s;
    s.step = step;
    s.beginNs = beginNs;
    s.endNs = endNs;
    s.loss = loss;
    live().writeStep(s);
    live().commit();
  }
  void log(int64_t step, uint64_t opSeq, const std::string& level, const std::string& scope,
           const std::string& message) {
    storage::LogRecord l;
    l.step = step;
    l.opSeq = opSeq;
    l.level = level == "error"  ? LogLevel::Error
              : level == "warn" ? LogLevel::Warn
                                : LogLevel::Info;
    l.scope = scope;
    l.message = message;
    l.timeNs = nowUnixNs();
    live().writeLog(l);
  }
  // One allocator event (kind: Keel's name, "alloc", "free", "reserve", "release", ...).
  void mem(const std::string& kind, const std::string& device, uint64_t address, uint64_t bytes,
           int64_t step, int64_t stackId, int64_t timeNs, uint64_t allocatedAfter,
           uint64_t reservedAfter) {
    storage::MemRecord r;
    const std::optional<MemEventKind> k = parseMemEventKind(kind);
    if (!k) throw std::invalid_argument("keel_torch: unknown allocator event '" + kind + "'");
    r.kind = *k;
    r.device = device;
    r.address = address;
    r.bytes = bytes;
    r.step = step;
    r.stackId = stackId;
    r.timeNs = timeNs;
    r.allocatedAfter = allocatedAfter;
    r.reservedAfter = reservedAfter;
    live().writeMem(r);
  }
  void close(const std::string& status) {
    if (!writer_) return;
    flush();
    queue_.reset();
    writer_->setRunStatus(status);
    writer_->commit();
    writer_->close();
    writer_.reset();
  }

 private:
  // Every queued op written (their hashes waited for).
  void flush() {
    if (!queue_ || !writer_) return;
    std::vector<storage::OpRecord> ready;
    queue_->finish(ready);
    for (const storage::OpRecord& r : ready) writer_->writeOp(r);
  }
  storage::Writer& live() {
    if (!writer_) throw std::runtime_error("keel_torch: the recording is closed");
    return *writer_;
  }
  Hashing hashing_;
  std::unique_ptr<HashQueue> queue_;  // its workers never touch the writer
  std::unique_ptr<storage::Writer> writer_;
};

// A PyTorch memory snapshot file as a recording at `out` (the keel tool's `import torch-memory`):
// the restricted unpickler reads it, the output guard and the replace-on-complete rule apply.
py::dict importTorchMemory(const std::string& snapshot, const std::string& out, int device) {
  storage::TorchMemoryImportOptions o;
  o.read.device = device;
  o.engineVersion = std::string("torch memory snapshot, keel ") + KEEL_VERSION_STRING;
  o.outputOption = "output";
  storage::TorchMemoryImported imported;
  {
    py::gil_scoped_release free;
    imported = storage::importTorchMemorySnapshot(snapshot, out, o);
  }
  const storage::TorchMemoryWritten& w = imported.written;
  py::dict r;
  r["events"] = w.events;
  r["trace_entries"] = imported.traceEntries;
  r["stacks"] = imported.stacks;
  r["peak_allocated"] = w.peakAllocated;
  r["peak_reserved"] = w.peakReserved;
  r["end_allocated"] = w.endAllocated;
  r["end_reserved"] = w.endReserved;
  return r;
}

}  // namespace

PYBIND11_MODULE(_keel, m) {
  m.doc() = "Keel's recording writer and tensor hasher (see keel_torch)";
  m.def("hash", &hashTensor, py::arg("data"), py::arg("dtype"), py::arg("shape"),
        py::arg("md5") = true, py::arg("stats") = true, py::arg("rounded_digits") = 0);
  m.def("import_torch_memory", &importTorchMemory, py::arg("snapshot"), py::arg("out"),
        py::arg("device") = 0);
  py::class_<Recording>(m, "Recording")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&,
                    uint64_t, const std::string&, const std::string&>())
      .def("op", &Recording::op)
      .def("hashing", &Recording::hashing)
      .def("stack", &Recording::stack)
      .def("step", &Recording::step)
      .def("log", &Recording::log)
      .def("mem", &Recording::mem)
      .def("close", &Recording::close);
  // keel::Error (and storage errors) become RuntimeError with Keel's one-line message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const keel::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}
