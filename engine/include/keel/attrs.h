// Attrs: an op's named, typed attributes (ints, floats, bools, strings, int lists), kept in the
// order they were set so that printing and hashing them is deterministic.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace keel {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs& set(std::string name, AttrValue v);
  // Typed overloads: without them a double would convert to int (a standard conversion beats
  // the variant's converting constructor).
  Attrs& set(std::string name, int v) { return set(std::move(name), AttrValue(int64_t(v))); }
  Attrs& set(std::string name, int64_t v) { return set(std::move(name), AttrValue(v)); }
  Attrs& set(std::string name, double v) { return set(std::move(name), AttrValue(v)); }
  Attrs& set(std::string name, bool v) { return set(std::move(name), AttrValue(v)); }
  Attrs& set(std::string name, std::vector<int64_t> v) {
    return set(std::move(name), AttrValue(std::move(v)));
  }
  Attrs& set(std::string name, std::string v) {
    return set(std::move(name), AttrValue(std::move(v)));
  }
  Attrs& set(std::string name, const char* v) {
    return set(std::move(name), AttrValue(std::string(v)));
  }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  int64_t getInt(const std::string& name) const;
  int64_t getInt(const std::string& name, int64_t dflt) const;
  double getDouble(const std::string& name) const;  // accepts an int too
  double getDouble(const std::string& name, double dflt) const;
  bool getBool(const std::string& name) const;
  bool getBool(const std::string& name, bool dflt) const;
  const std::string& getString(const std::string& name) const;
  const std::vector<int64_t>& getInts(const std::string& name) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  // Compact JSON-like text, e.g. {"dim":-1,"keepdim":true}.
  std::string toString() const;

 private:
  const AttrValue* find(const std::string& name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace keel
