// FlashMask mask builders, tile statistics and index validation (see keel/flashmask.h and
// Note [FlashMask geometry]). Builders work on host vectors and copy the result to the device once.
#include "keel/flashmask.h"

#include <array>
#include <numeric>

#include "flashmask/flashmask_geometry.h"
#include "keel/base/vocabulary.h"
#include "keel/error.h"
#include "keel/random.h"

namespace keel::detail::flashmask {

void validateIndices(std::string_view op, const Tensor& idx, const Shape& q, const Shape& k,
                     bool causal) {
  const Shape& s = idx.shape();
  KEEL_CHECK(idx.dtype() == DType::Int32, "op '", op, "': startend_row_indices must be int32, got ",
             dtypeName(idx.dtype()), " ", shapeStr(s));
  KEEL_CHECK(idx.dim() == 4, "op '", op,
             "': startend_row_indices must be [B, Hk or 1, Sk, C], got ", shapeStr(s));
  const int64_t b = q[0], sq = q[1], sk = k[1], hk = k[2];
  KEEL_CHECK(s[0] == b && (s[1] == 1 || s[1] == hk) && s[2] == sk, "op '", op,
             "': startend_row_indices ", shapeStr(s), " does not match [B, Hk or 1, Sk, C] = [", b,
             ", ", hk, " or 1, ", sk, ", C] for q ", shapeStr(q), " and k ", shapeStr(k));
  const int64_t c = s[3];
  if (causal)
    KEEL_CHECK(
        c == 1 || c == 2, "op '", op,
        "': with causal=true startend_row_indices needs C = 1 (LTS) or 2 (LTS, LTE), got C = ", c);
  else
    KEEL_CHECK(c == 2 || c == 4, "op '", op,
               "': with causal=false startend_row_indices needs C = 2 (LTS, UTE) or 4 (LTS, LTE, "
               "UTS, UTE), got C = ",
               c);
  // On a cuda device the values are checked by the kernel's pre-pass (a bad one is a deferred
  // error: Note [Deferred device errors]); here only the shape and dtype.
  if (!idx.device().isHost()) return;
  const int32_t* p = idx.data<int32_t>();
  const Shape& st = idx.strides();
  static const char* const kNamesCausal[] = {"LTS", "LTE"};
  static const char* const kNamesNonCausal2[] = {"LTS", "UTE"};
  static const char* const kNames4[] = {"LTS", "LTE", "UTS", "UTE"};
  const char* const* names = causal ? kNamesCausal : c == 2 ? kNamesNonCausal2 : kNames4;
  for (int64_t i0 = 0; i0 < s[0]; ++i0)
    for (int64_t i1 = 0; i1 < s[1]; ++i1)
      for (int64_t j = 0; j < sk; ++j) {
        const int32_t* e = p + i0 * st[0] + i1 * st[1] + j * st[2];
        for (int64_t ci = 0; ci < c; ++ci) {
          const int32_t v = e[ci * st[3]];
          KEEL_CHECK(v >= 0 && v <= sq, "op '", op, "': startend_row_indices ", names[ci], " at [",
                     i0, ", ", i1, ", ", j, "] is ", v, ", out of range [0, Sq = ", sq, "]");
        }
        const bool hasLte = (causal && c == 2) || c == 4;
        if (hasLte)
          KEEL_CHECK(e[0] <= e[st[3]], "op '", op, "': startend_row_indices LTS > LTE at [", i0,
                     ", ", i1, ", ", j, "] (", e[0], " > ", e[st[3]], ")");
        if (c == 4)
          KEEL_CHECK(e[2 * st[3]] <= e[3 * st[3]], "op '", op,
                     "': startend_row_indices UTS > UTE at [", i0, ", ", i1, ", ", j, "] (",
                     e[2 * st[3]], " > ", e[3 * st[3]], ")");
      }
}

void describeMask(Attrs& a, const Tensor& q, const Tensor& k, const Tensor& idx) {
  if (idx.defined() && !idx.device().isHost()) return;
  const bool causal = a.getBool("causal", false);
  const int64_t sq = q.size(1), sk = k.size(1), windowSize = a.getInt("window_size", -1);
  const int64_t window = windowSize > 0 ? windowSize : -1;
  if (!a.has("mask"))
    a.set("mask", idx.defined() ? "custom"
                  : window > 0  ? "sliding_window"
                  : causal      ? "causal"
                                : "full");
  const keel::flashmask::TileShape tile = keel::flashmask::tileShape(q.size(3));
  const keel::flashmask::TileCounts tc =
      keel::flashmask::countTiles(idx, causal, sq, sk, window, tile);
  a.set("block_sparsity", tc.skippedFraction())
      .set("tile_shape", std::vector<int64_t>{tile.rows, tile.cols})
      .set("tile_map", keel::flashmask::tileMap(idx, causal, sq, sk, window, tile));
}

}  // namespace keel::detail::flashmask

