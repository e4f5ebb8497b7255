// keel::NonCopyable: the base of scope objects and guards (NoGradGuard, ScopeGuard, BufferPin,
// OutputLock, ...) whose copy would undo or repeat what their destructor does once. Deriving from
// it deletes the copy constructor and assignment, as each class used to spell out itself.
#pragma once

namespace keel {

class NonCopyable {
 public:
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
  ~NonCopyable() = default;
};

}  // namespace keel
