// The restricted pickle reader (Note [Restricted unpickler] in pickle.h).
#include "pickle.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace keel::storage::pickle {

namespace {

// What one held value is counted as: a Value in a vector that grows by doubling (1.5x on average).
constexpr int64_t kValueBytes = int64_t(sizeof(Value)) * 3 / 2;
// A node as malloc holds it (its header and rounding): counted as 64 bytes, a 38 MB pickle of
// empty lists took 5.5 GiB before the 4 GiB budget refused it.
constexpr int64_t kNodeBytes = int64_t(sizeof(Node)) + 16;

// Opcodes that build data (protocols 2 to 5).
enum : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  NONE = 'N',
  BINFLOAT = 'G',
  BINUNICODE = 'X',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  APPEND = 'a',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  SETITEMS = 'u',
  TUPLE = 't',
  EMPTY_TUPLE = ')',
  EMPTY_LIST = ']',
  EMPTY_DICT = '}',
  PROTO = 0x80,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

// The opcodes refused by name (anything else is "unknown opcode 0xNN"), and whether running one
// would call code (the others build data a memory snapshot never holds).
struct Refused {
  uint8_t code;
  const char* name;
  bool runsCode;
};
constexpr Refused kRefused[] = {
    {'c', "GLOBAL", true},
    {0x93, "STACK_GLOBAL", true},
    {'R', "REDUCE", true},
    {'b', "BUILD", true},
    {'i', "INST", true},
    {'o', "OBJ", true},
    {0x81, "NEWOBJ", true},
    {0x92, "NEWOBJ_EX", true},
    {'P', "PERSID", true},
    {'Q', "BINPERSID", true},
    {0x82, "EXT1", true},
    {0x83, "EXT2", true},
    {0x84, "EXT4", true},
    {0x96, "BYTEARRAY8", false},
    {0x97, "NEXT_BUFFER", false},
    {0x98, "READONLY_BUFFER", false},
    {0x8f, "EMPTY_SET", false},
    {0x90, "ADDITEMS", false},
    {0x91, "FROZENSET", false},
    {'I', "INT", false},
    {'L', "LONG", false},
    {'F', "FLOAT", false},
    {'S', "STRING", false},
    {'T', "BINSTRING", false},
    {'U', "SHORT_BINSTRING", false},
    {'V', "UNICODE", false},
    {'p', "PUT", false},
    {'g', "GET", false},
    {'d', "DICT", false},
    {'l', "LIST", false},
    {'2', "DUP", false},
};

const Refused* refused(uint8_t op) {
  for (const Refused& r : kRefused)
    if (r.code == op) return &r;
  return nullptr;
}

uint64_t littleEndian(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

const std::vector<Value>& noItems() {
  static const std::vector<Value> none;
  return none;
}

}  // namespace

Node::~Node() {
  if (live) *live -= kNodeBytes + int64_t(str.size()) + kValueBytes * int64_t(items.size());
}

void Node::dropItems() {
  if (!frozen) return;
  if (live) *live -= kValueBytes * int64_t(items.size());
  std::vector<Value>().swap(items);
}

std::string_view Value::str() const {
  return (kind == Kind::Str || kind == Kind::Bytes) && node ? std::string_view(node->str)
                                                            : std::string_view();
}

const std::vector<Value>& Value::items() const {
  return (kind == Kind::List || kind == Kind::Tuple || kind == Kind::Dict) && node ? node->items
                                                                                   : noItems();
}

const Value* Value::get(std::string_view key) const {
  if (kind != Kind::Dict || !node) return nullptr;
  const std::vector<Value>& kv = node->items;
  for (size_t k = 0; k + 1 < kv.size(); k += 2)
    if (kv[k].kind == Kind::Str && kv[k].node->str == key) return &kv[k + 1];
  return nullptr;
}

// One decoded opcode: its code, its integer argument (ints, lengths, memo indices) and, for
// strings and bytes when asked, its payload.
struct Reader::Op {
  uint8_t code = 0;
  int64_t arg = 0;
  double f = 0;
  std::string payload;
};

Reader::Reader(std::FILE* file, uint64_t size, std::string name, Limits limits)
    : file_(file),
      size_(size),
      start_(std::ftell(file)),
      name_(std::move(name)),
      limits_(limits),
      buf_(size_t(1) << 16) {}

void Reader::fail(const std::string& what) const {
  throw PickleError(name_ + ": not a memory snapshot Keel can read: " + what + " (byte " +
                    std::to_string(opStart_) + ")");
}

void Reader::fill() {
  bufPos_ = 0;
  bufLen_ = std::fread(buf_.data(), 1, buf_.size(), file_);
  if (bufLen_ == 0)
    fail(std::ferror(file_) ? std::string("read error: ") + std::strerror(errno)
                            : "the file ends in the middle of the pickle");
}

// byte(), take() and addChild() run once or more per opcode: kept inline.
[[gnu::always_inline]] inline uint8_t Reader::byte() {
  if (offset_ >= size_) fail("the file ends in the middle of the pickle");
  if (bufPos_ == bufLen_) fill();
  ++offset_;
  return buf_[bufPos_++];
}

[[gnu::always_inline]] inline void Reader::take(void* out, uint64_t n) {
  if (n > size_ - offset_)
    fail("a length of " + std::to_string(n) + " bytes runs past the file's end");
  auto* o = static_cast<uint8_t*>(out);
  if (n <= bufLen_ - bufPos_) {
    std::memcpy(o, buf_.data() + bufPos_, n);
    bufPos_ += n;
    offset_ += n;
    return;
  }
  while (n) {
    if (bufPos_ == bufLen_) fill();
    const size_t k = std::min<uint64_t>(n, bufLen_ - bufPos_);
    std::memcpy(o, buf_.data() + bufPos_, k);
    o += k;
    bufPos_ += k;
    offset_ += k;
    n -= k;
  }
}

void Reader::skip(uint64_t n) {
  if (n > size_ - offset_)
    fail("a length of " + std::to_string(n) + " bytes runs past the file's end");
  const uint64_t inBuf = std::min<uint64_t>(n, bufLen_ - bufPos_);
  bufPos_ += inBuf;
  offset_ += inBuf;
  n -= inBuf;
  if (n == 0) return;
  if (std::fseek(file_, long(n), SEEK_CUR) != 0)
    fail(std::string("seek error: ") + std::strerror(errno));
  offset_ += n;
  bufPos_ = bufLen_ = 0;
}

// Decodes the next opcode and its argument; false at STOP.
bool Reader::next(Op& op, bool payload) {
  opStart_ = offset_;
  op.code = byte();
  if (opStart_ == 0 && op.code != PROTO)
    fail("not a pickle of protocol 2 or later (no PROTO opcode)");
  uint8_t b[8];
  auto fixed = [&](int n) {
    take(b, uint64_t(n));
    return littleEndian(b, n);
  };
  auto data = [&](uint64_t n) {
    if (payload) {
      if (n > size_ - offset_)
        fail("a length of " + std::to_string(n) + " bytes runs past the file's end");
      op.payload.resize(n);
      take(op.payload.data(), n);
    } else {
      skip(n);
    }
  };
  switch (op.code) {
    case STOP:
      return false;
    case PROTO:
      op.arg = byte();
      if (op.arg < 2 || op.arg > 5)
        fail("pickle protocol " + std::to_string(op.arg) + " (a snapshot is written with 2 to 5)");
      break;
    case FRAME:
      if (fixed(8) > size_ - offset_) fail("a frame runs past the file's end");
      break;
    case BININT:
      op.arg = int32_t(uint32_t(fixed(4)));
      break;
    case BININT1:
      op.arg = byte();
      break;
    case BININT2:
      op.arg = int64_t(fixed(2));
      break;
    case LONG1:
    case LONG4: {
      const uint64_t n = op.code == LONG1 ? byte() : fixed(4);
      if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (Keel reads up to 64 bits)");
      uint8_t v[8] = {};
      take(v, n);
      uint64_t u = littleEndian(v, int(n));
      if (n > 0 && n < 8 && (v[n - 1] & 0x80)) u |= ~uint64_t(0) << (8 * n);  // sign-extend
      op.arg = int64_t(u);
      break;
    }
    case BINFLOAT: {
      take(b, 8);
      uint64_t u = 0;
      for (int k = 0; k < 8; ++k) u = (u << 8) | b[k];  // big-endian
      op.f = std::bit_cast<double>(u);
      break;
    }
    case SHORT_BINUNICODE:
    case SHORT_BINBYTES:
      data(byte());
      break;
    case BINUNICODE:
    case BINBYTES:
      data(fixed(4));
      break;
    case BINUNICODE8:
    case BINBYTES8:
      data(fixed(8));
      break;
    case BINGET:
    case BINPUT:
      op.arg = byte();
      break;
    case LONG_BINGET:
    case LONG_BINPUT:
      op.arg = int64_t(fixed(4));
      break;
    case MARK:
    case POP:
    case POP_MARK:
    case NONE:
    case NEWTRUE:
    case NEWFALSE:
    case EMPTY_TUPLE:
    case EMPTY_LIST:
    case EMPTY_DICT:
    case TUPLE:
    case TUPLE1:
    case TUPLE2:
    case TUPLE3:
    case APPEND:
    case APPENDS:
    case SETITEM:
    case SETITEMS:
    case MEMOIZE:
      break;
    default: {
      const Refused* r = refused(op.code);
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op.code);
      if (!r) fail(std::string("unknown opcode ") + hex);
      fail(std::string("opcode ") + r->name + " (" + hex + ")" +
           (r->runsCode ? ", which would run code: Keel's reader builds plain data only"
                        : ", which a memory snapshot never uses"));
    }
  }
  return true;
}

