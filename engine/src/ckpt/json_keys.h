// The keys of one JSON object in document order, read by a SAX pass over the text: what the
// safetensors reader and the checkpoint metadata reader need beside nlohmann's DOM (the first key
// named twice; the order of a checkpoint's keys). Linear in the text. See Note [Linear headers].
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace keel::ckpt::detail {

// Note [Linear headers]
// A checkpoint may hold hundreds of thousands of keys (200,000 empty tensors in one safetensors
// header), so everything done per key must cost O(1) or O(log n), never O(keys). Two parts of
// nlohmann-json are linear per key and made loading quadratic (20,000 keys took seconds, 200,000
// minutes): a parser callback (json::parse(text, cb)) scans the whole enclosing object for a
// discarded value at the end of every nested object, and ordered_json's object is a vector whose
// operator[] and insertion search every earlier key. So headers are parsed with the plain
// (std::map) json and no callback; the keys' document order and duplicates come from one SAX pass
// (objectKeys); and ordered_json objects are built by appending to their vector directly, the keys
// being known distinct. Planning, loading and resuming look keys up through hash maps.

struct ObjectKeys {
  std::vector<std::string> keys;  // in document order, each once
  std::string duplicate;          // the first key named twice, or empty
  bool hasDuplicate = false;
};

// Keys of the object reached from the root through `path` (empty: the root object itself).
// Nothing is collected when the text is not valid JSON or the path leads to no object; the caller
// parses the text with nlohmann's DOM parser too and reports syntax errors from there.
inline ObjectKeys objectKeys(std::string_view text, std::vector<std::string_view> path) {
  struct Sax : nlohmann::json_sax<nlohmann::json> {
    std::vector<std::string_view> path;
    ObjectKeys out;
    std::unordered_set<std::string> seen;
    std::vector<char> onPath;  // per open container: reached through a prefix of `path`
    std::string pending;       // the last key read in an on-path object
    bool hasPending = false;

    bool open() {
      const size_t level = onPath.size();  // the new container's depth (the root's is 0)
      onPath.push_back(level == 0 || (onPath.back() && hasPending && level <= path.size() &&
                                      pending == path[level - 1]));
      hasPending = false;
      return true;
    }
    bool close() {
      onPath.pop_back();
      hasPending = false;
      return true;
    }
    bool value() {
      hasPending = false;
      return true;
    }
    bool null() override { return value(); }
    bool boolean(bool) override { return value(); }
    bool number_integer(number_integer_t) override { return value(); }
    bool number_unsigned(number_unsigned_t) override { return value(); }
    bool number_float(number_float_t, const string_t&) override { return value(); }
    bool string(string_t&) override { return value(); }
    bool binary(binary_t&) override { return value(); }
    bool start_object(std::size_t) override { return open(); }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
      if (!onPath.back()) return true;
      if (onPath.size() == path.size() + 1) {
        if (seen.insert(k).second)
          out.keys.push_back(k);
        else if (!out.hasDuplicate)
          out.duplicate = k, out.hasDuplicate = true;
      } else {
        pending = k;
        hasPending = true;
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } sax;
  sax.path = std::move(path);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax)) return {};
  return std::move(sax.out);
}

// Appends (key, value) to an ordered_json object without ordered_json's search of every earlier
// key (See Note [Linear headers]); the caller guarantees the key is not there yet.
inline void appendDistinct(nlohmann::ordered_json& object, std::string key,
                           nlohmann::ordered_json value) {
  object.get_ref<nlohmann::ordered_json::object_t&>().emplace_back(std::move(key),
                                                                   std::move(value));
}

}  // namespace keel::ckpt::detail
