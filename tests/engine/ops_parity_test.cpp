// The backend parity harness (llm.c's rule: no fast kernel without a reference beside it). Every
// non-view op runs on the backend under test and on `cpu-ref` with identical inputs and must agree
// within a stated per-dtype tolerance; one table line per (op, variant). Registry walks keep the
// table complete. Built twice: ops_parity_test tests `cpu`; cuda_ops_parity_test (KEEL_PARITY_CUDA,
// ctest label gpu) tests `cuda:0` with the same table, and skips without a CUDA device.
//
// Tolerances (|cpu - ref| <= atol + rtol * |ref|), see defaultTolerance():
//   float32 atol 1e-5 rtol 1e-4 (this already covers matmul and reductions, whose float32
//   accumulation order differs from the reference's float64 one); float64 1e-10 / 1e-10;
//   float16 1e-3 / 1e-2; bfloat16 1e-2 / 2e-2 (one rounding step of the storage type);
//   int32 / int64 / bool exact. dropout, uniform and normal must be bit-identical where their
//   parameters make the result exactly representable (p = 0.5, low/high = -1/1, mean/std = 0/1).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "keel/flashmask.h"
#include "keel/random.h"
#include "keel/registry.h"
#include "test_util.h"

namespace keel::test {
namespace {

constexpr DType F32 = DType::Float32, F64 = DType::Float64, F16 = DType::Float16,
                BF16 = DType::BFloat16, I32 = DType::Int32, I64 = DType::Int64, Bool = DType::Bool;
const std::vector<DType> kF2{F32, F64};
const std::vector<DType> kF4{F32, F64, F16, BF16};
const std::vector<DType> kF4I{F32, F64, F16, BF16, I32, I64};
const std::vector<DType> kAll{F32, F64, F16, BF16, I32, I64, Bool};

// The backend under test.
#if defined(KEEL_PARITY_CUDA)
const Device kUnderTest{Backend::Cuda, 0};
constexpr Backend kTested = Backend::Cuda;
#define KEEL_PARITY_NEEDS_DEVICE()                                             \
  do {                                                                         \
    if (cudaDevices() == 0)                                                    \
      GTEST_SKIP() << "no CUDA device: "                                       \
                   << (loadCudaBackend().empty() ? std::string("none present") \
                                                 : loadCudaBackend());         \
  } while (0)
#else
const Device kUnderTest = kCpu;
constexpr Backend kTested = Backend::Cpu;
#define KEEL_PARITY_NEEDS_DEVICE() \
  do {                             \
  } while (0)
#endif

const char* const kOpNames[] = {
#define KEEL_X_NAME(e, n) n,
    KEEL_BUILTIN_OPS(KEEL_X_NAME)
#undef KEEL_X_NAME
};
std::string opName(OpId id) {
  return kOpNames[int(id)];
}

// The ops that build views over their input's buffer and have no kernels.
const std::set<std::string> kViewOps{"reshape", "view",   "transpose", "permute",
                                     "slice",   "expand", "split"};

// Typed attribute values (Attrs::set(name, double) would pick the int overload).
AttrValue dbl(double v) {
  return AttrValue(v);
}
AttrValue boolean(bool v) {
  return AttrValue(v);
}
AttrValue i64(int64_t v) {
  return AttrValue(v);
}
AttrValue ints(std::vector<int64_t> v) {
  return AttrValue(std::move(v));
}

// ---------------------------------------------------------------- input generators
using Gen = std::function<Tensor(const Shape&, DType, Device, uint64_t)>;

// Values that suit the dtype: floats in [-2, 2), ints in [-20, 20], bools 0/1.
Tensor anyVals(const Shape& s, DType t, Device d, uint64_t seed) {
  if (t == Bool) return randInt(s, 0, 1, Bool, d, seed);
  if (isIntegral(t)) return randInt(s, -20, 20, t, d, seed);
  return randUniform(s, -2.0, 2.0, t, d, seed);
}
Gen range(double lo, double hi) {
  return [lo, hi](const Shape& s, DType t, Device d, uint64_t seed) {
    if (!isFloating(t)) return anyVals(s, t, d, seed);
    return randUniform(s, lo, hi, t, d, seed);
  };
}
// Small integers in [-2, 2] (as any dtype): comparisons and sorts see many ties.
Tensor tiedVals(const Shape& s, DType t, Device d, uint64_t seed) {
  if (t == Bool) return randInt(s, 0, 1, Bool, d, seed);
  return randInt(s, -2, 2, t, d, seed);
}
// Layouts that exercise the kernels' stride handling; each returns a tensor of `shape`.
enum class Layout { Contiguous, Transposed, Sliced, Expanded };
Tensor make(const Gen& g, Layout l, const Shape& shape, DType t, Device d, uint64_t seed) {
  switch (l) {
    case Layout::Contiguous:
      return g(shape, t, d, seed);
    case Layout::Transposed: {  // last two dims swapped in memory
      Shape s = shape;
      std::swap(s[s.size() - 1], s[s.size() - 2]);
      return ops::transpose(g(s, t, d, seed), -1, -2);
    }
    case Layout::Sliced: {  // every other element of a twice-as-long last dim, offset by one
      Shape s = shape;
      s.back() = 2 * s.back() + 1;
      return ops::slice(g(s, t, d, seed), -1, 1, s.back(), 2);
    }
    case Layout::Expanded: {  // first dim broadcast with stride 0
      Shape s = shape;
      s[0] = 1;
      return ops::expand(g(s, t, d, seed), shape);
    }
  }
  return {};
}

// ---------------------------------------------------------------- the table
using Maker = std::function<std::vector<Tensor>(DType, Device)>;
// Runs the case and returns the tensors to compare. Empty: dispatch(op, inputs, attrs).
using Runner = std::function<std::vector<Tensor>(const std::vector<Tensor>&, DType, Device)>;

enum class Check {
  Close,      // within tolerance
  Exact,      // bit-identical
  SameZeros,  // the same elements are zero (bit-identical mask), values within tolerance
};

struct ParityCase {
  OpId op;
  std::string variant;
  std::vector<DType> dtypes;
  Maker make;
  Attrs attrs;
  Runner run;
  Check check = Check::Close;
  double tolScale = 1.0;  // documented per line where a looser bound is needed
};

struct TableBuilder {
  std::vector<ParityCase> cases;
  ParityCase& add(OpId op, std::string variant, std::vector<DType> dtypes, Maker m, Attrs a = {}) {
    cases.push_back(ParityCase{op,
                               std::move(variant),
                               std::move(dtypes),
                               std::move(m),
                               std::move(a),
                               {},
                               Check::Close,
                               1.0});
    return cases.back();
  }
};

void addBinary(TableBuilder& b, OpId op, const std::vector<DType>& dts, Gen ga, Gen gb) {
  b.add(op, "odd_127", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{ga({127}, t, d, 1), gb({127}, t, d, 2)};
  });
  b.add(op, "broadcast_3x1x5_4x1", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{ga({3, 1, 5}, t, d, 3), gb({4, 1}, t, d, 4)};
  });
  b.add(op, "transposed_and_sliced", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{make(ga, Layout::Transposed, {7, 5}, t, d, 5),
                               make(gb, Layout::Sliced, {7, 5}, t, d, 6)};
  });
  b.add(op, "expanded_stride0", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{make(ga, Layout::Expanded, {4, 6}, t, d, 7), gb({1, 6}, t, d, 8)};
  });
  b.add(op, "scalar_operand", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{ga({2, 3}, t, d, 9), gb({}, t, d, 10)};
  });
}

void addUnary(TableBuilder& b, OpId op, const std::vector<DType>& dts, Gen g) {
  b.add(op, "odd_127", dts,
        [=](DType t, Device d) { return std::vector<Tensor>{g({127}, t, d, 11)}; });
  b.add(op, "transposed", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{make(g, Layout::Transposed, {6, 9}, t, d, 12)};
  });
  b.add(op, "sliced", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{make(g, Layout::Sliced, {3, 5}, t, d, 13)};
  });
  b.add(op, "size1_dims", dts, [=](DType t, Device d) {
    return std::vector<Tensor>{g({1, 5, 1}, t, d, 14)};
  });
}