// Pass 1: which memo indices are ever fetched (GET). No objects are built.
void Reader::scanMemoUses() {
  Op op;
  uint32_t kept = 0;
  while (next(op, false)) {
    if (op.code == MEMOIZE || op.code == BINPUT || op.code == LONG_BINPUT) {
      // Python's pickler stores at index len(memo): the next index, or one already used.
      const uint64_t idx = op.code == MEMOIZE ? memoSlot_.size() : uint64_t(op.arg);
      if (idx > memoSlot_.size())
        fail("a memo store at index " + std::to_string(idx) + " out of order");
      if (idx == memoSlot_.size()) {
        if (memoSlot_.size() >= kNotKept) fail("more memo entries than Keel reads");
        memoSlot_.push_back(kNotKept);
      }
    } else if (op.code == BINGET || op.code == LONG_BINGET) {
      const uint64_t idx = uint64_t(op.arg);
      if (idx >= memoSlot_.size())
        fail("a memo fetch of entry " + std::to_string(idx) + ", which was never stored");
      if (memoSlot_[idx] == kNotKept) memoSlot_[idx] = kept++;
    }
  }
  memo_.resize(kept);
}

Value Reader::makeNode(Kind k) {
  Value v;
  v.kind = k;
  v.node = NodeRef(new Node);
  v.node->live = live_;
  (*live_) += kNodeBytes;
  return v;
}

