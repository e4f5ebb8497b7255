// Qt text for the views: one conversion from the std strings and string_views that storage and
// the shared vocabulary (keel/base) hand out, so no view re-spells an enum's name or a byte count.
#pragma once
#include <QString>
#include <cstdint>
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

}  // namespace keel::views