std::vector<ParityCase> buildTable() {
  TableBuilder b;
  Gen any = anyVals;
  Gen pos = range(0.5, 2.0);
  Gen unit = range(-1.0, 1.0);

  // ---- binary elementwise
  for (OpId op : {OpId::Add, OpId::Sub, OpId::Mul, OpId::Maximum, OpId::Minimum})
    addBinary(b, op, kF4I, any, any);
  addBinary(b, OpId::Div, kF4, any, pos);
  addBinary(b, OpId::Pow, kF4, pos, any);
  for (OpId op : {OpId::Eq, OpId::Lt, OpId::Gt}) {
    std::vector<DType> dts = kF4I;
    if (op == OpId::Eq) dts.push_back(Bool);
    addBinary(b, op, dts, tiedVals, tiedVals);
  }

  // ---- unary
  for (OpId op : {OpId::Neg, OpId::Relu, OpId::Abs}) addUnary(b, op, kF4I, range(-4, 4));
  for (OpId op : {OpId::Exp, OpId::Tanh, OpId::Sigmoid, OpId::Gelu, OpId::Silu})
    addUnary(b, op, kF4, range(-4, 4));
  for (OpId op : {OpId::Log, OpId::Sqrt, OpId::Rsqrt}) addUnary(b, op, kF4, range(0.1, 4));
  for (OpId op : {OpId::GeluBackward, OpId::SiluBackward}) {
    b.add(op, "odd_127", kF4, [](DType t, Device d) {
      return std::vector<Tensor>{anyVals({127}, t, d, 15), randUniform({127}, -4, 4, t, d, 16)};
    });
    b.add(op, "transposed_and_sliced", kF4, [=](DType t, Device d) {
      return std::vector<Tensor>{make(anyVals, Layout::Sliced, {4, 6}, t, d, 17),
                                 make(range(-4, 4), Layout::Transposed, {4, 6}, t, d, 18)};
    });
  }

  // ---- scalar attribute (int: the scalar truncates toward zero)
  for (OpId op : {OpId::AddScalar, OpId::MulScalar})
    for (double s : {2.5, -1.75}) {
      std::string v = s > 0 ? "plus_2_5" : "minus_1_75";
      b.add(
          op, "odd_127_" + v, kF4I,
          [](DType t, Device d) { return std::vector<Tensor>{anyVals({127}, t, d, 19)}; },
          Attrs().set("scalar", dbl(s)));
      b.add(
          op, "transposed_" + v, kF4I,
          [](DType t, Device d) {
            return std::vector<Tensor>{make(anyVals, Layout::Transposed, {5, 3}, t, d, 20)};
          },
          Attrs().set("scalar", dbl(s)));
    }
  for (double e : {2.0, 3.0, 1.7, -0.5}) {
    std::string v = e == 2.0 ? "square" : e == 3.0 ? "cube" : e > 0 ? "e_1_7" : "e_minus_0_5";
    b.add(
        OpId::PowScalar, "odd_127_" + v, kF4,
        [pos](DType t, Device d) { return std::vector<Tensor>{pos({127}, t, d, 21)}; },
        Attrs().set("exponent", dbl(e)));
  }
  b.add(
      OpId::PowScalar, "sliced", kF4,
      [pos](DType t, Device d) {
        return std::vector<Tensor>{make(pos, Layout::Sliced, {3, 4}, t, d, 22)};
      },
      Attrs().set("exponent", dbl(1.5)));

  // ---- reductions
  struct Red {
    std::string variant;
    Shape shape;
    Layout layout;
    std::vector<int64_t> dims;
    bool keepdim;
  };
  const std::vector<Red> reds{
      {"all_4x33", {4, 33}, Layout::Contiguous, {}, false},
      {"all_1001", {1001}, Layout::Contiguous, {}, false},
      {"dim1_keepdim", {3, 4, 5}, Layout::Contiguous, {1}, true},
      {"dims0_2", {3, 4, 5}, Layout::Contiguous, {0, 2}, false},
      {"last_dim_transposed", {6, 7}, Layout::Transposed, {-1}, false},
      {"dim0_sliced", {5, 4}, Layout::Sliced, {0}, true},
      {"size1_dim", {3, 1, 4}, Layout::Contiguous, {1}, false},
      {"expanded", {4, 6}, Layout::Expanded, {0}, false},
  };
  for (const Red& r : reds) {
    Maker m = [r](DType t, Device d) {
      return std::vector<Tensor>{make(anyVals, r.layout, r.shape, t, d, 23)};
    };
    Attrs a = Attrs().set("dims", ints(r.dims)).set("keepdim", boolean(r.keepdim));
    b.add(OpId::Sum, r.variant, kF4I, m, a);
    b.add(OpId::Mean, r.variant, kF4, m, a);
  }
  struct Arg {
    std::string variant;
    Shape shape;
    Layout layout;
    int64_t dim;
    bool keepdim;
    bool ties;
  };
  const std::vector<Arg> args{
      {"dim1", {3, 7, 4}, Layout::Contiguous, 1, false, false},
      {"last_dim_keepdim", {5, 127}, Layout::Contiguous, -1, true, false},
      {"dim0_transposed", {6, 5}, Layout::Transposed, 0, false, false},
      {"ties_first_wins", {4, 9}, Layout::Contiguous, -1, false, true},
      {"ties_sliced", {4, 6}, Layout::Sliced, 1, true, true},
      {"size1_dim", {4, 1}, Layout::Contiguous, 1, false, false},
  };
  for (const Arg& r : args) {
    Maker m = [r](DType t, Device d) {
      return std::vector<Tensor>{
          make(r.ties ? Gen(tiedVals) : Gen(anyVals), r.layout, r.shape, t, d, 24)};
    };
    Attrs a = Attrs().set("dim", i64(r.dim)).set("keepdim", boolean(r.keepdim));
    b.add(OpId::Max, r.variant, kF4I, m, a);
    b.add(OpId::Argmax, r.variant, kF4I, m, a);
  }

  // ---- matmul (values in [-1, 1))
  struct Mm {
    std::string variant;
    Shape a, b;
    bool ta, tb;
    Layout la, lb;
  };
  const std::vector<Mm> mms{
      {"5x7_7x3", {5, 7}, {7, 3}, false, false, Layout::Contiguous, Layout::Contiguous},
      {"trans_a", {7, 5}, {7, 3}, true, false, Layout::Contiguous, Layout::Contiguous},
      {"trans_b", {5, 7}, {3, 7}, false, true, Layout::Contiguous, Layout::Contiguous},
      {"trans_a_trans_b", {7, 5}, {3, 7}, true, true, Layout::Contiguous, Layout::Contiguous},
      {"batched_broadcast",
       {2, 1, 4, 5},
       {3, 5, 6},
       false,
       false,
       Layout::Contiguous,
       Layout::Contiguous},
      {"batched_trans_b",
       {3, 4, 5},
       {3, 6, 5},
       false,
       true,
       Layout::Contiguous,
       Layout::Contiguous},
      {"strided_views", {7, 5}, {5, 4}, false, false, Layout::Transposed, Layout::Sliced},
      {"expanded_batch", {3, 4, 5}, {3, 5, 2}, false, false, Layout::Contiguous, Layout::Expanded},
      {"odd_33x65x17", {33, 65}, {65, 17}, false, false, Layout::Contiguous, Layout::Contiguous},
      {"64x127x48", {64, 127}, {127, 48}, false, false, Layout::Contiguous, Layout::Contiguous},
      {"k1", {4, 1}, {1, 3}, false, false, Layout::Contiguous, Layout::Contiguous},
      {"m1_n1", {1, 8}, {8, 1}, false, false, Layout::Contiguous, Layout::Contiguous},
  };
  for (const Mm& m : mms)
    b.add(
        OpId::Matmul, m.variant, kF4,
        [m, unit](DType t, Device d) {
          return std::vector<Tensor>{make(unit, m.la, m.a, t, d, 25),
                                     make(unit, m.lb, m.b, t, d, 26)};
        },
        Attrs().set("trans_a", boolean(m.ta)).set("trans_b", boolean(m.tb)));

  // ---- softmax family
  struct Sm {
    std::string variant;
    Shape shape;
    Layout layout;
    int64_t dim;
    double scale, shift;
  };
  const std::vector<Sm> sms{
      {"last_dim_4x127", {4, 127}, Layout::Contiguous, -1, 1, 0},
      {"dim0", {5, 6}, Layout::Contiguous, 0, 1, 0},
      {"dim1_of_3d_transposed", {3, 5, 4}, Layout::Transposed, 1, 1, 0},
      {"size1_dim", {4, 1}, Layout::Contiguous, -1, 1, 0},
      {"large_logits", {3, 8}, Layout::Contiguous, -1, 10, 100},
  };
  for (const Sm& s : sms) {
    Maker m = [s](DType t, Device d) {
      Gen g = range(s.shift - 2 * s.scale, s.shift + 2 * s.scale);
      return std::vector<Tensor>{make(g, s.layout, s.shape, t, d, 27)};
    };
    b.add(OpId::Softmax, s.variant, kF4, m, Attrs().set("dim", i64(s.dim)));
    b.add(OpId::LogSoftmax, s.variant, kF4, m, Attrs().set("dim", i64(s.dim)));
  }
  for (auto [variant, shape, dim] :
       {std::tuple<std::string, Shape, int64_t>{"last_dim", {4, 33}, -1}, {"dim0", {5, 6}, 0}}) {
    b.add(
        OpId::SoftmaxBackward, variant, kF4,
        [shape](DType t, Device d) {
          return std::vector<Tensor>{anyVals(shape, t, d, 28),
                                     randUniform(shape, 0.01, 1, t, d, 29)};
        },
        Attrs().set("dim", i64(dim)));
    b.add(
        OpId::LogSoftmaxBackward, variant, kF4,
        [shape](DType t, Device d) {
          return std::vector<Tensor>{anyVals(shape, t, d, 30),
                                     randUniform(shape, -4, -0.01, t, d, 31)};
        },
        Attrs().set("dim", i64(dim)));
  }
  b.add(
      OpId::SoftmaxBackward, "strided", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 6}, t, d, 32),
                                   make(range(0.01, 1), Layout::Sliced, {4, 6}, t, d, 33)};
      },
      Attrs().set("dim", i64(-1)));
  b.add(
      OpId::LogSoftmaxBackward, "strided", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 6}, t, d, 34),
                                   make(range(-4, -0.01), Layout::Sliced, {4, 6}, t, d, 35)};
      },
      Attrs().set("dim", i64(-1)));

  // ---- norms
  struct Nm {
    std::string variant;
    Shape x;
    Layout layout;
  };
  const std::vector<Nm> nms{{"4x33", {4, 33}, Layout::Contiguous},
                            {"2x3x16", {2, 3, 16}, Layout::Contiguous},
                            {"transposed", {6, 8}, Layout::Transposed},
                            {"sliced", {3, 5}, Layout::Sliced},
                            {"last_dim_1", {4, 1}, Layout::Contiguous}};
  for (const Nm& n : nms) {
    int64_t dl = n.x.back();
    b.add(
        OpId::LayerNorm, n.variant, kF4,
        [n, dl](DType t, Device d) {
          return std::vector<Tensor>{make(anyVals, n.layout, n.x, t, d, 36),
                                     randUniform({dl}, 0.5, 1.5, t, d, 37),
                                     anyVals({dl}, t, d, 38)};
        },
        Attrs().set("eps", dbl(1e-5)));
    b.add(
        OpId::LayerNormBackward, n.variant, kF4,
        [n, dl](DType t, Device d) {
          return std::vector<Tensor>{anyVals(n.x, t, d, 39), make(anyVals, n.layout, n.x, t, d, 40),
                                     randUniform({dl}, 0.5, 1.5, t, d, 41)};
        },
        Attrs().set("eps", dbl(1e-5)));
    b.add(
        OpId::RmsNorm, n.variant, kF4,
        [n, dl](DType t, Device d) {
          return std::vector<Tensor>{make(anyVals, n.layout, n.x, t, d, 42),
                                     randUniform({dl}, 0.5, 1.5, t, d, 43)};
        },
        Attrs().set("eps", dbl(1e-6)));
    b.add(
        OpId::RmsNormBackward, n.variant, kF4,
        [n, dl](DType t, Device d) {
          return std::vector<Tensor>{anyVals(n.x, t, d, 44), make(anyVals, n.layout, n.x, t, d, 45),
                                     randUniform({dl}, 0.5, 1.5, t, d, 46)};
        },
        Attrs().set("eps", dbl(1e-6)));
  }

  // ---- embedding
  for (DType it : {I64, I32}) {
    std::string v = it == I64 ? "int64_indices" : "int32_indices";
    b.add(OpId::Embedding, v, kF4, [it](DType t, Device d) {
      return std::vector<Tensor>{anyVals({7, 5}, t, d, 47),
                                 fromInts({0, 6, 3, 3, 1, 6}, {2, 3}, it, d)};
    });
    b.add(
        OpId::EmbeddingBackward, v + "_repeats", kF4,
        [it](DType t, Device d) {
          return std::vector<Tensor>{anyVals({2, 3, 5}, t, d, 48),
                                     fromInts({0, 6, 3, 3, 1, 6}, {2, 3}, it, d)};
        },
        Attrs().set("num_weights", i64(7)));
  }
  b.add(OpId::Embedding, "transposed_weight", kF4, [](DType t, Device d) {
    return std::vector<Tensor>{make(anyVals, Layout::Transposed, {6, 4}, t, d, 49),
                               fromInts({5, 0, 2}, {3}, I64, d)};
  });
  b.add(
      OpId::EmbeddingBackward, "strided_grad", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 3}, t, d, 50),
                                   fromInts({2, 2, 0, 1}, {4}, I64, d)};
      },
      Attrs().set("num_weights", i64(3)));

  // ---- cross entropy (targets int64; -100 is ignored by default)
  struct Ce {
    std::string variant;
    std::vector<int64_t> targets;
    int64_t ignore;
    Layout layout;
  };
  const std::vector<Ce> ces{
      {"one_ignored", {0, 4, 2, -100, 1, 3}, -100, Layout::Contiguous},
      {"ignore_class_2", {2, 4, 2, 0, 1, 3}, 2, Layout::Contiguous},
      {"all_ignored", {-100, -100, -100, -100, -100, -100}, -100, Layout::Contiguous},
      {"transposed_logits", {1, 1, 0, 4, 2, 3}, -100, Layout::Transposed}};
  for (const Ce& c : ces) {
    b.add(
        OpId::CrossEntropy, c.variant, kF4,
        [c](DType t, Device d) {
          return std::vector<Tensor>{make(anyVals, c.layout, {6, 5}, t, d, 51),
                                     fromInts(c.targets, {6}, I64, d)};
        },
        Attrs().set("ignore_index", i64(c.ignore)));
    b.add(
        OpId::CrossEntropyBackward, c.variant, kF4,
        [c](DType t, Device d) {
          return std::vector<Tensor>{randUniform({}, 0.5, 2, t, d, 52),
                                     make(anyVals, c.layout, {6, 5}, t, d, 53),
                                     fromInts(c.targets, {6}, I64, d)};
        },
        Attrs().set("ignore_index", i64(c.ignore)));
  }
  // Logits near 270 (float32 ulp 3e-5): a log-sum-exp rounded to float32 before exp(x - lse)
  // moves every probability by up to half that ulp, 1.5e-5 relative. This line is held to a
  // hundredth of the default tolerance (float32: atol 1e-7, rtol 1e-6); measured on it, that
  // rounding errs by 1.4e-5 relative (7x the tolerance), the kernel by 8e-8 (0.03x). See Note
  // [cross_entropy backward precision]. float32 and float64 only: float16 and bfloat16 store
  // these logits to within 0.125 and 1, so a tight line would test their rounding, not the kernel.
  Maker largeLogits = [](DType t, Device d) {
    return std::vector<Tensor>{randUniform({}, 0.5, 2, t, d, 52),
                               randUniform({6, 5}, 262, 278, t, d, 53),
                               fromInts({0, 4, 2, -100, 1, 3}, {6}, I64, d)};
  };
  b.add(OpId::CrossEntropyBackward, "large_logits", kF2, largeLogits).tolScale = 0.01;
  // The same for log_softmax's forward: x - lse rounded once (outputs of a few units, ulp 2.4e-7),
  // not with lse rounded to float32 first (1.5e-5 absolute at these logits).
  Maker largeLogitsLsm = [](DType t, Device d) {
    return std::vector<Tensor>{randUniform({6, 5}, 262, 278, t, d, 54)};
  };
  b.add(OpId::LogSoftmax, "large_logits_270", kF2, largeLogitsLsm, Attrs().set("dim", i64(-1)))
      .tolScale = 0.01;

  // ---- dropout: p = 0.5 scales by exactly 2, so the values must match bit for bit; for p = 0.3
  // the kept values are x / 0.7, rounded once (ref: float64) or twice (cpu: float32 scale).
  auto dropAttrs = [](double p, int64_t seed, int64_t offset) {
    return Attrs().set("p", dbl(p)).set("seed", i64(seed)).set("offset", i64(offset));
  };
  b.add(
       OpId::Dropout, "p0_5_exact", kF4,
       [](DType t, Device d) { return std::vector<Tensor>{anyVals({1001}, t, d, 54)}; },
       dropAttrs(0.5, 7, 11))
      .check = Check::Exact;
  b.add(
       OpId::Dropout, "p0_5_strided_exact", kF4,
       [](DType t, Device d) {
         return std::vector<Tensor>{make(anyVals, Layout::Transposed, {9, 13}, t, d, 55)};
       },
       dropAttrs(0.5, 123456789012345, 1 << 20))
      .check = Check::Exact;
  b.add(
       OpId::Dropout, "p0_3_same_mask", kF4,
       [](DType t, Device d) { return std::vector<Tensor>{range(0.5, 2)({1001}, t, d, 56)}; },
       dropAttrs(0.3, 3, 0))
      .check = Check::SameZeros;

  // ---- rope: both backends take cos/sin of t·θ in double (cpu rounds them to its compute type).
  // Angles up to 32 rad, an odd head count, a small base with the inverse, and the strided head
  // view of a fused qkv projection that GPT attention passes.
  b.add(OpId::Rope, "t33_h3_d8", kF4, [](DType t, Device d) {
    return std::vector<Tensor>{anyVals({2, 33, 3, 8}, t, d, 58)};
  });
  b.add(
      OpId::Rope, "base100_inverse_d6", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({1, 17, 2, 6}, t, d, 59)};
      },
      Attrs().set("base", dbl(100.0)).set("inverse", boolean(true)));
  b.add(OpId::Rope, "head_view_of_fused_qkv", kF4, [](DType t, Device d) {
    Tensor qkv = anyVals({2, 9, 24}, t, d, 60);
    return std::vector<Tensor>{ops::reshape(ops::split(qkv, {8, 8, 8}, -1)[1], {2, 9, 2, 4})};
  });

  // ---- flashmask attention (every mask kind, bfloat16 bounds, determinism: flashmask_test.cpp).
  // Strided q (a transposed copy), GQA 4:2, a causal-document mask, odd lengths; the backward line
  // takes out and lse from the forward on its own backend, so its 16-bit inputs already differ by
  // a rounding step: tolerance x4.
  {
    auto fmIn = [](DType t, Device d) {
      Tensor idx =
          flashmask::repeatMask(flashmask::causalDocument({5, 9, 3}, d).startendRowIndices, 2, 1);
      Tensor q = ops::transpose(anyVals({2, 4, 17, 8}, t, d, 90), 1, 2);
      return std::vector<Tensor>{q, anyVals({2, 17, 2, 8}, t, d, 91),
                                 anyVals({2, 17, 2, 8}, t, d, 92), idx};
    };
    Attrs fa = Attrs().set("causal", boolean(true)).set("dropout", dbl(0.0));
    b.add(OpId::FlashmaskAttention, "causal_document_gqa_strided_q", kF4, fmIn, fa);
    b.add(
        OpId::FlashmaskAttention, "no_mask_window_5", kF4,
        [](DType t, Device d) {
          return std::vector<Tensor>{anyVals({1, 13, 2, 4}, t, d, 95),
                                     anyVals({1, 21, 1, 4}, t, d, 96),
                                     anyVals({1, 21, 1, 4}, t, d, 97)};
        },
        Attrs().set("window_size", i64(5)));
    // Head dims past the small ones above, as models use them (each picks its own tile plan),
    // causal without an index tensor, and lengths that are not multiples of a tile.
    for (int64_t hd : {32, 64, 128}) {
      const int64_t sq = hd == 128 ? 70 : 100;
      b.add(
          OpId::FlashmaskAttention, "causal_head_dim_" + std::to_string(hd), kF4,
          [hd, sq](DType t, Device d) {
            return std::vector<Tensor>{anyVals({1, sq, 2, hd}, t, d, 98),
                                       anyVals({1, sq, 2, hd}, t, d, 99),
                                       anyVals({1, sq, 2, hd}, t, d, 100)};
          },
          fa);
    }
    // As gpt-mini calls it: q, k, v are head views of one fused projection ([B, T, 3C] split).
    b.add(
        OpId::FlashmaskAttention, "causal_fused_qkv_views", kF4,
        [](DType t, Device d) {
          Tensor qkv = anyVals({3, 64, 3 * 128}, t, d, 101);
          std::vector<Tensor> p = ops::split(qkv, {128, 128, 128}, -1);
          std::vector<Tensor> in;
          for (const Tensor& x : p) in.push_back(ops::reshape(x, {3, 64, 4, 32}));
          return in;
        },
        fa);
    b.add(
         OpId::FlashmaskAttentionBackward, "causal_document_gqa", kF4,
         [fmIn, fa](DType t, Device d) {
           std::vector<Tensor> in = fmIn(t, d);
           std::vector<Tensor> o = dispatch(OpId::FlashmaskAttention, in, fa);
           DType lt = t == F64 ? F64 : F32;
           return std::vector<Tensor>{
               anyVals({2, 17, 4, 8}, t, d, 93),          in[0], in[1], in[2], o[0], o[1],
               randUniform({2, 4, 17}, -1, 1, lt, d, 94), in[3]};
         },
         fa)
        .tolScale = 4.0;
  }

  // ---- slice_backward
  b.add(
      OpId::SliceBackward, "dim1_step2", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({3, 3}, t, d, 57)};
      },
      Attrs()
          .set("shape", ints({3, 7}))
          .set("dim", i64(1))
          .set("start", i64(1))
          .set("end", i64(6))
          .set("step", i64(2)));
  b.add(
      OpId::SliceBackward, "negative_start_clamped_end", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {5, 4}, t, d, 58)};
      },
      Attrs()
          .set("shape", ints({6, 4}))
          .set("dim", i64(0))
          .set("start", i64(-5))
          .set("end", i64(100))
          .set("step", i64(1)));

  // ---- shape ops with kernels
  b.add(
      OpId::Concat, "dim1_mixed_layouts", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({2, 3}, t, d, 59),
                                   make(anyVals, Layout::Transposed, {2, 1}, t, d, 60),
                                   make(anyVals, Layout::Sliced, {2, 4}, t, d, 61)};
      },
      Attrs().set("dim", i64(1)));
  b.add(
      OpId::Concat, "dim0_negative_dim", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({3, 2, 5}, t, d, 62),
                                   make(anyVals, Layout::Expanded, {1, 2, 5}, t, d, 63)};
      },
      Attrs().set("dim", i64(-3)));
  b.add(
      OpId::Concat, "single_input", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 3}, t, d, 64)};
      },
      Attrs().set("dim", i64(0)));
  for (Layout l : {Layout::Transposed, Layout::Sliced, Layout::Expanded}) {
    std::string v = l == Layout::Transposed ? "transposed"
                    : l == Layout::Sliced   ? "sliced"
                                            : "expanded";
    b.add(OpId::Contiguous, v, kAll, [l](DType t, Device d) {
      return std::vector<Tensor>{make(anyVals, l, {5, 7}, t, d, 65)};
    });
    b.add(OpId::CopyTo, v, kAll, [l](DType t, Device d) {
       return std::vector<Tensor>{make(anyVals, l, {5, 7}, t, d, 66)};
     }).run = [](const std::vector<Tensor>& in, DType, Device d) {
      Device other = d == kUnderTest ? kCpuRef : kUnderTest;
      return dispatch(OpId::CopyTo, in, Attrs().set("device", other.name()));
    };
  }
  b.add(OpId::CopyTo, "contiguous_same_device", kAll, [](DType t, Device d) {
     return std::vector<Tensor>{anyVals({127}, t, d, 67)};
   }).run = [](const std::vector<Tensor>& in, DType, Device d) {
    return dispatch(OpId::CopyTo, in, Attrs().set("device", d.name()));
  };
  b.add(
      OpId::Reshape, "copy_of_transposed", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 6}, t, d, 68)};
      },
      Attrs().set("shape", ints({-1})));

  // ---- indexing
  b.add(
      OpId::IndexSelect, "dim0_int64_repeats", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({5, 4}, t, d, 69), fromInts({0, 4, 4, 2}, {4}, I64, d)};
      },
      Attrs().set("dim", i64(0)));
  b.add(
      OpId::IndexSelect, "dim1_int32_transposed", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {5, 4}, t, d, 70),
                                   fromInts({3, 0}, {2}, I32, d)};
      },
      Attrs().set("dim", i64(-1)));
  b.add(
      OpId::IndexSelect, "sliced_index", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{
            anyVals({3, 6}, t, d, 71),
            ops::slice(fromInts({5, 9, 0, 9, 2, 9}, {6}, I64, d), 0, 0, 6, 2)};
      },
      Attrs().set("dim", i64(1)));
  b.add(
      OpId::IndexAdd, "dim0_int64_repeats", kF4I,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({5, 4}, t, d, 72), fromInts({1, 3, 1}, {3}, I64, d),
                                   anyVals({3, 4}, t, d, 73)};
      },
      Attrs().set("dim", i64(0)));
  b.add(
      OpId::IndexAdd, "dim1_int32_strided", kF4I,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 5}, t, d, 74),
                                   fromInts({4, 0, 4, 4}, {4}, I32, d),
                                   make(anyVals, Layout::Sliced, {4, 4}, t, d, 75)};
      },
      Attrs().set("dim", i64(1)));
  b.add(
      OpId::Gather, "dim1_int64", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({4, 5}, t, d, 76), randInt({4, 3}, 0, 4, I64, d, 77)};
      },
      Attrs().set("dim", i64(1)));
  b.add(
      OpId::Gather, "dim0_int32_transposed", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 5}, t, d, 78),
                                   randInt({2, 5}, 0, 3, I32, d, 79)};
      },
      Attrs().set("dim", i64(0)));
  b.add(
      OpId::ScatterAdd, "dim1_duplicates", kF4I,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({4, 5}, t, d, 80), randInt({4, 3}, 0, 1, I64, d, 81),
                                   anyVals({4, 3}, t, d, 82)};
      },
      Attrs().set("dim", i64(1)));
  b.add(
      OpId::ScatterAdd, "dim0_int32_strided", kF4I,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 5}, t, d, 83),
                                   randInt({6, 5}, 0, 3, I32, d, 84),
                                   make(anyVals, Layout::Sliced, {6, 5}, t, d, 85)};
      },
      Attrs().set("dim", i64(0)));

  // ---- sorting and selection
  struct Tk {
    std::string variant;
    Shape shape;
    Layout layout;
    int64_t k, dim;
    bool largest, ties;
  };
  const std::vector<Tk> tks{
      {"k3_largest_last_dim", {4, 9}, Layout::Contiguous, 3, -1, true, false},
      {"k2_smallest_dim0", {6, 5}, Layout::Transposed, 2, 0, false, false},
      {"ties_lower_index_first", {5, 8}, Layout::Contiguous, 4, 1, true, true},
      {"ties_smallest_sliced", {3, 7}, Layout::Sliced, 3, 1, false, true},
      {"k_full_extent", {2, 127}, Layout::Contiguous, 127, 1, true, false},
      {"k1", {3, 5}, Layout::Contiguous, 1, -1, true, true}};
  for (const Tk& k : tks)
    b.add(
        OpId::Topk, k.variant, kF4I,
        [k](DType t, Device d) {
          return std::vector<Tensor>{
              make(k.ties ? Gen(tiedVals) : Gen(anyVals), k.layout, k.shape, t, d, 86)};
        },
        Attrs().set("k", i64(k.k)).set("dim", i64(k.dim)).set("largest", boolean(k.largest)));
  struct As {
    std::string variant;
    Shape shape;
    Layout layout;
    int64_t dim;
    bool descending, ties;
  };
  const std::vector<As> ass{{"ascending_127", {2, 127}, Layout::Contiguous, -1, false, false},
                            {"descending_dim0", {6, 4}, Layout::Transposed, 0, true, false},
                            {"stable_ties_ascending", {5, 9}, Layout::Contiguous, 1, false, true},
                            {"stable_ties_descending", {5, 9}, Layout::Sliced, 1, true, true},
                            // Rows longer than one block's shared-memory sort (cuda: 4096).
                            {"long_rows_ties", {2, 5000}, Layout::Contiguous, 1, false, true}};
  for (const As& s : ass)
    b.add(
        OpId::Argsort, s.variant, kF4I,
        [s](DType t, Device d) {
          return std::vector<Tensor>{
              make(s.ties ? Gen(tiedVals) : Gen(anyVals), s.layout, s.shape, t, d, 87)};
        },
        Attrs().set("dim", i64(s.dim)).set("descending", boolean(s.descending)));
  b.add(OpId::Where, "broadcast_three_ways", kAll, [](DType t, Device d) {
    return std::vector<Tensor>{randInt({3, 1}, 0, 1, Bool, d, 88), anyVals({3, 4}, t, d, 89),
                               anyVals({4}, t, d, 90)};
  });
  b.add(OpId::Where, "strided", kAll, [](DType t, Device d) {
    return std::vector<Tensor>{make(tiedVals, Layout::Transposed, {5, 4}, Bool, d, 91),
                               make(anyVals, Layout::Sliced, {5, 4}, t, d, 92),
                               make(anyVals, Layout::Expanded, {5, 4}, t, d, 93)};
  });
  b.add(
      OpId::MaskedFill, "broadcast_mask_minus_3", kAll,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({3, 4}, t, d, 94), randInt({1, 4}, 0, 1, Bool, d, 95)};
      },
      Attrs().set("value", dbl(-3.0)));
  b.add(
      OpId::MaskedFill, "strided_7_5", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 6}, t, d, 96),
                                   make(tiedVals, Layout::Sliced, {4, 6}, Bool, d, 97)};
      },
      Attrs().set("value", dbl(7.5)));
  b.add(
      OpId::MaskedFill, "minus_infinity", kF4,
      [](DType t, Device d) {
        return std::vector<Tensor>{anyVals({2, 5}, t, d, 98), randInt({2, 5}, 0, 1, Bool, d, 99)};
      },
      Attrs().set("value", dbl(-INFINITY)));

  // ---- cast: from each dtype to every dtype (float -> int truncates; -> bool is x != 0)
  auto castAll = [](const std::vector<Tensor>& in, DType, Device) {
    std::vector<Tensor> out;
    for (DType to : kAll)
      out.push_back(dispatch1(OpId::Cast, in, Attrs().set("dtype", std::string(dtypeName(to)))));
    return out;
  };
  b.add(OpId::Cast, "to_every_dtype", kAll, [](DType t, Device d) {
     std::vector<double> v{-300.75, -2.7, -1.0, -0.5, -0.0,  0.0,   0.25, 0.999,
                           1.0,     2.5,  3.5,  7.0,  100.2, 255.0, 256.5};
     if (t == Bool) v = {0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0};
     return std::vector<Tensor>{fromDoubles(v, {3, 5}, t, d)};
   }).run = castAll;
  b.add(OpId::Cast, "strided_to_every_dtype", kAll, [](DType t, Device d) {
     return std::vector<Tensor>{make(anyVals, Layout::Transposed, {4, 5}, t, d, 100)};
   }).run = castAll;

  // ---- factories (dispatch dtype is the output's)
  auto factory = [](OpId op, Attrs a, Shape shape) {
    return [op, a, shape](const std::vector<Tensor>&, DType t, Device d) {
      Attrs full = a;
      full.set("shape", ints(std::vector<int64_t>(shape.begin(), shape.end())))
          .set("dtype", std::string(dtypeName(t)))
          .set("device", d.name());
      return dispatch(op, {}, full);
    };
  };
  auto none = [](DType, Device) { return std::vector<Tensor>{}; };
  b.add(OpId::Fill, "3x4_value_2_5", kAll, none).run =
      factory(OpId::Fill, Attrs().set("value", dbl(2.5)), {3, 4});
  b.add(OpId::Fill, "scalar_negative", kAll, none).run =
      factory(OpId::Fill, Attrs().set("value", dbl(-7.0)), {});
  b.add(OpId::Arange, "n127", kF4I, none).run = factory(OpId::Arange, {}, {127});
  b.add(OpId::Arange, "n1", kF4I, none).run = factory(OpId::Arange, {}, {1});
  ParityCase& u1 = b.add(OpId::Uniform, "minus1_1_exact", kF4, none);
  u1.run = factory(
      OpId::Uniform,
      Attrs().set("low", dbl(-1)).set("high", dbl(1)).set("seed", i64(5)).set("offset", i64(3)),
      {33, 31});
  u1.check = Check::Exact;
  b.add(OpId::Uniform, "general_range", kF4, none).run = factory(
      OpId::Uniform,
      Attrs().set("low", dbl(0.1)).set("high", dbl(3.3)).set("seed", i64(6)).set("offset", i64(0)),
      {1001});
  ParityCase& n1 = b.add(OpId::Normal, "standard_exact", kF4, none);
  n1.run = factory(
      OpId::Normal,
      Attrs().set("mean", dbl(0)).set("std", dbl(1)).set("seed", i64(8)).set("offset", i64(9)),
      {33, 31});
  n1.check = Check::Exact;
