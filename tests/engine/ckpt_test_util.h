// Shared helpers of the FlexCheckpoint tests: dense host arrays with plain-loop reference
// operations (permute, slice, concat, cast), random fills, reassembling a key from its shards
// by hand (independently of the executor), and per-test temporary directories.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/dtype.h"
#include "keel/error.h"
#include "test_util.h"

namespace keel::ckpt::test {

namespace fs = std::filesystem;

struct Arr {
  st::DType dtype = st::DType::F32;
  Dims shape;
  std::vector<uint8_t> bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  size_t es() const { return st::dtypeSize(dtype); }
};

inline Dims stridesOf(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (size_t a = shape.size(); a-- > 1;) s[a - 1] = s[a] * shape[a];
  return s;
}

// Calls fn(multi-index) in row-major order.
template <typename Fn>
void forEachIndex(const Dims& shape, Fn&& fn) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  Dims idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    fn(idx);
    for (size_t a = shape.size(); a-- > 0;) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
}

inline int64_t linear(const Dims& idx, const Dims& shape) {
  int64_t l = 0;
  for (size_t a = 0; a < shape.size(); ++a) l = l * shape[a] + idx[a];
  return l;
}

// Random values: floats normal(0, 1) rounded to the dtype; integers uniform in [-1000, 1000].
inline Arr randomArr(st::DType t, const Dims& shape, uint64_t seed) {
  Arr a;
  a.dtype = t;
  a.shape = shape;
  a.bytes.resize(size_t(a.numel()) * a.es());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int64_t> id(-1000, 1000);
  for (int64_t i = 0; i < a.numel(); ++i) {
    uint8_t* p = a.bytes.data() + size_t(i) * a.es();
    switch (t) {
      case st::DType::F32: {
        float f = nd(rng);
        std::memcpy(p, &f, 4);
        break;
      }
      case st::DType::F64: {
        double f = nd(rng);
        std::memcpy(p, &f, 8);
        break;
      }
      case st::DType::BF16: {
        uint16_t b = BFloat16::fromFloat(nd(rng));
        std::memcpy(p, &b, 2);
        break;
      }
      case st::DType::F16: {
        uint16_t b = Half::fromFloat(nd(rng));
        std::memcpy(p, &b, 2);
        break;
      }
      default: {
        int64_t v = id(rng);
        std::memcpy(p, &v, a.es());  // little-endian: low bytes
        break;
      }
    }
  }
  return a;
}

// out[idx] = in[idx'] with idx'[perm[d]] = idx[d].
inline Arr permuteArr(const Arr& in, const std::vector<int>& perm) {
  Arr out;
  out.dtype = in.dtype;
  for (int p : perm) out.shape.push_back(in.shape[size_t(p)]);
  out.bytes.resize(in.bytes.size());
  const size_t es = in.es();
  forEachIndex(out.shape, [&](const Dims& idx) {
    Dims src(idx.size());
    for (size_t d = 0; d < idx.size(); ++d) src[size_t(perm[d])] = idx[d];
    std::memcpy(out.bytes.data() + size_t(linear(idx, out.shape)) * es,
                in.bytes.data() + size_t(linear(src, in.shape)) * es, es);
  });
  return out;
}

inline Arr transposeArr(const Arr& in) {
  std::vector<int> rev;
  for (size_t d = in.shape.size(); d-- > 0;) rev.push_back(int(d));
  return permuteArr(in, rev);
}

inline Arr sliceArr(const Arr& in, size_t axis, int64_t start, int64_t len) {
  Arr out;
  out.dtype = in.dtype;
  out.shape = in.shape;
  out.shape[axis] = len;
  out.bytes.resize(size_t(out.numel()) * in.es());
  forEachIndex(out.shape, [&](const Dims& idx) {
    Dims src = idx;
    src[axis] += start;
    std::memcpy(out.bytes.data() + size_t(linear(idx, out.shape)) * in.es(),
                in.bytes.data() + size_t(linear(src, in.shape)) * in.es(), in.es());
  });
  return out;
}

inline Arr concatArr(const std::vector<Arr>& parts, size_t axis) {
  Arr out;
  out.dtype = parts[0].dtype;
  out.shape = parts[0].shape;
  out.shape[axis] = 0;
  for (const auto& p : parts) out.shape[axis] += p.shape[axis];
  out.bytes.resize(size_t(out.numel()) * out.es());
  int64_t at = 0;
  for (const auto& p : parts) {
    forEachIndex(p.shape, [&](const Dims& idx) {
      Dims dst = idx;
      dst[axis] += at;
      std::memcpy(out.bytes.data() + size_t(linear(dst, out.shape)) * out.es(),
                  p.bytes.data() + size_t(linear(idx, p.shape)) * p.es(), p.es());
    });
    at += p.shape[axis];
  }
  return out;
}

