// The FlexCheckpoint executor: fills target shards from source byte ranges with bounded memory
// (one target-shard buffer and one staging buffer per thread), and the conversions built on it:
// convert (checkpoint -> checkpoint), saveTensors (memory -> checkpoint), loadTensors
// (checkpoint -> memory). See Note [Bounded reads].
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ckpt_internal.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/dtype.h"
#include "keel/error.h"

namespace keel::ckpt {

// Note [Bounded reads]
// A read item is a box of one source shard that lands in one target shard, possibly permuted and
// cast. Its bytes are fetched one of three ways: (1) when the source and target runs are both
// contiguous, uncast and long (>= 64 KiB), each run is pread straight into the target buffer,
// and when the source range is contiguous but its runs land apart (>= 256 B each), one preadv
// scatters it into the target; (2) otherwise the box is cut along its outer axes into slabs whose
// source span fits the staging buffer, and each slab is read as one span (dense enough) or run by
// run (sparse: long runs far apart, so reading the gaps would waste more than it saves), then
// copied into the target with the permutation and casts (a tiled copy when the innermost axes
// swap). Nothing larger than the target shard plus the staging buffer is held per thread, and no
// source tensor is ever read whole unless the target shard needs all of it.

namespace detail {
namespace {

constexpr size_t kDirectRunBytes = size_t(64) << 10;
constexpr size_t kPackedRunBytes = size_t(4) << 10;
constexpr size_t kScatterRunBytes = 256;
constexpr int64_t kTile = 32;

// ---- element conversion --------------------------------------------------------------------

bool isIntType(st::DType t) {
  return t == st::DType::I64 || t == st::DType::I32 || t == st::DType::I16 || t == st::DType::I8 ||
         t == st::DType::U8;
}

// One element of type T at p (unaligned), and back.
template <typename T>
T loadAs(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void storeAs(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Float elements through double (16-bit floats widen and round through float).
double loadF(const uint8_t* p, st::DType t) {
  switch (t) {
    case st::DType::F64:
      return loadAs<double>(p);
    case st::DType::F32:
      return loadAs<float>(p);
    case st::DType::F16:
      return float(loadAs<Half>(p));
    case st::DType::BF16:
      return float(loadAs<BFloat16>(p));
    default:
      return 0;
  }
}

void storeF(uint8_t* p, st::DType t, double v) {
  switch (t) {
    case st::DType::F64:
      return storeAs<double>(p, v);
    case st::DType::F32:
      return storeAs<float>(p, float(v));
    case st::DType::F16:
      return storeAs<Half>(p, Half(float(v)));
    case st::DType::BF16:
      return storeAs<BFloat16>(p, BFloat16(float(v)));
    default:
      break;
  }
}

// Integer elements through int64 (narrower ones truncate on the way back).
int64_t loadI(const uint8_t* p, st::DType t) {
  switch (t) {
    case st::DType::I64:
      return loadAs<int64_t>(p);
    case st::DType::I32:
      return loadAs<int32_t>(p);
    case st::DType::I16:
      return loadAs<int16_t>(p);
    case st::DType::I8:
      return int8_t(*p);
    case st::DType::U8:
      return *p;
    default:
      return 0;
  }
}

void storeI(uint8_t* p, st::DType t, int64_t v) {
  switch (t) {
    case st::DType::I64:
      return storeAs<int64_t>(p, v);
    case st::DType::I32:
      return storeAs<int32_t>(p, int32_t(v));
    case st::DType::I16:
      return storeAs<int16_t>(p, int16_t(v));
    default:
      *p = uint8_t(v);
      break;
  }
}

// Converts one element through the cast chain (src -> casts..., the last being the target).
void convertElem(const uint8_t* s, st::DType from, const std::vector<st::DType>& casts,
                 uint8_t* d) {
  if (isIntType(from)) {
    storeI(d, casts.back(), loadI(s, from));
    return;
  }
  double v = loadF(s, from);
  uint8_t tmp[8];
  for (size_t i = 0; i + 1 < casts.size(); ++i) {
    storeF(tmp, casts[i], v);
    v = loadF(tmp, casts[i]);
  }
  storeF(d, casts.back(), v);
}

// ---- strided copy ----------------------------------------------------------------------------

struct Strided {
  size_t rank = 0;
  Arr len{}, s{}, d{};  // extents and strides in elements (source axis order)
};

// Drops unit axes and merges axes contiguous in both source and destination.
Strided simplify(const Strided& in) {
  Strided o;
  for (size_t a = 0; a < in.rank; ++a) {
    if (in.len[a] == 1) continue;
    if (o.rank > 0 && o.s[o.rank - 1] == in.len[a] * in.s[a] &&
        o.d[o.rank - 1] == in.len[a] * in.d[a]) {
      o.len[o.rank - 1] *= in.len[a];
      o.s[o.rank - 1] = in.s[a];
      o.d[o.rank - 1] = in.d[a];
      continue;
    }
    o.len[o.rank] = in.len[a];
    o.s[o.rank] = in.s[a];
    o.d[o.rank] = in.d[a];
    ++o.rank;
  }
  if (o.rank == 0) {
    o.rank = 1;
    o.len[0] = 1;
    o.s[0] = o.d[0] = 1;
  }
  return o;
}

// Calls fn(srcElem, dstElem) for every index of the axes [0, upto) except `skip` (-1: none).
template <typename Fn>
void forEachOuter(const Strided& g, size_t upto, int skip, Fn&& fn) {
  Arr idx{};
  int64_t so = 0, dO = 0;
  for (;;) {
    fn(so, dO);
    size_t a = upto;
    for (;;) {
      if (a == 0) return;
      --a;
      if (int(a) == skip) continue;
      if (++idx[a] < g.len[a]) {
        so += g.s[a];
        dO += g.d[a];
        break;
      }
      so -= g.s[a] * (g.len[a] - 1);
      dO -= g.d[a] * (g.len[a] - 1);
      idx[a] = 0;
    }
  }
}

template <typename T>
void tiledCopy(const Strided& g, size_t p, const uint8_t* src, uint8_t* dst) {
  // Axes p (destination stride 1) and last (source stride 1) in tiles; the rest outside.
  const size_t l = g.rank - 1;
  const T* s0 = reinterpret_cast<const T*>(src);
  T* d0 = reinterpret_cast<T*>(dst);
  Strided outer = g;
  outer.len[p] = 1;
  forEachOuter(outer, l, -1, [&](int64_t so, int64_t dO) {
    for (int64_t i0 = 0; i0 < g.len[p]; i0 += kTile)
      for (int64_t j0 = 0; j0 < g.len[l]; j0 += kTile) {
        const int64_t i1 = std::min(g.len[p], i0 + kTile), j1 = std::min(g.len[l], j0 + kTile);
        for (int64_t j = j0; j < j1; ++j)
          for (int64_t i = i0; i < i1; ++i)
            d0[dO + i * g.d[p] + j * g.d[l]] = s0[so + i * g.s[p] + j * g.s[l]];
      }
  });
}

template <typename T>
void elemCopy(const Strided& g, const uint8_t* src, uint8_t* dst) {
  const size_t l = g.rank - 1;
  const T* s0 = reinterpret_cast<const T*>(src);
  T* d0 = reinterpret_cast<T*>(dst);
  forEachOuter(g, l, -1, [&](int64_t so, int64_t dO) {
    for (int64_t j = 0; j < g.len[l]; ++j) d0[dO + j * g.d[l]] = s0[so + j * g.s[l]];
  });
}

// Copies g's elements from src to dst (both at element 0 of the box), converting dtypes.
void stridedCopy(const Strided& in, const uint8_t* src, st::DType from,
                 const std::vector<st::DType>& casts, uint8_t* dst) {
  const Strided g = simplify(in);
  const size_t l = g.rank - 1;
  const size_t es = st::dtypeSize(from);
  if (!casts.empty()) {
    const size_t ed = st::dtypeSize(casts.back());
    forEachOuter(g, l, -1, [&](int64_t so, int64_t dO) {
      for (int64_t j = 0; j < g.len[l]; ++j)
        convertElem(src + size_t(so + j * g.s[l]) * es, from, casts,
                    dst + size_t(dO + j * g.d[l]) * ed);
    });
    return;
  }
  if (g.s[l] == 1 && g.d[l] == 1) {
    const size_t run = size_t(g.len[l]) * es;
    forEachOuter(g, l, -1, [&](int64_t so, int64_t dO) {
      std::memcpy(dst + size_t(dO) * es, src + size_t(so) * es, run);
    });
    return;
  }
  // An axis that is contiguous in the destination while the last is contiguous in the source:
  // a transpose, done in tiles.
  int p = -1;
  if (g.s[l] == 1)
    for (size_t a = 0; a < l; ++a)
      if (g.d[a] == 1) p = int(a);
  switch (es) {
    case 1:
      p >= 0 ? tiledCopy<uint8_t>(g, size_t(p), src, dst) : elemCopy<uint8_t>(g, src, dst);
      break;
    case 2:
      p >= 0 ? tiledCopy<uint16_t>(g, size_t(p), src, dst) : elemCopy<uint16_t>(g, src, dst);
      break;
    case 4:
      p >= 0 ? tiledCopy<uint32_t>(g, size_t(p), src, dst) : elemCopy<uint32_t>(g, src, dst);
      break;
    default:
      p >= 0 ? tiledCopy<uint64_t>(g, size_t(p), src, dst) : elemCopy<uint64_t>(g, src, dst);
      break;
  }
}

// ---- one read item -------------------------------------------------------------------------

struct Worker {
  std::unique_ptr<uint8_t[]> target;
  size_t targetCap = 0;
  std::unique_ptr<uint8_t[]> staging;
  size_t stagingCap = 0;
  uint8_t* stage(size_t n) {
    if (n > stagingCap) {
      staging.reset();
      staging.reset(new uint8_t[n]);
      stagingCap = n;
    }
    return staging.get();
  }
  uint8_t* targetBuf(size_t n) {
    if (n > targetCap) {
      target.reset();
      target.reset(new uint8_t[n]);
      targetCap = n;
    }
    return target.get();
  }
};

struct ItemCtx {
  const Source* source;
  uint32_t key, shard;
  st::DType from;
  const std::vector<st::DType>* casts;
  size_t es, ed;
  Arr sstride{};  // source shard strides (source axes)
  Arr dstride{};  // target strides by source axis
  size_t stagingBytes;
  uint64_t* bytesRead;
};

// Copies the box (srcLocal, len) of the source shard to dst (already at the box's first element).
void copyBox(ItemCtx& c, Worker& w, size_t rank, const Arr& srcLocal, const Arr& len,
             uint8_t* dst) {
  uint64_t first = 0, last = 0, volume = 1;
  for (size_t a = 0; a < rank; ++a) {
    first += uint64_t(srcLocal[a]) * uint64_t(c.sstride[a]);
    last += uint64_t(srcLocal[a] + len[a] - 1) * uint64_t(c.sstride[a]);
    volume *= uint64_t(len[a]);
  }
  const uint64_t span = (last - first + 1) * c.es;
  Strided g;
  g.rank = rank;
  g.len = len;
  g.d = c.dstride;
  g.s = c.sstride;
  if (rank == 0) {
    g.rank = 1;
    g.len[0] = 1;
    g.s[0] = g.d[0] = 1;
  }
  const Strided sg = simplify(g);
  const size_t l = sg.rank - 1;
  const uint64_t runBytes = (sg.s[l] == 1 ? uint64_t(sg.len[l]) : 1) * c.es;
  // (1) direct: contiguous, uncast, long runs.
  if (c.casts->empty() && sg.s[l] == 1 && sg.d[l] == 1 && runBytes >= kDirectRunBytes) {
    forEachOuter(sg, l, -1, [&](int64_t so, int64_t dO) {
      c.source->read(c.key, c.shard, (first + uint64_t(so)) * c.es, dst + size_t(dO) * c.ed,
                     size_t(runBytes));
    });
    *c.bytesRead += volume * c.es;
    return;
  }
  // (1b) scatter: a contiguous source range whose runs land apart in the target (a reshard
  // along an inner axis), uncast: one preadv straight into the target.
  if (c.casts->empty() && sg.s[l] == 1 && sg.d[l] == 1 && span == volume * c.es &&
      runBytes >= kScatterRunBytes) {
    std::vector<st::Reader::Span> spans;
    spans.reserve(size_t(volume * c.es / runBytes));
    forEachOuter(sg, l, -1, [&](int64_t, int64_t dO) {
      spans.push_back({dst + size_t(dO) * c.ed, size_t(runBytes)});
    });
    c.source->readv(c.key, c.shard, first * c.es, spans.data(), spans.size());
    *c.bytesRead += volume * c.es;
    return;
  }
  // (2) staged, in slabs that fit.
  if (span <= c.stagingBytes) {
    uint8_t* buf = w.stage(size_t(std::min<uint64_t>(c.stagingBytes, span)));
    if (runBytes >= kPackedRunBytes && span > 2 * volume * c.es && sg.s[l] == 1) {
      // Sparse: read run by run, packed.
      Strided packed = sg;
      int64_t st = 1;
      for (size_t a = sg.rank; a-- > 0;) {
        packed.s[a] = st;
        st *= sg.len[a];
      }
      size_t at = 0;
      forEachOuter(sg, l, -1, [&](int64_t so, int64_t) {
        c.source->read(c.key, c.shard, (first + uint64_t(so)) * c.es, buf + at, size_t(runBytes));
        at += size_t(runBytes);
      });
      *c.bytesRead += volume * c.es;
      stridedCopy(packed, buf, c.from, *c.casts, dst);
    } else {
      c.source->read(c.key, c.shard, first * c.es, buf, size_t(span));
      *c.bytesRead += span;
      stridedCopy(g, buf, c.from, *c.casts, dst);
    }
    return;
  }
  // Too big: cut along the first axis longer than 1.
  size_t a = 0;
  while (a < rank && len[a] == 1) ++a;
  if (a >= rank) return;
  Arr sub = len;
  sub[a] = 1;
  uint64_t restSpan = c.es;
  for (size_t b = 0; b < rank; ++b)
    restSpan += uint64_t(sub[b] - 1) * uint64_t(c.sstride[b]) * c.es;
  const uint64_t step = uint64_t(c.sstride[a]) * c.es;
  int64_t chunk = 1;
  if (restSpan < c.stagingBytes && a + 1 < rank)
    chunk = std::max<int64_t>(1, int64_t((c.stagingBytes - restSpan) / step) + 1);
  if (a + 1 == rank)  // the innermost axis alone is too long: chunks of the staging size
    chunk = std::max<int64_t>(1, int64_t(c.stagingBytes / c.es));
  chunk = std::min(chunk, len[a]);
  for (int64_t i = 0; i < len[a]; i += chunk) {
    Arr off = srcLocal, l2 = len;
    off[a] = srcLocal[a] + i;
    l2[a] = std::min(chunk, len[a] - i);
    copyBox(c, w, rank, off, l2, dst + size_t(i * c.dstride[a]) * c.ed);
  }
}

// Whether an item is a plain byte range in both the source shard and the target shard.
bool contiguousCopy(const aoa::Piece& p, const ShardInfo& s, const Dims& tShape, const ItemGeom& g,
                    uint64_t& srcAt, uint64_t& dstAt, uint64_t& n) {
  if (!p.casts.empty()) return false;
  Strided st;
  st.rank = g.rank;
  st.len = g.len;
  int64_t sAcc = 1;
  Arr tstride{};
  for (size_t d = g.rank; d-- > 0;) {
    tstride[d] = sAcc;
    sAcc *= tShape[d];
  }
  int64_t acc = 1;
  srcAt = dstAt = 0;
  for (size_t a = g.rank; a-- > 0;) {
    st.s[a] = acc;
    srcAt += uint64_t(g.srcLocal[a] * acc);
    acc *= s.shape[a];
  }
  for (size_t d = 0; d < g.rank; ++d) {
    st.d[size_t(p.perm[d])] = tstride[d];
    dstAt += uint64_t(g.dstLocal[d] * tstride[d]);
  }
  const Strided sg = simplify(st);
  n = g.volume();
  return sg.rank == 1 && sg.s[0] == 1 && sg.d[0] == 1;
}

// Note [Kernel copies]
// When every read item of a target shard is one contiguous byte range on both sides (row splits,
// fused_qkv, renames) and both ends are files, the bytes go file to file with copy_file_range:
// one copy inside the kernel instead of a read into a buffer and a write out of it. Elsewhere
// (or where the file system refuses: the flag turns the path off for the rest of the run) the
// buffered path of Note [Bounded reads] runs.
bool copyInKernel(const Plan& plan, const Metadata& src, const Source& source, Sink& sink,
                  size_t si, const Dims& off, const Dims& shape, std::atomic<uint64_t>& readTotal,
                  std::atomic<bool>& enabled) {
  const TargetShard& ts = plan.shards[si];
  const aoa::TargetKey& k = plan.target.keys[ts.key];
  int dfd;
  uint64_t dbase;
  if (!sink.fileRange(si, dfd, dbase)) return false;
  const uint64_t ed = st::dtypeSize(k.dtype);
  struct Range {
    int fd;
    uint64_t from, to, n;
  };
  std::vector<Range> ranges;
  ItemGeom g;
  for (uint32_t i = 0; i < ts.numItems; ++i) {
    const ReadItem& it = plan.items[ts.firstItem + i];
    const aoa::Piece& p = k.pieces[it.piece];
    const ShardInfo& s = src.keys[p.src].shards[it.shard];
    if (!itemGeometry(p, s, off, shape, g)) continue;
    uint64_t a, b, n;
    int sfd;
    uint64_t sbase;
    if (!contiguousCopy(p, s, shape, g, a, b, n) || !source.fileRange(p.src, it.shard, sfd, sbase))
      return false;
    ranges.push_back({sfd, sbase + a * ed, dbase + b * ed, n * ed});
  }
  for (size_t r = 0; r < ranges.size(); ++r) {
    loff_t in = loff_t(ranges[r].from), out = loff_t(ranges[r].to);
    uint64_t left = ranges[r].n;
    while (left > 0) {
      ssize_t n = ::copy_file_range(ranges[r].fd, &in, dfd, &out, size_t(left), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && r == 0 && left == ranges[r].n &&
          (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
        enabled = false;  // not here: the buffered path rewrites the whole shard
        return false;
      }
      KEEL_CHECK(n > 0, "copy_file_range failed (", n < 0 ? std::strerror(errno) : "source ended",
                 ")");
      left -= uint64_t(n);
    }
    readTotal += ranges[r].n;
  }
  return true;
}

}  // namespace

uint64_t execute(const Plan& plan, const Metadata& src, const Source& source, Sink& sink,
                 const ConvertOptions& opt) {
  const size_t n = plan.shards.size();
  const int threads = std::max(1, std::min<int>(opt.threads, int(std::max<size_t>(n, 1))));
  // Note [Threads and files]: writes to one file serialise on its inode lock, so threads that
  // write the same file mostly wait for each other. Each worker drains the shards of one target
  // file (worker t starts at file t mod F, in file order, so its writes are sequential) and then
  // helps with the file that has the most shards left.
  uint32_t files = 1;
  for (const TargetShard& ts : plan.shards) files = std::max(files, ts.file + 1);
  std::vector<std::vector<size_t>> byFile(files);
  for (size_t si = 0; si < n; ++si) byFile[plan.shards[si].file].push_back(si);
  std::unique_ptr<std::atomic<size_t>[]> nextInFile(new std::atomic<size_t>[files]);
  for (uint32_t f = 0; f < files; ++f) nextInFile[f] = 0;
  // The next shard for a worker now at file `f` (moved when that file is drained); n when done.
  auto take = [&](uint32_t& f) -> size_t {
    for (;;) {
      const size_t k = nextInFile[f].fetch_add(1);
      if (k < byFile[f].size()) return byFile[f][k];
      size_t mostLeft = 0;
      for (uint32_t g = 0; g < files; ++g) {
        const size_t at = nextInFile[g].load();
        if (at < byFile[g].size() && byFile[g].size() - at > mostLeft) {
          mostLeft = byFile[g].size() - at;
          f = g;
        }
      }
      if (mostLeft == 0) return n;
    }
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> readTotal{0};
  std::atomic<bool> kernelCopy{true};
  std::mutex mu;
  std::exception_ptr error;
  uint64_t done = 0;
  auto work = [&](int worker) {
    Worker w;
    Dims off, shape;
    uint32_t file = uint32_t(worker) % files;
    try {
      for (;;) {
        if (stop.load()) return;
        throwIfStopped(opt.stop);
        const size_t si = take(file);
        if (si >= n) return;
        const TargetShard& ts = plan.shards[si];
        const aoa::TargetKey& k = plan.target.keys[ts.key];
        plan.shardBox(ts, off, shape);
        const size_t ed = st::dtypeSize(k.dtype);
        auto* dst = static_cast<uint8_t*>(sink.direct(si));
        const bool own = dst == nullptr;
        if (own) {
          try {
            dst = w.targetBuf(size_t(std::max<uint64_t>(ts.bytes, 1)));
          } catch (const std::bad_alloc&) {  // name what was asked, not a bare bad_alloc
            throw Error(keel::detail::concat("out of memory for the ", formatBytes(ts.bytes),
                                             " shard of key '", k.name, "' (file ", ts.file, ")"));
          }
        }
        // Elements no piece covers (declared keys) are zeros.
        uint64_t covered = 0;
        detail::ItemGeom g;
        for (uint32_t i = 0; i < ts.numItems; ++i) {
          const ReadItem& it = plan.items[ts.firstItem + i];
          if (itemGeometry(k.pieces[it.piece], src.keys[k.pieces[it.piece].src].shards[it.shard],
                           off, shape, g))
            covered += g.volume() * ed;
        }
        if (own && covered == ts.bytes && kernelCopy.load() &&
            copyInKernel(plan, src, source, sink, si, off, shape, readTotal, kernelCopy)) {
          std::lock_guard<std::mutex> lock(mu);
          done += ts.bytes;
          if (opt.progress) opt.progress(done, plan.bytesWritten);
          continue;
        }
        if (covered < ts.bytes) std::memset(dst, 0, size_t(ts.bytes));
        Arr tstride{};
        {
          int64_t st = 1;
          for (size_t d = shape.size(); d-- > 0;) {
            tstride[d] = st;
            st *= shape[d];
          }
        }
        uint64_t readBytes = 0;
        for (uint32_t i = 0; i < ts.numItems; ++i) {
          const ReadItem& it = plan.items[ts.firstItem + i];
          const aoa::Piece& p = k.pieces[it.piece];
          const KeyInfo& sk = src.keys[p.src];
          const ShardInfo& s = sk.shards[it.shard];
          if (!itemGeometry(p, s, off, shape, g)) continue;
          ItemCtx c;
          c.source = &source;
          c.key = p.src;
          c.shard = it.shard;
          c.from = sk.dtype;
          c.casts = &p.casts;
          c.es = st::dtypeSize(sk.dtype);
          c.ed = ed;
          c.stagingBytes = std::max<size_t>(opt.stagingBytes, 64);
          c.bytesRead = &readBytes;
          int64_t st = 1;
          for (size_t a = g.rank; a-- > 0;) {
            c.sstride[a] = st;
            st *= s.shape[a];
          }
          for (size_t d = 0; d < g.rank; ++d) c.dstride[size_t(p.perm[d])] = tstride[d];
          uint64_t dOff = 0;
          for (size_t d = 0; d < g.rank; ++d) dOff += uint64_t(g.dstLocal[d] * tstride[d]);
          copyBox(c, w, g.rank, g.srcLocal, g.len, dst + dOff * ed);
        }
        readTotal += readBytes;
        if (own) sink.commit(si, dst, size_t(ts.bytes));
        std::lock_guard<std::mutex> lock(mu);
        done += ts.bytes;
        if (opt.progress) opt.progress(done, plan.bytesWritten);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      stop = true;
    }
  };
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  return readTotal.load();
}

namespace {

class FileSource : public Source {
 public:
  FileSource(const Checkpoint& c) : c_(c) {}
  void read(uint32_t key, uint32_t shard, uint64_t at, void* dst, size_t n) const override {
    const ShardInfo& s = c_.metadata().keys[key].shards[shard];
    KEEL_CHECK(at <= s.end - s.begin && n <= s.end - s.begin - at, "read outside shard");
    c_.reader(s.file).readAt(s.begin + at, dst, n);
  }
  void readv(uint32_t key, uint32_t shard, uint64_t at, const st::Reader::Span* spans,
             size_t count) const override {
    const ShardInfo& s = c_.metadata().keys[key].shards[shard];
    uint64_t n = 0;
    for (size_t i = 0; i < count; ++i) n += spans[i].n;
    KEEL_CHECK(at <= s.end - s.begin && n <= s.end - s.begin - at, "read outside shard");
    c_.reader(s.file).readAtV(s.begin + at, spans, count);
  }
  bool fileRange(uint32_t key, uint32_t shard, int& fd, uint64_t& base) const override {
    const ShardInfo& s = c_.metadata().keys[key].shards[shard];
    fd = c_.reader(s.file).fd();
    base = s.begin;
    return true;
  }

 private:
  const Checkpoint& c_;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(const std::vector<HostTensor>& t) : t_(t) {}
  void read(uint32_t key, uint32_t, uint64_t at, void* dst, size_t n) const override {
    std::memcpy(dst, static_cast<const uint8_t*>(t_[key].data) + at, n);
  }
  void readv(uint32_t key, uint32_t, uint64_t at, const st::Reader::Span* spans,
             size_t count) const override {
    const auto* p = static_cast<const uint8_t*>(t_[key].data) + at;
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(spans[i].dst, p, spans[i].n);
      p += spans[i].n;
    }
  }

 private:
  const std::vector<HostTensor>& t_;
};

// Writes each target file; records every shard's byte range for the metadata.
class FileSink : public Sink {
 public:
  FileSink(const Plan& plan, const std::string& dir, Metadata& out) : plan_(plan) {
    namespace fs = std::filesystem;
    out.files.clear();
    for (int f = 0; f < plan.tp; ++f) out.files.push_back(fileName(f, plan.tp));
    std::vector<std::vector<st::WriteEntry>> entries(size_t(plan.tp));
    slot_.resize(plan.shards.size());
    Dims off, shape;
    for (size_t i = 0; i < plan.shards.size(); ++i) {
      const TargetShard& ts = plan.shards[i];
      plan.shardBox(ts, off, shape);
      slot_[i] = {ts.file, entries[ts.file].size()};
      entries[ts.file].push_back(
          {plan.target.keys[ts.key].name, plan.target.keys[ts.key].dtype, shape});
    }
    const std::map<std::string, std::string> meta = {{"format", "pt"}, {"keel", "flexcheckpoint"}};
    for (int f = 0; f < plan.tp; ++f)
      writers_.push_back(std::make_unique<st::Writer>(
          (fs::path(dir) / out.files[size_t(f)]).string(), entries[size_t(f)], meta));
    // Metadata: keys in target order, shards in part order.
    out.keys.clear();
    std::vector<size_t> keyAt(plan.target.keys.size());
    for (size_t k = 0; k < plan.target.keys.size(); ++k) {
      keyAt[k] = k;
      KeyInfo ki;
      ki.key = plan.target.keys[k].name;
      ki.dtype = plan.target.keys[k].dtype;
      ki.shape = plan.target.keys[k].shape;
      ki.splitAxis = plan.axis[k];
      out.keys.push_back(std::move(ki));
    }
    for (size_t i = 0; i < plan.shards.size(); ++i) {
      const TargetShard& ts = plan.shards[i];
      plan.shardBox(ts, off, shape);
      ShardInfo s;
      s.offset = off;
      s.shape = shape;
      s.file = ts.file;
      s.replica = plan.axis[ts.key] >= 0 ? 0 : int64_t(ts.file);
      s.begin = writers_[ts.file]->offsetOf(slot_[i].second);
      s.end = s.begin + ts.bytes;
      out.keys[ts.key].shards.push_back(std::move(s));
    }
    for (auto& k : out.keys)
      std::sort(k.shards.begin(), k.shards.end(),
                [](const ShardInfo& a, const ShardInfo& b) { return a.offset < b.offset; });
  }
  void* direct(size_t) override { return nullptr; }
  void commit(size_t i, const void* data, size_t n) override {
    if (n > 0) writers_[slot_[i].first]->write(slot_[i].second, 0, data, n);
  }
  bool fileRange(size_t i, int& fd, uint64_t& base) override {
    fd = writers_[slot_[i].first]->fd();
    base = writers_[slot_[i].first]->offsetOf(slot_[i].second);
    return true;
  }
  void close() {
    for (auto& w : writers_) w->close();
  }

 private:
  const Plan& plan_;
  std::vector<std::pair<uint32_t, size_t>> slot_;
  std::vector<std::unique_ptr<st::Writer>> writers_;
};

class MemorySink : public Sink {
 public:
  explicit MemorySink(std::vector<void*> ptrs) : ptrs_(std::move(ptrs)) {}
  void* direct(size_t i) override { return ptrs_[i]; }
  void commit(size_t, const void*, size_t) override {}

 private:
  std::vector<void*> ptrs_;
};

void prepareDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A link to nothing: creating it said "cannot create (File exists)".
  if (fs::is_symlink(fs::symlink_status(dir, ec)) && !fs::exists(dir, ec))
    throw Error(dir + ": a symbolic link to " + fs::read_symlink(dir, ec).string() +
                ", which does not exist");
  if (fs::exists(dir, ec)) {
    KEEL_CHECK(fs::is_directory(dir, ec), dir, ": exists and is not a directory");
    KEEL_CHECK(fs::is_empty(dir, ec), dir, ": exists and is not empty (refusing to overwrite)");
  } else {
    fs::create_directories(dir, ec);
    KEEL_CHECK(!ec, dir, ": cannot create (", ec.message(), ")");
  }
}

// Fills dstDir (prepared by a NewDir) with the plan's files and the metadata.
ConvertStats runToDir(const Plan& plan, const Metadata& src, const Source& source,
                      const std::string& dstDir, const std::string& trainState,
                      const ConvertOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Metadata out;
  out.trainState = trainState;
  FileSink sink(plan, dstDir, out);
  ConvertStats stats;
  stats.bytesRead = execute(plan, src, source, sink, opt);
  sink.close();
  writeMetadata(dstDir, out, opt.fileDigests, opt.stop);
  stats.bytesWritten = plan.bytesWritten;
  stats.bytesNeeded = plan.bytesRead;
  stats.files = size_t(plan.tp);
  stats.shards = plan.shards.size();
  stats.items = plan.items.size();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace

void writeMetadata(const std::string& dir, Metadata m, bool digests, const StopFn& stop) {
  namespace fs = std::filesystem;
  m.fileMd5.clear();  // Note [Checkpoint file digests]: of the files as written
  if (digests)
    for (const std::string& f : m.files)
      m.fileMd5.push_back(fileMd5((fs::path(dir) / f).string(), stop));
  const std::string path = (fs::path(dir) / kMetadataFile).string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KEEL_CHECK(out.good(), tmp, ": cannot create");
    out << metadataToJson(m) << "\n";
    out.flush();
    KEEL_CHECK(out.good(), tmp, ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KEEL_CHECK(!ec, path, ": cannot rename into place (", ec.message(), ")");
}

// Note [Outputs left as found]
// Writing a new checkpoint folder (convert, saveTensors, and through it a training save's
// step-N.tmp) either finishes or leaves the folder as it found it: absent, or empty. A write
// error, a full disk, a file-size limit, an argument found wrong late or a stop
// (ConvertOptions::stop: keel ckpt convert's Ctrl-C) removes what was made, the folders above it
// that the write created included, so the same call can run again (a half-written folder was
// refused as "exists and is not empty"). Every argument is checked before the folder is made. One
// writer per folder: an OutputLock on .DST.lock beside it (two conversions into one empty folder
// both said "converted" over a mix of their files, or one removed what the other wrote); the lock
// sits in the folder's parent, so the folders above it that do not exist are made first.
NewDir::NewDir(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dst = fs::path(dir).lexically_normal();
  if (dst.filename().empty()) dst = dst.parent_path();  // "out/"
  for (fs::path p = dst.parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path())
    madeParents_.push_back(p.string());
  if (!madeParents_.empty()) fs::create_directories(dst.parent_path(), ec);
  try {
    lock_ = std::make_unique<OutputLock>(dst.string());
    existed_ = fs::exists(dir, ec);
    prepareDir(dir);  // absent or empty, else refused: a refused folder is never cleaned
  } catch (...) {
    lock_.reset();
    removeMadeParents();
    throw;
  }
}

NewDir::~NewDir() {
  if (kept_) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!existed_) {
    fs::remove_all(dir_, ec);
    lock_.reset();
    removeMadeParents();
  } else if (fs::is_directory(dir_, ec)) {
    for (const auto& e : fs::directory_iterator(dir_, ec)) fs::remove_all(e.path(), ec);
  }
}

void NewDir::removeMadeParents() {
  std::error_code ec;
  for (const std::string& p : madeParents_) std::filesystem::remove(p, ec);  // deepest first
}

}  // namespace detail

ConvertStats convert(const Checkpoint& src, const std::string& dstDir, const TargetSpec& spec,
                     const aoa::Program* rules, const ConvertOptions& opt) {
  Plan plan = makePlan(src.metadata(), rules, spec);  // validates everything first
  // Note [Checkpoint file digests]: a damaged source is refused before anything is made (a
  // conversion passed a flipped byte on, and --md5 then vouched for it).
  const size_t verified = opt.verifySource ? src.verifyFiles(opt.threads, opt.stop) : 0;
  detail::FileSource source(src);
  detail::NewDir out(dstDir);  // Note [Outputs left as found]
  ConvertStats stats =
      detail::runToDir(plan, src.metadata(), source, dstDir, src.metadata().trainState, opt);
  out.keep();
  stats.verifiedFiles = verified;
  return stats;
}

void saveTensors(const std::string& dir, const std::vector<HostTensor>& tensors,
                 const TargetSpec& spec, const std::string& trainStateJson,
                 const ConvertOptions& opt) {
  // Every argument is checked before the folder is made (Note [Outputs left as found]).
  if (!trainStateJson.empty()) {
    nlohmann::json state;
    try {
      checkJsonDepth(trainStateJson, "saveTensors: trainStateJson");  // Note [Bounded JSON]
      state = nlohmann::json::parse(trainStateJson);
    } catch (const nlohmann::json::exception& e) {
      throw Error("saveTensors: trainStateJson is not valid JSON (" + jsonErrorText(e.what()) +
                  ")");
    }
    KEEL_CHECK(state.is_object(), "saveTensors: trainStateJson must be a JSON object, got ",
               state.type_name());
  }
  Metadata src;
  src.files = {"<memory>"};
  std::unordered_set<std::string_view> names;
  for (const auto& t : tensors) {
    KEEL_CHECK(t.key != "__metadata__", "saveTensors: tensors: the key '__metadata__' is reserved ",
               "(safetensors keeps its metadata under that name)");
    KEEL_CHECK(names.insert(t.key).second, "saveTensors: tensors: the key '", t.key,
               "' is given twice");
    KEEL_CHECK(t.data != nullptr || st::byteCount(t.shape, t.dtype, t.key) == 0,
               "saveTensors: tensors: '", t.key, "' has no data");
    src.keys.push_back(
        detail::wholeKey(t.key, t.dtype, t.shape, 0,
                         st::byteCount(t.shape, t.dtype, "saveTensors: '" + t.key + "'")));
  }
  Plan plan = makePlan(src, nullptr, spec);
  detail::MemorySource source(tensors);
  detail::NewDir out(dir);
  detail::runToDir(plan, src, source, dir, trainStateJson, opt);
  out.keep();
}

namespace {

std::string dimsText(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

void loadRank(const Checkpoint& src, const aoa::Program* rules, const TargetSpec& spec, int rank,
              std::vector<HostTensor>& targets, const LoadOptions& opt) {
  KEEL_CHECK(spec.tp >= 1 && rank >= 0 && rank < spec.tp, "load: rank ", rank,
             " is not in [0, tp=", spec.tp, ")");
  aoa::Result all = aoa::apply(rules, detail::sourceKeys(src.metadata()));
  std::unordered_map<std::string, size_t> byName;
  for (size_t i = 0; i < all.keys.size(); ++i) byName[all.keys[i].name] = i;
  aoa::Result chosen;
  std::vector<const HostTensor*> chosenTargets;
  std::vector<bool> used(all.keys.size(), false);
  std::string missing;
  size_t nMissing = 0;
  for (auto& t : targets) {
    auto it = byName.find(t.key);
    if (it == byName.end()) {
      if (!opt.allowMissing) {
        if (nMissing < 3) missing += (missing.empty() ? "'" : ", '") + t.key + "'";
        ++nMissing;
      }
      continue;
    }
    used[it->second] = true;
    aoa::TargetKey k = all.keys[it->second];
    if (k.declared && k.pieces.empty()) continue;  // `_ -> x`: keep the target's value
    if (k.dtype != t.dtype) {
      KEEL_CHECK(st::isFloatDType(k.dtype) && st::isFloatDType(t.dtype), src.path(), ": key '",
                 t.key, "' is ", st::dtypeName(k.dtype), " in the checkpoint but the target is ",
                 st::dtypeName(t.dtype));
      for (auto& p : k.pieces) p.casts.push_back(t.dtype);
      k.dtype = t.dtype;
    }
    chosen.keys.push_back(std::move(k));
    chosenTargets.push_back(&t);
  }
  KEEL_CHECK(nMissing == 0, src.path(), ": the checkpoint has no key", nMissing == 1 ? " " : "s ",
             missing,
             nMissing > 3 ? " and " + std::to_string(nMissing - 3) + " more" : std::string(),
             rules && !rules->statements.empty() ? " (after the rules)" : "");
  if (!opt.allowUnused) {
    std::string unused;
    size_t nUnused = 0;
    for (size_t i = 0; i < all.keys.size(); ++i)
      if (!used[i]) {
        if (nUnused < 3) unused += (unused.empty() ? "'" : ", '") + all.keys[i].name + "'";
        ++nUnused;
      }
    const bool one = nUnused == 1;
    KEEL_CHECK(nUnused == 0, src.path(), one ? ": checkpoint key " : ": checkpoint keys ", unused,
               nUnused > 3 ? " and " + std::to_string(nUnused - 3) + " more" : std::string(),
               one ? " matches" : " match", " nothing in the target (drop ", one ? "it" : "them",
               " with 'key -> _'",
               rules ? ")"
                     : std::string(": keel ckpt convert --aoa RULES writes a checkpoint without ") +
                           (one ? "it)" : "them)"));
  }
  Plan plan = detail::planFor(src.metadata(), std::move(chosen), spec, false);
  // This rank's part of each split key, and every replicated key whole (whichever file the
  // planner would have written it to).
  std::vector<TargetShard> mine;
  std::vector<void*> ptrs;
  Dims off, shape;
  for (const TargetShard& ts : plan.shards) {
    const int a = plan.axis[ts.key];
    if (a >= 0 && int(ts.part) != rank) continue;
    const HostTensor& t = *chosenTargets[ts.key];
    plan.shardBox(ts, off, shape);
    KEEL_CHECK(shape == t.shape, src.path(), ": key '", t.key, "' has shape ",
               dimsText(plan.target.keys[ts.key].shape), " in the checkpoint",
               a >= 0 ? ", rank " + std::to_string(rank) + " of tp=" + std::to_string(spec.tp) +
                            " holds " + dimsText(shape) + " (split along axis " +
                            std::to_string(a) + "),"
                      : std::string(),
               " but the target expects ", dimsText(t.shape));
    mine.push_back(ts);
    ptrs.push_back(t.data);
  }
  plan.shards = std::move(mine);
  detail::MemorySink sink(ptrs);
  detail::FileSource source(src);
  detail::execute(plan, src.metadata(), source, sink, opt.exec);
}

void loadTensors(const Checkpoint& src, const aoa::Program* rules, std::vector<HostTensor>& targets,
                 const LoadOptions& opt) {
  TargetSpec whole;
  whole.tp = 1;
  loadRank(src, rules, whole, 0, targets, opt);
}

}  // namespace keel::ckpt
