// GptConfig parsing and validation (nlohmann-json). Every failure is one keel::Error line of the
// form "<source>: field '<name>': <what is wrong>" (or "<source>: <what>" for file-level problems).
// Required keys: vocab_size, seq_len, n_layer, n_head, d_model; every other key has a default.
#include "keel/gpt_config.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "keel/base/text.h"
#include "keel/base/vocabulary.h"
#include "keel/error.h"

namespace keel {
namespace {

using Json = nlohmann::json;

std::string jsonTypeName(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

class FieldReader {
 public:
  FieldReader(const Json& obj, const std::string& source) : obj_(obj), source_(source) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    // (a field name can be any key the file holds, 500 KB of it: a readable excerpt)
    throw Error(source_ + ": field '" + clipText(field, 80) + "': " + what);
  }

  void readInt(const char* key, int64_t& out, bool required = false) {
    const Json* v = find(key, required);
    if (!v) return;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(key, "integer out of range");
      out = int64_t(u);
    } else if (v->is_number_integer()) {
      out = v->get<int64_t>();
    } else {
      fail(key, "expected an integer, got " + describe(*v));
    }
  }
  void readDouble(const char* key, double& out) {
    const Json* v = find(key, false);
    if (!v) return;
    if (!v->is_number()) fail(key, "expected a number, got " + describe(*v));
    out = v->get<double>();
    if (!std::isfinite(out)) fail(key, "expected a finite number");
  }
  void readBool(const char* key, bool& out) {
    const Json* v = find(key, false);
    if (!v) return;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + describe(*v));
    out = v->get<bool>();
  }
  void readString(const char* key, std::string& out) {
    const Json* v = find(key, false);
    if (!v) return;
    if (!v->is_string()) fail(key, "expected a string, got " + describe(*v));
    out = v->get<std::string>();
    // A "\u0000" escape would cut the name short in every C string it later passes through.
    if (out.find('\0') != std::string::npos) fail(key, "contains a NUL character (\\u0000)");
  }
  bool has(const char* key) const { return obj_.contains(key); }

  // Rejects keys no reader asked for.
  void rejectUnknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!known_.count(it.key())) fail(it.key(), "unknown key");
  }

 private:
  const Json* find(const char* key, bool required) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) fail(key, "missing (required)");
      return nullptr;
    }
    return &*it;
  }
  static std::string describe(const Json& v) {
    if (v.is_null()) return "null";  // not "null null"
    std::string dumped = v.dump();
    if (dumped.size() > 40) dumped = dumped.substr(0, 37) + "...";
    return jsonTypeName(v) + " " + dumped;
  }

  const Json& obj_;
  const std::string& source_;
  std::set<std::string> known_;
};

// The attention keys: the mask kind, the parameters it needs (and no others), and pack_documents.
template <typename Fail>
void validateAttention(const GptConfig& c, const Fail& fail) {
  const bool sliding = c.attention_mask == "sliding_window",
             global = c.attention_mask == "global_sliding_window";
  if (c.attention_mask != "causal" && !sliding && !global && c.attention_mask != "causal_document")
    fail("attention_mask",
         "expected \"causal\", \"sliding_window\", \"global_sliding_window\" or "
         "\"causal_document\", got \"" +
             c.attention_mask + "\"");
  if (sliding || global) {
    if (c.attention_window < 1)
      fail("attention_window", "must be >= 1 with attention_mask \"" + c.attention_mask +
                                   "\", got " + std::to_string(c.attention_window));
  } else if (c.attention_window != 0) {
    fail("attention_window",
         "is only used with a sliding_window or global_sliding_window mask, "
         "not with attention_mask \"" +
             c.attention_mask + "\"");
  }
  if (global) {
    if (c.attention_global < 1 || c.attention_global >= c.seq_len)
      fail("attention_global", "must be in [1, seq_len) = [1, " + std::to_string(c.seq_len) +
                                   ") with attention_mask \"global_sliding_window\", got " +
                                   std::to_string(c.attention_global));
  } else if (c.attention_global != 0) {
    fail("attention_global",
         "is only used with a global_sliding_window mask, not with attention_mask \"" +
             c.attention_mask + "\"");
  }
  if (c.pack_documents && c.attention_mask != "causal_document")
    fail("pack_documents",
         "packed documents need attention_mask \"causal_document\" (the "
         "default with pack_documents), got \"" +
             c.attention_mask + "\"");
}

std::string bytesForPeople(long double b) {
  if (b < 1e18L) return formatBytes(uint64_t(b));
  std::ostringstream os;
  os.precision(3);
  os << double(b) << " bytes";
  return os.str();
}