// float32 <-> bfloat16 / float16 casts through keel's own conversions.
inline Arr castArr(const Arr& in, st::DType to) {
  Arr out;
  out.dtype = to;
  out.shape = in.shape;
  out.bytes.resize(size_t(in.numel()) * st::dtypeSize(to));
  for (int64_t i = 0; i < in.numel(); ++i) {
    float f = 0;
    const uint8_t* s = in.bytes.data() + size_t(i) * in.es();
    uint16_t b;
    if (in.dtype == st::DType::F32) {
      std::memcpy(&f, s, 4);
    } else if (in.dtype == st::DType::BF16) {
      std::memcpy(&b, s, 2);
      BFloat16 h;
      h.bits = b;
      f = float(h);
    } else if (in.dtype == st::DType::F16) {
      std::memcpy(&b, s, 2);
      f = Half::toFloat(b);
    }
    uint8_t* d = out.bytes.data() + size_t(i) * st::dtypeSize(to);
    if (to == st::DType::F32) {
      std::memcpy(d, &f, 4);
    } else if (to == st::DType::BF16) {
      b = BFloat16::fromFloat(f);
      std::memcpy(d, &b, 2);
    } else if (to == st::DType::F16) {
      b = Half::fromFloat(f);
      std::memcpy(d, &b, 2);
    }
  }
  return out;
}

// Reassembles a key from its shards with plain loops (reads whole shards through st::Reader).
inline Arr assemble(const std::string& dir, const std::string& key) {
  Checkpoint c = Checkpoint::open(dir);
  const KeyInfo* k = c.metadata().find(key);
  EXPECT_NE(k, nullptr) << "no key " << key << " in " << dir;
  if (!k) return {};
  Arr out;
  out.dtype = k->dtype;
  out.shape = k->shape;
  out.bytes.resize(size_t(out.numel()) * out.es());
  for (const auto& s : k->shards) {
    std::vector<uint8_t> b(size_t(s.end - s.begin));
    c.reader(s.file).readAt(s.begin, b.data(), b.size());
    forEachIndex(s.shape, [&](const Dims& idx) {
      Dims g = idx;
      for (size_t a = 0; a < g.size(); ++a) g[a] += s.offset[a];
      std::memcpy(out.bytes.data() + size_t(linear(g, out.shape)) * out.es(),
                  b.data() + size_t(linear(idx, s.shape)) * out.es(), out.es());
    });
  }
  return out;
}

inline ::testing::AssertionResult sameArr(const Arr& a, const Arr& b) {
  if (a.dtype != b.dtype)
    return ::testing::AssertionFailure()
           << "dtype " << st::dtypeName(a.dtype) << " vs " << st::dtypeName(b.dtype);
  if (a.shape != b.shape) return ::testing::AssertionFailure() << "shapes differ";
  for (size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] != b.bytes[i])
      return ::testing::AssertionFailure()
             << "byte " << i << " differs (element " << i / a.es() << ")";
  return ::testing::AssertionSuccess();
}

using keel::test::errorOf;  // test_util.h

// A fresh directory for the running test (ctest runs tests of one binary in parallel).
// Removes the folders tempDir made for a test once it has passed (a failed one's stay, to look
// at): every run of the suites left hundreds of megabytes of checkpoints in /tmp.
class TempDirCleaner : public ::testing::EmptyTestEventListener {
 public:
  static TempDirCleaner& instance() {
    static TempDirCleaner* c = [] {
      auto* made = new TempDirCleaner;
      ::testing::UnitTest::GetInstance()->listeners().Append(made);  // gtest owns it
      return made;
    }();
    return *c;
  }
  void add(const fs::path& d) { dirs_.push_back(d); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Passed()) {
      std::error_code ec;
      for (const fs::path& d : dirs_) fs::remove_all(d, ec);
    }
    dirs_.clear();
  }

 private:
  std::vector<fs::path> dirs_;
};

inline std::string tempDir(const std::string& tag = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(::testing::TempDir()) /
               ("keel_ckpt_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
                info->name() + (tag.empty() ? "" : "_" + tag));
  fs::remove_all(d);
  fs::create_directories(d);
  TempDirCleaner::instance().add(d);
  return d.string();
}

// Saves named arrays as a checkpoint with tp ranks (axis rule: the default TP rule, or `axis`
// for every key of rank >= 1 when axis >= 0).
inline void saveArrs(const std::string& dir, std::vector<std::pair<std::string, Arr>>& arrs, int tp,
                     int axis = -2) {
  std::vector<HostTensor> ts;
  for (auto& [name, a] : arrs) ts.push_back({name, a.dtype, a.shape, a.bytes.data()});
  TargetSpec spec;
  spec.tp = tp;
  if (axis >= -1)
    spec.axis = [axis](const std::string&, const Dims& s) {
      return int(s.size()) > axis ? axis : -1;
    };
  saveTensors(dir, ts, spec);
}

inline void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline std::string readFileBytes(const std::string& path) {
  return keel::readFile(path);
}

}  // namespace keel::ckpt::test
