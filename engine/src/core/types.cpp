// dtype, device, attribute and shape helpers: names, parsing, printing.
#include <array>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <tuple>

#include "cuda_backend.h"
#include "keel/attrs.h"
#include "keel/base/vocabulary.h"
#include "keel/device.h"
#include "keel/dtype.h"
#include "keel/registry.h"
#include "shape_util.h"

namespace keel {

constexpr std::array<std::string_view, 3> kBackendNames = {"cpu", "cpu-ref", "cuda"};
static_assert(kBackendNames.size() == size_t(Backend::Cuda) + 1);
std::string_view backendName(Backend b) {
  return detail::enumName(kBackendNames, b);
}

Device::Device(const char* name) {
  std::string_view n(name ? name : "");
  if (n == backendName(Backend::Cpu)) {
    backend = Backend::Cpu;
  } else if (n == backendName(Backend::CpuRef)) {
    backend = Backend::CpuRef;
  } else if (n == "cuda" || n.starts_with("cuda:")) {
    backend = Backend::Cuda;
    if (n.size() > 5) {
      std::string idx(n.substr(5));
      char* end = nullptr;
      long v = std::strtol(idx.c_str(), &end, 10);
      KEEL_CHECK(end && *end == '\0' && v >= 0 && v < 1024, "bad device '", n,
                 "': expected cuda:N with N >= 0");
      index = int(v);
    }
  } else {
    throw Error(detail::concat("unknown backend '", n, "' (expected cpu, cpu-ref or cuda:N)"));
  }
}

Device trainingDevice(std::string_view name) {
  for (Backend b : {Backend::Cpu, Backend::CpuRef})
    if (name == backendName(b)) return Device(b);
  if (name == "cuda" || name.starts_with("cuda:")) {
    const Device d{std::string(name)};
    detail::cudaApiFor(d);  // loads the backend; throws "device 'cuda:N' is not available: ..."
    return d;
  }
  throw Error(detail::concat(
      "backend '", name, "' is not available for training (expected cpu, cpu-ref or cuda[:N])"));
}

std::string Device::name() const {
  if (backend == Backend::Cuda) return "cuda:" + std::to_string(index);
  return std::string(backendName(backend));
}

// ---- Attrs ----
Attrs& Attrs::set(std::string name, AttrValue v) {
  for (auto& [k, val] : items_)
    if (k == name) {
      val = std::move(v);
      return *this;
    }
  items_.emplace_back(std::move(name), std::move(v));
  return *this;
}

const AttrValue* Attrs::find(const std::string& name) const {
  for (auto& [k, v] : items_)
    if (k == name) return &v;
  return nullptr;
}

static Error missingAttr(const std::string& name, const char* type) {
  return Error(detail::concat("missing or mistyped attribute '", name, "' (expected ", type, ")"));
}

// The attribute as T, or as Alt converted to T (a bool for an int, an int for a float or a bool).
template <typename T, typename Alt>
static T attrAs(const AttrValue* v, const std::string& name, const char* type) {
  if (v && std::holds_alternative<T>(*v)) return std::get<T>(*v);
  if (v && std::holds_alternative<Alt>(*v)) return T(std::get<Alt>(*v));
  throw missingAttr(name, type);
}

int64_t Attrs::getInt(const std::string& name) const {
  return attrAs<int64_t, bool>(find(name), name, "int");
}
int64_t Attrs::getInt(const std::string& name, int64_t dflt) const {
  return has(name) ? getInt(name) : dflt;
}
double Attrs::getDouble(const std::string& name) const {
  return attrAs<double, int64_t>(find(name), name, "float");
}
double Attrs::getDouble(const std::string& name, double dflt) const {
  return has(name) ? getDouble(name) : dflt;
}
bool Attrs::getBool(const std::string& name) const {
  return attrAs<bool, int64_t>(find(name), name, "bool");
}
bool Attrs::getBool(const std::string& name, bool dflt) const {
  return has(name) ? getBool(name) : dflt;
}
const std::string& Attrs::getString(const std::string& name) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<std::string>(*v)) return std::get<std::string>(*v);
  throw missingAttr(name, "string");
}
const std::vector<int64_t>& Attrs::getInts(const std::string& name) const {
  const AttrValue* v = find(name);
  if (v && std::holds_alternative<std::vector<int64_t>>(*v))
    return std::get<std::vector<int64_t>>(*v);
  throw missingAttr(name, "int list");
}

std::string Attrs::toString() const {
  std::ostringstream os;
  os.precision(17);
  os << '{';
  bool first = true;
  for (auto& [k, v] : items_) {
    if (!first) os << ',';
    first = false;
    os << '"' << k << "\":";
    std::visit(
        [&](auto&& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, bool>) {
            os << (x ? "true" : "false");
          } else if constexpr (std::is_same_v<X, std::string>) {
            os << '"' << x << '"';
          } else if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
            os << '[';
            for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
            os << ']';
          } else if constexpr (std::is_same_v<X, double>) {
            if (std::isfinite(x))
              os << x;
            else
              os << '"' << x << '"';
          } else {
            os << x;
          }
        },
        v);
  }
  os << '}';
  return os.str();
}

// ---- shapes ----
std::string shapeStr(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shapeNumel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguousStrides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t d = int64_t(s.size()) - 1; d >= 0; --d) {
    st[size_t(d)] = acc;
    acc *= std::max<int64_t>(s[size_t(d)], 1);
  }
  return st;
}

int64_t normDim(int64_t d, int64_t rank, std::string_view op) {
  int64_t r = d < 0 ? d + rank : d;
  KEEL_CHECK(r >= 0 && r < rank, "op '", op, "': dim ", d, " out of range for a tensor of rank ",
             rank);
  return r;
}

Shape broadcastShapes(const Shape& a, const Shape& b, std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KEEL_CHECK(da == db || da == 1 || db == 1, "op '", op, "': shapes ", shapeStr(a), " and ",
               shapeStr(b), " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcastStrides(const Tensor& t, const Shape& outShape) {
  size_t n = outShape.size(), r = size_t(t.dim());
  Shape st(n, 0);
  for (size_t i = 0; i < r; ++i) {
    size_t o = n - r + i;
    st[o] = t.shape()[i] == 1 && outShape[o] != 1 ? 0 : t.strides()[i];
  }
  return st;
}

SlicePlace slicePlace(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &out = c.outputs[0];
  SlicePlace p;
  p.dim = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  p.step = c.attrs.getInt("step", 1);
  std::tie(p.start, p.length) = sliceBounds(out.size(p.dim), c.attrs.getInt("start"),
                                            c.attrs.getInt("end"), p.step, c.op.name);
  KEEL_CHECK(g.dim() == out.dim() && g.size(p.dim) == p.length, "op '", c.op.name, "': grad ",
             shapeStr(g.shape()), " does not match the slice of ", shapeStr(out.shape()));
  return p;
}

std::pair<int64_t, int64_t> sliceBounds(int64_t n, int64_t start, int64_t end, int64_t step,
                                        std::string_view op) {
  KEEL_CHECK(step > 0, "op '", op, "': step must be positive, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  return {start, (end - start + step - 1) / step};
}

DimSplit splitAt(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t i = 0; i < int64_t(shape.size()); ++i) {
    if (i < dim)
      s.outer *= shape[size_t(i)];
    else if (i == dim)
      s.n = shape[size_t(i)];
    else
      s.inner *= shape[size_t(i)];
  }
  return s;
}

}  // namespace keel
