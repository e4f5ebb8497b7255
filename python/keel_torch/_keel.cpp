// keel_torch's C++ half: Keel's own recording writer (storage::Writer) and tensor hasher
// (capture::tensorMd5, capture::tensorStats) for Python, so a PyTorch run's recording is written
// by the same code as a Keel run's — every Keel tool opens it — and its MD5s equal Keel's for the
// same bytes. The Python half (keel_torch/__init__.py) decides what to record.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/dtype.h"
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

// MD5, rounded MD5 (digits 1..17; 0: none) and statistics of a contiguous buffer of `dtype`
// elements of `shape`, exactly as Keel hashes its own tensors. Returns (md5, stats dict or None,
// rounded md5); all empty for a dtype Keel lacks.
py::tuple hashTensor(py::buffer data, const std::string& dtype, const std::vector<int64_t>& shape,
                     bool md5, bool stats, int roundedDigits) {
  const std::optional<DType> t = keelDType(dtype);
  if (!t) return py::make_tuple(std::string(), py::none(), std::string());
  if (roundedDigits < 0 || roundedDigits > 17)
    throw std::invalid_argument("keel_torch: rounded MD5 digits must be in 1..17, got " +
                                std::to_string(roundedDigits));
  const py::buffer_info info = data.request();
  Tensor host = Tensor::empty(shape, *t, Device(Backend::Cpu));
  const size_t bytes = size_t(host.nbytes());
  if (size_t(info.size * info.itemsize) != bytes)
    throw std::invalid_argument("keel_torch: " + std::to_string(info.size * info.itemsize) +
                                " bytes for a " + dtype + " tensor of " + std::to_string(bytes) +
                                " bytes");
  if (bytes) std::memcpy(host.data(), info.ptr, bytes);
  std::string digest = md5 ? capture::tensorMd5(host) : std::string();
  std::string rounded = roundedDigits > 0 && isFloating(*t)
                            ? capture::tensorMd5Rounded(host, roundedDigits)
                            : std::string();
  py::object s = py::none();
  if (stats && isFloating(*t)) {
    const storage::TensorStats st = capture::tensorStats(host);
    py::dict d;
    d["min"] = st.min;
    d["max"] = st.max;
    d["mean"] = st.mean;
    d["std"] = st.std;
    d["abs_max"] = st.absMax;
    d["nan"] = st.nanCount;
    d["inf"] = st.infCount;
    d["zero"] = st.zeroCount;
    s = d;
  }
  return py::make_tuple(digest, s, rounded);
}

// One tensor from keel_torch's tuple: (output, index, id, version, buffer, shape, strides,
// offset, dtype, device, bytes, md5, stats dict or None, rounded md5).
storage::TensorRecord tensorRecord(const py::tuple& d) {
  if (d.size() != 14) throw std::invalid_argument("keel_torch: a tensor record has 14 fields");
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
  t.md5 = d[11].cast<std::string>();
  t.md5Rounded = d[13].cast<std::string>();
  if (!d[12].is_none()) {
    const py::dict s = d[12].cast<py::dict>();
    t.hasStats = true;
    t.stats.min = s["min"].cast<double>();
    t.stats.max = s["max"].cast<double>();
    t.stats.mean = s["mean"].cast<double>();
    t.stats.std = s["std"].cast<double>();
    t.stats.absMax = s["abs_max"].cast<double>();
    t.stats.nanCount = s["nan"].cast<int64_t>();
    t.stats.infCount = s["inf"].cast<int64_t>();
    t.stats.zeroCount = s["zero"].cast<int64_t>();
  }
  return t;
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
  void op(uint64_t seq, int64_t step, const std::string& phase, const std::string& name,
          const std::string& scope, const std::string& attrsJson, int64_t beginNs, int64_t endNs,
          uint64_t forwardSeq, int64_t stackId, const py::list& tensors) {
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
    for (const py::handle& t : tensors) op.tensors.push_back(tensorRecord(t.cast<py::tuple>()));
    live().writeOp(op);
  }
  void stack(int64_t id, const std::vector<std::tuple<std::string, std::string, int32_t>>& frames) {
    storage::StackRecord s;
    s.id = id;
    for (const auto& [function, file, line] : frames) s.frames.push_back({0, function, file, line});
    live().writeStack(s);
  }
  void step(int64_t step, int64_t beginNs, int64_t endNs, double loss) {
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
    writer_->setRunStatus(status);
    writer_->commit();
    writer_->close();
    writer_.reset();
  }

 private:
  storage::Writer& live() {
    if (!writer_) throw std::runtime_error("keel_torch: the recording is closed");
    return *writer_;
  }
  std::unique_ptr<storage::Writer> writer_;
};

}  // namespace

PYBIND11_MODULE(_keel, m) {
  m.doc() = "Keel's recording writer and tensor hasher (see keel_torch)";
  m.def("hash", &hashTensor, py::arg("data"), py::arg("dtype"), py::arg("shape"),
        py::arg("md5") = true, py::arg("stats") = true, py::arg("rounded_digits") = 0);
  py::class_<Recording>(m, "Recording")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&,
                    uint64_t, const std::string&, const std::string&>())
      .def("op", &Recording::op)
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