[[gnu::always_inline]] inline void Reader::push(Value v) {
  if ((*live_) + kValueBytes > limits_.maxBytes)
    fail("it would hold more than " + std::to_string(limits_.maxBytes >> 20) + " MiB of values");
  (*live_) += kValueBytes;
  stack_.push_back(std::move(v));
}

size_t Reader::markPos() const {
  for (size_t k = stack_.size(); k-- > 0;)
    if (stack_[k].kind == Kind::Mark) return k;
  fail("a MARK is missing");
}

[[gnu::always_inline]] inline void Reader::addChild(Node& parent, Value child) {
  if (child.node && child.kind != Kind::Str && child.kind != Kind::Bytes) {
    child.node->frozen = true;
    const uint32_t h = child.node->height + 1;
    if (h > limits_.maxDepth)
      fail("containers nested more than " + std::to_string(limits_.maxDepth) + " deep");
    parent.height = std::max(parent.height, h);
  }
  if ((*live_) + kValueBytes > limits_.maxBytes)
    fail("it would hold more than " + std::to_string(limits_.maxBytes >> 20) + " MiB of values");
  (*live_) += kValueBytes;
  parent.items.push_back(std::move(child));
}

Value Reader::load(const AppendHook& hook) {
  if (size_ == 0) fail("the file is empty");
  scanMemoUses();
  if (std::fseek(file_, start_, SEEK_SET) != 0)
    fail(std::string("seek error: ") + std::strerror(errno));
  offset_ = 0;
  bufPos_ = bufLen_ = 0;

  auto pop = [&] {
    if (stack_.empty() || stack_.back().kind == Kind::Mark) fail("the stack is empty");
    Value v = std::move(stack_.back());
    stack_.pop_back();
    (*live_) -= kValueBytes;
    return v;
  };
  auto popToMark = [&] {
    const size_t m = markPos();
    std::vector<Value> items(std::make_move_iterator(stack_.begin() + long(m + 1)),
                             std::make_move_iterator(stack_.end()));
    (*live_) -= kValueBytes * int64_t(stack_.size() - m);
    stack_.resize(m);
    return items;
  };
  auto mutableTop = [&](Kind k, const char* what) -> Node& {
    if (stack_.empty() || stack_.back().kind != k)
      fail(std::string(what) + " without a " + (k == Kind::List ? "list" : "dict") + " below it");
    Node& n = *stack_.back().node;
    if (n.frozen) fail(std::string(what) + " changes a container that is already shared");
    return n;
  };
  auto makeTuple = [&](std::vector<Value> items) {
    Value t = makeNode(Kind::Tuple);
    for (Value& v : items) addChild(*t.node, std::move(v));
    t.node->frozen = true;
    push(std::move(t));
  };
  auto appendTo = [&](std::vector<Value> items, const char* what) {
    Node& list = mutableTop(Kind::List, what);
    if (hook && hook(stack_, stack_.size() - 1, items)) return;
    list.items.reserve(list.items.size() + items.size());
    for (Value& v : items) addChild(list, std::move(v));
  };

  Op op;
  while (next(op, true)) {
    switch (op.code) {
      case PROTO:
      case FRAME:
        break;
      case MARK: {
        Value m;
        m.kind = Kind::Mark;
        push(std::move(m));
        break;
      }
      case POP:
        pop();
        break;
      case POP_MARK:
        popToMark();
        break;
      case NONE:
        push({});
        break;
      case NEWTRUE:
      case NEWFALSE: {
        Value v;
        v.kind = Kind::Bool;
        v.i = op.code == NEWTRUE;
        push(std::move(v));
        break;
      }
      case BININT:
      case BININT1:
      case BININT2:
      case LONG1:
      case LONG4: {
        Value v;
        v.kind = Kind::Int;
        v.i = op.arg;
        push(std::move(v));
        break;
      }
      case BINFLOAT: {
        Value v;
        v.kind = Kind::Float;
        v.f = op.f;
        push(std::move(v));
        break;
      }
      case SHORT_BINUNICODE:
      case BINUNICODE:
      case BINUNICODE8:
      case SHORT_BINBYTES:
      case BINBYTES:
      case BINBYTES8: {
        const bool text =
            op.code == SHORT_BINUNICODE || op.code == BINUNICODE || op.code == BINUNICODE8;
        Value v = makeNode(text ? Kind::Str : Kind::Bytes);
        if ((*live_) + int64_t(op.payload.size()) > limits_.maxBytes)
          fail("it would hold more than " + std::to_string(limits_.maxBytes >> 20) +
               " MiB of values");
        (*live_) += int64_t(op.payload.size());
        v.node->str = std::move(op.payload);
        op.payload = {};
        push(std::move(v));
        break;
      }
      case EMPTY_LIST:
        push(makeNode(Kind::List));
        break;
      case EMPTY_DICT:
        push(makeNode(Kind::Dict));
        break;
      case EMPTY_TUPLE:
        makeTuple({});
        break;
      case TUPLE:
        makeTuple(popToMark());
        break;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const size_t n = size_t(op.code - TUPLE1 + 1);
        std::vector<Value> items(n);
        for (size_t k = n; k-- > 0;) items[k] = pop();
        makeTuple(std::move(items));
        break;
      }
      case APPEND: {
        std::vector<Value> items;
        items.push_back(pop());
        appendTo(std::move(items), "APPEND");
        break;
      }
      case APPENDS: {
        std::vector<Value> items = popToMark();
        appendTo(std::move(items), "APPENDS");
        break;
      }
      case SETITEM:
      case SETITEMS: {
        std::vector<Value> kv;
        if (op.code == SETITEM) {
          Value v = pop();
          kv.push_back(pop());
          kv.push_back(std::move(v));
        } else {
          kv = popToMark();
          if (kv.size() % 2) fail("SETITEMS with a key and no value");
        }
        Node& dict = mutableTop(Kind::Dict, op.code == SETITEM ? "SETITEM" : "SETITEMS");
        for (size_t k = 0; k < kv.size(); k += 2) {
          if (kv[k].kind == Kind::List || kv[k].kind == Kind::Dict)
            fail("a dict key that is a list or a dict");
          addChild(dict, std::move(kv[k]));
          addChild(dict, std::move(kv[k + 1]));
        }
        break;
      }
      case MEMOIZE:
      case BINPUT:
      case LONG_BINPUT: {
        if (stack_.empty() || stack_.back().kind == Kind::Mark)
          fail("a memo store with an empty stack");
        const uint32_t idx = op.code == MEMOIZE ? memoNext_ : uint32_t(op.arg);
        if (idx == memoNext_) ++memoNext_;
        const uint32_t slot = memoSlot_[idx];  // (pass 1 checked the index)
        if (slot == kNotKept) break;           // never fetched again: not kept
        Value& v = stack_.back();
        if (v.node && v.node->memo < 0) v.node->memo = idx;
        memo_[slot] = v;
        break;
      }
      case BINGET:
      case LONG_BINGET: {
        const Value& v = memo_[memoSlot_[uint32_t(op.arg)]];  // (pass 1 checked it)
        if (v.node && v.kind != Kind::Str && v.kind != Kind::Bytes) v.node->frozen = true;
        push(v);
        break;
      }
      default:
        fail("internal: an opcode decoded but not run");
    }
  }
  if (stack_.size() != 1 || stack_.back().kind == Kind::Mark)
    fail("the pickle stops with " + std::to_string(stack_.size()) +
         " values on its stack, not one");
  Value result = std::move(stack_.back());
  stack_.clear();
  (*live_) -= kValueBytes;
  return result;
}

}  // namespace keel::storage::pickle