#if defined(KEEL_PARITY_CUDA)
  // cuda's float64 log and cos are correctly rounded (double-double); glibc's misround about 0.1%
  // of inputs by an ulp, so float64 normals agree to an ulp and the narrower dtypes bit for bit.
  n1.dtypes = {F32, F16, BF16};
  b.add(OpId::Normal, "standard_float64_to_an_ulp", {F64}, none).run = factory(
      OpId::Normal,
      Attrs().set("mean", dbl(0)).set("std", dbl(1)).set("seed", i64(8)).set("offset", i64(9)),
      {33, 31});
#endif
  b.add(OpId::Normal, "mean_0_5_std_2", kF4, none).run = factory(OpId::Normal,
                                                                 Attrs()
                                                                     .set("mean", dbl(0.5))
                                                                     .set("std", dbl(2))
                                                                     .set("seed", i64(10))
                                                                     .set("offset", i64(1 << 16)),
                                                                 {1001});

  // ---- optimizer updates (in place): compare the updated state
  auto optimizerCase = [&](OpId op, std::string variant, Attrs a) {
    int n = op == OpId::SgdStep ? 3 : 4;
    ParityCase& c = b.add(
        op, std::move(variant), kF4,
        [n](DType t, Device d) {
          std::vector<Tensor> in{anyVals({5, 7}, t, d, 101), anyVals({5, 7}, t, d, 102),
                                 anyVals({5, 7}, t, d, 103)};
          if (n == 4) in.push_back(randUniform({5, 7}, 0.0, 1.0, t, d, 104));
          return in;
        },
        a);
    c.run = [op, a](const std::vector<Tensor>& in, DType, Device) {
      dispatch(op, in, a);
      std::vector<Tensor> out(in.begin(), in.end());
      out.erase(out.begin() + 1);  // the gradient is read-only
      return out;
    };
  };
  auto sgd = [](double lr, double m, double wd, bool nesterov) {
    return Attrs()
        .set("lr", dbl(lr))
        .set("momentum", dbl(m))
        .set("weight_decay", dbl(wd))
        .set("nesterov", boolean(nesterov));
  };
  optimizerCase(OpId::SgdStep, "plain", sgd(0.1, 0, 0, false));
  optimizerCase(OpId::SgdStep, "momentum_weight_decay", sgd(0.05, 0.9, 0.01, false));
  optimizerCase(OpId::SgdStep, "nesterov", sgd(0.05, 0.9, 0.0, true));
  auto adamw = [](double wd, int64_t step) {
    return Attrs()
        .set("lr", dbl(1e-2))
        .set("beta1", dbl(0.9))
        .set("beta2", dbl(0.999))
        .set("eps", dbl(1e-8))
        .set("weight_decay", dbl(wd))
        .set("step", i64(step));
  };
  optimizerCase(OpId::AdamwStep, "step1", adamw(0.0, 1));
  optimizerCase(OpId::AdamwStep, "step3_weight_decay", adamw(0.1, 3));

  // ---- collectives: in one process every group has one rank, so each is a copy of its input
  // (tests/dist/ runs them on 2 and 4 ranks under mpirun). Strided inputs, every dtype.
  auto str = [](const char* v) { return AttrValue(std::string(v)); };
  auto strided = [](DType t, Device d) {
    return std::vector<Tensor>{ops::transpose(anyVals({6, 5}, t, d, 70), 0, 1)};
  };
  for (const char* op : {"sum", "max"})
    b.add(OpId::AllReduce, std::string(op), kAll, strided,
          Attrs().set("op", str(op)).set("group", str("world")));
  b.add(OpId::AllReduce, "mean_dp", kF4, strided,
        Attrs().set("op", str("mean")).set("group", str("dp")));
  b.add(OpId::CopyToGroup, "tp", kAll, strided, Attrs().set("group", str("tp")));
  b.add(OpId::AllGather, "dim1", kAll, strided,
        Attrs().set("dim", i64(1)).set("group", str("world")));
  b.add(OpId::ReduceScatter, "dim0_sum", kF4I, strided,
        Attrs().set("dim", i64(0)).set("op", str("sum")).set("group", str("tp")));
  b.add(OpId::Broadcast, "root0", kAll, strided,
        Attrs().set("root", i64(0)).set("group", str("world")));
  b.add(OpId::AllToAll, "dp", kAll, strided, Attrs().set("group", str("dp")));
  return b.cases;
}