namespace keel::flashmask {
namespace {

using I = std::vector<int32_t>;

// Interleaves per-column vectors into a [1, 1, S, C] tensor.
Mask make(MaskKind kind, bool causal, const std::vector<I>& cols, Device device) {
  const size_t s = cols[0].size(), c = cols.size();
  I v(s * c);
  for (size_t j = 0; j < s; ++j)
    for (size_t k = 0; k < c; ++k) v[j * c + k] = cols[k][j];
  Mask m;
  m.startendRowIndices =
      Tensor::fromVector<int32_t>(v, {1, 1, int64_t(s), int64_t(c)}, DType::Int32, device);
  m.causal = causal;
  m.kind = kind;
  return m;
}

void checkLen(const char* what, int64_t s) {
  KEEL_CHECK(s >= 1 && s <= INT32_MAX, "flashmask::", what,
             ": sequence length must be in [1, 2^31), got ", s);
}

int64_t checkLens(const char* what, const std::vector<int64_t>& lens) {
  KEEL_CHECK(!lens.empty(), "flashmask::", what, ": needs at least one length");
  int64_t s = 0;
  for (int64_t l : lens) {
    KEEL_CHECK(l >= 1, "flashmask::", what, ": lengths must be positive, got ", l);
    s += l;
  }
  checkLen(what, s);
  return s;
}

}  // namespace

constexpr std::array<std::string_view, 12> kMaskKindNames = {"full",
                                                             "causal",
                                                             "sliding_window",
                                                             "causal_document",
                                                             "document",
                                                             "shared_question",
                                                             "global_sliding_window",
                                                             "causal_blockwise",
                                                             "prefix_lm_document",
                                                             "prefix_lm_causal",
                                                             "qk_sparse",
                                                             "random_eviction"};
static_assert(kMaskKindNames.size() == size_t(MaskKind::RandomEviction) + 1);
const char* maskKindName(MaskKind k) {
  return keel::detail::enumName(kMaskKindNames, k).data();  // the names are literals: terminated
}

Mask full(int64_t s, Device device) {
  checkLen("full", s);
  return make(MaskKind::Full, false, {I(size_t(s), int32_t(s)), I(size_t(s), 0)}, device);
}

Mask causal(int64_t s, Device device) {
  checkLen("causal", s);
  return make(MaskKind::Causal, true, {I(size_t(s), int32_t(s))}, device);
}

Mask slidingWindow(int64_t s, int64_t window, Device device) {
  checkLen("slidingWindow", s);
  KEEL_CHECK(window >= 1, "flashmask::slidingWindow: window must be >= 1, got ", window);
  I lts(static_cast<size_t>(s));
  for (int64_t j = 0; j < s; ++j) lts[size_t(j)] = int32_t(std::min(s, j + window));
  return make(MaskKind::SlidingWindow, true, {lts}, device);
}

Mask causalDocument(const std::vector<int64_t>& docLens, Device device) {
  const int64_t s = checkLens("causalDocument", docLens);
  I lts;
  int64_t end = 0;
  for (int64_t l : docLens) {
    end += l;
    lts.insert(lts.end(), size_t(l), int32_t(end));
  }
  (void)s;
  return make(MaskKind::CausalDocument, true, {lts}, device);
}

Mask causalDocumentRows(const std::vector<std::vector<int64_t>>& docLens, Device device) {
  KEEL_CHECK(!docLens.empty(), "flashmask::causalDocumentRows: needs at least one row");
  const int64_t s = checkLens("causalDocumentRows", docLens[0]);
  I lts;
  lts.reserve(docLens.size() * size_t(s));
  for (size_t b = 0; b < docLens.size(); ++b) {
    const int64_t sb = checkLens("causalDocumentRows", docLens[b]);
    KEEL_CHECK(sb == s, "flashmask::causalDocumentRows: row ", b, " has ", sb,
               " tokens, row 0 has ", s);
    int64_t end = 0;
    for (int64_t l : docLens[b]) {
      end += l;
      lts.insert(lts.end(), size_t(l), int32_t(end));
    }
  }
  Mask m;
  m.startendRowIndices =
      Tensor::fromVector<int32_t>(lts, {int64_t(docLens.size()), 1, s, 1}, DType::Int32, device);
  m.causal = true;
  m.kind = MaskKind::CausalDocument;
  return m;
}

Mask document(const std::vector<int64_t>& docLens, Device device) {
  checkLens("document", docLens);
  I lts, ute;
  int64_t start = 0;
  for (int64_t l : docLens) {
    lts.insert(lts.end(), size_t(l), int32_t(start + l));
    ute.insert(ute.end(), size_t(l), int32_t(start));
    start += l;
  }
  return make(MaskKind::Document, false, {lts, ute}, device);
}

Mask sharedQuestion(int64_t questionLen, const std::vector<int64_t>& answerLens, Device device) {
  KEEL_CHECK(questionLen >= 1, "flashmask::sharedQuestion: question length must be >= 1, got ",
             questionLen);
  const int64_t s = questionLen + checkLens("sharedQuestion", answerLens);
  checkLen("sharedQuestion", s);
  I lts(static_cast<size_t>(questionLen), int32_t(s));
  int64_t end = questionLen;
  for (int64_t l : answerLens) {
    end += l;
    lts.insert(lts.end(), size_t(l), int32_t(end));
  }
  return make(MaskKind::SharedQuestion, true, {lts}, device);
}

Mask globalSlidingWindow(int64_t s, int64_t global, int64_t window, Device device) {
  checkLen("globalSlidingWindow", s);
  KEEL_CHECK(global >= 0 && global <= s, "flashmask::globalSlidingWindow: global must be in [0, ",
             s, "], got ", global);
  KEEL_CHECK(window >= 1, "flashmask::globalSlidingWindow: window must be >= 1, got ", window);
  I lts(static_cast<size_t>(s));
  for (int64_t j = 0; j < s; ++j)
    lts[size_t(j)] = int32_t(j < global ? s : std::min(s, j + window));
  return make(MaskKind::GlobalSlidingWindow, true, {lts}, device);
}

Mask causalBlockwise(const std::vector<int64_t>& blockLens, Device device) {
  const int64_t s = checkLens("causalBlockwise", blockLens);
  const int64_t lastStart = s - blockLens.back();
  I lts, lte;
  int64_t end = 0;
  for (size_t b = 0; b < blockLens.size(); ++b) {
    end += blockLens[b];
    const bool last = b + 1 == blockLens.size();
    lts.insert(lts.end(), size_t(blockLens[b]), int32_t(last ? s : end));
    lte.insert(lte.end(), size_t(blockLens[b]), int32_t(last ? s : lastStart));
  }
  return make(MaskKind::CausalBlockwise, true, {lts, lte}, device);
}

Mask prefixLmDocument(const std::vector<int64_t>& docLens, const std::vector<int64_t>& prefixLens,
                      Device device) {
  checkLens("prefixLmDocument", docLens);
  KEEL_CHECK(prefixLens.size() == docLens.size(),
             "flashmask::prefixLmDocument: ", prefixLens.size(), " prefix lengths for ",
             docLens.size(), " documents");
  I lts, ute;
  int64_t start = 0;
  for (size_t d = 0; d < docLens.size(); ++d) {
    const int64_t l = docLens[d], p = prefixLens[d];
    KEEL_CHECK(p >= 0 && p <= l, "flashmask::prefixLmDocument: prefix ", p, " of document ", d,
               " is outside [0, ", l, "]");
    for (int64_t j = start; j < start + l; ++j) {
      lts.push_back(int32_t(start + l));
      ute.push_back(int32_t(j < start + p ? start : j));
    }
    start += l;
  }
  return make(MaskKind::PrefixLmDocument, false, {lts, ute}, device);
}

Mask prefixLmCausal(int64_t s, int64_t prefix, Device device) {
  checkLen("prefixLmCausal", s);
  KEEL_CHECK(prefix >= 0 && prefix <= s, "flashmask::prefixLmCausal: prefix must be in [0, ", s,
             "], got ", prefix);
  I lts(static_cast<size_t>(s), int32_t(s)), ute(static_cast<size_t>(s));
  for (int64_t j = 0; j < s; ++j) ute[size_t(j)] = int32_t(j < prefix ? 0 : j);
  return make(MaskKind::PrefixLmCausal, false, {lts, ute}, device);
}

Mask qkSparse(int64_t s, const std::vector<QkSpan>& spans, Device device) {
  checkLen("qkSparse", s);
  I lts(static_cast<size_t>(s), int32_t(s)), lte(static_cast<size_t>(s), int32_t(s));
  std::vector<bool> used(size_t(s), false);
  for (const QkSpan& sp : spans) {
    KEEL_CHECK(sp.keyBegin >= 0 && sp.keyBegin <= sp.keyEnd && sp.keyEnd <= s && sp.rowBegin >= 0 &&
                   sp.rowBegin <= sp.rowEnd && sp.rowEnd <= s,
               "flashmask::qkSparse: span keys [", sp.keyBegin, ", ", sp.keyEnd, ") rows [",
               sp.rowBegin, ", ", sp.rowEnd, ") is outside [0, ", s, "]");
    for (int64_t j = sp.keyBegin; j < sp.keyEnd; ++j) {
      KEEL_CHECK(!used[size_t(j)], "flashmask::qkSparse: key spans overlap at key ", j);
      used[size_t(j)] = true;
      lts[size_t(j)] = int32_t(sp.rowBegin);
      lte[size_t(j)] = int32_t(sp.rowEnd);
    }
  }
  return make(MaskKind::QkSparse, true, {lts, lte}, device);
}

Mask randomEviction(int64_t s, uint64_t seed, int64_t sinks, Device device) {
  checkLen("randomEviction", s);
  KEEL_CHECK(sinks >= 0, "flashmask::randomEviction: sinks must be >= 0, got ", sinks);
  I lts(static_cast<size_t>(s), int32_t(s));
  for (int64_t j = sinks; j < s; ++j) {
    const auto r = int64_t(double(philoxUniform(seed, 0, uint64_t(j))) * double(s - j));
    lts[size_t(j)] = int32_t(std::min(s, j + 1 + r));
  }
  return make(MaskKind::RandomEviction, true, {lts}, device);
}

Tensor repeatMask(const Tensor& idx, int64_t batch, int64_t heads) {
  KEEL_CHECK(idx.dtype() == DType::Int32 && idx.dim() == 4 && idx.size(0) == 1,
             "flashmask::repeatMask: expects an int32 [1, Hm, S, C] tensor, got ",
             dtypeName(idx.dtype()), " ", shapeStr(idx.shape()));
  KEEL_CHECK(batch >= 1 && heads >= 1 && (idx.size(1) == heads || idx.size(1) == 1),
             "flashmask::repeatMask: cannot repeat ", shapeStr(idx.shape()), " to batch ", batch,
             ", heads ", heads);
  std::vector<int32_t> src = idx.contiguous().toVector<int32_t>();
  const int64_t per = idx.size(2) * idx.size(3), hm = idx.size(1);
  std::vector<int32_t> out(size_t(batch * heads * per));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(src.begin() + (hm == 1 ? 0 : h) * per, per, out.begin() + (b * heads + h) * per);
  return Tensor::fromVector<int32_t>(out, {batch, heads, idx.size(2), idx.size(3)}, DType::Int32,
                                     idx.device());
}

TileShape tileShape(int64_t headDim) {
  // See Note [FlashMask tile shape] in backends/cpu/flashmask.cpp.
  constexpr int64_t kRows = 64, kMaxCols = 64, kSmallGemm = 262144;
  int64_t cols = kSmallGemm / (kRows * std::max<int64_t>(headDim, 1));
  cols = std::max<int64_t>(16, std::min(kMaxCols, cols / 16 * 16));
  return {kRows, cols};
}

TileCounts countTiles(const Tensor& idx, bool causal, int64_t sq, int64_t sk, int64_t windowSize,
                      TileShape tile) {
  namespace fm = keel::detail::flashmask;
  fm::Geometry g{sq, sk, causal, windowSize > 0 ? windowSize : -1};
  TileCounts tc;
  const int64_t nb = idx.defined() ? idx.size(0) : 1, nh = idx.defined() ? idx.size(1) : 1;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h) {
      fm::ColumnBounds cb = fm::readBounds(idx, b, h, g);
      std::vector<fm::TileBounds> tb = fm::tileBounds(cb, sk, tile.cols);
      for (int64_t m0 = 0; m0 < sq; m0 += tile.rows)
        for (size_t t = 0; t < tb.size(); ++t) {
          const int64_t n0 = int64_t(t) * tile.cols;
          switch (fm::classify(tb[t], g, m0, std::min(sq, m0 + tile.rows), n0,
                               std::min(sk, n0 + tile.cols))) {
            case fm::TileClass::Skip:
              ++tc.skipped;
              break;
            case fm::TileClass::Partial:
              ++tc.partial;
              break;
            case fm::TileClass::Unmasked:
              ++tc.unmasked;
              break;
          }
        }
    }
  return tc;
}

