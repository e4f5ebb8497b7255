// Qt text for the views: one conversion from the std strings and string_views that storage and
// the shared vocabulary (keel/base) hand out, so no view re-spells an enum's name.
#pragma once
#include <QString>
#include <string_view>

namespace keel::views {

inline QString qs(std::string_view s) {
  return QString::fromUtf8(s.data(), qsizetype(s.size()));
}

}  // namespace keel::views