// The memory the host can give a process: physical memory, or less under an address-space limit;
// *what names which, with its size ("this machine's 23.4 GiB of memory", or the limit).
long double hostMemoryBytes(std::string* what) {
  long double bytes = (long double)sysconf(_SC_PHYS_PAGES) * (long double)sysconf(_SC_PAGESIZE);
  if (!(bytes > 0)) bytes = std::numeric_limits<long double>::infinity();
  *what = "this machine's " + bytesForPeople(bytes) + " of memory";
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY &&
      (long double)as.rlim_cur < bytes) {
    bytes = (long double)as.rlim_cur;
    *what = "the address-space limit (ulimit -v) of " + bytesForPeople(bytes);
  }
  return bytes;
}

// Note [A config that cannot fit]
// A model or batch far beyond the machine (d_model or batch_size 2^62, n_layer 2^62) used to
// crash with SIGSEGV (an element count wrapping into a small buffer) or train until killed. The
// config is refused up front instead, from a lower estimate computed in long double (it cannot
// wrap): parameters with their gradients and AdamW's two moments (16 bytes each), and the
// float32 activations a training step keeps (per token and layer: about 12·d_model plus 3·d_ff
// per routed expert; per token: 3·vocab_size for the logits, their softmax and gradient).
// Refused when that exceeds physical memory (or RLIMIT_AS), naming the fields and the bytes.
// (Host memory: the trainer runs on the host backends; a device backend will check its own.)
void checkFitsInMemory(const GptConfig& c, const std::string& source) {
  using LD = long double;
  const LD d = LD(c.d_model), ff = LD(c.d_ff), L = LD(c.n_layer), V = LD(c.vocab_size),
           T = LD(c.seq_len), B = LD(c.batch_size);
  const LD experts = c.n_expert > 0 ? LD(c.n_expert) : 1, routed = c.n_expert > 0 ? LD(c.top_k) : 1;
  const LD params = 2 * V * d + (c.position == "learned" ? T * d : 0) +
                    L * (4 * d * d + experts * 3 * d * ff + (c.n_expert > 0 ? d * experts : 0));
  const LD paramBytes = params * 16;
  const LD activationBytes = B * T * (L * (12 * d + 3 * ff * routed) + 3 * V) * 4;
  std::string what;
  const LD limit = hostMemoryBytes(&what);
  if (paramBytes + activationBytes <= limit) return;
  std::ostringstream os;
  os << source << ": the model needs about " << bytesForPeople(paramBytes + activationBytes)
     << " to train, more than " << what << ": ";
  if (paramBytes >= activationBytes)
    os << "parameters and optimizer state " << bytesForPeople(paramBytes) << " (d_model "
       << c.d_model << ", d_ff " << c.d_ff << ", n_layer " << c.n_layer << ", vocab_size "
       << c.vocab_size << (c.n_expert > 0 ? ", n_expert " + std::to_string(c.n_expert) : "") << ")";
  else
    os << "activations " << bytesForPeople(activationBytes) << " (batch_size " << c.batch_size
       << ", seq_len " << c.seq_len << ", d_model " << c.d_model << ", d_ff " << c.d_ff
       << ", n_layer " << c.n_layer << ", vocab_size " << c.vocab_size
       << (c.n_expert > 0 ? ", top_k " + std::to_string(c.top_k) : "") << ")";
  throw Error(os.str());
}

}  // namespace

