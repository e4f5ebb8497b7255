// keel_torch's C++ half: Keel's own recording writer (storage::Writer) and tensor hasher
// (capture::tensorMd5, capture::tensorStats) for Python, so a PyTorch run's recording is written
// by the same code as a Keel run's — every Keel tool opens it — and its MD5s equal Keel's for the
// same bytes. The Python half (keel_torch/__init__.py) installs a recording — module scopes,
// phases, steps, autograd hooks — and this half does the work of each op call (Note [keel_torch
// dispatch in C++]).
#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "keel/base/output_path.h"
#include "keel/capture/hash.h"
#include "keel/capture/hash_pool.h"
#include "keel/capture/md5_multi.h"
#include "keel/dtype.h"
#include "keel/runtime.h"
#include "keel/storage/torch_memory.h"
#include "keel/storage/writer.h"
#include "keel/tensor.h"
#include "keel/version.h"

namespace py = pybind11;

namespace {

using namespace keel;

// A PyTorch dtype name ("float32", "bfloat16", ...) as Keel's, or nullopt for one Keel has no
// dtype for.
std::optional<DType> keelDType(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtypeName(DType(i)) == name) return DType(i);
  return std::nullopt;
}

// Note [keel_torch dtypes Keel lacks]: how a dtype's elements are hashed. Keel's own dtypes as
// Keel hashes them; the PyTorch dtypes whose bytes have one meaning that Keel lacks (uint8, int8,
// int16, and complex as its (real, imaginary) pairs) by the same layout (docs/capture.md: the
// elements' little-endian bytes in row-major order, then the trailer) with PyTorch's name in the
// trailer ("uint8"), MD5 only: no statistics, rounded MD5 or dumps, which read values Keel has no
// type for. Any other (quantized) dtype gets no MD5 (keel_torch.hash_tensor warns, once per
// dtype).
struct ElementLayout {
  std::optional<DType> keel;  // nullopt: hashed as bytes
  size_t size = 0;            // bytes per element
  // The dtype a hashing job of these elements is given: Keel's, or for bytes a stand-in the pool
  // reads only for statistics (off) and to normalise bool (which it is not).
  DType job() const { return keel.value_or(DType::Int32); }
};
std::optional<ElementLayout> elementLayout(const std::string& name) {
  if (const std::optional<DType> k = keelDType(name)) return ElementLayout{k, dtypeSize(*k)};
  static const std::pair<const char*, size_t> kBytes[] = {{"uint8", 1},     {"int8", 1},
                                                          {"int16", 2},     {"complex32", 4},
                                                          {"complex64", 8}, {"complex128", 16}};
  for (const auto& [n, size] : kBytes)
    if (name == n) return ElementLayout{std::nullopt, size};
  return std::nullopt;
}

// docs/capture.md's trailer: the dtype's name, NUL, the rank and each dimension as little-endian
// int64 (capture::hashTrailer's, for any dtype name).
std::string hashTrailer(const std::string& dtype, const std::vector<int64_t>& shape) {
  std::string h = dtype;
  h.push_back('\0');
  const auto le64 = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) h.push_back(char(uint64_t(v) >> (8 * i) & 0xff));
  };
  le64(int64_t(shape.size()));
  for (const int64_t d : shape) le64(d);
  return h;
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

// A contiguous `dtype` buffer of `shape` (its size checked), or null for a dtype with no layout
// to hash (Note [keel_torch dtypes Keel lacks]); `layout` set to the dtype's. The view holds the
// buffer's owner: release it with the GIL.
std::unique_ptr<py::buffer_info> bufferView(const py::buffer& data, const std::string& dtype,
                                            const std::vector<int64_t>& shape,
                                            ElementLayout& layout) {
  const std::optional<ElementLayout> l = elementLayout(dtype);
  if (!l) return nullptr;
  layout = *l;
  auto info = std::make_unique<py::buffer_info>(data.request());
  size_t bytes = layout.size;
  for (const int64_t d : shape) bytes *= size_t(d);
  if (size_t(info->size * info->itemsize) != bytes)
    throw std::invalid_argument("keel_torch: " + std::to_string(info->size * info->itemsize) +
                                " bytes for a " + dtype + " tensor of " + std::to_string(bytes) +
                                " bytes");
  return info;
}

