// Training data: a byte-level tokenizer (token = byte, vocab 256) and a text dataset with a
// held-out split (the last 10%) and random batches drawn from the counter-based generator, so a
// seed fixes every batch on every backend.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// The default corpus: every regular file (symlinks excluded) of this directory, sorted by name.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

class TextDataset {
 public:
  // valFraction of the tokens (rounded down) at the end form the validation split.
  TextDataset(std::string_view text, std::string source, double valFraction = 0.1);
  // A text file, or a directory (its regular files, sorted by name, concatenated). Throws
  // keel::Error naming the path when it is missing, unreadable or empty.
  static TextDataset load(const std::string& path);
  static TextDataset defaultCorpus() { return load(kDefaultCorpusDir); }

  const std::string& source() const { return source_; }  // path (or a description)
  int64_t numTokens() const { return int64_t(tokens_.size()); }
  int64_t splitTokens(Split s) const;

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
