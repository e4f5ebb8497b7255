// Op definitions, attention: flashmask_attention (column-sparse masked attention, optional
// startend_row_indices) and its fused backward op, with the describe rule that adds the mask's
// recording-only attributes. See Note [FlashMask geometry] (flashmask/flashmask_geometry.h).
#include <cmath>

#include "flashmask/flashmask_geometry.h"
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

// The log-sum-exp output of flashmask_attention: float64 for float64 inputs, else float32.
DType lseDtype(DType t) {
  return t == DType::Float64 ? DType::Float64 : DType::Float32;
}

// q [B, Sq, H, D], k and v [B, Sk, Hk, D], H a multiple of Hk; attributes causal, window_size,
// dropout, scale, seed, offset, skip_tiles in range.
void checkAttention(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Attrs& a) {
  requireFloat(op, q, "q");
  KEEL_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "op '", op,
             "': q, k and v must share a dtype, got ", dtypeName(q.dtype()), ", ",
             dtypeName(k.dtype()), ", ", dtypeName(v.dtype()));
  KEEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "op '", op,
             "': q must be [B, Sq, H, D] and k, v [B, Sk, Hk, D], got q ", shapeStr(q.shape()),
             ", k ", shapeStr(k.shape()), ", v ", shapeStr(v.shape()));
  KEEL_CHECK(k.shape() == v.shape(), "op '", op, "': k ", shapeStr(k.shape()), " and v ",
             shapeStr(v.shape()), " differ");
  KEEL_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "op '", op, "': q ",
             shapeStr(q.shape()), " and k ", shapeStr(k.shape()), " differ in batch or head dim");
  KEEL_CHECK(k.size(2) >= 1 && q.size(2) % k.size(2) == 0, "op '", op, "': q heads (", q.size(2),
             ") must be a multiple of k/v heads (", k.size(2), ")");
  KEEL_CHECK(q.size(3) >= 1, "op '", op, "': head dim must be >= 1");
  const int64_t w = a.getInt("window_size", -1);
  KEEL_CHECK(w == -1 || w >= 1, "op '", op, "': window_size must be -1 (off) or >= 1, got ", w);
  const double p = a.getDouble("dropout", 0.0);
  KEEL_CHECK(p >= 0.0 && p < 1.0, "op '", op, "': dropout must be in [0, 1), got ", p);
  const double s = a.getDouble("scale", 0.0);
  KEEL_CHECK(s >= 0.0 && std::isfinite(s), "op '", op,
             "': scale must be finite and >= 0 (0: 1/sqrt(D)), got ", s);
}

}  // namespace

void defineAttentionOps(OpTable& t) {
  t.family("Attention");
  t.doc(OpId::FlashmaskAttention,
        "q [B,Sq,H,D], k, v [B,Sk,Hk,D], optional startend_row_indices int32 [B,Hk or 1,Sk,C]",
        "causal, window_size (−1 off), dropout, scale (0: 1/√D), seed, offset, skip_tiles; for "
        "the recording only (no kernel reads them): mask, block_sparsity, tile_shape, tile_map "
        "([flashmask.md](flashmask.md#what-a-recording-shows))",
        "out [B,Sq,H,D], lse [B,H,Sq] (float32; float64 for float64)",
        "column-sparse masked attention, see [flashmask.md](flashmask.md); rows seeing no key give "
        "0 and lse −inf");
  t.doc(OpId::FlashmaskAttentionBackward,
        "grad_out, q, k, v, out, lse, grad_lse, optional startend_row_indices", "as forward",
        "dq, dk, dv", "cpu-ref recomputes everything in float64 and ignores out/lse");

  OpDef& o = t.at(OpId::FlashmaskAttention, -1);  // q, k, v [, startend_row_indices]
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    KEEL_CHECK(in.size() == 3 || in.size() == 4, "op '", op.name,
               "' expects q, k, v and optionally startend_row_indices, got ", in.size(), " inputs");
    checkAttention(op.name, in[0], in[1], in[2], a);
    if (in.size() == 4)
      flashmask::validateIndices(op.name, in[3], in[0].shape(), in[1].shape(),
                                 a.getBool("causal", false));
    const Shape& q = in[0].shape();
    return Metas{{q, in[0].dtype()}, {{q[0], q[2], q[1]}, lseDtype(in[0].dtype())}};
  };
  // For observers only: see Note [FlashMask op attributes].
  o.describe = [](Inputs in, Attrs& a) {
    flashmask::describeMask(a, in[0], in[1], in.size() == 4 ? in[3] : Tensor());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &q = c.inputs[0], &out = c.outputs[0], &lse = c.outputs[1];
    Tensor g = c.gradOutputs[0].defined() ? c.gradOutputs[0] : zerosLike(out);
    Tensor glse =
        c.gradOutputs.size() > 1 && c.gradOutputs[1].defined() ? c.gradOutputs[1] : zerosLike(lse);
    std::vector<Tensor> in{g, q, c.inputs[1], c.inputs[2], out, lse, glse};
    if (c.inputs.size() == 4) in.push_back(c.inputs[3]);
    Grads r = dispatch(OpId::FlashmaskAttentionBackward, in, c.attrs);
    if (c.inputs.size() == 4) r.push_back(Tensor());
    return r;
  };

  // grad_out, q, k, v, out, lse, grad_lse [, startend_row_indices] -> dq, dk, dv
  OpDef& b = t.at(OpId::FlashmaskAttentionBackward, -1);
  b.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    KEEL_CHECK(in.size() == 7 || in.size() == 8, "op '", op.name,
               "' expects grad_out, q, k, v, out, lse, grad_lse and optionally "
               "startend_row_indices, got ",
               in.size(), " inputs");
    checkAttention(op.name, in[1], in[2], in[3], a);
    const Shape& q = in[1].shape();
    for (int i : {0, 4})
      KEEL_CHECK(in[size_t(i)].shape() == q && in[size_t(i)].dtype() == in[1].dtype(), "op '",
                 op.name, "': ", i == 0 ? "grad_out " : "out ", shapeStr(in[size_t(i)].shape()),
                 " ", dtypeName(in[size_t(i)].dtype()), " does not match q ", shapeStr(q), " ",
                 dtypeName(in[1].dtype()));
    const Shape ls{q[0], q[2], q[1]};
    for (int i : {5, 6})
      KEEL_CHECK(in[size_t(i)].shape() == ls && in[size_t(i)].dtype() == lseDtype(in[1].dtype()),
                 "op '", op.name, "': ", i == 5 ? "lse " : "grad_lse ",
                 shapeStr(in[size_t(i)].shape()), " ", dtypeName(in[size_t(i)].dtype()),
                 " must be ", shapeStr(ls), " ", dtypeName(lseDtype(in[1].dtype())));
    if (in.size() == 8)
      flashmask::validateIndices(op.name, in[7], q, in[2].shape(), a.getBool("causal", false));
    return Metas{
        {q, in[1].dtype()}, {in[2].shape(), in[2].dtype()}, {in[3].shape(), in[3].dtype()}};
  };
  b.describe = [](Inputs in, Attrs& a) {
    flashmask::describeMask(a, in[1], in[2], in.size() == 8 ? in[7] : Tensor());
  };
}

}  // namespace keel::detail
