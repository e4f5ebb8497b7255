// Training data: a byte-level tokenizer (token = byte, vocab 256) and a text dataset with a
// held-out split (the last 10%) and random batches drawn from the counter-based generator, so a
// seed fixes every batch on every backend. Documents are packed into one token stream, each
// after the first opening with the separator token; documentMask() turns the separators of a
// batch into the causal-document attention mask. See Note [Packed documents] in data.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/flashmask.h"
#include "keel/random.h"
#include "keel/tensor.h"

namespace keel::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;
  static std::vector<int64_t> encode(std::string_view text);
  // Throws keel::Error on a token outside [0, 256).
  static std::string decode(const std::vector<int64_t>& tokens);
};

enum class Split { Train, Val };

// The document separator: ASCII FS (0x1C, "file separator"). It opens every document but the first
// of a stream, so it belongs to the document it opens.
inline constexpr int64_t kDocumentSeparator = 0x1C;

// Per row of tokens int64 [B, S] (any device): the lengths of its documents, in order. A row's
// first document starts at position 0 (a row may start inside a document); every separator starts
// another one.
std::vector<std::vector<int64_t>> documentLengths(const Tensor& tokens);
// The causal-document mask of a batch of packed rows: int32 [B, 1, S, 1] on `device`, causal,
// kind CausalDocument: no query attends to a key of another document of its row.
flashmask::Mask documentMask(const Tensor& tokens, Device device = {});

// The default corpus: every regular file (symlinks excluded) of this directory, sorted by name.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

class TextDataset {
 public:
  // valFraction of the tokens (rounded down) at the end form the validation split.
  TextDataset(std::string_view text, std::string source, double valFraction = 0.1);
  // Documents packed into one stream, a separator before every document but the first.
  static TextDataset fromDocuments(const std::vector<std::string>& documents, std::string source,
                                   double valFraction = 0.1);
  // A directory: each regular file (sorted by name) is a document. A text file: one document, or,
  // when it holds separator bytes, the documents they separate. Throws keel::Error naming the path
  // when it is missing, unreadable or empty.
  static TextDataset load(const std::string& path);
  static TextDataset defaultCorpus() { return load(kDefaultCorpusDir); }

  const std::string& source() const { return source_; }  // path (or a description)
  int64_t numTokens() const { return int64_t(tokens_.size()); }
  int64_t splitTokens(Split s) const;
  int64_t numDocuments() const;  // 1 + the number of separators in the stream

  // x, y int64 [batchSize, seqLen] on device, y = x shifted by one token. Row offsets are uniform
  // over the split, drawn from gen (batchSize counters per call). Throws if the split is shorter
  // than seqLen + 1 tokens.
  std::pair<Tensor, Tensor> getBatch(int64_t batchSize, int64_t seqLen, Generator& gen,
                                     Split split = Split::Train, Device device = {}) const;

 private:
  std::string source_;
  std::vector<uint8_t> tokens_;
  int64_t valBegin_ = 0;
};

}  // namespace keel::data