// keel_torch.hash_tensor: (md5, stats dict or None, rounded md5) of a contiguous buffer, exactly
// as Keel hashes its own tensors; all empty for a dtype with no layout to hash, and only the MD5
// for one Keel lacks (Note [keel_torch dtypes Keel lacks]).
py::tuple hashTensor(py::buffer data, const std::string& dtype, const std::vector<int64_t>& shape,
                     bool md5, bool stats, int roundedDigits) {
  checkDigits(roundedDigits);
  ElementLayout layout;
  const std::unique_ptr<py::buffer_info> info = bufferView(data, dtype, shape, layout);
  if (!info) return py::make_tuple(std::string(), py::none(), std::string());
  storage::TensorRecord r;
  if (!layout.keel) {
    if (md5) {
      auto job = std::make_shared<capture::detail::HashJob>();
      job->md5 = true;
      job->dtype = layout.job();
      job->bytes = int64_t(info->size * info->itemsize);
      static const uint8_t kNone = 0;  // no elements: a pointer all the same (null means none)
      job->external = info->ptr ? static_cast<const uint8_t*>(info->ptr) : &kNone;
      capture::detail::hashBatch({job}, 0);
      if (!job->error.empty())
        throw std::runtime_error("keel_torch: hashing failed: " + job->error);
      const std::string trailer = hashTrailer(dtype, shape);
      const capture::Md5Digest d =
          job->md5State.finish({reinterpret_cast<const uint8_t*>(trailer.data()), trailer.size()});
      r.md5 = capture::toHex(d.data(), d.size());
    }
    return py::make_tuple(r.md5, py::none(), std::string());
  }
  Tensor host = Tensor::empty(shape, *layout.keel, Device(Backend::Cpu));
  if (host.nbytes()) std::memcpy(host.data(), info->ptr, size_t(host.nbytes()));
  if (md5) r.md5 = capture::tensorMd5(host);
  if (roundedDigits > 0 && isFloating(host.dtype()))
    r.md5Rounded = capture::tensorMd5Rounded(host, roundedDigits);
  py::object st = py::none();
  if (stats && isFloating(host.dtype())) {
    r.stats = capture::tensorStats(host);
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

// Note [keel_torch tensors read in C++]: an op's tensors are read here, from the PyTorch objects
// (their attributes through the C API, the dtype's name and size looked up once per dtype), not
// in Python: a recording's cost per op is mostly this bookkeeping, and Python bytecode and the
// tuples it built cost twice what the attribute reads do. The bytes of a tensor to hash come from
// Python (keel_torch._host_bytes, called here for a tensor not hashed yet). A tensor's layout is
// read at every op, not cached by identity: `t.data = other` changes it without any op that a
// dispatch mode sees.
//
// A tensor's identity is a number per Python object for its lifetime: id() is reused once an
// object is freed, which would join unrelated ops in the graph, so each number is kept with a
// weak reference and counts only while it still names the object (dead entries go at each step).
class TensorReader {
 public:
  TensorReader()
      : version_(intern("_version")),
        shape_(intern("shape")),
        stride_(intern("stride")),
        storageOffset_(intern("storage_offset")),
        dataPtr_(intern("data_ptr")),
        dtype_(intern("dtype")),
        isCuda_(intern("is_cuda")),
        device_(intern("device")),
        elementSize_(intern("element_size")),
        isInference_(intern("is_inference")) {}

  // The record of tensor `t` into `r`, every field but role and index (set by the caller), its
  // buffers reused (Note [keel_torch records recycled]); `layout`: how its elements are hashed
  // (nullopt: not at all).
  void read(py::handle t, std::optional<ElementLayout>& layout, storage::TensorRecord& r) {
    r.tensorId = identity(t.ptr());
    r.version = version(t).value_or(0);
    ints(attr(t, shape_), r.shape);
    ints(call(t, stride_), r.strides);
    r.offset = intOf(call(t, storageOffset_));
    const DTypeInfo& d = dtype(attr(t, dtype_), t);
    r.dtype = d.name;
    layout = d.layout;
    int64_t n = 1;
    for (const int64_t s : r.shape) n *= s;
    r.bytes = n * d.size;
    r.bufferId = base(t, r.offset, d.size);
    if (PyObject_IsTrue(attr(t, isCuda_).ptr()) == 1)
      r.device = py::str(attr(t, device_));
    else
      r.device = "cpu";
    r.md5.clear();
    r.md5Rounded.clear();
    r.hasStats = false;
    r.stats = {};
  }

  // The version counter of `t`; nullopt for an inference tensor (torch.inference_mode), which has
  // none (Note [keel_torch versions]).
  std::optional<uint64_t> version(py::handle t) {
    PyObject* v = PyObject_GetAttr(t.ptr(), version_.ptr());
    if (!v) {
      PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
      PyErr_Fetch(&type, &value, &trace);
      PyObject* inference = PyObject_CallMethodNoArgs(t.ptr(), isInference_.ptr());
      const bool yes = inference == Py_True;
      Py_XDECREF(inference);
      if (yes) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return std::nullopt;
      }
      PyErr_Restore(type, value, trace);  // not an inference tensor: its own error
      throw py::error_already_set();
    }
    return uint64_t(intOf(py::reinterpret_steal<py::object>(v)));
  }

  // The buffer (storage base address) of `t`, or 0.
  uint64_t buffer(py::handle t) {
    return base(t, intOf(call(t, storageOffset_)), dtype(attr(t, dtype_), t).size);
  }

  // Objects given an identity and not yet forgotten.
  size_t identities() const { return ids_.size(); }
  // The weak reference kept with the identity of `t` (read() gave it one).
  const py::object& weakRef(py::handle t) const { return ids_.at(t.ptr()).ref; }
  // Forgets the identities of dead objects.
  void prune() {
    for (auto it = ids_.begin(); it != ids_.end();) {
      if (PyWeakref_GetObject(it->second.ref.ptr()) != it->first)
        it = ids_.erase(it);
      else
        ++it;
    }
  }

 private:
  struct DTypeInfo {
    std::string name;
    std::optional<ElementLayout> layout;
    int64_t size = 1;
  };
  struct Identity {
    uint64_t number = 0;
    py::object ref;  // a weak reference to the object
  };

  // The storage's base address of `t` (offset elements of `size` bytes into it): views of one
  // buffer share it; 0 where PyTorch has none (data_ptr() raises).
  uint64_t base(py::handle t, int64_t offset, int64_t size) const {
    PyObject* p = PyObject_CallMethodNoArgs(t.ptr(), dataPtr_.ptr());
    if (!p) {
      PyErr_Clear();
      return 0;
    }
    const uint64_t ptr = uint64_t(PyLong_AsUnsignedLongLongMask(p));
    Py_DECREF(p);
    return ptr - uint64_t(offset * size);
  }
  static py::object intern(const char* s) {
    return py::reinterpret_steal<py::object>(PyUnicode_InternFromString(s));
  }
  static py::object attr(py::handle o, const py::object& name) {
    PyObject* r = PyObject_GetAttr(o.ptr(), name.ptr());
    if (!r) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
  }
  static py::object call(py::handle o, const py::object& name) {
    PyObject* r = PyObject_CallMethodNoArgs(o.ptr(), name.ptr());
    if (!r) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
  }
  static int64_t intOf(const py::object& o) {
    const long long v = PyLong_AsLongLong(o.ptr());
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    return int64_t(v);
  }
  static int64_t intAttr(py::handle o, const py::object& name) { return intOf(attr(o, name)); }
  // A tuple of ints (torch.Size, strides) into `out`.
  static void ints(const py::object& seq, std::vector<int64_t>& out) {
    PyObject* s = seq.ptr();
    if (!PyTuple_Check(s)) throw std::invalid_argument("keel_torch: expected a tuple of ints");
    const Py_ssize_t n = PyTuple_GET_SIZE(s);
    out.resize(size_t(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(s, i));
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
      out[size_t(i)] = int64_t(v);
    }
  }
  const DTypeInfo& dtype(const py::object& dt, py::handle t) {
    const auto it = dtypes_.find(dt.ptr());
    if (it != dtypes_.end()) return it->second;
    DTypeInfo d;
    std::string name = py::str(dt);  // "torch.float32"
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    d.name = name;
    d.layout = elementLayout(name);
    d.size = intOf(call(t, elementSize_));
    dtypeRefs_.push_back(dt);  // keeps the key alive
    return dtypes_.emplace(dt.ptr(), std::move(d)).first->second;
  }
  uint64_t identity(PyObject* t) {
    const auto it = ids_.find(t);
    if (it != ids_.end() && PyWeakref_GetObject(it->second.ref.ptr()) == t)
      return it->second.number;
    // A run without steps (graph only: no content cache to bound them) forgets dead objects
    // once the table has doubled since the last time.
    if (ids_.size() >= pruneAt_) {
      prune();
      pruneAt_ = std::max<size_t>(kMinPrune, 2 * ids_.size());
    }
    PyObject* ref = PyWeakref_NewRef(t, nullptr);
    if (!ref) throw py::error_already_set();
    Identity& e = ids_[t];
    e.number = ++next_;
    e.ref = py::reinterpret_steal<py::object>(ref);
    return e.number;
  }

  py::object version_, shape_, stride_, storageOffset_, dataPtr_, dtype_, isCuda_, device_,
      elementSize_, isInference_;
  std::unordered_map<PyObject*, DTypeInfo> dtypes_;
  std::vector<py::object> dtypeRefs_;
  std::unordered_map<PyObject*, Identity> ids_;
  static constexpr size_t kMinPrune = size_t(1) << 16;
  size_t pruneAt_ = kMinPrune;
  uint64_t next_ = 0;
};

// Note [keel_torch uninitialised memory]
// An allocation-only ATen op (empty, empty_like, new_empty, empty_strided, ...: the list is
// keel_torch._ALLOCATION_ONLY) returns memory nothing has written: whatever the allocator's
// block held before. Hashed, its garbage made identical runs diverge and was named a run's first
// NaN/Inf (CPU dropout's empty_like before bernoulli_). So its outputs are recorded with their
// shape, strides and dtype and nothing of their contents — no MD5, no statistics, no dump: to
// every Keel tool a tensor not hashed, which neither holds a NaN nor diverges (keel diff: "not
// compared") — and the op's attributes say why (`"uninitialised": ...`). Until the buffer is
// written (its version moves on) or its tensor dies, an op reading it (bernoulli_'s input, a
// view of it) does not hash it either. Keel's own engine records no such op: Tensor::empty
// allocates without an op call (zeros and full are its `fill` op), so a Keel run's recording holds
// no uninitialised memory and the two frameworks' recordings agree.

// Note [keel_torch content cache]: the key of a tensor's content within a step. A contiguous
// tensor's is its elements' place (buffer, offset, bytes), version and dtype, with no identity,
// shape or strides: a reshape, a detach or a view of the same elements shares it.
struct ContentKey {
  uint64_t number = 0, version = 0, buffer = 0;  // number: the identity (0: contiguous)
  int64_t offset = 0, bytes = 0;
  std::vector<int64_t> shape, strides;  // empty: contiguous
  std::string dtype;
  bool operator==(const ContentKey&) const = default;
};
struct ContentKeyHash {
  size_t operator()(const ContentKey& k) const {
    uint64_t h = k.number * 0x9e3779b97f4a7c15ull ^ k.version;
    h = h * 0x100000001b3ull ^ k.buffer;
    h = h * 0x100000001b3ull ^ uint64_t(k.offset);
    h = h * 0x100000001b3ull ^ uint64_t(k.bytes);
    for (const int64_t s : k.shape) h = h * 0x100000001b3ull ^ uint64_t(s);
    for (const int64_t s : k.strides) h = h * 0x100000001b3ull ^ uint64_t(s);
    return size_t(h) ^ std::hash<std::string>()(k.dtype);
  }
};

// Note [keel_torch hashing off the Python thread]: an op's tensors are hashed by Keel's own
// hashing thread (capture::detail::HashPool, the one keel record uses: the MD5 lanes streamed,
// statistics fused into the same pass) while Python runs on, from PyTorch's own memory: the op's
// record holds a buffer view of each tensor (which keeps it alive) and the pool reads the bytes
// without the GIL. What PyTorch writes in place is announced first: before an op that writes an
// argument (`Tensor(a!)` in its schema) runs, keel_torch calls before_write() with the written
// buffers, and the pool copies every tensor of those buffers still queued (one being hashed is
// waited for), so no recorded digest is of bytes an op changed after the op recorded them. The
// op's record is written once its hashes are done, in op order, by the thread that calls op()
// (the writer is single-threaded), and its views are released there, under the GIL. At most
// kMaxPendingBytes are queued; past that op() hashes or waits (without the GIL). step() and
// close() wait for all. The rounded MD5 hashes a copy (it reads a Keel tensor).
//
// Note [keel_torch content cache]
// A step reads most tensors more than once (an op's output is the next ops' input; a parameter
// feeds forward and backward; a reshape or a detach is the same elements again), and a gpt-mini
// step in PyTorch would hash 999 MiB where 355 MiB are distinct. Each tensor's content gets a
// key (ContentKey): a contiguous tensor's is where its elements are — buffer, offset, bytes —
// with its version counter and dtype, whatever tensor object or shape; a strided view's adds its
// identity, shape and strides. Each new key gets a slot; a tensor whose key is known this step is
// passed without bytes and, when its op is written (in op order, so the slot's job is done by
// then), takes the slot's statistics and MD5 midstates, finished with its own trailer (its
// shape). An address outlives its tensor — PyTorch's allocator hands freed memory to the next
// tensor of that size, with version 0 again — so a contiguous key holds only while the tensor
// first hashed under it is alive and still has those elements there (a weak reference, checked
// at each hit); otherwise the elements are hashed again. Bytes written without the version
// counter seeing it (through `.data`, another alias with its own counter) are caught by the ATen
// schema: after an op that writes an argument, every key on that argument's buffer is dropped.
// The cache lives for one step (end_step and step() clear it). Bytes written by no ATen op at all
// (through a NumPy array sharing a tensor's memory) are seen by neither.
class HashQueue {
 public:
  static constexpr int64_t kMaxPendingBytes = int64_t(256) << 20;
  struct Work {
    size_t index = 0;  // the tensor's place in op.tensors
    capture::detail::HashJobPtr job;
    std::unique_ptr<py::buffer_info> view;  // holds PyTorch's memory; released under the GIL
    int64_t slot = 0;                       // where its results are kept (0: nowhere)
    std::vector<uint8_t> copy;              // the bytes `job` reads, where it owns none
  };
  struct Pending {
    storage::OpRecord op;
    std::vector<Work> work;
    std::vector<std::pair<size_t, int64_t>>
        reuse;             // (tensor index, slot it takes its results from)
    size_t submitted = 0;  // jobs of `work` given to the pool so far
    bool discard = false;  // an op that failed: its slots are filled, nothing is written
    size_t used = 0;       // op.tensors in use (Note [keel_torch records recycled])
    // The record's next tensor (one kept from an earlier op where there is one).
    storage::TensorRecord& nextTensor() {
      if (used == op.tensors.size()) op.tensors.emplace_back();
      return op.tensors[used++];
    }
  };
  explicit HashQueue(Hashing h) : h_(h), pool_(kMaxPendingBytes, 0) {}
  HashQueue(const HashQueue&) = delete;
  HashQueue& operator=(const HashQueue&) = delete;
  // A job for one tensor's bytes: PyTorch's memory (`view`, in `buffer`), or a copy where the
  // rounded MD5 needs a Keel tensor or no buffer names the memory (a write to it could not be
  // announced).
  Work work(size_t index, std::unique_ptr<py::buffer_info> view, const ElementLayout& layout,
            uint64_t buffer, int64_t slot) const {
    Work w;
    w.index = index;
    w.slot = slot;
    auto job = std::make_shared<capture::detail::HashJob>();
    const DType dtype = layout.job();
    const bool floating = layout.keel && isFloating(dtype);
    job->md5 = h_.md5;
    job->stats = h_.stats && floating;
    job->dtype = dtype;
    job->bytes = int64_t(view->size * view->itemsize);
    const bool rounded = h_.roundedDigits > 0 && floating;
    if (buffer == 0 && !layout.keel) {
      // Bytes of a dtype Keel lacks (Note [keel_torch dtypes Keel lacks]) where no buffer names
      // the memory: hashed from a copy the work owns.
      const auto* p = static_cast<const uint8_t*>(view->ptr);
      w.copy.assign(p, p + job->bytes);
      static const uint8_t kNone = 0;  // no elements: a pointer all the same (null means none)
      job->external = w.copy.empty() ? &kNone : w.copy.data();
    } else if (rounded || buffer == 0) {
      job->tensor =
          Tensor::empty({job->bytes / int64_t(dtypeSize(dtype))}, dtype, Device(Backend::Cpu));
      if (job->bytes) std::memcpy(job->tensor.data(), view->ptr, size_t(job->bytes));
      if (rounded) job->roundedDigits = h_.roundedDigits;
    } else {
      job->external = static_cast<const uint8_t*>(view->ptr);
      job->bufferId = buffer;
      w.view = std::move(view);
    }
    w.job = std::move(job);
    return w;
  }
  // Queues an op's jobs; moves the ops now done to `done`, in order.
  void push(std::unique_ptr<Pending> p, std::vector<std::unique_ptr<Pending>>& done) {
    submit(*p);
    ops_.push_back(std::move(p));
    while (!ops_.empty() && ready(*ops_.front())) pop(done);
  }
  // Gives the pool the jobs of `p` it does not have yet (before_write: an op's inputs, before
  // the op may write them).
  void submit(Pending& p) {
    py::gil_scoped_release nogil;
    for (; p.submitted < p.work.size(); ++p.submitted)
      pool_.submit(p.work[p.submitted].job, /*block=*/true);
  }
  // Every queued op, in order, once its hashes are done.
  void finish(std::vector<std::unique_ptr<Pending>>& done) {
    {
      py::gil_scoped_release nogil;
      pool_.drain();
    }
    while (!ops_.empty()) pop(done);
  }
  // PyTorch is about to write these buffers: their tensors still queued are copied now, those
  // being hashed waited for.
  void beforeWrite(const std::vector<uint64_t>& buffers) {
    py::gil_scoped_release nogil;
    for (const uint64_t b : buffers) pool_.settle(b);
  }
  // Queued ops whose tensors are not all hashed yet.
  size_t waiting() const {
    size_t n = 0;
    for (const std::unique_ptr<Pending>& p : ops_) n += !ready(*p);
    return n;
  }
  // Forgets the content slots (a step ended; call after finish()).
  void clearSlots() { slots_.clear(); }

 private:
  static bool ready(const Pending& p) {
    for (const Work& w : p.work)
      if (!w.job->done()) return false;
    return true;
  }
  // The front op (done): its results into its record and its slots, the tensors that reuse a
  // slot given theirs; moved to `done`.
  // A done job's results into a tensor's record: its MD5s are the job's midstates finished with
  // the tensor's own trailer (its shape), so a reshape of the same elements gets its own.
  static void fill(storage::TensorRecord& r, const capture::detail::HashJob& job) {
    const std::string trailer = hashTrailer(r.dtype, r.shape);
    if (job.md5) {
      const capture::Md5Digest d =
          job.md5State.finish({reinterpret_cast<const uint8_t*>(trailer.data()), trailer.size()});
      r.md5 = capture::toHex(d.data(), d.size());
    }
    if (job.roundedDigits > 0) r.md5Rounded = job.md5Rounded.finish(trailer);
    if (job.stats) {
      r.hasStats = true;
      r.stats = job.statsResult;
    }
  }
  void pop(std::vector<std::unique_ptr<Pending>>& done) {
    Pending& p = *ops_.front();
    for (const Work& w : p.work) {
      capture::detail::HashJob& job = *w.job;
      if (!job.error.empty()) throw std::runtime_error("keel_torch: hashing failed: " + job.error);
      fill(p.op.tensors[w.index], job);
      std::vector<uint8_t>().swap(job.snapshot);  // a copy made before a write: read, let go
      if (w.slot) slots_[w.slot] = w.job;
    }
    for (const auto& [index, slot] : p.reuse) {
      const auto it = slots_.find(slot);
      if (it == slots_.end()) continue;  // not kept (a slot from before clearSlots)
      fill(p.op.tensors[index], *it->second);
    }
    done.push_back(std::move(ops_.front()));
    ops_.pop_front();
  }

  Hashing h_;
  std::deque<std::unique_ptr<Pending>> ops_;  // their views outlive the pool's reads:
  std::unordered_map<int64_t, capture::detail::HashJobPtr>
      slots_;                       // Note [keel_torch content cache]: done jobs, by slot
  capture::detail::HashPool pool_;  // destroyed (its queue hashed) first
};

// An output's values as the recording's dumps table holds them (zstd, as keel record --dumps).
storage::DumpRecord dumpRecord(uint64_t seq, const storage::TensorRecord& r, const void* bytes,
                               size_t n) {
  storage::DumpRecord d;
  d.opSeq = seq;
  d.role = storage::Role::Output;
  d.index = r.index;
  d.dtype = r.dtype;
  d.shape = r.shape;
  d.rawBytes = int64_t(n);
  d.data.resize(ZSTD_compressBound(n));
  const size_t z = ZSTD_compress(d.data.data(), d.data.size(), bytes, n, 3);
  if (ZSTD_isError(z))
    throw std::runtime_error(std::string("keel_torch: zstd compression failed: ") +
                             ZSTD_getErrorName(z));
  d.data.resize(z);
  d.codec = "zstd";
  return d;
}

// Note [keel_torch writer thread]: the SQLite inserts of a recording run on a thread of their own
// (as keel record's do), so the Python thread only reads the tensors and queues the records; a
// step ends with a commit on that thread. A write that fails (a full disk) is reported by the next
// call from Python and by close(). At most kMaxQueued records wait; past that the caller waits
// (without the GIL).
// The status a recording ends with: the loop's own, except that a loop that ended well
// ("finished") whose records could not all be written or recorded (`error`) did not finish, and a
// loop that failed with that very error (raised in it: "failed: RuntimeError: recording ...")
// failed with the write's error as such.
std::string endedStatus(const std::string& status, const std::string& error) {
  if (error.empty()) return status;
  const std::string line = error.substr(0, error.find('\n'));  // its first line, as Python's
  const bool same = status.rfind("failed: ", 0) == 0 && status.size() >= line.size() &&
                    status.compare(status.size() - line.size(), line.size(), line) == 0;
  if (status != "finished" && !same) return status;
  return "failed: " + line;
}

class WriterThread {
 public:
  using Task = std::function<void(storage::Writer&)>;
  // close() records the run's status even after a failed write (best effort: through
  // Writer::closeWithStatus, since the connection whose write failed may refuse every later one).
  static constexpr size_t kMaxQueued = 1 << 16;
  static constexpr size_t kWakeRecords = 1024;
  explicit WriterThread(std::unique_ptr<storage::Writer> w) : writer_(std::move(w)) {
    thread_ = std::thread([this] { run(); });
  }
  ~WriterThread() {
    try {
      close(std::nullopt);
    } catch (...) {  // a destructor reports nothing; close() is where errors are seen
    }
  }
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;

  // wake: start the thread now, rather than once kWakeRecords records are queued (a wake-up per
  // record would cost a context switch each on a small machine). records: how many the task
  // writes (a batch of ops: Note [keel_torch records recycled]).
  void post(Task t, bool wake = false, size_t records = 1) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!error_.empty()) throw std::runtime_error(error_);
    if (closed_) throw std::runtime_error("keel_torch: the recording is closed");
    if (queued_ >= kMaxQueued) {
      // Waits without the GIL and then takes the GIL back without holding mu_ (another Python
      // thread may hold the GIL and want mu_).
      lk.unlock();
      {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> wait(mu_);
        room_.wait(wait, [&] { return queued_ < kMaxQueued || !error_.empty(); });
      }
      lk.lock();
      if (!error_.empty()) throw std::runtime_error(error_);
      if (closed_) throw std::runtime_error("keel_torch: the recording is closed");
    }
    tasks_.push_back(std::move(t));
    queued_ += records;
    if (idle_ && (wake || queued_ >= kWakeRecords)) work_.notify_one();
  }
  // Writes what is queued, records `status` (if given), commits and closes the file, then stops
  // the thread; throws the first write error. Idempotent.
  void close(std::optional<std::string> status) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) return;
      closed_ = true;
      status_ = std::move(status);
    }
    work_.notify_one();
    {
      py::gil_scoped_release nogil;
      thread_.join();
    }
    if (!error_.empty()) throw std::runtime_error(error_);
  }

 private:
  void run() {
    std::deque<Task> batch;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      idle_ = true;
      work_.wait(lk, [&] { return closed_ || !tasks_.empty(); });
      idle_ = false;
      if (tasks_.empty() && closed_) break;
      batch.swap(tasks_);
      queued_ = 0;
      room_.notify_all();
      lk.unlock();
      try {
        for (Task& t : batch)
          if (error_.empty()) t(*writer_);
      } catch (const std::exception& e) {
        lk.lock();
        error_ = e.what();
        room_.notify_all();
        lk.unlock();
      }
      batch.clear();
      lk.lock();
    }
    bool failed = !error_.empty();
    lk.unlock();
    if (status_ && !failed) {
      try {
        writer_->setRunStatus(*status_);
        writer_->commit();
        writer_->close();
      } catch (const std::exception& e) {
        lk.lock();
        error_ = e.what();
        lk.unlock();
        failed = true;
      }
    }
    if (status_ && failed) writer_->closeWithStatus(endedStatus(*status_, error_));
    writer_.reset();  // closes the file if nothing above did
  }

  std::unique_ptr<storage::Writer> writer_;
  std::mutex mu_;
  std::condition_variable work_, room_;
  std::deque<Task> tasks_;
  size_t queued_ = 0;                  // records in tasks_
  std::optional<std::string> status_;  // close()'s
  bool idle_ = false, closed_ = false;
  std::string error_;  // the first failed write (guarded by mu_ once the thread runs)
  std::thread thread_;
};

