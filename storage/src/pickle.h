// A restricted reader of Python pickles: the data a pickle can hold (None, bools, ints, floats,
// strings, bytes, lists, tuples, dicts) and nothing that runs code. Used to import PyTorch memory
// snapshots (torch_memory.cpp); see Note [Restricted unpickler].
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keel::storage::pickle {

// Note [Restricted unpickler]
// A pickle is a program for a stack machine, and Python's unpickler runs any callable it names
// (GLOBAL + REDUCE is `os.system("...")`), so Keel never hands a user's file to one. This reader
// knows only the opcodes that build plain data (protocols 2 to 5): every other opcode — GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, the extension registry, out-of-band
// buffers, sets, protocol 0's text opcodes — is refused by name, at its byte offset.
// Bounded, whatever the file claims:
// - every length is checked against the bytes left in the file before anything is allocated;
// - containers nest at most Limits::maxDepth deep (destroying them recurses that deep, no more);
// - a container may be changed only while it is new: once it is inside another container or was
//   fetched from the memo it is frozen, so a pickle cannot build a cycle (`l.append(l)`), which
//   reference counting would leak and a walk would never finish;
// - what is held (the stack, containers, strings) is counted, and a file that would hold more
//   than Limits::maxBytes is refused;
// - the memo keeps only the entries the file fetches again: a first pass over the opcodes (no
//   objects built) finds which memo indices a GET names, so everything else is freed as soon as
//   nothing else holds it. With the append hook below taking a snapshot's trace entries as they
//   arrive, a 2 GB snapshot is read holding its segments and its shared frames, not its trace.
// Every refusal is a PickleError: one line with the file's name and the byte offset.

class PickleError : public std::runtime_error {
 public:
  explicit PickleError(const std::string& msg) : std::runtime_error(msg) {}
};

enum class Kind : uint8_t { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Mark };

struct Node;

// A counted reference to a Node. Not atomic: a Reader and what it built belong to one thread.
class NodeRef {
 public:
  NodeRef() = default;
  explicit NodeRef(Node* n);
  NodeRef(const NodeRef& o);
  NodeRef(NodeRef&& o) noexcept : n_(o.n_) { o.n_ = nullptr; }
  NodeRef& operator=(NodeRef o) noexcept {
    std::swap(n_, o.n_);
    return *this;
  }
  ~NodeRef();
  Node* get() const { return n_; }
  Node* operator->() const { return n_; }
  Node& operator*() const { return *n_; }
  explicit operator bool() const { return n_ != nullptr; }

 private:
  Node* n_ = nullptr;
};

// One value. Ints are int64 (a pickle's larger ints are refused); strings, bytes and containers
// live in a shared Node.
struct Value {
  Kind kind = Kind::None;
  int64_t i = 0;  // Int, Bool
  double f = 0;   // Float
  NodeRef node;

  bool isInt() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool isStr() const { return kind == Kind::Str; }
  bool isList() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool isDict() const { return kind == Kind::Dict; }
  std::string_view str() const;                  // "" unless Str or Bytes
  const std::vector<Value>& items() const;       // List, Tuple; Dict: key, value, key, value, ...
  const Value* get(std::string_view key) const;  // a Dict's value under a string key, or null
};

struct Node {
  std::string str;
  std::vector<Value> items;
  int64_t memo = -1;  // the memo index holding this node for the whole read, else -1
  int64_t tag = -1;   // free for the reader's user (what it made of a shared node)
  uint32_t refs = 0;
  uint32_t height = 0;  // containers: 1 + the tallest container inside
  bool frozen = false;
  std::shared_ptr<int64_t> live;  // the Reader's count of bytes held; decremented on destruction
  ~Node();
  // Frees the items of a frozen container the reader's user has converted (and tagged): the
  // memo may keep the node for later fetches, and those find the tag, not the items.
  void dropItems();
};

inline NodeRef::NodeRef(Node* n) : n_(n) {
  if (n_) ++n_->refs;
}
inline NodeRef::NodeRef(const NodeRef& o) : n_(o.n_) {
  if (n_) ++n_->refs;
}
inline NodeRef::~NodeRef() {
  if (n_ && --n_->refs == 0) delete n_;
}

struct Limits {
  uint32_t maxDepth = 64;
  int64_t maxBytes = int64_t(4) << 30;  // what the values held may take, counted roughly
};

class Reader {
 public:
  // `file` is read from its current position to its end (`size` bytes), twice.
  Reader(std::FILE* file, uint64_t size, std::string name, Limits limits = {});

  // Called before APPEND/APPENDS adds `items` to the list at stack[listPos]: a hook that takes
  // them (returns true) leaves the list as it was, and the items are freed once it is done.
  using AppendHook = std::function<bool(const std::vector<Value>& stack, size_t listPos,
                                        std::vector<Value>& items)>;

  // Runs the pickle to its STOP; returns the value it built. Throws PickleError.
  Value load(const AppendHook& hook = {});

  const std::string& name() const { return name_; }

 private:
  struct Op;
  void scanMemoUses();
  bool next(Op& op, bool payload);
  void fill();
  uint8_t byte();
  void take(void* out, uint64_t n);
  void skip(uint64_t n);
  [[noreturn]] void fail(const std::string& what) const;
  Value makeNode(Kind k);
  void push(Value v);
  size_t markPos() const;
  void addChild(Node& parent, Value child);

  std::FILE* file_;
  uint64_t size_;
  long start_;
  std::string name_;
  Limits limits_;
  std::vector<uint8_t> buf_;
  size_t bufPos_ = 0, bufLen_ = 0;
  uint64_t offset_ = 0;   // of the next byte, from the start of the pickle
  uint64_t opStart_ = 0;  // of the opcode being run
  std::vector<Value> stack_;
  // Memo indices: every store's index -> its slot in memo_ when a GET names it, else kNotKept.
  static constexpr uint32_t kNotKept = UINT32_MAX;
  std::vector<uint32_t> memoSlot_;
  std::vector<Value> memo_;
  uint32_t memoNext_ = 0;  // the next store's index
  std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
};

}  // namespace keel::storage::pickle
