// Run diff, comparison (see diff.h): one tensor of an aligned pair by MD5, rounded MD5, dumped
// values (tolerances and ULPs in the tensor's dtype) or statistics, first available wins; each
// verdict carries its basis and a short human phrase. Also the two runs' step losses.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>

#include "diff_util.h"
#include "keel/base/dtype.h"
#include "keel/storage/diff.h"
#include "keel/storage/export.h"

namespace keel::storage {

using detail::fmtNum;

namespace {

// ---- ULPs (16-bit floats round as the engine rounds them: keel/base/dtype.h) ------------------

// Distance of two sign-magnitude floats of `bits` width, on the monotonic integer line.
uint64_t ulpFromBits(uint64_t ba, uint64_t bb, int bits) {
  uint64_t signMask = 1ull << (bits - 1);
  uint64_t ma = ba & (signMask - 1), mb = bb & (signMask - 1);
  if ((ba & signMask) == (bb & signMask)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

// ---- statistics ------------------------------------------------------------------------------

// The element rule of compareValues for one number: atol/rtol, or within maxUlps in `dtype` when
// it is given -- for statistics, min, max and abs-max, which are values of the tensor's dtype
// (a mean or std is not: an integer tensor's mean measured in its ULPs would round differences
// away); a loss has none.
// `scale`: what rtol is of, when more than |b| (Note [The tolerance of a mean]).
bool closeEnough(double a, double b, const DiffOptions& opt, const std::string& ulpDtype = "",
                 double scale = 0) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;
  if (std::isinf(a) || std::isinf(b)) return false;
  return std::fabs(a - b) <= opt.atol + opt.rtol * std::max(std::fabs(b), scale) ||
         (opt.maxUlps > 0 && !ulpDtype.empty() && ulpDistance(a, b, ulpDtype) <= opt.maxUlps);
}

TensorDiff compareStats(const TensorRecord& a, const TensorRecord& b, const DiffOptions& opt) {
  TensorDiff d;
  d.role = a.role;
  d.index = a.index;
  d.basis = DiffBasis::Stats;
  const TensorStats &sa = a.stats, &sb = b.stats;
  if (sa.nanCount != sb.nanCount) {
    d.status = DiffStatus::Diverged;
    d.detail = "NaN count " + std::to_string(sa.nanCount) + " vs " + std::to_string(sb.nanCount);
    return d;
  }
  if (sa.infCount != sb.infCount) {
    d.status = DiffStatus::Diverged;
    d.detail = "Inf count " + std::to_string(sa.infCount) + " vs " + std::to_string(sb.infCount);
    return d;
  }
  struct Field {
    const char* name;
    double a, b;
    bool ofElements;  // a value of the tensor's dtype: the ULP rule applies
  };
  const Field fields[] = {{"min", sa.min, sb.min, true},
                          {"max", sa.max, sb.max, true},
                          {"mean", sa.mean, sb.mean, false},
                          {"std", sa.std, sb.std, false},
                          {"absMax", sa.absMax, sb.absMax, true}};
  // Note [The tolerance of a mean]: when every element is within tolerance, |a_i - b_i| <=
  // atol + rtol·|b_i|, the means differ by at most atol + rtol·mean|b_i| <= atol + rtol·absMax(B),
  // and the standard deviations (a norm of the centred values) by no more. The mean and std are
  // held to that bound, not to rtol of themselves: a gradient's mean is a sum that cancels
  // (1e-9 from elements near 1e-2), and rtol of it called two backends that agree element by
  // element "diverged" under --atol 0.
  const double elementScale = std::isfinite(sb.absMax) ? std::fabs(sb.absMax) : 0.0;
  for (const Field& f : fields) {
    const std::pair<double, double> v{f.a, f.b};
    const char* field = f.name;
    if (!closeEnough(v.first, v.second, opt, f.ofElements ? a.dtype : std::string(),
                     f.ofElements ? 0.0 : elementScale)) {
      d.status = DiffStatus::Diverged;
      d.detail = std::string(field) + " " + numberPair(v.first, v.second);
      return d;
    }
  }
  d.status = DiffStatus::WithinTolerance;
  d.detail = "statistics within tolerance";
  // The fields that give the tensor's scale, against rtol of that scale (Note on atolScale).
  const double scale = std::max(std::fabs(sa.absMax), std::fabs(sb.absMax));
  double worst = 0;
  for (auto [x, y] : {std::pair{sa.min, sb.min}, {sa.max, sb.max}, {sa.absMax, sb.absMax}})
    if (std::isfinite(x) && std::isfinite(y)) worst = std::max(worst, std::fabs(x - y));
  if (std::isfinite(scale) && worst > opt.rtol * scale && worst <= opt.atol) {
    d.atolScale = true;
    d.detail = "statistics within tolerance only on atol (largest magnitude " +
               numberPair(sa.absMax, sb.absMax) + ")";
  }
  return d;
}

}  // namespace

uint64_t ulpDistance(double a, double b, const std::string& dtype) {
  bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na && nb ? 0 : std::numeric_limits<uint64_t>::max();
  const std::optional<DType> t = tryParseDType(dtype);
  if (t == DType::Float32) {
    return ulpFromBits(std::bit_cast<uint32_t>(static_cast<float>(a)),
                       std::bit_cast<uint32_t>(static_cast<float>(b)), 32);
  }
  if (t == DType::Float16) {
    return ulpFromBits(Half::fromFloat(static_cast<float>(a)),
                       Half::fromFloat(static_cast<float>(b)), 16);
  }
  if (t == DType::BFloat16) {
    return ulpFromBits(BFloat16::fromFloat(static_cast<float>(a)),
                       BFloat16::fromFloat(static_cast<float>(b)), 16);
  }
  // A dtype the engine has none for stays a string (records.h): a foreign integer type (a
  // PyTorch run's uint8, int16) is told by its name, anything else is measured as float64.
  const bool integral = t ? isIntegral(*t) || *t == DType::Bool
                          : dtype.starts_with("int") || dtype.starts_with("uint");
  if (integral) {
    double d = std::fabs(std::round(a) - std::round(b));
    return d >= 1.8e19 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(d);
  }
  return ulpFromBits(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b), 64);  // float64
}

std::string numberPair(double a, double b, const char* sep) {
  std::string x = fmtNum(a), y = fmtNum(b);
  if (std::isfinite(a) && std::isfinite(b) && a != b) {
    for (int digits = 7; x == y && digits <= 17; ++digits) {
      char ba[40], bb[40];
      std::snprintf(ba, sizeof ba, "%.*g", digits, a);
      std::snprintf(bb, sizeof bb, "%.*g", digits, b);
      x = ba;
      y = bb;
    }
  }
  return x + sep + y;
}

TensorDiff compareValues(const std::vector<double>& a, const std::vector<double>& b,
                         const std::string& dtype, const DiffOptions& opt) {
  TensorDiff d;
  d.basis = DiffBasis::Values;
  if (a.size() != b.size()) {
    d.status = DiffStatus::Diverged;
    d.detail = std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " dumped elements";
    return d;
  }
  const double inf = std::numeric_limits<double>::infinity();
  double maxAbs = 0, maxRel = 0, scale = 0;
  uint64_t maxUlps = 0;
  int64_t bad = 0;
  int64_t firstBad = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = a[i], y = b[i];
    uint64_t ulps = ulpDistance(x, y, dtype);
    double abs = 0, rel = 0;
    bool ok;
    if (std::isnan(x) || std::isnan(y)) {
      ok = std::isnan(x) && std::isnan(y);
      if (!ok) abs = rel = inf;
    } else if (x == y) {
      ok = true;
    } else if (std::isinf(x) || std::isinf(y)) {
      ok = false;
      abs = rel = inf;
    } else {
      abs = std::fabs(x - y);
      rel = y == 0 ? inf : abs / std::fabs(y);
      ok = abs <= opt.atol + opt.rtol * std::fabs(y) || (opt.maxUlps > 0 && ulps <= opt.maxUlps);
    }
    maxAbs = std::max(maxAbs, abs);
    maxRel = std::max(maxRel, rel);
    if (std::isfinite(y)) scale = std::max(scale, std::fabs(y));
    maxUlps = std::max(maxUlps, ulps);
    if (!ok) {
      if (firstBad < 0) firstBad = static_cast<int64_t>(i);
      ++bad;
    }
  }
  d.maxAbs = maxAbs;
  d.maxRel = maxRel;
  d.maxUlps = maxUlps;
  d.badElements = bad;
  if (bad > 0) {
    d.status = DiffStatus::Diverged;
    size_t i = static_cast<size_t>(firstBad);
    d.detail = std::to_string(bad) + " of " + std::to_string(a.size()) +
               " elements outside tolerance; first at " + std::to_string(i) + ": " +
               numberPair(a[i], b[i]);
  } else if (maxUlps == 0) {
    d.status = DiffStatus::Equal;
    d.detail = "dumped values equal";
  } else {
    d.status = DiffStatus::WithinTolerance;
    d.detail = "dumped values within tolerance";
    if (maxAbs > opt.rtol * scale && maxAbs <= opt.atol) {  // see atolScale
      d.atolScale = true;
      d.detail =
          "dumped values within tolerance only on atol (largest magnitude " + fmtNum(scale) + ")";
    }
  }
  return d;
}

