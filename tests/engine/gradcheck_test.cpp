// Finite-difference checks of every backward rule: each differentiable op (its OpDef has a backward
// rule) has at least one line here, and each line passes the float64 gradcheck on `cpu-ref` and
// on `cpu` (on `cuda:0` in cuda_gradcheck_test). Inputs stay away from kinks (relu/abs/max near 0
// or ties; log/sqrt of positives).
#include <gtest/gtest.h>

#include <set>

#include "keel/registry.h"
#include "test_util.h"

namespace keel::test {
namespace {

constexpr DType F64 = DType::Float64;

// The optimized backend checked beside cpu-ref: cpu, or cuda:0 where this file is built as
// cuda_gradcheck_test (tests/engine/cuda_gradcheck_test.cpp: label gpu, skipped without a device,
// and cudasim_cuda_gradcheck_test on the CUDA simulator; there only the cuda lines run).
#if defined(KEEL_GRADCHECK_CUDA)
const Device kTested{Backend::Cuda, 0};
constexpr const char* kTestedName = "cuda";
#else
const Device kTested = kCpu;
constexpr const char* kTestedName = "cpu";
#endif

const char* const kOpNames[] = {
#define KEEL_X_NAME(e, n) n,
    KEEL_BUILTIN_OPS(KEEL_X_NAME)
#undef KEEL_X_NAME
};

AttrValue dbl(double v) {
  return AttrValue(v);
}

// A float64 leaf that requires grad.
Tensor leaf(Tensor t) {
  t.setRequiresGrad(true);
  return t;
}
Tensor uni(const Shape& s, double lo, double hi, Device d, uint64_t seed) {
  return leaf(randUniform(s, lo, hi, F64, d, seed));
}
// Distinct values on a 0.1 grid offset by 0.05: no ties, nothing within 0.05 of 0.
Tensor distinct(const Shape& s, Device d, uint64_t seed) {
  return leaf(randDistinct(s, 0.1, F64, d, seed));
}

using Maker = std::function<std::vector<Tensor>(Device)>;

struct GradCase {
  OpId op;
  std::string variant;
  Maker make;
  GradFn fn;
  GradcheckOptions opt{};
};

std::vector<GradCase> buildCases() {
  std::vector<GradCase> c;
  using V = std::vector<Tensor>;
  auto add = [&](OpId op, std::string variant, Maker m, GradFn fn, GradcheckOptions o = {}) {
    c.push_back(GradCase{op, std::move(variant), std::move(m), std::move(fn), o});
  };

  // ---- binary, with broadcasting (the rule must sum the gradient back to each input's shape)
  add(
      OpId::Add, "broadcast_3x4_and_4",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 1), uni({4}, -2, 2, d, 2)};
      },
      [](const V& x) { return ops::add(x[0], x[1]); });
  add(
      OpId::Add, "both_broadcast",
      [](Device d) {
        return V{uni({2, 1, 3}, -2, 2, d, 3), uni({4, 1}, -2, 2, d, 4)};
      },
      [](const V& x) { return ops::add(x[0], x[1]); });
  add(
      OpId::Sub, "broadcast_3x4_and_3x1",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 5), uni({3, 1}, -2, 2, d, 6)};
      },
      [](const V& x) { return ops::sub(x[0], x[1]); });
  add(
      OpId::Mul, "broadcast_3x4_and_1x4",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 7), uni({1, 4}, -2, 2, d, 8)};
      },
      [](const V& x) { return ops::mul(x[0], x[1]); });
  add(
      OpId::Mul, "same_input_twice", [](Device d) { return V{uni({5}, -2, 2, d, 9)}; },
      [](const V& x) { return ops::mul(x[0], x[0]); });
  add(
      OpId::Div, "broadcast_divisor",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 10), uni({4}, 0.5, 2, d, 11)};
      },
      [](const V& x) { return ops::div(x[0], x[1]); });
  add(
      OpId::Pow, "positive_base",
      [](Device d) {
        return V{uni({3, 4}, 0.5, 2, d, 12), uni({3, 4}, -1.5, 1.5, d, 13)};
      },
      [](const V& x) { return ops::pow(x[0], x[1]); });
  add(
      OpId::Maximum, "no_ties_broadcast",
      [](Device d) {
        return V{distinct({3, 4}, d, 14), uni({4}, -0.6, 0.6, d, 15)};
      },
      [](const V& x) { return ops::maximum(x[0], x[1]); });
  add(
      OpId::Minimum, "no_ties_broadcast",
      [](Device d) {
        return V{distinct({3, 4}, d, 16), uni({4}, -0.6, 0.6, d, 17)};
      },
      [](const V& x) { return ops::minimum(x[0], x[1]); });

  // ---- unary
  struct Un {
    OpId op;
    Tensor (*f)(const Tensor&);
    double lo, hi;
  };
  for (Un u : {Un{OpId::Neg, ops::neg, -2, 2}, Un{OpId::Exp, ops::exp, -2, 2},
               Un{OpId::Log, ops::log, 0.5, 2}, Un{OpId::Sqrt, ops::sqrt, 0.5, 2},
               Un{OpId::Rsqrt, ops::rsqrt, 0.5, 2}, Un{OpId::Tanh, ops::tanh, -2, 2},
               Un{OpId::Sigmoid, ops::sigmoid, -3, 3}, Un{OpId::Gelu, ops::gelu, -3, 3},
               Un{OpId::Silu, ops::silu, -3, 3}}) {
    auto f = u.f;
    add(
        u.op, "3x5",
        [u](Device d) {
          return V{uni({3, 5}, u.lo, u.hi, d, 18)};
        },
        [f](const V& x) { return f(x[0]); });
  }
  add(
      OpId::Relu, "away_from_zero",
      [](Device d) {
        return V{distinct({3, 5}, d, 19)};
      },
      [](const V& x) { return ops::relu(x[0]); });
  add(
      OpId::Abs, "away_from_zero",
      [](Device d) {
        return V{distinct({3, 5}, d, 20)};
      },
      [](const V& x) { return ops::abs(x[0]); });
  add(
      OpId::Exp, "transposed_input",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 21)};
      },
      [](const V& x) { return ops::exp(ops::transpose(x[0], 0, 1)); });

  // ---- scalar attributes (typed attributes: Attrs::set(name, double) is not relied on here)
  add(
      OpId::AddScalar, "plus_2_5",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 22)};
      },
      [](const V& x) {
        return dispatch1(OpId::AddScalar, {ops::mul(x[0], x[0])}, Attrs().set("scalar", dbl(2.5)));
      });
  add(
      OpId::MulScalar, "times_minus_1_5",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 23)};
      },
      [](const V& x) {
        return dispatch1(OpId::MulScalar, {x[0]}, Attrs().set("scalar", dbl(-1.5)));
      });
  for (double e : {2.5, -0.5, 3.0})
    add(
        OpId::PowScalar,
        e == 2.5 ? "e_2_5"
        : e < 0  ? "e_minus_0_5"
                 : "cube",
        [](Device d) {
          return V{uni({3, 4}, 0.5, 2, d, 24)};
        },
        [e](const V& x) {
          return dispatch1(OpId::PowScalar, {x[0]}, Attrs().set("exponent", dbl(e)));
        });

  // ---- reductions
  add(
      OpId::Sum, "dim1",
      [](Device d) {
        return V{uni({2, 3, 4}, -2, 2, d, 25)};
      },
      [](const V& x) { return ops::sum(x[0], {1}); });
  add(
      OpId::Sum, "all_dims_keepdim",
      [](Device d) {
        return V{uni({2, 3}, -2, 2, d, 26)};
      },
      [](const V& x) { return ops::sum(x[0], {}, true); });
  add(
      OpId::Mean, "dims0_2_keepdim",
      [](Device d) {
        return V{uni({2, 3, 4}, -2, 2, d, 27)};
      },
      [](const V& x) {
        return ops::mean(x[0], {0, 2}, true);
      });
  add(
      OpId::Mean, "all",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 28)};
      },
      [](const V& x) { return ops::mean(x[0]); });
  add(
      OpId::Max, "dim1_distinct",
      [](Device d) {
        return V{distinct({3, 5}, d, 29)};
      },
      [](const V& x) { return ops::max(x[0], 1); });
  add(
      OpId::Max, "dim0_keepdim_distinct",
      [](Device d) {
        return V{distinct({4, 3}, d, 30)};
      },
      [](const V& x) { return ops::max(x[0], 0, true); });

  // ---- matmul
  struct Mm {
    std::string variant;
    Shape a, b;
    bool ta, tb;
  };
  for (const Mm& m :
       {Mm{"3x4_4x2", {3, 4}, {4, 2}, false, false}, Mm{"trans_a", {4, 3}, {4, 2}, true, false},
        Mm{"trans_b", {3, 4}, {2, 4}, false, true},
        Mm{"trans_a_trans_b", {4, 3}, {2, 4}, true, true},
        Mm{"batched_broadcast", {2, 1, 3, 4}, {3, 4, 2}, false, false},
        Mm{"batched_trans_b_broadcast", {2, 3, 4}, {1, 2, 4}, false, true}})
    add(
        OpId::Matmul, m.variant,
        [m](Device d) {
          return V{uni(m.a, -1, 1, d, 31), uni(m.b, -1, 1, d, 32)};
        },
        [m](const V& x) { return ops::matmul(x[0], x[1], m.ta, m.tb); });

  // ---- softmax family and norms
  add(
      OpId::Softmax, "last_dim",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 33)};
      },
      [](const V& x) { return ops::softmax(x[0], -1); });
  add(
      OpId::Softmax, "dim0",
      [](Device d) {
        return V{uni({4, 3}, -2, 2, d, 34)};
      },
      [](const V& x) { return ops::softmax(x[0], 0); });
  add(
      OpId::LogSoftmax, "last_dim",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 35)};
      },
      [](const V& x) { return ops::logSoftmax(x[0], -1); });
  add(
      OpId::LogSoftmax, "dim0",
      [](Device d) {
        return V{uni({4, 3}, -2, 2, d, 36)};
      },
      [](const V& x) { return ops::logSoftmax(x[0], 0); });
  add(
      OpId::LayerNorm, "3x5",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 37), uni({5}, 0.5, 1.5, d, 38), uni({5}, -1, 1, d, 39)};
      },
      [](const V& x) {
        return dispatch1(OpId::LayerNorm, {x[0], x[1], x[2]}, Attrs().set("eps", dbl(1e-5)));
      });
  add(
      OpId::LayerNorm, "2x2x4_transposed_input",
      [](Device d) {
        return V{uni({2, 4, 2}, -2, 2, d, 40), uni({4}, 0.5, 1.5, d, 41), uni({4}, -1, 1, d, 42)};
      },
      [](const V& x) {
        return dispatch1(OpId::LayerNorm, {ops::transpose(x[0], 1, 2), x[1], x[2]},
                         Attrs().set("eps", dbl(1e-5)));
      });
  add(
      OpId::RmsNorm, "3x5",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 43), uni({5}, 0.5, 1.5, d, 44)};
      },
      [](const V& x) {
        return dispatch1(OpId::RmsNorm, {x[0], x[1]}, Attrs().set("eps", dbl(1e-6)));
      });

  // ---- embedding, cross entropy, dropout
  add(
      OpId::Embedding, "repeated_indices",
      [](Device d) {
        return V{uni({5, 3}, -1, 1, d, 45), fromInts({4, 0, 4, 2, 2, 4}, {2, 3}, DType::Int64, d)};
      },
      [](const V& x) { return ops::embedding(x[0], x[1]); });
  add(
      OpId::Embedding, "int32_indices",
      [](Device d) {
        return V{uni({4, 2}, -1, 1, d, 46), fromInts({3, 1, 3}, {3}, DType::Int32, d)};
      },
      [](const V& x) { return ops::embedding(x[0], x[1]); });
  add(
      OpId::CrossEntropy, "one_ignored",
      [](Device d) {
        return V{uni({4, 5}, -2, 2, d, 47), fromInts({1, -100, 4, 1}, {4}, DType::Int64, d)};
      },
      [](const V& x) { return ops::crossEntropy(x[0], x[1]); });
  add(
      OpId::CrossEntropy, "ignore_class_0",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 48), fromInts({0, 3, 2}, {3}, DType::Int64, d)};
      },
      [](const V& x) { return ops::crossEntropy(x[0], x[1], 0); });
  add(
      OpId::Dropout, "p0_3_fixed_seed",
      [](Device d) {
        return V{uni({4, 6}, -2, 2, d, 49)};
      },
      [](const V& x) {
        return dispatch1(
            OpId::Dropout, {x[0]},
            Attrs().set("p", dbl(0.3)).set("seed", int64_t(5)).set("offset", int64_t(7)));
      });

  // ---- collectives, on a group of one rank (in one process); tests/dist/ checks their gradients
  // across 2 and 4 ranks.
  add(
      OpId::AllReduce, "sum_strided",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 80)};
      },
      [](const V& x) { return ops::allReduce(ops::transpose(x[0], 0, 1), "sum", "world"); });
  add(
      OpId::AllReduce, "mean", [](Device d) { return V{uni({5}, -2, 2, d, 81)}; },
      [](const V& x) { return ops::allReduce(x[0], "mean", "dp"); });
  add(
      OpId::CopyToGroup, "tp",
      [](Device d) {
        return V{uni({2, 3}, -2, 2, d, 82)};
      },
      [](const V& x) { return ops::copyToGroup(x[0], "tp"); });
  add(
      OpId::AllGather, "dim1",
      [](Device d) {
        return V{uni({2, 3}, -2, 2, d, 83)};
      },
      [](const V& x) { return ops::allGather(x[0], 1, "world"); });
  add(
      OpId::ReduceScatter, "dim0",
      [](Device d) {
        return V{uni({4, 2}, -2, 2, d, 84)};
      },
      [](const V& x) { return ops::reduceScatter(x[0], 0, "sum", "tp"); });
  add(
      OpId::AllToAll, "dp",
      [](Device d) {
        return V{uni({4, 3}, -2, 2, d, 85)};
      },
      [](const V& x) { return ops::allToAll(x[0], "dp"); });

  // ---- rope (its backward is rope turned back)
  add(
      OpId::Rope, "t5_h2_d6",
      [](Device d) {
        return V{uni({2, 5, 2, 6}, -2, 2, d, 50)};
      },
      [](const V& x) { return ops::rope(x[0]); });
  add(
      OpId::Rope, "base7_inverse_strided",
      [](Device d) {
        return V{uni({1, 4, 6, 3}, -2, 2, d, 51)};
      },
      [](const V& x) { return ops::rope(ops::transpose(x[0], -1, -2), 7.0, true); });

  // ---- flashmask attention (more cases, the log-sum-exp output: flashmask_test.cpp)
  add(
      OpId::FlashmaskAttention, "causal_document_gqa",
      [](Device d) {
        return V{uni({1, 6, 2, 3}, -1, 1, d, 80), uni({1, 6, 1, 3}, -1, 1, d, 81),
                 uni({1, 6, 1, 3}, -1, 1, d, 82),
                 fromInts({2, 2, 6, 6, 6, 6}, {1, 1, 6, 1}, DType::Int32, d)};
      },
      [](const V& x) {
        return dispatch(OpId::FlashmaskAttention, x, Attrs().set("causal", true))[0];
      });
  add(
      OpId::FlashmaskAttention, "document_c4_dropout",
      [](Device d) {
        return V{uni({1, 5, 2, 3}, -1, 1, d, 83), uni({1, 6, 2, 3}, -1, 1, d, 84),
                 uni({1, 6, 2, 3}, -1, 1, d, 85),
                 fromInts({3, 5, 0, 0, 3, 5, 0, 1, 5, 5, 0, 2, 5, 5, 2, 3, 5, 5, 2, 3, 5, 5, 0, 0},
                          {1, 1, 6, 4}, DType::Int32, d)};
      },
      [](const V& x) {
        return dispatch(OpId::FlashmaskAttention, x,
                        Attrs().set("dropout", dbl(0.2)).set("seed", int64_t(9)))[0];
      });

  // ---- views and copies
  add(
      OpId::Reshape, "2x6_to_3x4",
      [](Device d) {
        return V{uni({2, 6}, -2, 2, d, 50)};
      },
      [](const V& x) {
        return ops::reshape(x[0], {3, -1});
      });
  add(
      OpId::Reshape, "copy_of_transposed",
      [](Device d) {
        return V{uni({2, 6}, -2, 2, d, 51)};
      },
      [](const V& x) { return ops::reshape(ops::transpose(x[0], 0, 1), {12}); });
  add(
      OpId::View, "flatten",
      [](Device d) {
        return V{uni({2, 3, 2}, -2, 2, d, 52)};
      },
      [](const V& x) { return ops::view(x[0], {12}); });
  add(
      OpId::Transpose, "dims_0_2",
      [](Device d) {
        return V{uni({2, 3, 4}, -2, 2, d, 53)};
      },
      [](const V& x) { return ops::transpose(x[0], 0, 2); });
  add(
      OpId::Permute, "2_0_1",
      [](Device d) {
        return V{uni({2, 3, 4}, -2, 2, d, 54)};
      },
      [](const V& x) {
        return ops::permute(x[0], {2, 0, 1});
      });
  add(
      OpId::Slice, "step2_negative_start",
      [](Device d) {
        return V{uni({3, 7}, -2, 2, d, 55)};
      },
      [](const V& x) { return ops::slice(x[0], 1, -6, 7, 2); });
  add(
      OpId::Expand, "3x1_to_2x3x4",
      [](Device d) {
        return V{uni({3, 1}, -2, 2, d, 56)};
      },
      [](const V& x) {
        return ops::expand(x[0], {2, 3, 4});
      });
  add(
      OpId::Concat, "dim1_three_inputs",
      [](Device d) {
        return V{uni({2, 3}, -2, 2, d, 57), uni({2, 1}, -2, 2, d, 58), uni({2, 2}, -2, 2, d, 59)};
      },
      [](const V& x) {
        return ops::concat({x[0], x[1], x[2]}, 1);
      });
  add(
      OpId::Split, "sizes_2_3_reordered",
      [](Device d) {
        return V{uni({5, 3}, -2, 2, d, 60)};
      },
      [](const V& x) {
        auto p = ops::split(x[0], {2, 3}, 0);
        return ops::concat({ops::mul(p[1], p[1]), p[0]}, 0);
      });
  add(
      OpId::Split, "one_part_unused",
      [](Device d) {
        return V{uni({2, 5}, -2, 2, d, 61)};
      },
      [](const V& x) {
        return ops::split(x[0], {1, 4}, 1)[1];
      });
  add(
      OpId::Contiguous, "of_transposed",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 62)};
      },
      [](const V& x) { return ops::contiguous(ops::transpose(x[0], 0, 1)); });
  add(
      OpId::CopyTo, "round_trip_other_backend",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 63)};
      },
      [](const V& x) {
        Device here = x[0].device(), other = here == kCpuRef ? kTested : kCpuRef;
        return ops::copyTo(ops::mul(ops::copyTo(x[0], other), ops::copyTo(x[0], other)), here);
      });

  // ---- indexing and selection
  add(
      OpId::IndexSelect, "dim0_repeats",
      [](Device d) {
        return V{uni({5, 3}, -2, 2, d, 64), fromInts({4, 0, 4}, {3}, DType::Int64, d)};
      },
      [](const V& x) { return ops::indexSelect(x[0], 0, x[1]); });
  add(
      OpId::IndexAdd, "dim0_repeats",
      [](Device d) {
        return V{uni({5, 3}, -2, 2, d, 65), fromInts({1, 3, 1}, {3}, DType::Int64, d),
                 uni({3, 3}, -2, 2, d, 66)};
      },
      [](const V& x) { return ops::indexAdd(x[0], 0, x[1], x[2]); });
  add(
      OpId::Gather, "dim1_repeats",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 67),
                 fromInts({4, 4, 0, 1, 2, 2, 3, 0, 0, 1, 2, 3}, {3, 4}, DType::Int64, d)};
      },
      [](const V& x) { return ops::gather(x[0], 1, x[1]); });
  add(
      OpId::ScatterAdd, "dim1_duplicates",
      [](Device d) {
        return V{uni({3, 5}, -2, 2, d, 68), fromInts({0, 0, 4, 2, 3, 3}, {3, 2}, DType::Int64, d),
                 uni({3, 2}, -2, 2, d, 69)};
      },
      [](const V& x) { return ops::scatterAdd(x[0], 1, x[1], x[2]); });
  add(
      OpId::Topk, "k3_distinct",
      [](Device d) {
        return V{distinct({3, 6}, d, 70)};
      },
      [](const V& x) { return ops::topk(x[0], 3, 1, true).first; });
  add(
      OpId::Topk, "k2_smallest_dim0",
      [](Device d) {
        return V{distinct({5, 2}, d, 71)};
      },
      [](const V& x) { return ops::topk(x[0], 2, 0, false).first; });
  add(
      OpId::Where, "broadcast_three_ways",
      [](Device d) {
        return V{fromInts({1, 0, 1}, {3, 1}, DType::Bool, d), uni({3, 4}, -2, 2, d, 72),
                 uni({4}, -2, 2, d, 73)};
      },
      [](const V& x) { return ops::where(x[0], x[1], x[2]); });
  add(
      OpId::MaskedFill, "broadcast_mask",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 74), fromInts({0, 1, 1, 0}, {1, 4}, DType::Bool, d)};
      },
      [](const V& x) {
        return dispatch1(OpId::MaskedFill, {x[0], x[1]}, Attrs().set("value", dbl(-1.5)));
      });
  // The float32 round trip rounds each evaluation, so the step and tolerance are larger.
  add(
      OpId::Cast, "via_float32",
      [](Device d) {
        return V{uni({3, 4}, -2, 2, d, 75)};
      },
      [](const V& x) { return ops::mul(ops::cast(ops::cast(x[0], DType::Float32), F64), x[0]); },
      GradcheckOptions{1e-3, 1e-3, 1e-3, 1234});
  return c;
}

