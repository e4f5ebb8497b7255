// AOA: the key space the statements run over (Note [AOA semantics], eval.cpp) and the box
// arithmetic every primitive reduces to: slicing, concatenating and permuting a key's pieces,
// and which casts are allowed. No statement moves bytes.
#include <algorithm>
#include <numeric>

#include "aoa_internal.h"

namespace keel::aoa {

bool Piece::identityPerm() const {
  for (size_t d = 0; d < perm.size(); ++d)
    if (perm[d] != int8_t(d)) return false;
  return true;
}

namespace detail {

namespace {

int intRank(st::DType t) {
  switch (t) {
    case st::DType::I8:
      return 1;
    case st::DType::U8:
      return 1;
    case st::DType::I16:
      return 2;
    case st::DType::I32:
      return 3;
    case st::DType::I64:
      return 4;
    default:
      return 0;
  }
}

}  // namespace

std::string dimsStr(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

TargetKey identityKey(const SourceKey& src, uint32_t index) {
  TargetKey k;
  k.name = src.name;
  k.dtype = src.dtype;
  k.shape = src.shape;
  Piece& p = k.pieces.emplace_back();
  p.src = index;
  p.dstOff.assign(k.shape.size(), 0);
  p.srcOff.assign(k.shape.size(), 0);
  p.shape = k.shape;
  p.perm.resize(k.shape.size());
  std::iota(p.perm.begin(), p.perm.end(), int8_t(0));
  return k;
}

// ---- the key space ---------------------------------------------------------------------------

Space::Space(const std::vector<SourceKey>& src) {
  for (uint32_t i = 0; i < src.size(); ++i) add(identityKey(src[i], i));
}

void Space::add(TargetKey k, Place place) {
  std::string n = k.name;
  index_[n] = slots_.size();
  slots_.push_back(std::move(k));
  places_.push_back(place.empty() ? Place{nextPlace_++} : std::move(place));
  alive_.push_back(true);
  auto sep = n.find(kStateSeparator);
  if (sep != std::string::npos)
    states_[n.substr(0, sep)].insert(n.substr(sep + 2));
  else
    bases_[n] = slots_.size() - 1;
}

TargetKey Space::take(const std::string& n, int line) {
  size_t i = index_.at(n);
  index_.erase(n);
  alive_[i] = false;
  consumedAt_[n] = line;
  auto sep = n.find(kStateSeparator);
  if (sep != std::string::npos) {
    auto it = states_.find(n.substr(0, sep));
    if (it != states_.end()) it->second.erase(n.substr(sep + 2));
  } else {
    bases_.erase(n);
  }
  return std::move(slots_[i]);
}

std::set<std::string> Space::statesOf(const std::string& base) const {
  auto it = states_.find(base);
  return it == states_.end() ? std::set<std::string>{} : it->second;
}

int Space::consumedAt(const std::string& n) const {
  auto it = consumedAt_.find(n);
  return it == consumedAt_.end() ? 0 : it->second;
}

std::vector<std::string> Space::baseKeys(std::string_view prefix) const {
  std::vector<size_t> at;
  for (auto it = bases_.lower_bound(prefix);
       it != bases_.end() && std::string_view(it->first).substr(0, prefix.size()) == prefix; ++it)
    at.push_back(it->second);
  std::sort(at.begin(), at.end());  // space order
  std::vector<std::string> out;
  out.reserve(at.size());
  for (size_t i : at) out.push_back(slots_[i].name);
  return out;
}

std::string Space::nearKeyHint() const {
  auto keys = baseKeys();
  if (keys.empty()) return " (there are no keys)";
  return " (keys look like '" + keys.front() + "')";
}

Result Space::result() {
  std::vector<size_t> live;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (alive_[i]) live.push_back(i);
  // Note [Key order]: places are distinct among live keys.
  std::sort(live.begin(), live.end(), [&](size_t a, size_t b) { return places_[a] < places_[b]; });
  Result r;
  r.keys.reserve(live.size());
  for (size_t i : live) r.keys.push_back(std::move(slots_[i]));
  return r;
}

// ---- piece arithmetic ------------------------------------------------------------------------

TargetKey sliceKey(const TargetKey& k, size_t axis, int64_t start, int64_t len) {
  TargetKey out;
  out.dtype = k.dtype;
  out.shape = k.shape;
  out.shape[axis] = len;
  for (const Piece& p : k.pieces) {
    int64_t lo = std::max(p.dstOff[axis], start);
    int64_t hi = std::min(p.dstOff[axis] + p.shape[axis], start + len);
    if (lo >= hi) continue;
    Piece q = p;
    q.srcOff[size_t(p.perm[axis])] += lo - p.dstOff[axis];
    q.dstOff[axis] = lo - start;
    q.shape[axis] = hi - lo;
    out.pieces.push_back(std::move(q));
  }
  return out;
}

TargetKey concatKeys(const std::vector<TargetKey>& parts, size_t axis) {
  TargetKey out;
  out.dtype = parts.front().dtype;
  out.shape = parts.front().shape;
  out.shape[axis] = 0;
  for (const auto& k : parts) {
    for (Piece p : k.pieces) {
      p.dstOff[axis] += out.shape[axis];
      out.pieces.push_back(std::move(p));
    }
    out.shape[axis] += k.shape[axis];
  }
  return out;
}

TargetKey permuteKey(const TargetKey& k, const std::vector<int8_t>& perm) {
  TargetKey out;
  out.dtype = k.dtype;
  out.declared = k.declared;
  out.hasShape = k.hasShape;
  for (size_t d = 0; d < perm.size(); ++d) out.shape.push_back(k.shape[size_t(perm[d])]);
  for (const Piece& p : k.pieces) {
    Piece q = p;
    for (size_t d = 0; d < perm.size(); ++d) {
      q.dstOff[d] = p.dstOff[size_t(perm[d])];
      q.shape[d] = p.shape[size_t(perm[d])];
      q.perm[d] = p.perm[size_t(perm[d])];
    }
    out.pieces.push_back(std::move(q));
  }
  return out;
}

bool castable(st::DType from, st::DType to) {
  if (from == to) return true;
  if (st::isFloatDType(from) && st::isFloatDType(to)) return true;
  int a = intRank(from), b = intRank(to);
  return a > 0 && b > a;  // integer widening (U8 -> I16/I32/I64 included)
}

}  // namespace detail

}  // namespace keel::aoa
