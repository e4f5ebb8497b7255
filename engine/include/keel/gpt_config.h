// GptConfig: the model and training settings of a GPT run, read from a JSON file. Parsing is
// strict: every key must be known and of the right type, and every value in range; anything else
// throws keel::Error with one line naming the file and the field.
#pragma once
#include <cstdint>
#include <string>

namespace keel {

struct GptConfig {
  std::string name;  // free text, shown in summaries

  // Model.
  int64_t vocab_size = 256;
  int64_t seq_len = 64;
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t d_model = 64;
  int64_t d_ff = 256;              // SwiGLU hidden size; a file without it gets 4 * d_model
  std::string norm = "layernorm";  // "layernorm" | "rmsnorm"
  double dropout = 0.0;            // [0, 1)
  int64_t n_expert = 0;            // 0: dense SwiGLU MLP; > 0: mixture of experts
  int64_t top_k = 2;               // experts per token, 1..n_expert (MoE only)
  double capacity_factor = 1.25;   // > 0 (MoE only)
  double aux_loss_coef = 0.01;     // >= 0 (MoE only)
  // "learned": a position embedding (wpe) added to the token embedding; "rope": no wpe, rotary
  // position embedding (the rope op, base 10000) on q and k in every attention layer.
  std::string position = "learned";
  // Attention mask of every layer (flashmask_attention, docs/flashmask.md): "causal" |
  // "sliding_window" (attention_window) | "global_sliding_window" (attention_window,
  // attention_global) | "causal_document" (documents of a packed row never see each other; the
  // document boundaries are the data's separator tokens, see keel/data.h).
  std::string attention_mask = "causal";
  int64_t attention_window = 0;  // sliding masks: keys a query sees, itself included (>= 1)
  int64_t attention_global = 0;  // global_sliding_window: leading tokens every query sees (>= 1)

  // Training.
  int64_t batch_size = 8;
  double lr = 3e-4;      // peak learning rate, > 0
  double min_lr = 3e-5;  // end of the cosine decay, in [0, lr]
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double grad_clip = 1.0;           // 0: no clipping
  std::string optimizer = "adamw";  // "adamw" | "sgd"
  double momentum = 0.9;            // sgd only, [0, 1)
  bool nesterov = false;            // sgd only
  double beta1 = 0.9;               // adamw only, [0, 1)
  double beta2 = 0.95;              // adamw only, [0, 1)
  double eps = 1e-8;                // adamw only, > 0
  // Validation loss during training: every eval_every steps (0: never), the mean lm loss of
  // eval_batches validation batches, reported with the step (StepStats::valLoss, recordings'
  // steps.val_loss, the studio's metrics plot). Training is bitwise the same either way.
  int64_t eval_every = 0;
  int64_t eval_batches = 4;       // >= 1
  std::string dtype = "float32";  // only "float32" for now
  // Allocator for host tensors: "host" | "caching" | "vmm"; "" leaves the choice to
  // KEEL_ALLOCATOR (default vmm). `keel train/record --alloc` overrides it.
  std::string allocator;
  // Train on packed documents: rows hold several documents and attention never crosses a
  // document boundary. Implies (and requires) attention_mask "causal_document".
  bool pack_documents = false;

  bool isMoe() const { return n_expert > 0; }
  bool operator==(const GptConfig&) const = default;
  int64_t headDim() const { return d_model / n_head; }
};

// Reads and validates a config file. Throws keel::Error ("<path>: field 'x': ...").
GptConfig loadGptConfig(const std::string& path);
// Validates JSON text; `source` names it in messages (a path, or "<string>").
GptConfig parseGptConfig(const std::string& jsonText, const std::string& source = "<string>");
// The config as JSON text, every field: parseGptConfig reads it back to the same config (a
// training checkpoint records it, so a resume with other settings is named).
std::string gptConfigJson(const GptConfig& cfg);
// Checks ranges and cross-field rules of a config built in code (same messages as parsing).
void validateGptConfig(const GptConfig& cfg, const std::string& source = "<config>");

// Whether the parallel layout fits the config — dp (a cp group counted once) divides
// batch_size, tp divides n_head and d_ff of a dense model, ep divides n_expert of a MoE model —
// in the words the trainer and the model use; keel::Error otherwise. The trainer checks it on
// every rank; `keel launch` before it starts them (one line instead of one per rank).
void checkGptLayout(const GptConfig& cfg, int dp, int tp, int ep, int cp);

}  // namespace keel