const std::vector<GradCase>& gradCases() {
  static const std::vector<GradCase> c = buildCases();
  return c;
}

struct GradParam {
  size_t caseIdx;
  bool optimized;  // cpu (true) or cpu-ref
};

std::vector<GradParam> allParams() {
  std::vector<GradParam> p;
  for (size_t i = 0; i < gradCases().size(); ++i) {
#if !defined(KEEL_GRADCHECK_CUDA)
    p.push_back({i, false});
#endif
    p.push_back({i, true});
  }
  return p;
}

void PrintTo(const GradParam& p, std::ostream* os) {
  *os << kOpNames[int(gradCases()[p.caseIdx].op)] << " on "
      << (p.optimized ? kTestedName : "cpu-ref");
}

class Gradcheck : public ::testing::TestWithParam<GradParam> {};

TEST_P(Gradcheck, AutogradMatchesFiniteDifferences) {
  const GradCase& c = gradCases()[GetParam().caseIdx];
#if defined(KEEL_GRADCHECK_CUDA)
  if (cudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
#endif
  Device d = GetParam().optimized ? kTested : kCpuRef;
  std::vector<Tensor> in = c.make(d);
  EXPECT_TRUE(gradcheck(c.fn, in, c.opt));
}

INSTANTIATE_TEST_SUITE_P(Rules, Gradcheck, ::testing::ValuesIn(allParams()),
                         [](const ::testing::TestParamInfo<GradParam>& info) {
                           const GradCase& c = gradCases()[info.param.caseIdx];
                           std::string s = std::string(kOpNames[int(c.op)]) + "_" + c.variant;
                           s += info.param.optimized ? "_" : "_cpu_ref";
                           if (info.param.optimized) s += kTestedName;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

#if !defined(KEEL_GRADCHECK_CUDA)  // host-only checks of the table: once, in gradcheck_test
TEST(GradcheckCoverage, EveryDifferentiableOpHasAGradcheckCase) {
  std::set<std::string> covered;
  for (const GradCase& c : gradCases()) covered.insert(kOpNames[int(c.op)]);
  const Registry& r = Registry::get();
  int differentiable = 0;
  for (int i = 0; i < r.size(); ++i) {
    const OpDef& op = r.op(i);
    if (!op.backward) continue;
    ++differentiable;
    EXPECT_TRUE(covered.count(op.name))
        << "differentiable op '" << op.name << "' has no gradcheck case";
  }
  EXPECT_GT(differentiable, 40);
}

TEST(GradcheckCoverage, EveryCaseTargetsADifferentiableOp) {
  for (const GradCase& c : gradCases())
    EXPECT_TRUE(bool(Registry::get().op(c.op).backward))
        << "case '" << c.variant << "' targets op '" << kOpNames[int(c.op)]
        << "', which has no backward rule";
}

// The checker itself must catch a wrong rule: a gradient that is off by a factor fails.
TEST(GradcheckSelfTest, DetectsAWrongGradientThroughAHook) {
  Tensor x = leaf(randUniform({4}, -1, 1, F64, kCpuRef, 1));
  auto fn = [](const std::vector<Tensor>& v) {
    Tensor y = ops::mul(v[0], v[0]);
    if (y.requiresGrad())  // not during the finite-difference evaluations (no grad mode)
      y.registerHook([](const Tensor& g) { return ops::add(g, g); });  // doubles the gradient
    return y;
  };
  EXPECT_FALSE(gradcheck(fn, {x}));
  auto ok = [](const std::vector<Tensor>& v) { return ops::mul(v[0], v[0]); };
  EXPECT_TRUE(gradcheck(ok, {x}));
}

#endif  // !KEEL_GRADCHECK_CUDA

}  // namespace
}  // namespace keel::test