TensorDiff compareTensors(const TensorRecord& a, const TensorRecord& b, uint64_t seqA,
                          uint64_t seqB, const DiffOptions& opt, const DumpValues& values) {
  TensorDiff d;
  d.role = a.role;
  d.index = a.index;
  if (a.shape != b.shape || a.dtype != b.dtype) {
    d.status = DiffStatus::Diverged;
    d.basis = DiffBasis::Shape;
    // Only the dtype differs (a float32 run against a float64 one): said first, so the text
    // reads "diverged (dtype)" (it read "diverged (shape)" of two equal shapes).
    d.detail = a.shape == b.shape
                   ? "dtype " + a.dtype + " vs " + b.dtype + ", shape " + shapeText(a.shape)
                   : a.dtype + shapeText(a.shape) + " vs " + b.dtype + shapeText(b.shape);
    return d;
  }
  bool haveMd5 = opt.useMd5 && !a.md5.empty() && !b.md5.empty();
  if (haveMd5 && a.md5 == b.md5) {
    d.status = DiffStatus::Equal;
    d.basis = DiffBasis::Md5;
    return d;
  }
  bool haveRounded = opt.useRoundedMd5 && !a.md5Rounded.empty() && !b.md5Rounded.empty();
  if (haveRounded && a.md5Rounded == b.md5Rounded) {
    d.status = DiffStatus::WithinTolerance;
    d.basis = DiffBasis::RoundedMd5;
    d.detail = "MD5 differs, rounded MD5 equal";
    return d;
  }
  if (opt.useDumps && values) {
    int role = static_cast<int>(a.role);
    auto va = values(seqA, role, a.index, true);
    if (va) {
      auto vb = values(seqB, role, b.index, false);
      if (vb) {
        TensorDiff v = compareValues(*va, *vb, a.dtype, opt);
        v.role = a.role;
        v.index = a.index;
        return v;
      }
    }
  }
  if (opt.useStats && a.hasStats && b.hasStats) return compareStats(a, b, opt);
  if (haveMd5 || haveRounded) {
    d.status = DiffStatus::Diverged;
    d.basis = DiffBasis::Md5Only;
    d.detail = haveMd5 ? "MD5 differs (no stats or dumps to compare)"
                       : "rounded MD5 differs (no stats or dumps to compare)";
    return d;
  }
  d.status = DiffStatus::Equal;
  d.basis = DiffBasis::None;
  d.detail = "not compared (nothing recorded)";
  return d;
}

std::vector<LossDiff> compareLosses(const std::vector<StepRecord>& a,
                                    const std::vector<StepRecord>& b, const DiffOptions& opt) {
  std::map<int64_t, double> lossB;  // B's ended steps that reported a loss
  for (const StepRecord& s : b)
    if (s.endNs > 0 && s.reported(StepMetric::Loss)) lossB.emplace(s.step, s.loss);
  std::vector<LossDiff> out;
  for (const StepRecord& s : a) {
    auto it = lossB.find(s.step);
    if (s.endNs <= 0 || !s.reported(StepMetric::Loss) || it == lossB.end()) continue;
    LossDiff d{s.step, s.loss, it->second, DiffStatus::Equal};
    if (std::isnan(d.a) != std::isnan(d.b))
      d.status = DiffStatus::Diverged;  // a NaN against a number
    else if (!std::isnan(d.a) && d.a != d.b)
      d.status = closeEnough(d.a, d.b, opt) ? DiffStatus::WithinTolerance : DiffStatus::Diverged;
    out.push_back(d);
  }
  std::sort(out.begin(), out.end(),
            [](const LossDiff& x, const LossDiff& y) { return x.step < y.step; });
  return out;
}

}  // namespace keel::storage