std::string tileMap(const Tensor& idx, bool causal, int64_t sq, int64_t sk, int64_t windowSize,
                    TileShape tile, int64_t b, int64_t h, int64_t maxCells) {
  namespace fm = keel::detail::flashmask;
  KEEL_CHECK(sq >= 1 && sk >= 1 && tile.rows >= 1 && tile.cols >= 1 && maxCells >= 1,
             "flashmask::tileMap: bad geometry Sq=", sq, " Sk=", sk, " tile ", tile.rows, "x",
             tile.cols, " maxCells ", maxCells);
  fm::Geometry g{sq, sk, causal, windowSize > 0 ? windowSize : -1};
  Tensor host = idx.defined() && !idx.device().isHost() ? idx.to(Device(Backend::Cpu)) : idx;
  fm::ColumnBounds cb = fm::readBounds(host, b, h, g);
  std::vector<fm::TileBounds> tb = fm::tileBounds(cb, sk, tile.cols);
  const int64_t nq = (sq + tile.rows - 1) / tile.rows, nk = int64_t(tb.size());
  const int64_t rows = std::min(nq, maxCells), cols = std::min(nk, maxCells);
  // Bit 0: some tile of the cell is skipped; bit 1: some is partial; bit 2: some is unmasked.
  std::vector<uint8_t> seen(size_t(rows * cols), 0);
  for (int64_t qt = 0; qt < nq; ++qt) {
    const int64_t m0 = qt * tile.rows, r = qt * rows / nq;
    for (int64_t kt = 0; kt < nk; ++kt) {
      const int64_t n0 = kt * tile.cols;
      const fm::TileClass c = fm::classify(tb[size_t(kt)], g, m0, std::min(sq, m0 + tile.rows), n0,
                                           std::min(sk, n0 + tile.cols));
      seen[size_t(r * cols + kt * cols / nk)] |= uint8_t(1u << unsigned(c));
    }
  }
  std::string out;
  out.reserve(size_t(rows * (cols + 1)));
  for (int64_t r = 0; r < rows; ++r) {
    if (r) out += '/';
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = seen[size_t(r * cols + c)];
      out += v == 1 ? 's' : v == 4 ? 'f' : 'p';
    }
  }
  return out;
}

std::vector<uint8_t> denseVisibility(const Tensor& idx, bool causal, int64_t sq, int64_t sk,
                                     int64_t windowSize, int64_t b, int64_t h) {
  namespace fm = keel::detail::flashmask;
  fm::Geometry g{sq, sk, causal, windowSize > 0 ? windowSize : -1};
  Tensor host = idx.defined() ? idx.to(Device(Backend::Cpu)) : idx;
  fm::ColumnBounds cb = fm::readBounds(host, b, h, g);
  std::vector<uint8_t> v(size_t(sq * sk));
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) v[size_t(i * sk + j)] = fm::masked(cb, g, i, j) ? 0 : 1;
  return v;
}

}  // namespace keel::flashmask