void validateGptConfig(const GptConfig& c, const std::string& source) {
  auto fail = [&](const char* field, const std::string& what) {
    throw Error(source + ": field '" + field + "': " + what);
  };
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(field, "must be a positive integer, got " + std::to_string(v));
  };
  auto num = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  positive("vocab_size", c.vocab_size);
  positive("seq_len", c.seq_len);
  positive("n_layer", c.n_layer);
  positive("n_head", c.n_head);
  positive("d_model", c.d_model);
  positive("d_ff", c.d_ff);
  if (c.d_model % c.n_head != 0)
    fail("n_head", "d_model (" + std::to_string(c.d_model) + ") is not divisible by n_head (" +
                       std::to_string(c.n_head) + ")");
  if (c.norm != "layernorm" && c.norm != "rmsnorm")
    fail("norm", "expected \"layernorm\" or \"rmsnorm\", got \"" + c.norm + "\"");
  if (c.position != "learned" && c.position != "rope")
    fail("position", "expected \"learned\" or \"rope\", got \"" + c.position + "\"");
  if (c.position == "rope" && c.d_model % c.n_head == 0 && c.headDim() % 2 != 0)
    fail("position",
         "\"rope\" turns pairs of a head's dims, so d_model / n_head must be even, got " +
             std::to_string(c.headDim()));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    fail("dropout", "must be in [0, 1), got " + num(c.dropout));
  if (c.n_expert < 0) fail("n_expert", "must be >= 0, got " + std::to_string(c.n_expert));
  if (c.n_expert > 0) {
    if (c.top_k < 1) fail("top_k", "must be >= 1, got " + std::to_string(c.top_k));
    if (c.top_k > c.n_expert)
      fail("top_k", "top_k (" + std::to_string(c.top_k) + ") exceeds n_expert (" +
                        std::to_string(c.n_expert) + ")");
    if (!(c.capacity_factor > 0.0))
      fail("capacity_factor", "must be > 0, got " + num(c.capacity_factor));
    if (!(c.aux_loss_coef >= 0.0))
      fail("aux_loss_coef", "must be >= 0, got " + num(c.aux_loss_coef));
  }
  validateAttention(c, fail);
  positive("batch_size", c.batch_size);
  if (!(c.lr > 0.0)) fail("lr", "must be > 0, got " + num(c.lr));
  if (!(c.min_lr >= 0.0 && c.min_lr <= c.lr))
    fail("min_lr", "must be in [0, lr], got " + num(c.min_lr) + " with lr " + num(c.lr));
  if (c.warmup_steps < 0)
    fail("warmup_steps", "must be >= 0, got " + std::to_string(c.warmup_steps));
  if (!(c.weight_decay >= 0.0)) fail("weight_decay", "must be >= 0, got " + num(c.weight_decay));
  if (!(c.grad_clip >= 0.0)) fail("grad_clip", "must be >= 0 (0: off), got " + num(c.grad_clip));
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    fail("optimizer", "expected \"adamw\" or \"sgd\", got \"" + c.optimizer + "\"");
  if (!(c.momentum >= 0.0 && c.momentum < 1.0))
    fail("momentum", "must be in [0, 1), got " + num(c.momentum));
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) fail("beta1", "must be in [0, 1), got " + num(c.beta1));
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) fail("beta2", "must be in [0, 1), got " + num(c.beta2));
  if (!(c.eps > 0.0)) fail("eps", "must be > 0, got " + num(c.eps));
  if (c.eval_every < 0)
    fail("eval_every", "must be >= 0 (0: never), got " + std::to_string(c.eval_every));
  positive("eval_batches", c.eval_batches);
  if (c.dtype != "float32") fail("dtype", "only \"float32\" is supported, got \"" + c.dtype + "\"");
  if (!c.allocator.empty() && !parseAllocatorKind(c.allocator))
    fail("allocator", "expected \"host\", \"caching\" or \"vmm\", got \"" + c.allocator + "\"");
  checkFitsInMemory(c, source);
}

GptConfig parseGptConfig(const std::string& jsonText, const std::string& source) {
  Json j;
  try {
    checkJsonDepth(jsonText, source);  // Note [Bounded JSON]
    j = Json::parse(jsonText);
  } catch (const Json::exception& e) {
    throw Error(source + ": invalid JSON: " + jsonErrorText(e.what()));
  }
  if (!j.is_object())
    throw Error(source + ": expected a JSON object at the top level, got " + jsonTypeName(j));

  GptConfig c;
  FieldReader r(j, source);
  r.readString("name", c.name);
  r.readInt("vocab_size", c.vocab_size, true);
  r.readInt("seq_len", c.seq_len, true);
  r.readInt("n_layer", c.n_layer, true);
  r.readInt("n_head", c.n_head, true);
  r.readInt("d_model", c.d_model, true);
  // (Saturating: a d_model past 2^61 must not wrap the default into 0; the memory check refuses.)
  if (__builtin_mul_overflow(int64_t(4), c.d_model, &c.d_ff))
    c.d_ff = std::numeric_limits<int64_t>::max();
  r.readInt("d_ff", c.d_ff);
  r.readString("norm", c.norm);
  r.readString("position", c.position);
  r.readDouble("dropout", c.dropout);
  r.readInt("n_expert", c.n_expert);
  r.readInt("top_k", c.top_k);
  r.readDouble("capacity_factor", c.capacity_factor);
  r.readDouble("aux_loss_coef", c.aux_loss_coef);
  r.readBool("pack_documents", c.pack_documents);
  if (c.pack_documents) c.attention_mask = "causal_document";
  r.readString("attention_mask", c.attention_mask);
  r.readInt("attention_window", c.attention_window);
  r.readInt("attention_global", c.attention_global);
  r.readInt("batch_size", c.batch_size);
  r.readDouble("lr", c.lr);
  c.min_lr = c.lr * 0.1;
  r.readDouble("min_lr", c.min_lr);
  r.readInt("warmup_steps", c.warmup_steps);
  r.readDouble("weight_decay", c.weight_decay);
  r.readDouble("grad_clip", c.grad_clip);
  r.readString("optimizer", c.optimizer);
  r.readDouble("momentum", c.momentum);
  r.readBool("nesterov", c.nesterov);
  r.readDouble("beta1", c.beta1);
  r.readDouble("beta2", c.beta2);
  r.readDouble("eps", c.eps);
  r.readInt("eval_every", c.eval_every);
  r.readInt("eval_batches", c.eval_batches);
  r.readString("dtype", c.dtype);
  r.readString("allocator", c.allocator);
  r.rejectUnknown();
  // A sliding mask's parameters are required: the defaults (0) are no window, and "must be >= 1,
  // got 0" named a value the user never wrote.
  const bool sliding = c.attention_mask == "sliding_window",
             global = c.attention_mask == "global_sliding_window";
  if ((sliding || global) && !r.has("attention_window"))
    r.fail("attention_window",
           "missing (required with attention_mask \"" + c.attention_mask + "\")");
  if (global && !r.has("attention_global"))
    r.fail("attention_global",
           "missing (required with attention_mask \"" + c.attention_mask + "\")");
  validateGptConfig(c, source);
  return c;
}

