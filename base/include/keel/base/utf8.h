// UTF-8 for text that leaves Keel: recorded strings (op names, module scopes, messages) are stored
// as the workload gave them and need not be UTF-8 (a damaged file, a C++ workload's own bytes);
// every text export writes them through validUtf8, so its output is always valid UTF-8.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

// `text` with every byte sequence that is not well-formed UTF-8 replaced by U+FFFD, one per
// maximal ill-formed subpart (Unicode's recommended practice, and what nlohmann::json's
// error_handler_t::replace writes in the Chrome trace and keel diff --json): what every text
// export writes for a recorded string that is not UTF-8 (a damaged file, a workload's own bytes).
inline std::string validUtf8(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;          // built only once a sequence is replaced
  size_t i = 0, plain = 0;  // text[plain, i) is valid and not yet copied
  while (i < text.size()) {
    const auto b = uint8_t(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The sequence's length and the range of its second byte (Unicode Table 3-7).
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      lo = b == 0xE0 ? 0xA0 : 0x80;
      hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      lo = b == 0xF0 ? 0x90 : 0x80;
      hi = b == 0xF4 ? 0x8F : 0xBF;
    }
    size_t j = i + 1;
    for (size_t k = 1; k < len && j < text.size(); ++k, ++j) {
      const auto c = uint8_t(text[j]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
    }
    if (len != 0 && j - i == len) {
      i = j;
      continue;
    }
    if (out.empty()) out.reserve(text.size() + 16);
    out.append(text.substr(plain, i - plain));
    out += kReplacement;
    i = plain = j;  // the byte that broke the sequence starts the next one
  }
  if (plain == 0) return std::string(text);
  out.append(text.substr(plain));
  return out;
}

}  // namespace keel