// One recording being written. Records arrive in order; commit() ends a batch (a step).
class Recording {
 public:
  // `script`: the running program's file ("" none), never written over (Note [Outputs never
  // destroy inputs]: like `keel record -o`, a device, a FIFO, a directory or the script itself
  // is refused, and a symlink's file is written, not the link). An existing recording this
  // process may not write is refused, as is a directory it may not write in ("cannot write
  // OUTPUT: Permission denied", as `keel record` says). Nothing is written until open(): the
  // constructor only checks the output and takes its lock, so a setup that fails after it
  // leaves an existing recording byte for byte.
  Recording(const std::string& path, const std::string& device, const std::string& host,
            const std::string& configJson, uint64_t seed, const std::string& optionsJson,
            const std::string& frameworkVersion, const std::string& script) {
    try {
      checkOutputPath("keel_torch.record: output", path, {{"the running script", script}});
      checkReplacesOnlyARecording("keel_torch.record: output", path);
      checkWritable(path);  // a read-only recording (or another user's) is not replaced
      target_ = followOutputLink(path);
      const size_t slash = target_.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : target_.substr(0, slash + 1);
      if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0)
        throw Error("cannot write " + path + ": " + std::strerror(errno));
      lock_ = std::make_unique<OutputLock>(target_);
    } catch (const Error& e) {  // one line that says who refused
      const std::string what = e.what();
      if (what.rfind("keel_torch.record: ", 0) == 0) throw;
      throw Error("keel_torch.record: " + what);
    }
    run_.backend = "torch";
    run_.device = device;
    run_.host = host;
    run_.configJson = configJson.empty() ? "{}" : configJson;
    run_.seed = seed;
    run_.engineVersion = "torch " + frameworkVersion + ", keel " + KEEL_VERSION_STRING;
    run_.captureOptionsJson = optionsJson;
  }
  // Creates the recording (replacing an existing one: it keeps its permission bits, Note
  // [Outputs never destroy inputs]); called once the setup has succeeded.
  void open() {
    if (writer_ || !lock_) throw std::logic_error("keel_torch: open() twice or after close()");
    run_.startTimeUnixNs = nowUnixNs();
    writer_ = std::make_unique<WriterThread>(storage::Writer::create(target_, run_));
  }
  bool opened() const { return writer_ != nullptr; }
  // Note [keel_torch dispatch in C++]: the dispatch mode's work for each ATen op call happens
  // here, not in Python: a recording's cost is per op (1,276 ops in a gpt-mini step), and the
  // same steps as Python bytecode cost about as much as the op's record. What the Python half
  // keeps is what happens per module, per step or per new kind of op, which it reaches through
  // the session object given to bind(): _overload(func) (name, attributes JSON, the arguments
  // the op writes, whether to skip it), _end_pending() (the step the optimizer ended is
  // written), _hook_forward_outputs(pending) (Note [keel_torch forward links]), _stack() (the
  // Python stack's id) and _delegate(...) (modes pushed inside the recording run first: Note
  // [keel_torch direct dispatch mode]). The state the Python half changes (the phase, the
  // module scopes, the forward op autograd is running, ...) lives here, as properties.
  void bind(const py::object& session, bool direct, bool stacks, const py::object& dumps) {
    session_ = session;
    direct_ = direct;
    stacks_ = stacks;
    dumpAll_ = false;
    dumpPrefix_.reset();
    if (py::isinstance<py::bool_>(dumps))
      dumpAll_ = dumps.cast<bool>();
    else if (std::string prefix = dumps.cast<std::string>(); !prefix.empty())
      dumpPrefix_ = std::move(prefix);  // "" dumps nothing, as False
    const py::module_ torch = py::module_::import("torch");
    tensorType_ = torch.attr("Tensor");
    gradEnabled_ = torch.attr("is_grad_enabled");
    stackLength_ = torch.attr("_C").attr("_len_torch_dispatch_stack");
    requiresGrad_ = py::reinterpret_steal<py::object>(PyUnicode_InternFromString("requires_grad"));
  }
  // Breaks the session <-> recording cycle (neither is collected while it stands).
  void unbind() {
    session_ = py::object();
    pendingOutputs_ = py::list();
    overloads_.clear();
  }

  // The mode's __torch_dispatch__: runs `func` and records the call.
  py::object dispatch(const py::object& func, const py::object& types, const py::object& args,
                      const py::object& kwargs) {
    if (!session_) throw std::logic_error("keel_torch: dispatch() before bind()");
    PyObject* kw = kwargs.is_none() ? nullptr : kwargs.ptr();
    if (direct_ && stackLength_().cast<int64_t>() > 1)
      return session_.attr("_delegate")(func, types, args, kwargs);
    if (busy_) return call(func, args, kw);
    busy_ = true;
    // Its tensor lists are kept from op to op (their blocks), not their references.
    struct Idle {
      Recording& r;
      ~Idle() {
        r.inputs_.clear();
        r.outputs_.clear();
        r.outputReturns_.clear();
        r.writtenTensors_.clear();
        r.busy_ = false;
      }
    } idle{*this};
    // Note [keel_torch step boundary]: the optimizer's step ends the step; the next one begins
    // with the next op, so preparing the next batch is the next step's (forward, as Keel's
    // trainer makes its batch), except the optimizer's (or the model's) zero_grad and reading a
    // number (the loss, for a log line: detach, _local_scalar_dense), which stay in the step they
    // finish; ops that are not computation (profiler markers) end nothing.
    const Overload& o = overload(func);
    if (o.skip) return call(o.run, args, kw);  // not computation: ends no step
    if (pendingEnd_ && o.name != "_local_scalar_dense" && o.name != "detach" &&
        !session_.attr("in_zero_grad").cast<bool>()) {
      session_.attr("_end_pending")();
      afterBackward_ = false;  // what follows is not the optimizer's work
    }
    if (PyList_GET_SIZE(pendingOutputs_.ptr()) > 0) hookPending();

    std::vector<py::object>& inputs = inputs_;
    tensorsOf(args.ptr(), inputs);
    if (kw) {
      PyObject *key = nullptr, *value = nullptr;
      for (Py_ssize_t pos = 0; PyDict_Next(kw, &pos, &key, &value);) tensorsIn(value, inputs);
    }
    // The op's record. Whatever ends this call before the record is queued (the op raising, a
    // tensor that cannot be read, the stack callback) queues it as discarded all the same: its
    // hashing jobs may be with the pool, reading PyTorch's memory through the record's views,
    // and its content slots must be filled for the ops that reuse them.
    std::unique_ptr<HashQueue::Pending> p = takePending();
    struct Abandon {
      Recording& r;
      std::unique_ptr<HashQueue::Pending>& p;
      ~Abandon() {
        if (!p) return;
        try {
          r.abortWrite(std::move(p));
        } catch (...) {  // the exception under way is the one to report
        }
      }
    } abandon{*this, p};
    py::object out;
    int64_t begin = 0;
    if (!o.written.empty()) {
      // The inputs are read before the op writes them (their version, their bytes: Note
      // [keel_torch hashing off the Python thread], [keel_torch content cache]).
      std::vector<py::object>& written = writtenTensors_;
      for (const auto& [position, name] : o.written) {
        PyObject* value = nullptr;
        if (position >= 0 && position < PyTuple_GET_SIZE(args.ptr()))
          value = PyTuple_GET_ITEM(args.ptr(), position);
        else if (kw)
          value = PyDict_GetItemWithError(kw, name.ptr());
        if (value) tensorsIn(value, written);
      }
      beforeWrite(inputs, written, *p);
      begin = monotonicNs();
      try {
        out = call(o.run, args, kw);
      } catch (...) {
        afterWrite();
        throw;
      }
      afterWrite();
    } else {
      begin = monotonicNs();
      out = call(o.run, args, kw);
      boundContent();
      addTensors(inputs, storage::Role::Input, false, *p);
    }
    const int64_t end = monotonicNs();
    std::vector<py::object>& outputs = outputs_;
    std::vector<size_t>& returnOf = outputReturns_;  // each output's return
    if (isTensor(out.ptr())) {
      outputs.push_back(out);
      returnOf.push_back(0);
    } else if (PyTuple_Check(out.ptr()) || PyList_Check(out.ptr())) {
      // (Tensor, Tensor[]) results too; a single Tensor[] return is the list itself.
      const bool one = o.returns.size() <= 1;
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(out.ptr());
      PyObject** items = PySequence_Fast_ITEMS(out.ptr());
      for (Py_ssize_t i = 0; i < n; ++i) {
        tensorsIn(items[i], outputs);
        returnOf.resize(outputs.size(), one ? 0 : size_t(i));
      }
    }
    const std::vector<std::optional<uint64_t>>& versions = outputVersions(o, args, kw);
    const size_t inputCount = p->used;  // the inputs' records come first
    ++seq_;
    ++stepOps_;
    uint64_t forwardSeq = 0;
    Phase phase = phase_;
    bool gradientWork = false;
    std::string scope;
    if (phase == Phase::Backward) {
      // Note [keel_torch backward scopes]
      forwardSeq = forwardSeq_;
      const auto it = forwardScopes_.find(forwardSeq);
      scope = it != forwardScopes_.end() ? it->second : backwardScope_;
    } else {
      if (!scopes_.empty()) scope = scopes_.back();
      // Outputs get a grad_fn when an input requires grad (only those are held: holding the
      // others changed what PyTorch 1.13 dispatched, an extra detach).
      if (phase == Phase::Forward && anyRequiresGrad(inputs) &&
          PyObject_IsTrue(gradEnabled_().ptr()) == 1) {
        py::list held(outputs.size());
        for (size_t i = 0; i < outputs.size(); ++i) held[i] = outputs[i];
        pendingOutputs_.append(py::make_tuple(seq_, std::move(held)));
        forwardScopes_[seq_] = scope;
      } else if (phase == Phase::Forward && afterBackward_ && scopes_.empty() &&
                 readsGradients(*p, inputCount)) {
        gradientWork = true;
        // Note [keel_torch optimizer work]: after .backward(), outside any module, an op that
        // reads a parameter's gradient or what such an op made is the optimizer's work (gradient
        // clipping or scaling, as Keel's clip_grad_norm).
        phase = Phase::Optimizer;
      }
    }
    storage::OpRecord& op = p->op;
    op.seq = seq_;
    op.step = stepNo_;
    op.phase = phase;
    op.name = o.name;
    op.scope = std::move(scope);
    op.attrsJson = o.attrs;
    op.beginNs = begin;
    op.endNs = end;
    op.forwardSeq = forwardSeq;
    op.stackId = stacks_ ? session_.attr("_stack")().cast<int64_t>() : -1;
    const bool dump = dumped(op.scope) && !o.allocationOnly;
    dumpedOps_ += dump;
    addTensors(outputs, storage::Role::Output, dump, *p, &versions, o.allocationOnly);
    if (gradientWork)  // Note [keel_torch optimizer work]
      for (size_t i = inputCount; i < p->used; ++i) gradDerived_.insert(op.tensors[i].tensorId);
    if (!queue_) {
      writeOp(std::move(p));
    } else {
      std::vector<std::unique_ptr<HashQueue::Pending>> done;
      queue_->push(std::move(p), done);  // an op with nothing to hash still waits its turn
      write(done);
    }
    return out;
  }

  // The forward ops' outputs waiting for a hook (Note [keel_torch forward links]) given to the
  // session's _hook_forward_outputs.
  void hookPending() {
    if (!session_ || PyList_GET_SIZE(pendingOutputs_.ptr()) == 0) return;
    py::list pending = std::move(pendingOutputs_);
    pendingOutputs_ = py::list();
    session_.attr("_hook_forward_outputs")(pending);
  }
  void pushScope(const std::string& scope) { scopes_.push_back(scope); }
  std::string popScope() {
    if (scopes_.empty()) throw std::logic_error("keel_torch: no module scope to leave");
    std::string s = std::move(scopes_.back());
    scopes_.pop_back();
    return s;
  }
  std::string phaseName() const { return std::string(keel::phaseName(phase_)); }
  void setPhase(const std::string& p) { phase_ = parsePhase(p); }
  bool busy_ = false, afterBackward_ = false;
  uint64_t seq_ = 0, forwardSeq_ = 0;
  int64_t stepNo_ = 1, stepOps_ = 0, pendingEnd_ = 0;  // pendingEnd_: 0 none
  std::string backwardScope_;
  Phase phase_ = Phase::Forward;
  std::vector<std::string> scopes_;

  // Tensors whose bytes were hashed, and those that took an earlier tensor's results (Note
  // [keel_torch content cache]): counts and bytes.
  py::dict counts() const {
    py::dict d;
    d["hashed"] = py::make_tuple(hashed_[0], hashed_[1]);
    d["reused"] = py::make_tuple(reused_[0], reused_[1]);
    d["identities"] = reader_.identities();
    d["waiting"] = queue_ ? queue_->waiting() : 0;  // ops whose hashing is not done
    d["dumped_ops"] = dumpedOps_;
    return d;
  }
  // What dispatch() computes of each tensor's bytes, off the Python thread (Note [keel_torch
  // hashing off the Python thread]). hostBytes: keel_torch._host_bytes (a tensor's elements as a
  // contiguous host buffer).
  void hashing(bool md5, bool stats, int roundedDigits, py::function hostBytes) {
    checkDigits(roundedDigits);
    hostBytes_ = std::move(hostBytes);
    flush();
    queue_.reset();
    hashing_ = {md5, stats, roundedDigits};
    if (hashing_.any()) queue_ = std::make_unique<HashQueue>(hashing_);
  }
  void stack(int64_t id, const std::vector<std::tuple<std::string, std::string, int32_t>>& frames) {
    storage::StackRecord s;
    s.id = id;
    for (const auto& [function, file, line] : frames) s.frames.push_back({0, function, file, line});
    live().post([s = std::move(s)](storage::Writer& w) { w.writeStack(s); });
  }
  // Ends the step: its record (number, time, loss, the optimizer's learning rate where known)
  // after its ops'.
  // `loss`: none when the step reported none; a NaN given is a NaN (Note [Reported NaN]).
  void step(int64_t beginNs, int64_t endNs, std::optional<double> loss, std::optional<double> lr) {
    flush();
    if (queue_) queue_->clearSlots();  // Note [keel_torch content cache]: one step's
    content_.clear();
    contentBuffers_.clear();
    reader_.prune();
    std::erase_if(uninitialised_,
                  [&](const auto& e) { return !stillThere(e.second.source, e.first); });
    storage::StepRecord s;
    s.step = stepNo_;
    s.beginNs = beginNs;
    s.endNs = endNs;
    if (loss) {
      s.loss = *loss;
      if (std::isnan(*loss)) s.nanMetrics |= storage::stepMetricBit(storage::StepMetric::Loss);
    }
    if (lr) {
      s.lr = *lr;
      if (std::isnan(*lr)) s.nanMetrics |= storage::stepMetricBit(storage::StepMetric::Lr);
    }
    live().post(
        [s](storage::Writer& w) {
          w.writeStep(s);
          w.commit();
        },
        /*wake=*/true);
    ++stepNo_;  // once its record is queued
    stepOps_ = 0;
    forwardScopes_.clear();
    gradBuffers_.clear();
    gradDerived_.clear();
  }
  // Note [keel_torch optimizer work]: the parameters' gradients as .backward() left them.
  void gradients(const std::vector<py::object>& grads) {
    gradBuffers_.clear();
    gradDerived_.clear();
    for (const py::object& g : grads)
      if (const uint64_t b = reader_.buffer(g)) gradBuffers_.insert(b);
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
    live().post([l = std::move(l)](storage::Writer& w) { w.writeLog(l); });
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
    live().post([r = std::move(r)](storage::Writer& w) { w.writeMem(r); });
  }
  void close(const std::string& status) {
    if (!writer_) {  // never opened (the setup failed): nothing was written
      lock_.reset();
      return;
    }
    std::exception_ptr failed;  // the recording is closed with its status all the same
    try {
      flush();
    } catch (...) {
      failed = std::current_exception();
    }
    try {
      postBatch();  // the ops done before a failure are kept
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    queue_.reset();
    std::string error;  // why the last ops could not be recorded
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        error = exceptionText(e);
      } catch (...) {
        error = "recording the last ops";
      }
    }
    {
      // The output lock goes with the file's close, whatever it throws: the same path recorded
      // again in this process (a notebook's next cell) found its own lock still held.
      const std::unique_ptr<OutputLock> lock = std::move(lock_);
      const std::unique_ptr<WriterThread> writer = std::move(writer_);
      writer->close(endedStatus(status, error));
    }
    if (failed) std::rethrow_exception(failed);
  }

 private:
  // Every queued op written (their hashes waited for).
  void flush() {
    if (!queue_ || !writer_) return;
    std::vector<std::unique_ptr<HashQueue::Pending>> done;
    queue_->finish(done);
    write(done);
  }
  // Finished ops written in order; their views of PyTorch's memory released (the GIL is held).
  void write(std::vector<std::unique_ptr<HashQueue::Pending>>& done) {
    for (std::unique_ptr<HashQueue::Pending>& p : done) {
      if (p->discard)
        recycle(std::move(p));
      else
        writeOp(std::move(p));
    }
    done.clear();
  }

  // Note [keel_torch records recycled]: an op's record is made of a dozen heap blocks (its
  // strings, its tensors, their shapes and strides), and made on the Python thread and freed on
  // the writer's, glibc's allocator spent as long on them as the rest of the recording (frees
  // into another thread's arena take its lock, and its bins fill with chunks to sort). So records
  // go round: the writer thread writes a batch of kOpBatch ops and hands the batch back, and the
  // next ops are filled in place, reusing the blocks (a string or vector assigned into one
  // that is large enough allocates nothing).
  static constexpr size_t kOpBatch = 256;
  using OpBatch = std::vector<std::unique_ptr<HashQueue::Pending>>;
  std::unique_ptr<HashQueue::Pending> takePending() {
    if (spare_.empty()) {
      std::lock_guard<std::mutex> lk(returnedMu_);
      if (!returned_.empty()) {
        spare_ = std::move(returned_.back());
        returned_.pop_back();
      }
    }
    if (spare_.empty()) return std::make_unique<HashQueue::Pending>();
    std::unique_ptr<HashQueue::Pending> p = std::move(spare_.back());
    spare_.pop_back();
    return p;
  }
  // A record done with, its views of PyTorch's memory released (the GIL is held), kept for
  // the next op.
  static void reset(HashQueue::Pending& p) {
    p.work.clear();
    p.reuse.clear();
    p.submitted = 0;
    p.discard = false;
    p.used = 0;
  }
  void recycle(std::unique_ptr<HashQueue::Pending> p) {
    reset(*p);
    spare_.push_back(std::move(p));
  }
  void writeOp(std::unique_ptr<HashQueue::Pending> p) {
    p->op.tensors.resize(p->used);
    reset(*p);
    batch_.push_back(std::move(p));
    if (batch_.size() >= kOpBatch) postBatch();
  }
  // The ops waiting in batch_ to the writer thread; the batch comes back once written.
  void postBatch() {
    if (batch_.empty() || !writer_) return;
    auto batch = std::make_shared<OpBatch>(std::move(batch_));
    batch_ = OpBatch();
    const size_t records = batch->size();
    writer_->post(
        [this, batch](storage::Writer& w) {
          for (const std::unique_ptr<HashQueue::Pending>& p : *batch) w.writeOp(p->op);
          std::lock_guard<std::mutex> lk(returnedMu_);
          returned_.push_back(std::move(*batch));
        },
        /*wake=*/false, records);
  }
  // The writer thread, for a record other than an op: the ops before it are posted first.
  WriterThread& live() {
    if (!writer_) throw std::runtime_error("keel_torch: the recording is closed");
    postBatch();
    return *writer_;
  }
  // An op's inputs or outputs into its record; the bytes of those not hashed this step queued
  // (or dumped).
  // versions: the outputs' versions after the op where they differ from what is read now (Note
  // [keel_torch versions]).
  // allocationOnly: the tensors are the outputs of an op that only allocates them (Note
  // [keel_torch uninitialised memory]).
  void addTensors(const std::vector<py::object>& tensors, storage::Role role, bool dump,
                  HashQueue::Pending& p,
                  const std::vector<std::optional<uint64_t>>* versions = nullptr,
                  bool allocationOnly = false) {
    storage::OpRecord& op = p.op;
    int32_t index = 0;
    for (const py::handle t : tensors) {
      std::optional<ElementLayout> layout;
      const size_t at = p.used;
      storage::TensorRecord& r = p.nextTensor();
      reader_.read(t, layout, r);
      if (versions && size_t(index) < versions->size() && (*versions)[size_t(index)])
        r.version = *(*versions)[size_t(index)];
      r.role = role;
      r.index = index++;
      if (allocationOnly) {  // no digest, no statistics, no values: its shape and dtype only
        if (r.bufferId) uninitialised_[r.bufferId] = {r.version, reader_.weakRef(t)};
        continue;
      }
      if (!uninitialised_.empty() && stillUninitialised(r)) continue;
      // Values are dumped only in the dtypes Keel reads (Note [keel_torch dtypes Keel lacks]).
      const bool dumpIt = dump && layout && layout->keel;
      if (!layout || (!queue_ && !dumpIt)) continue;
      int64_t slot = 0;
      if (queue_) {
        const bool contiguous = isContiguous(r.shape, r.strides);
        ContentKey key{contiguous ? 0 : r.tensorId,
                       r.version,
                       r.bufferId,
                       r.offset,
                       r.bytes,
                       contiguous ? std::vector<int64_t>() : r.shape,
                       contiguous ? std::vector<int64_t>() : r.strides,
                       r.dtype};
        const auto it = content_.find(key);
        if (it != content_.end() && (!contiguous || stillThere(it->second.source, r.bufferId))) {
          p.reuse.emplace_back(at, it->second.slot);
          ++reused_[0];
          reused_[1] += r.bytes;
          if (!dumpIt) continue;
        } else {
          slot = ++nextSlot_;
          ContentEntry e{slot, contiguous ? reader_.weakRef(t) : py::object()};
          if (it != content_.end()) {
            it->second = std::move(e);  // its tensor is gone: the memory may be another's now
          } else {
            contentBuffers_[r.bufferId].push_back(key);
            content_.emplace(std::move(key), std::move(e));
          }
          ++hashed_[0];
          hashed_[1] += r.bytes;
        }
      }
      if (!hostBytes_) throw std::logic_error("keel_torch: hashing() was not called");
      ElementLayout l;
      std::unique_ptr<py::buffer_info> view = bufferView(hostBytes_(t), r.dtype, r.shape, l);
      if (!view) continue;
      if (dumpIt)
        live().post([d = dumpRecord(op.seq, r, view->ptr, size_t(view->size * view->itemsize))](
                        storage::Writer& w) { w.writeDump(d); });
      if (slot) p.work.push_back(queue_->work(at, std::move(view), l, r.bufferId, slot));
    }
  }

  // Note [keel_torch content cache]: a recording without steps (an inference loop) would grow
  // the cache and the identities without bound: past kMaxContent keys every queued op is
  // written and both start over. Called only between ops (no record refers to a slot yet).
  static constexpr size_t kMaxContent = size_t(1) << 20;
  void boundContent() {
    if (content_.size() < kMaxContent) return;
    flush();
    if (queue_) queue_->clearSlots();
    content_.clear();
    contentBuffers_.clear();
    reader_.prune();
  }

  // ---- Note [keel_torch dispatch in C++] ----
  // What the session's _overload() says of an ATen overload.
  struct Overload {
    std::string name, attrs;
    std::vector<std::pair<Py_ssize_t, py::object>> written;  // (position or -1, name)
    bool skip = false;                                       // not computation: not recorded
    bool allocationOnly = false;  // outputs uninitialised: Note [keel_torch uninitialised memory]
    py::object run;               // what runs it
    py::object func;              // keeps the key alive
    // Per return: how its tensors' versions after the op are known (Note [keel_torch versions]).
    struct Return {
      enum Kind : uint8_t { Own, View, Written } kind = Own;
      Py_ssize_t position = -1;  // View: the argument it views (or -1 and its name)
      py::object name;
    };
    std::vector<Return> returns;
  };
  const Overload& overload(const py::object& func) {
    const auto it = overloads_.find(func.ptr());
    if (it != overloads_.end()) return it->second;
    const py::tuple t = session_.attr("_overload")(func);
    Overload o;
    o.name = t[0].cast<std::string>();
    o.attrs = t[1].cast<std::string>();
    for (const py::handle w : t[2].cast<py::tuple>()) {
      const py::tuple pair = w.cast<py::tuple>();
      o.written.emplace_back(pair[0].is_none() ? -1 : pair[0].cast<Py_ssize_t>(),
                             py::reinterpret_borrow<py::object>(pair[1]));
    }
    o.skip = t[3].cast<bool>();
    o.run = t[4];
    o.allocationOnly = t[6].cast<bool>();
    o.func = func;
    for (const py::handle r : t[5].cast<py::tuple>()) {
      const py::tuple v = r.cast<py::tuple>();
      Overload::Return ret;
      ret.kind = Overload::Return::Kind(v[0].cast<int>());
      ret.position = v[1].is_none() ? -1 : v[1].cast<Py_ssize_t>();
      ret.name = py::reinterpret_borrow<py::object>(v[2]);
      o.returns.push_back(std::move(ret));
    }
    return overloads_.emplace(func.ptr(), std::move(o)).first->second;
  }
  static py::object call(const py::object& func, const py::object& args, PyObject* kwargs) {
    PyObject* r = PyObject_Call(func.ptr(), args.ptr(), kwargs);
    if (!r) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
  }
  static int64_t monotonicNs() {  // time.monotonic_ns's clock
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  bool isTensor(PyObject* o) const {
    return PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(tensorType_.ptr()));
  }
  // The tensors of `v`: itself, or those of a list or tuple (what ATen ops take and return).
  void tensorsIn(PyObject* v, std::vector<py::object>& out) const {
    if (isTensor(v)) {
      out.push_back(py::reinterpret_borrow<py::object>(v));
    } else if (PyList_Check(v) || PyTuple_Check(v)) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
      PyObject** items = PySequence_Fast_ITEMS(v);
      for (Py_ssize_t i = 0; i < n; ++i)
        if (isTensor(items[i])) out.push_back(py::reinterpret_borrow<py::object>(items[i]));
    }
  }
  // The tensors among a tuple or list of an op's arguments or results, in order (top level and
  // inside lists).
  void tensorsOf(PyObject* values, std::vector<py::object>& out) const {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    PyObject** items = PySequence_Fast_ITEMS(values);
    for (Py_ssize_t i = 0; i < n; ++i) tensorsIn(items[i], out);
  }
  bool anyRequiresGrad(const std::vector<py::object>& tensors) const {
    for (const py::object& t : tensors) {
      PyObject* r = PyObject_GetAttr(t.ptr(), requiresGrad_.ptr());
      if (!r) throw py::error_already_set();
      const bool yes = r == Py_True;
      Py_DECREF(r);
      if (yes) return true;
    }
    return false;
  }
  // Whether an op of this scope has its outputs' values stored (dumps=).
  bool dumped(const std::string& scope) const {
    if (!dumpPrefix_) return dumpAll_;
    const std::string& d = *dumpPrefix_;
    return scope == d || (scope.size() > d.size() && scope.compare(0, d.size(), d) == 0 &&
                          scope[d.size()] == '.');
  }
  // An op is about to write `written` (its `Tensor(a!)` arguments): its inputs are read now, as
  // they are before it runs, queued hashes of the written buffers are settled (Note [keel_torch
  // hashing off the Python thread]), and afterWrite() forgets their hashed content (Note
  // [keel_torch content cache]).
  void beforeWrite(const std::vector<py::object>& inputs, const std::vector<py::object>& written,
                   HashQueue::Pending& p) {
    boundContent();
    addTensors(inputs, storage::Role::Input, false, p);
    written_.clear();
    for (const py::object& t : written)
      if (const uint64_t b = reader_.buffer(t)) written_.push_back(b);
    if (queue_) {
      queue_->submit(p);              // the inputs' bytes are read before the op runs: the pool
      queue_->beforeWrite(written_);  // has them, and copies those of the written buffers now
    }
  }
  // Note [keel_torch versions]: a tensor's version counter is bumped by PyTorch's ADInplaceOrView
  // layer after an in-place op returns, above the dispatch mode, and a view gets its base's
  // counter there too: the mode sees an in-place op's output, and a new view, still at the
  // version before. Keel's convention (docs/capture.md) is an output at the version after the op,
  // the one its readers see, so the producer of a value (Note [Producer]) is found: an output
  // the op writes (`Tensor(a!)`) is one past the version read, a view (`Tensor(a)`) at its
  // base's. An inference tensor has no version counter: 0.
  const std::vector<std::optional<uint64_t>>& outputVersions(const Overload& o,
                                                             const py::object& args, PyObject* kw) {
    std::vector<std::optional<uint64_t>>& v = outputVersions_;
    v.assign(outputs_.size(), std::nullopt);
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const size_t ret = outputReturns_[i];
      if (ret >= o.returns.size()) continue;
      const Overload::Return& r = o.returns[ret];
      if (r.kind == Overload::Return::Written) {
        if (const std::optional<uint64_t> own = reader_.version(outputs_[i])) v[i] = *own + 1;
      } else if (r.kind == Overload::Return::View) {
        PyObject* base = nullptr;
        if (r.position >= 0 && r.position < PyTuple_GET_SIZE(args.ptr()))
          base = PyTuple_GET_ITEM(args.ptr(), r.position);
        else if (kw && r.name)
          base = PyDict_GetItemWithError(kw, r.name.ptr());
        if (base && isTensor(base)) v[i] = reader_.version(base).value_or(0);
      }
    }
    return v;
  }
  // Note [keel_torch optimizer work]: whether the first `n` tensors of `p` (the op's inputs)
  // include a parameter's gradient or a tensor made from one.
  bool readsGradients(const HashQueue::Pending& p, size_t n) const {
    if (gradBuffers_.empty() && gradDerived_.empty()) return false;
    for (size_t i = 0; i < n; ++i) {
      const storage::TensorRecord& r = p.op.tensors[i];
      if ((r.bufferId && gradBuffers_.count(r.bufferId)) || gradDerived_.count(r.tensorId))
        return true;
    }
    return false;
  }

  // A record that is not written (its op raised, or recording it failed): its hashes complete
  // (their slots may be reused by later ops) before its views let go of PyTorch's memory.
  void abortWrite(std::unique_ptr<HashQueue::Pending> p) {
    if (!queue_) return recycle(std::move(p));
    p->discard = true;
    std::vector<std::unique_ptr<HashQueue::Pending>> done;
    queue_->push(std::move(p), done);
    write(done);
  }
  // Note [keel_torch uninitialised memory]: whether `r` views a buffer an allocation-only op made
  // and nothing has written since (the version it was made at, its tensor alive).
  bool stillUninitialised(const storage::TensorRecord& r) {
    const auto it = uninitialised_.find(r.bufferId);
    if (it == uninitialised_.end()) return false;
    if (it->second.version == r.version && stillThere(it->second.source, r.bufferId)) return true;
    uninitialised_.erase(it);  // written since, or its memory is another tensor's now
    return false;
  }
  void afterWrite() {
    for (const uint64_t b : written_) {
      const auto it = contentBuffers_.find(b);
      if (it == contentBuffers_.end()) continue;
      for (const ContentKey& k : it->second) content_.erase(k);
      contentBuffers_.erase(it);
    }
    written_.clear();
  }

  py::object session_;                                         // the Python half (bind())
  std::vector<py::object> inputs_, outputs_, writtenTensors_;  // the op dispatch() records
  std::vector<size_t> outputReturns_;                          // each output's return
  std::vector<std::optional<uint64_t>> outputVersions_;        // Note [keel_torch versions]
  // Note [keel_torch optimizer work]: the buffers of the parameters' gradients after the last
  // .backward(), and the tensors that ops reading them made, until the step ends.
  std::unordered_set<uint64_t> gradBuffers_, gradDerived_;
  int64_t dumpedOps_ = 0;  // ops whose outputs' values were stored (dumps=)
  bool direct_ = false, stacks_ = false, dumpAll_ = false;
  std::optional<std::string> dumpPrefix_;  // dumps="blocks.1"
  py::object tensorType_, gradEnabled_, stackLength_, requiresGrad_;
  py::list pendingOutputs_;  // (seq, outputs) of forward ops: Note [keel_torch forward links]
  std::unordered_map<uint64_t, std::string> forwardScopes_;  // this step's, by seq
  std::unordered_map<PyObject*, Overload> overloads_;

  TensorReader reader_;
  py::function hostBytes_;
  // Note [keel_torch content cache]: this step's hashed tensors and each buffer's keys. An entry
  // of a contiguous tensor (a key without identity) keeps a weak reference to the tensor hashed.
  struct ContentEntry {
    int64_t slot = 0;
    py::object source;
  };
  // A contiguous key names the same elements only while the tensor first hashed under it still
  // holds that memory: once it is gone, PyTorch's allocator may give the address to a tensor
  // with other elements (and `t.data = other` moves a live tensor without an op).
  bool stillThere(const py::object& source, uint64_t buffer) {
    PyObject* t = PyWeakref_GetObject(source.ptr());
    return t != Py_None && reader_.buffer(t) == buffer;
  }
  // Row-major with no gaps (dimensions of size 1 have any stride).
  static bool isContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
    int64_t expected = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] != 1 && strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }
  std::unordered_map<ContentKey, ContentEntry, ContentKeyHash> content_;
  // Note [keel_torch uninitialised memory]: buffers made by allocation-only ops, by buffer id:
  // the version they were made at and the tensor made (a weak reference).
  struct Uninitialised {
    uint64_t version = 0;
    py::object source;
  };
  std::unordered_map<uint64_t, Uninitialised> uninitialised_;
  std::unordered_map<uint64_t, std::vector<ContentKey>> contentBuffers_;
  int64_t nextSlot_ = 0;
  std::vector<uint64_t> written_;  // buffers of the op being run that it writes
  // Note [keel_torch records recycled]
  OpBatch batch_, spare_;  // ops waiting for the writer; records to fill
  std::mutex returnedMu_;
  std::vector<OpBatch> returned_;  // batches the writer thread has written (returnedMu_)
  int64_t hashed_[2] = {0, 0}, reused_[2] = {0, 0};
  Hashing hashing_;
  std::unique_ptr<HashQueue> queue_;      // its workers never touch the writer
  std::unique_ptr<OutputLock> lock_;      // held while the file is written; outlives writer_
  std::string target_;                    // the file written (a symlink followed)
  storage::RunInfo run_;                  // open()'s
  std::unique_ptr<WriterThread> writer_;  // Note [keel_torch writer thread]
};