// Every field parseGptConfig reads, by the same names (keep the two in step).
std::string gptConfigJson(const GptConfig& c) {
  const Json j = {{"name", c.name},
                  {"vocab_size", c.vocab_size},
                  {"seq_len", c.seq_len},
                  {"n_layer", c.n_layer},
                  {"n_head", c.n_head},
                  {"d_model", c.d_model},
                  {"d_ff", c.d_ff},
                  {"norm", c.norm},
                  {"position", c.position},
                  {"dropout", c.dropout},
                  {"n_expert", c.n_expert},
                  {"top_k", c.top_k},
                  {"capacity_factor", c.capacity_factor},
                  {"aux_loss_coef", c.aux_loss_coef},
                  {"pack_documents", c.pack_documents},
                  {"attention_mask", c.attention_mask},
                  {"attention_window", c.attention_window},
                  {"attention_global", c.attention_global},
                  {"batch_size", c.batch_size},
                  {"lr", c.lr},
                  {"min_lr", c.min_lr},
                  {"warmup_steps", c.warmup_steps},
                  {"weight_decay", c.weight_decay},
                  {"grad_clip", c.grad_clip},
                  {"optimizer", c.optimizer},
                  {"momentum", c.momentum},
                  {"nesterov", c.nesterov},
                  {"beta1", c.beta1},
                  {"beta2", c.beta2},
                  {"eps", c.eps},
                  {"eval_every", c.eval_every},
                  {"eval_batches", c.eval_batches},
                  {"dtype", c.dtype},
                  {"allocator", c.allocator}};
  return j.dump();
}

GptConfig loadGptConfig(const std::string& path) {
  std::string text = readFile(path, "config file", kMaxConfigBytes);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error(path + ": config file is empty");
  return parseGptConfig(text, path);
}

void checkGptLayout(const GptConfig& cfg, int dp, int tp, int ep, int cp) {
  const int slices = dp / std::max(1, cp);
  KEEL_CHECK(slices >= 1 && cfg.batch_size % slices == 0, "data parallelism: dp ", slices,
             " does not divide config field 'batch_size' ", cfg.batch_size,
             " (each rank trains on batch_size / dp rows of the global batch",
             cp > 1 ? ", dp counting a cp group once" : "", ")");
  KEEL_CHECK(tp <= 1 || !cfg.isMoe(), "tensor parallelism: tp ", tp,
             " needs a dense model; this config has ", cfg.n_expert,
             " experts (split the experts with --ep instead)");
  KEEL_CHECK(ep <= 1 || cfg.isMoe(), "expert parallelism: --ep ", ep,
             " needs a mixture-of-experts model; this config is dense (n_expert 0)");
  KEEL_CHECK(cfg.n_head % tp == 0, "tensor parallelism: tp ", tp, " does not divide n_head ",
             cfg.n_head, " (attention splits by heads)");
  KEEL_CHECK(cfg.isMoe() || cfg.d_ff % tp == 0, "tensor parallelism: tp ", tp,
             " does not divide d_ff ", cfg.d_ff);
  KEEL_CHECK(!cfg.isMoe() || cfg.n_expert % ep == 0, "expert parallelism: --ep ", ep,
             " does not divide config field 'n_expert' ", cfg.n_expert);
}

}  // namespace keel