const std::vector<ParityCase>& parityTable() {
  static const std::vector<ParityCase> t = buildTable();
  return t;
}

// ---------------------------------------------------------------- the harness
// One test per table line (op, variant); it runs every dtype of the line (one ctest process
// each line keeps the sanitizer run short).
std::vector<size_t> allCases() {
  std::vector<size_t> p(parityTable().size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = i;
  return p;
}

std::string caseName(const ::testing::TestParamInfo<size_t>& info) {
  const ParityCase& c = parityTable()[info.param];
  std::string s = opName(c.op) + "_" + c.variant;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<Tensor> runCase(const ParityCase& c, DType t, Device d) {
  NoGradGuard ng;
  std::vector<Tensor> in = c.make(t, d);
  return c.run ? c.run(in, t, d) : dispatch(c.op, in, c.attrs);
}

void checkParity(const ParityCase& c, DType t) {
  std::vector<Tensor> ref = runCase(c, t, kCpuRef);
  std::vector<Tensor> opt = runCase(c, t, kUnderTest);
  ASSERT_EQ(ref.size(), opt.size());
  ASSERT_FALSE(ref.empty());
  for (size_t i = 0; i < ref.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    ASSERT_TRUE(ref[i].defined() && opt[i].defined());
    if (c.op != OpId::CopyTo) {
      EXPECT_EQ(ref[i].device(), kCpuRef);
      EXPECT_EQ(opt[i].device(), kUnderTest);
    }
    Tolerance tol = defaultTolerance(ref[i].dtype());
    tol.atol *= c.tolScale;
    tol.rtol *= c.tolScale;
    switch (c.check) {
      case Check::Close:
        EXPECT_TRUE(allClose(opt[i], ref[i], tol));
        break;
      case Check::Exact:
        EXPECT_TRUE(bitEqual(opt[i], ref[i]));
        break;
      case Check::SameZeros: {
        NoGradGuard ng;
        Tensor zr = ops::eq(ref[i], ops::fill({}, 0.0, ref[i].dtype(), kCpuRef));
        Tensor zo = ops::eq(opt[i], ops::fill({}, 0.0, opt[i].dtype(), kUnderTest));
        EXPECT_TRUE(bitEqual(zo.to(kCpuRef), zr)) << "the dropout masks differ";
        EXPECT_TRUE(allClose(opt[i], ref[i], tol));
        break;
      }
    }
  }
}

class OpsParity : public ::testing::TestWithParam<size_t> {};

TEST_P(OpsParity, MatchesCpuRef) {
  KEEL_PARITY_NEEDS_DEVICE();
  const ParityCase& c = parityTable()[GetParam()];
  for (DType t : c.dtypes) {
    SCOPED_TRACE(std::string(dtypeName(t)));
    try {
      checkParity(c, t);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, OpsParity, ::testing::ValuesIn(allCases()), caseName);

// ---------------------------------------------------------------- completeness
TEST(OpsParityCoverage, EveryNonViewOpHasKernelsOnBothBackends) {
#if defined(KEEL_PARITY_CUDA)
  // The CUDA backend built with this test loads on any machine (no device needed to register).
  ASSERT_EQ(loadCudaBackend(), "");
#endif
  const Registry& r = Registry::get();
  ASSERT_GE(r.size(), kNumBuiltinOps);
  for (int i = 0; i < r.size(); ++i) {
    const OpDef& op = r.op(i);
    if (kViewOps.count(op.name)) {
      EXPECT_TRUE(bool(op.view)) << "op '" << op.name
                                 << "' is listed as a view op but has no view rule";
      continue;
    }
    EXPECT_NE(op.kernels[int(kTested)].fn, nullptr)
        << "op '" << op.name << "' lacks a " << backendName(kTested) << " kernel";
    EXPECT_FALSE(op.kernels[int(kTested)].variant.empty())
        << "op '" << op.name << "': the " << backendName(kTested) << " kernel has no variant";
    EXPECT_NE(op.kernels[int(Backend::CpuRef)].fn, nullptr)
        << "op '" << op.name << "' lacks a cpu-ref kernel";
    EXPECT_EQ(op.kernels[int(kTested)].dtypes, op.kernels[int(Backend::CpuRef)].dtypes)
        << "op '" << op.name << "': " << backendName(kTested)
        << " and cpu-ref accept different dtypes";
  }
}

TEST(OpsParityCoverage, EveryNonViewOpHasAParityLine) {
  std::set<std::string> covered;
  for (const ParityCase& c : parityTable()) covered.insert(opName(c.op));
  const Registry& r = Registry::get();
  for (int i = 0; i < r.size(); ++i) {
    const std::string& name = r.op(i).name;
    if (kViewOps.count(name)) continue;
    EXPECT_TRUE(covered.count(name)) << "op '" << name << "' has no line in the parity table";
  }
}

TEST(OpsParityCoverage, EveryTestedDtypeIsAcceptedByBothBackends) {
#if defined(KEEL_PARITY_CUDA)
  ASSERT_EQ(loadCudaBackend(), "");
#endif
  const Registry& r = Registry::get();
  for (const ParityCase& c : parityTable()) {
    const OpDef& op = r.op(c.op);
    if (op.view || c.op == OpId::Where) continue;  // where dispatches on its bool condition
    for (DType t : c.dtypes) {
      // The dispatch dtype of cast/copy/etc. is the first input's; of factories the output's.
      EXPECT_TRUE(op.kernels[int(Backend::CpuRef)].dtypes & dtypeBit(t))
          << "op '" << op.name << "' (" << c.variant << "): cpu-ref does not accept "
          << dtypeName(t);
      EXPECT_TRUE(op.kernels[int(kTested)].dtypes & dtypeBit(t))
          << "op '" << op.name << "' (" << c.variant << "): " << backendName(kTested)
          << " does not accept " << dtypeName(t);
    }
  }
}

// The harness is only as good as its comparators: they must reject a real difference.
TEST(OpsParityCoverage, ComparatorsRejectDifferencesBeyondTolerance) {
  Tensor a = fromDoubles({1.0, 2.0, 3.0}, {3}, F32);
  Tensor b = fromDoubles({1.0, 2.001, 3.0}, {3}, F32);
  EXPECT_FALSE(allClose(b, a, defaultTolerance(F32)));
  EXPECT_TRUE(allClose(b, a, 1e-2, 0));
  Tensor c = fromDoubles({1.0, 2.0, 3.0 + 3e-7}, {3}, F32);  // one float32 ulp at 3
  EXPECT_TRUE(allClose(c, a, defaultTolerance(F32)));
  EXPECT_FALSE(bitEqual(c, a));
  EXPECT_TRUE(bitEqual(a, fromDoubles({1.0, 2.0, 3.0}, {3}, F32)));
  EXPECT_FALSE(allClose(fromDoubles({NAN}, {1}), fromDoubles({0.0}, {1}), 1, 1));
  EXPECT_TRUE(
      allClose(fromDoubles({NAN, -INFINITY}, {2}), fromDoubles({NAN, -INFINITY}, {2}), 0, 0));
  EXPECT_FALSE(allClose(fromDoubles({1.0}, {1}), fromDoubles({1.0}, {1, 1}), 1, 1));  // shape
  EXPECT_FALSE(allClose(fromInts({3}, {1}, I32), fromInts({3}, {1}, I64), 0, 0));     // dtype
}

// ---------------------------------------------------------------- exact values, both backends
class ExactValues : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { KEEL_PARITY_NEEDS_DEVICE(); }
};

TEST_P(ExactValues, SoftmaxOfZeroAndLn2IsOneThirdTwoThirds) {
  Tensor x = fromDoubles({0.0, std::log(2.0)}, {1, 2}, F64, GetParam());
  EXPECT_TRUE(allClose(ops::softmax(x, -1), fromDoubles({1.0 / 3, 2.0 / 3}, {1, 2}), 1e-15, 1e-15));
  EXPECT_TRUE(allClose(ops::logSoftmax(x, -1),
                       fromDoubles({-std::log(3.0), std::log(2.0 / 3)}, {1, 2}), 1e-15, 1e-15));
}

TEST_P(ExactValues, GeluIsTheErfForm) {
  Tensor x = fromDoubles({1.0, -1.0, 0.0, 3.0}, {4}, F64, GetParam());
  EXPECT_TRUE(
      allClose(ops::gelu(x),
               fromDoubles({0.8413447460685429, -0.15865525393145707, 0.0, 2.99595030590511}, {4}),
               1e-15, 1e-14));
  Tensor xf = fromDoubles({1.0}, {1}, F32, GetParam());
  EXPECT_FLOAT_EQ(float(ops::gelu(xf).item()), 0.8413447460685429f);
}

TEST_P(ExactValues, SiluAndSigmoidAtKnownPoints) {
  Tensor x = fromDoubles({0.0, 1.0, -2.0}, {3}, F64, GetParam());
  double s1 = 1.0 / (1.0 + std::exp(-1.0)), s2 = 1.0 / (1.0 + std::exp(2.0));
  EXPECT_TRUE(allClose(ops::sigmoid(x), fromDoubles({0.5, s1, s2}, {3}), 1e-15, 1e-15));
  EXPECT_TRUE(allClose(ops::silu(x), fromDoubles({0.0, s1, -2.0 * s2}, {3}), 1e-15, 1e-15));
}

// Rotate-half pairs (i, i + D/2) turned by t·base^(-2i/D): D = 4, base 10000 gives θ = 1 and
// 0.01; position 0 is untouched, and the inverse turns back.
TEST_P(ExactValues, RopeTurnsRotateHalfPairsByPositionTimesTheta) {
  Tensor x = fromDoubles({1, 2, 3, 4, 1, 0, 0, 1}, {1, 2, 1, 4}, F64, GetParam());
  Tensor y = ops::rope(x);
  EXPECT_TRUE(allClose(
      y,
      fromDoubles({1, 2, 3, 4, std::cos(1.0), -std::sin(0.01), std::sin(1.0), std::cos(0.01)},
                  {1, 2, 1, 4}),
      1e-15, 1e-15));
  EXPECT_TRUE(allClose(ops::rope(y, 10000.0, true), x, 1e-15, 1e-15));
  Tensor b = fromDoubles({0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0}, {1, 3, 1, 4}, F64, GetParam());
  // base 4: θ1 = 4^(-1/2) = 0.5, so position 2 turns pair (1, 3) by 1 rad.
  EXPECT_TRUE(allClose(ops::slice(ops::rope(b, 4.0), 1, 2, 3),
                       fromDoubles({0, std::cos(1.0), 0, std::sin(1.0)}, {1, 1, 1, 4}), 1e-15,
                       1e-15));
}

TEST_P(ExactValues, ArgsortIsStable) {
  Tensor x = fromDoubles({3, 1, 3, 1, 2}, {5}, F32, GetParam());
  EXPECT_EQ(ops::argsort(x, -1, false).toVector<int64_t>(), (std::vector<int64_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(ops::argsort(x, -1, true).toVector<int64_t>(), (std::vector<int64_t>{0, 2, 4, 1, 3}));
  Tensor xi = fromInts({2, 2, 2, 2}, {4}, I32, GetParam());
  EXPECT_EQ(ops::argsort(xi, 0, true).toVector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST_P(ExactValues, TopkBreaksTiesByLowerIndex) {
  Tensor x = fromDoubles({1, 5, 5, 2, 5}, {5}, F32, GetParam());
  auto [v, i] = ops::topk(x, 2, -1, true);
  EXPECT_EQ(v.toVector<double>(), (std::vector<double>{5, 5}));
  EXPECT_EQ(i.toVector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(i.dtype(), I64);
  auto [vs, is] = ops::topk(x, 3, -1, false);
  EXPECT_EQ(vs.toVector<double>(), (std::vector<double>{1, 2, 5}));
  EXPECT_EQ(is.toVector<int64_t>(), (std::vector<int64_t>{0, 3, 1}));
}

TEST_P(ExactValues, MaxAndArgmaxTakeTheFirstMaximum) {
  Tensor x = fromDoubles({2, 7, 7, -1, 4, 4}, {2, 3}, F64, GetParam());
  EXPECT_EQ(ops::argmax(x, 1).toVector<int64_t>(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ops::max(x, 1).toVector<double>(), (std::vector<double>{7, 4}));
  EXPECT_EQ(ops::argmax(x, 0, true).shape(), (Shape{1, 3}));
}

TEST_P(ExactValues, CastTruncatesTowardZeroAndBoolIsNonZero) {
  Tensor x = fromDoubles({-2.7, 2.7, -0.5, 0.0, 3.0}, {5}, F32, GetParam());
  EXPECT_EQ(ops::cast(x, I32).toVector<int32_t>(), (std::vector<int32_t>{-2, 2, 0, 0, 3}));
  EXPECT_EQ(ops::cast(x, I64).toVector<int64_t>(), (std::vector<int64_t>{-2, 2, 0, 0, 3}));
  EXPECT_EQ(ops::cast(x, Bool).toVector<int32_t>(), (std::vector<int32_t>{1, 1, 1, 0, 1}));
  Tensor b = fromInts({1, 0}, {2}, Bool, GetParam());
  EXPECT_EQ(ops::cast(b, F64).toVector<double>(), (std::vector<double>{1, 0}));
}

TEST_P(ExactValues, IntScalarOpsTruncateTheScalarTowardZero) {
  Tensor x = fromInts({1, -4, 10}, {3}, I64, GetParam());
  EXPECT_EQ(ops::addScalar(x, 2.9).toVector<int64_t>(), (std::vector<int64_t>{3, -2, 12}));
  EXPECT_EQ(ops::addScalar(x, -2.9).toVector<int64_t>(), (std::vector<int64_t>{-1, -6, 8}));
  EXPECT_EQ(ops::mulScalar(x, 2.5).toVector<int64_t>(), (std::vector<int64_t>{2, -8, 20}));
}

TEST_P(ExactValues, FloatScalarOpsKeepTheFraction) {
  Tensor x = fromDoubles({1.0, -4.0}, {2}, F64, GetParam());
  EXPECT_EQ(ops::addScalar(x, 0.25).toVector<double>(), (std::vector<double>{1.25, -3.75}));
  EXPECT_EQ(ops::mulScalar(x, 0.5).toVector<double>(), (std::vector<double>{0.5, -2.0}));
  EXPECT_EQ(ops::powScalar(fromDoubles({4.0}, {1}, F64, GetParam()), 0.5).item(), 2.0);
}

TEST_P(ExactValues, CrossEntropyOfUniformLogitsIsLnC) {
  Tensor logits = fromDoubles({1, 1, 1, 1, 5, 5, 5, 5}, {2, 4}, F64, GetParam());
  Tensor t = fromInts({3, 0}, {2}, I64, GetParam());
  EXPECT_NEAR(ops::crossEntropy(logits, t).item(), std::log(4.0), 1e-15);
  Tensor ign = fromInts({3, -100}, {2}, I64, GetParam());
  EXPECT_NEAR(ops::crossEntropy(logits, ign).item(), std::log(4.0), 1e-15);
  Tensor all = fromInts({-100, -100}, {2}, I64, GetParam());
  EXPECT_EQ(ops::crossEntropy(logits, all).item(), 0.0);
  // [0, ln 3] with target 1: -log(3/4).
  Tensor l2 = fromDoubles({0, std::log(3.0)}, {1, 2}, F64, GetParam());
  EXPECT_NEAR(ops::crossEntropy(l2, fromInts({1}, {1}, I64, GetParam())).item(), -std::log(0.75),
              1e-15);
}

TEST_P(ExactValues, LayerNormUsesBiasedVariance) {
  Tensor x = fromDoubles({1, 2, 3}, {1, 3}, F64, GetParam());
  Tensor w = fromDoubles({1, 1, 2}, {3}, F64, GetParam());
  Tensor b = fromDoubles({0, 0.5, 0}, {3}, F64, GetParam());
  double s = std::sqrt(1.5);  // 1 / sqrt(var), var = 2/3
  EXPECT_TRUE(
      allClose(ops::layerNorm(x, w, b, 0.0), fromDoubles({-s, 0.5, 2 * s}, {1, 3}), 1e-14, 1e-14));
  // rms of [1, 2, 3] is sqrt(14/3)
  double r = 1.0 / std::sqrt(14.0 / 3.0);
  EXPECT_TRUE(
      allClose(ops::rmsNorm(x, w, 0.0), fromDoubles({r, 2 * r, 6 * r}, {1, 3}), 1e-14, 1e-14));
}

TEST_P(ExactValues, DropoutKeepsIffPhiloxUniformIsAtLeastP) {
  const double p = 0.25;
  const uint64_t seed = 42, offset = 1000;
  Tensor x = fromDoubles(std::vector<double>(257, 3.0), {257}, F64, GetParam());
  std::vector<double> y = ops::dropout(x, p, seed, offset).toVector<double>();
  int kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    bool keep = philoxUniform(seed, offset, i) >= float(p);
    ASSERT_EQ(y[i], keep ? 3.0 / (1.0 - p) : 0.0) << "element " << i;
    kept += keep;
  }
  EXPECT_GT(kept, 150);  // about 193 expected
  EXPECT_LT(kept, 235);
}

TEST_P(ExactValues, UniformAndNormalFollowThePhiloxStream) {
  Tensor u = ops::uniform({100}, -3.0, 5.0, 9, 77, F64, GetParam());
  Tensor n = ops::normal({100}, 1.5, 0.5, 9, 77, F64, GetParam());
  std::vector<double> uv = u.toVector<double>(), nv = n.toVector<double>();
  for (size_t i = 0; i < 100; ++i) {
    ASSERT_NEAR(uv[i], -3.0 + 8.0 * double(philoxUniform(9, 77, i)), 1e-14) << i;
    ASSERT_NEAR(nv[i], 1.5 + 0.5 * philoxNormal(9, 77, i), 1e-14) << i;
  }
}

TEST_P(ExactValues, ArangeFillAndWhere) {
  EXPECT_EQ(ops::arange(5, I32, GetParam()).toVector<int32_t>(),
            (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ops::arange(3, F16, GetParam()).toVector<double>(), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(ops::fill({2}, 1.5, BF16, GetParam()).toVector<double>(),
            (std::vector<double>{1.5, 1.5}));
  Tensor c = fromInts({1, 0, 1}, {3}, Bool, GetParam());
  Tensor a = fromDoubles({1, 2, 3}, {3}, F32, GetParam());
  Tensor b = fromDoubles({-1}, {1}, F32, GetParam());
  EXPECT_EQ(ops::where(c, a, b).toVector<double>(), (std::vector<double>{1, -1, 3}));
  EXPECT_EQ(ops::maskedFill(a, c, 9).toVector<double>(), (std::vector<double>{9, 2, 9}));
}

TEST_P(ExactValues, IndexingOps) {
  Device d = GetParam();
  Tensor x = fromDoubles({0, 1, 2, 10, 11, 12}, {2, 3}, F64, d);
  EXPECT_EQ(ops::indexSelect(x, 1, fromInts({2, 2, 0}, {3}, I32, d)).toVector<double>(),
            (std::vector<double>{2, 2, 0, 12, 12, 10}));
  EXPECT_EQ(ops::gather(x, 1, fromInts({2, 0, 1, 1}, {2, 2}, I64, d)).toVector<double>(),
            (std::vector<double>{2, 0, 11, 11}));
  Tensor z = ops::fill({2, 3}, 0.0, F64, d);
  EXPECT_EQ(ops::scatterAdd(z, 1, fromInts({2, 2, 0, 1}, {2, 2}, I64, d),
                            fromDoubles({1, 2, 3, 4}, {2, 2}, F64, d))
                .toVector<double>(),
            (std::vector<double>{0, 0, 3, 3, 4, 0}));
  EXPECT_EQ(ops::indexAdd(z, 0, fromInts({1, 1}, {2}, I64, d),
                          fromDoubles({1, 2, 3, 4, 5, 6}, {2, 3}, F64, d))
                .toVector<double>(),
            (std::vector<double>{0, 0, 0, 5, 7, 9}));
  Tensor w = fromDoubles({0, 1, 10, 11, 20, 21}, {3, 2}, F64, d);
  Tensor e = ops::embedding(w, fromInts({2, 0, 2}, {3}, I32, d));
  EXPECT_EQ(e.shape(), (Shape{3, 2}));
  EXPECT_EQ(e.toVector<double>(), (std::vector<double>{20, 21, 0, 1, 20, 21}));
}

TEST_P(ExactValues, OptimizerStepsFollowTheDocumentedFormulas) {
  Device d = GetParam();
  // SGD, momentum 0.5, weight decay 0.1, first step: g' = g + 0.1 p; b = g'; p -= lr b.
  Tensor p = fromDoubles({1.0, -2.0}, {2}, F64, d), g = fromDoubles({0.5, 0.5}, {2}, F64, d);
  Tensor buf = fromDoubles({0.0, 0.0}, {2}, F64, d);
  ops::sgdStep(p, g, buf, 0.1, 0.5, 0.1, false);
  EXPECT_TRUE(allClose(buf, fromDoubles({0.6, 0.3}, {2}), 1e-15, 1e-15));
  EXPECT_TRUE(allClose(p, fromDoubles({0.94, -2.03}, {2}), 1e-15, 1e-15));
  // Nesterov: p -= lr (g' + m b) with b = m b_old + g'.
  ops::sgdStep(p, g, buf, 0.1, 0.5, 0.0, true);  // b = 0.5*0.6+0.5 = 0.8; step 0.5 + 0.4 = 0.9
  EXPECT_TRUE(
      allClose(p, fromDoubles({0.85, -2.03 - 0.1 * (0.5 + 0.5 * 0.65)}, {2}), 1e-15, 1e-14));
  // AdamW step 1: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2: p -= lr wd p; p -= lr g / (|g| +
  // eps).
  Tensor q = fromDoubles({1.0}, {1}, F64, d), gq = fromDoubles({-0.5}, {1}, F64, d);
  Tensor m = fromDoubles({0.0}, {1}, F64, d), v = fromDoubles({0.0}, {1}, F64, d);
  ops::adamwStep(q, gq, m, v, 0.01, 0.9, 0.999, 1e-8, 0.1, 1);
  double expect = (1.0 - 0.01 * 0.1) + 0.01 * 0.5 / (0.5 + 1e-8);
  EXPECT_NEAR(q.item(), expect, 1e-14);
  EXPECT_NEAR(m.item(), -0.05, 1e-16);
  EXPECT_NEAR(v.item(), 0.001 * 0.25, 1e-17);
}

#if defined(KEEL_PARITY_CUDA)
INSTANTIATE_TEST_SUITE_P(Backends, ExactValues, ::testing::Values(kUnderTest),
                         [](const ::testing::TestParamInfo<Device>&) {
                           return std::string("cuda");
                         });
#else
INSTANTIATE_TEST_SUITE_P(Backends, ExactValues, ::testing::Values(kCpuRef, kCpu), backendParamName);
#endif

}  // namespace
}  // namespace keel::test
