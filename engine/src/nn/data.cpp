// Byte tokenizer, corpus loading, batch sampling and the document mask of packed rows. Invariant:
// a batch is a pure function of the dataset, (seed, generator offset), batch size and sequence
// length; its document mask is a pure function of its tokens.
#include "keel/data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/nn.h"

namespace keel::data {
namespace fs = std::filesystem;

// Note [Packed documents]: a corpus of several documents (the files of a directory, or the
// separator-delimited parts of one file) is one token stream with kDocumentSeparator opening every
// document but the first. Batches are windows of that stream, so a row may hold the end of one
// document and the start of the next (GPT-2's packing). With attention_mask "causal_document"
// (pack_documents) the GPT builds documentMask(idx) for every batch, so no query attends to a key
// of another document. The mask is a pure function of the tokens (as Megatron derives its reset
// attention mask from end-of-document tokens): training, evaluation and any caller of
// GPT::forward get the right mask without passing it along. The separator opens its document
// like a BOS token: a document's last token predicts the separator, and the separator predicts
// the next document's first token from nothing but itself. Blank lines are not boundaries: the
// licence texts of the default corpus are themselves paragraphs separated by blank lines.

std::vector<std::vector<int64_t>> documentLengths(const Tensor& tokens) {
  KEEL_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::Int64,
             "documentLengths: expected int64 tokens [B, S], got ",
             tokens.defined()
                 ? shapeStr(tokens.shape()) + " " + std::string(dtypeName(tokens.dtype()))
                 : std::string("undefined"));
  const int64_t b = tokens.size(0), s = tokens.size(1);
  KEEL_CHECK(s >= 1, "documentLengths: empty rows ", shapeStr(tokens.shape()));
  const std::vector<int64_t> v = nn::hostInts(tokens);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    int64_t start = 0;
    for (int64_t t = 1; t < s; ++t)
      if (v[size_t(r * s + t)] == kDocumentSeparator) {
        out[size_t(r)].push_back(t - start);
        start = t;
      }
    out[size_t(r)].push_back(s - start);
  }
  return out;
}

flashmask::Mask documentMask(const Tensor& tokens, Device device) {
  return flashmask::causalDocumentRows(documentLengths(tokens), device);
}

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = int64_t(static_cast<unsigned char>(text[i]));
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& tokens) {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    KEEL_CHECK(tokens[i] >= 0 && tokens[i] < kVocabSize, "ByteTokenizer::decode: token ", tokens[i],
               " at position ", i, " is outside [0, ", kVocabSize, ")");
    out[i] = char(static_cast<unsigned char>(tokens[i]));
  }
  return out;
}

TextDataset::TextDataset(std::string_view text, std::string source, double valFraction)
    : source_(std::move(source)), tokens_(text.begin(), text.end()) {
  KEEL_CHECK(!tokens_.empty(), source_, ": no text to train on");
  KEEL_CHECK(valFraction >= 0.0 && valFraction < 1.0, source_,
             ": validation fraction must be in [0, 1), got ", valFraction);
  int64_t n = int64_t(tokens_.size());
  valBegin_ = n - int64_t(double(n) * valFraction);
}

TextDataset TextDataset::fromDocuments(const std::vector<std::string>& documents,
                                       std::string source, double valFraction) {
  std::string text;
  for (const std::string& d : documents) {
    if (d.empty()) continue;
    if (!text.empty()) text += char(kDocumentSeparator);
    text += d;
  }
  return TextDataset(text, std::move(source), valFraction);
}

TextDataset TextDataset::load(const std::string& path) {
  KEEL_CHECK(!path.empty(), "data path is empty");
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  KEEL_CHECK(!ec && fs::exists(st), path, ": no such file or directory");
  std::vector<std::string> docs;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    fs::directory_iterator it(path, ec), end;
    KEEL_CHECK(!ec, path, ": cannot list directory (", ec.message(), ")");
    for (; it != end; it.increment(ec)) {
      KEEL_CHECK(!ec, path, ": cannot list directory (", ec.message(), ")");
      if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
      files.push_back(it->path());
    }
    std::sort(files.begin(), files.end(),
              [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
    KEEL_CHECK(!files.empty(), path, ": directory has no regular files");
    for (auto& f : files) docs.push_back(readFile(f));
  } else {
    KEEL_CHECK(fs::is_regular_file(st), path, ": not a regular file");
    docs.push_back(readFile(path));
  }
  KEEL_CHECK(std::any_of(docs.begin(), docs.end(), [](const std::string& d) { return !d.empty(); }),
             path, ": is empty (no text to train on)");
  return fromDocuments(docs, path);
}

int64_t TextDataset::splitTokens(Split s) const {
  return s == Split::Train ? valBegin_ : numTokens() - valBegin_;
}

int64_t TextDataset::numDocuments() const {
  return 1 + int64_t(std::count(tokens_.begin(), tokens_.end(), uint8_t(kDocumentSeparator)));
}

std::pair<Tensor, Tensor> TextDataset::getBatch(int64_t batchSize, int64_t seqLen, Generator& gen,
                                                Split split, Device device) const {
  KEEL_CHECK(batchSize > 0 && seqLen > 0,
             "getBatch: batch size and sequence length must be "
             "positive, got ",
             batchSize, " and ", seqLen);
  const int64_t begin = split == Split::Train ? 0 : valBegin_;
  const int64_t len = splitTokens(split);
  KEEL_CHECK(len >= seqLen + 1, source_, ": the ", split == Split::Train ? "train" : "validation",
             " split has ", len, " tokens, fewer than seq_len + 1 = ", seqLen + 1);
  const uint64_t positions = uint64_t(len - seqLen);  // valid starts: [0, len - seqLen)
  const uint64_t first = gen.take(uint64_t(batchSize));
  std::vector<int64_t> x(size_t(batchSize * seqLen)), y(x.size());
  for (int64_t b = 0; b < batchSize; ++b) {
    uint64_t c = first + uint64_t(b);
    auto r = philox4x32({uint32_t(c), uint32_t(c >> 32), 0x44415441u /* "DATA" */, 0},
                        {uint32_t(gen.seed()), uint32_t(gen.seed() >> 32)});
    uint64_t v = (uint64_t(r[1]) << 32) | r[0];
    int64_t start = begin + int64_t(v % positions);
    for (int64_t t = 0; t < seqLen; ++t) {
      x[size_t(b * seqLen + t)] = tokens_[size_t(start + t)];
      y[size_t(b * seqLen + t)] = tokens_[size_t(start + t + 1)];
    }
  }
  return {nn::tensorFromHost(x, {batchSize, seqLen}, DType::Int64, device),
          nn::tensorFromHost(y, {batchSize, seqLen}, DType::Int64, device)};
}

}  // namespace keel::data