// A PyTorch memory snapshot file as a recording at `out` (the keel tool's `import torch-memory`):
// the restricted unpickler reads it, the output guard and the replace-on-complete rule apply.
py::dict importTorchMemory(const std::string& snapshot, const std::string& out, int device,
                           const std::string& name) {
  storage::TorchMemoryImportOptions o;
  o.read.device = device;
  o.sourceName = name;  // an in-memory snapshot: "the snapshot list", not its temporary file
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
        py::arg("device") = 0, py::arg("name") = "");
  py::class_<Recording>(m, "Recording")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&,
                    uint64_t, const std::string&, const std::string&, const std::string&>())
      .def("open", &Recording::open)
      .def_property_readonly("opened", &Recording::opened)
      .def("hashing", &Recording::hashing)
      .def("bind", &Recording::bind)
      .def("unbind", &Recording::unbind)
      .def("dispatch", &Recording::dispatch, py::arg("func"), py::arg("types"),
           py::arg("args") = py::tuple(), py::arg("kwargs") = py::none())
      .def("hook_pending", &Recording::hookPending)
      .def("push_scope", &Recording::pushScope)
      .def("pop_scope", &Recording::popScope)
      .def_property("phase", &Recording::phaseName, &Recording::setPhase)
      .def_readwrite("busy", &Recording::busy_)
      .def_readwrite("after_backward", &Recording::afterBackward_)
      .def_readwrite("forward_seq", &Recording::forwardSeq_)
      .def_readwrite("backward_scope", &Recording::backwardScope_)
      .def_readwrite("pending_end", &Recording::pendingEnd_)
      .def_readonly("seq", &Recording::seq_)
      .def_readonly("step_no", &Recording::stepNo_)
      .def_readonly("step_ops", &Recording::stepOps_)
      .def("counts", &Recording::counts)
      .def("stack", &Recording::stack)
      .def("step", &Recording::step, py::arg("begin_ns"), py::arg("end_ns"),
           py::arg("loss") = py::none(), py::arg("lr") = py::none())
      .def("gradients", &Recording::gradients)
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
