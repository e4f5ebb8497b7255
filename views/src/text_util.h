// Qt text for the views: one conversion from the std strings and string_views that storage and
// the shared vocabulary (keel/base) hand out, so no view re-spells an enum's name or a byte count.
#pragma once
#include <QString>
#include <cstdint>
#include <functional>
#include <string_view>

#include "keel/base/text.h"

namespace keel::views {

inline QString qs(std::string_view s) {
  return QString::fromUtf8(s.data(), qsizetype(s.size()));
}

// A byte count for people: keel::formatBytes ("512 B", "1.50 KiB", "15.0 MiB").
inline QString bytesText(uint64_t b) {
  return qs(keel::formatBytes(b));
}

// A number written to fit `width` (as `widthOf` measures text): the same value with fewer
// significant digits, in 'g' form or as a short "3.69e-3", rather than cut in the middle
// ("-0.…885" lost its exponent and leading digits). Text that is not a number, or that fits,
// comes back as it was; a number that fits in no form comes back at 1 digit ("-1e-12").
QString fitNumber(const QString& text, const std::function<int(const QString&)>& widthOf,
                  int width);

}  // namespace keel::views
