// Training checkpoints: a Trainer's parameters, optimizer state and progress saved as a sharded
// FlexCheckpoint, and restored so that the run continues bit for bit. See Note [Resume bit for
// bit].
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt_internal.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/data.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/nn.h"
#include "keel/observer.h"
#include "keel/ops.h"
#include "keel/optim.h"
#include "keel/safetensors.h"
#include "keel/train.h"

namespace keel::ckpt {

// Note [Resume bit for bit]
// A training run is a pure function of (config, device, seed, dataset, total steps) and its
// position. Besides the weights, a checkpoint therefore holds: AdamW's exp_avg and exp_avg_sq
// ("<param>::exp_avg", "<param>::exp_avg_sq") and per-parameter step counter ("<param>::step",
// the bias correction), or SGD's momentum; the number of steps done (the learning-rate schedule
// is a function of it); the run's seed (evaluation batches derive from it); and the positions
// (seed, offset) of the two Philox generators — the batch sampler (the data position) and the
// model's dropout generator. Gradients are not saved: every step starts from zeroGrad. Loading
// overwrites all of it in a freshly built Trainer, so step k+1 after a resume computes exactly
// what step k+1 of the uninterrupted run computed, whatever the tensor-parallel layout the
// checkpoint was saved in (resharding moves bytes, never values).
//
// Note [Multi-rank checkpoints]: a checkpoint describes every tensor from a single-device point
// of view (global shape; each shard a box in it), so each rank of a multi-rank run writes its own
// file, `model-RRRRR-of-WWWWW.safetensors` (RRRRR its rank, WWWWW the number of ranks), holding
// the boxes only it has — a rank with none writes no file, so a dp-only run of 2 ranks writes
// model-00000-of-00002 alone (the names say who wrote a file; the metadata lists the files): its
// tensor-parallel part of a sharded key (a fused q/k/v weight's part is three boxes, stored as KEY,
// KEY#1, KEY#2), written by the first data-parallel replica (an expert's by the first rank holding
// it: Note [Expert-parallel MoE]); a replicated key by tensor-parallel rank 0 of that replica;
// under --zero (Note [Sharded optimizer state]) each dp rank's rows of the optimizer moments; a
// step counter with its parameter's first box. Every file carries its boxes in its header's
// metadata
// ("keel_boxes"); once every rank has written (an all_reduce of a success flag), rank 0 reads the
// headers, checks each key is tiled exactly, writes keel-checkpoint.json and renames the
// directory into place. Nothing is gathered, and no rank holds more than its own part. Resuming,
// every rank reads the full keys it needs and keeps its own part (nn::cutShard, then its --zero
// rows), whatever layout saved them — 4 ranks at dp 2 x tp 2, with or without --zero, 2 at tp 2
// or 1 — so a run resumes bit for bit on another layout.

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The safetensors dtype of each engine DType, in DType's order.
constexpr st::DType kStDTypes[keel::kNumDTypes] = {st::DType::F32, st::DType::F16, st::DType::BF16,
                                                   st::DType::F64, st::DType::I32, st::DType::I64,
                                                   st::DType::Bool};
st::DType toSt(DType t) {
  return size_t(t) < size_t(keel::kNumDTypes) ? kStDTypes[size_t(t)] : st::DType::F32;
}

Tensor hostContiguous(const Tensor& t) {
  Tensor h = t.device().isHost() ? t : t.to(Device(Backend::Cpu));
  return h.contiguous();
}

json generatorJson(const Generator& g) {
  return {{"seed", g.seed()}, {"offset", g.offset()}};
}

void restoreGenerator(Generator& g, const json& j, const std::string& what) {
  KEEL_CHECK(j.is_object() && j.contains("seed") && j.contains("offset") &&
                 j["seed"].is_number_unsigned() && j["offset"].is_number_unsigned(),
             what, " must be {\"seed\": u64, \"offset\": u64}");
  g.setState(j["seed"].get<uint64_t>(), j["offset"].get<uint64_t>());
}

}  // namespace

std::string stepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string resolveCheckpoint(const std::string& dir, std::string* skipped) {
  std::error_code ec;
  if (skipped) skipped->clear();
  if (fs::exists(fs::path(dir) / kMetadataFile, ec)) return dir;
  detail::checkNotMetadataFile(dir);
  if (const std::string kind = nonRegularKind(dir); !kind.empty() && kind != "a directory")
    throw Error(detail::nonRegularText(dir, kind));
  KEEL_CHECK(!fs::is_regular_file(dir, ec), detail::notACheckpointText(dir, false));
  KEEL_CHECK(fs::is_directory(dir, ec), dir, ": no such checkpoint directory");
  const auto steps = stepCheckpoints(dir);
  KEEL_CHECK(!steps.empty(), dir, ": no checkpoint here (no ", kMetadataFile,
             ", and no step-* directory holding one)");
  if (skipped) {  // a newer step-N folder without metadata: an interrupted copy, say
    int64_t newest = steps.back().first;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const int64_t step = stepOfDirName(e.path().filename().string());
      if (step > newest && e.is_directory(ec) && !fs::exists(e.path() / kMetadataFile, ec)) {
        newest = step;
        *skipped = (fs::path(dir) / e.path().filename()).string();
      }
    }
  }
  return (fs::path(dir) / steps.back().second).string();
}

int64_t stepOfDirName(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 20) return -1;
  if (!std::all_of(name.begin() + 5, name.end(), ::isdigit)) return -1;
  return std::stoll(name.substr(5));
}

std::vector<std::pair<int64_t, std::string>> stepCheckpoints(const std::string& dir) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = stepOfDirName(name);
    if (step >= 0 && fs::exists(e.path() / kMetadataFile, ec)) out.emplace_back(step, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// Note [A save replaces nothing]
// A training save writes DIR.tmp and renames it to DIR. It used to remove both first, whatever
// they held: a second run saving into the same --ckpt-dir replaced the first run's step-N, and
// removed its step-N.tmp while it was being written. Neither is removed now: a step-N that
// exists was not written by this run (a run saves each step once, and keel train refuses a
// --ckpt-dir holding steps after the one it resumes from), and a step-N.tmp is another writer's
// or a save cut short, which keel train removes before its first step, holding the folder's
// lock (Note [One run per --ckpt-dir] in app/keel/cmd_train.cpp). Both are refused in one line.
void checkNothingToReplace(const std::string& dir) {
  std::error_code ec;
  KEEL_CHECK(!fs::exists(fs::symlink_status(dir, ec)), dir,
             " already exists, and this run did not write it (another run saving into the same "
             "folder?); refusing to replace it");
  KEEL_CHECK(!fs::exists(fs::symlink_status(dir + ".tmp", ec)), dir,
             ".tmp exists: another process is saving this checkpoint, or a save was cut short "
             "(remove it); refusing to replace it");
}

// Whether every rank of the world got here without an error: an all_reduce (max) of a flag.
bool everyRankOk(bool ok) {
  int32_t bad = ok ? 0 : 1, any = 0;
  dist::allReduce({"all_reduce", "world", DType::Int32, 1, 0}, &bad, &any, dist::ReduceOp::Max);
  return any == 0;
}

// A local range [a, b) along `axis` of a rank's part as (local begin, global begin, length)
// pieces: contiguous globally except across the blocks of a fused shard (nn::cutShard's layout).
std::vector<std::array<int64_t, 3>> globalSegments(int64_t a, int64_t b, const nn::Shard& s,
                                                   int axis, int64_t globalSize) {
  if (!s.on() || s.axis != axis) return {{a, a, b - a}};
  const int64_t block = globalSize / s.blocks, piece = block / s.parts;
  std::vector<std::array<int64_t, 3>> out;
  for (int64_t l = a; l < b;) {
    const int64_t bi = l / piece, end = std::min(b, (bi + 1) * piece);
    out.push_back({l, bi * block + s.part * piece + (l - bi * piece), end - l});
    l = end;
  }
  return out;
}

// This rank's file of a multi-rank checkpoint (Note [Multi-rank checkpoints]).
class RankFile {
 public:
  // Adds the boxes of `t`: rows [rowOffset, rowOffset + t.size(0)) of a local part shaped by
  // shard s of a key of global shape `global` (a scalar: one box).
  void add(const std::string& key, const Tensor& t, int64_t rowOffset, const nn::Shard& s,
           const Shape& global) {
    if (t.dim() == 0) return push(key, key, hostContiguous(t), {});
    if (t.size(0) == 0) return;
    const auto rows = globalSegments(rowOffset, rowOffset + t.size(0), s, 0, global[0]);
    std::vector<std::array<int64_t, 3>> cols = {{0, 0, -1}};
    if (s.on() && s.axis != 0) cols = globalSegments(0, t.size(s.axis), s, s.axis, global[s.axis]);
    for (const auto& r : rows)
      for (const auto& c : cols) {
        NoGradGuard ng;
        Tensor part = ops::slice(t, 0, r[0] - rowOffset, r[0] - rowOffset + r[2]);
        Dims offset(global.size(), 0);
        offset[0] = r[1];
        if (c[2] >= 0) {
          part = ops::slice(part, s.axis, c[0], c[0] + c[2]);
          offset[size_t(s.axis)] = c[1];
        }
        size_t& n = boxesOfKey_[key];  // the boxes of this key so far
        push(n == 0 ? key : key + "#" + std::to_string(n), key, hostContiguous(part), offset,
             global);
        ++n;
      }
  }
  bool empty() const { return entries_.empty(); }
  void write(const std::string& path) const {
    st::Writer w(path, entries_, {{"keel_boxes", boxes_.dump()}});
    for (size_t i = 0; i < data_.size(); ++i)
      w.write(i, 0, data_[i].data(), size_t(data_[i].nbytes()));
    w.close();
  }

 private:
  void push(const std::string& name, const std::string& key, const Tensor& part, const Dims& offset,
            const Shape& global = {}) {
    entries_.push_back({name, toSt(part.dtype()), part.shape()});
    data_.push_back(part);
    boxes_[name] = {{"key", key}, {"offset", offset}, {"global", global}};
  }
  std::vector<st::WriteEntry> entries_;
  std::vector<Tensor> data_;
  json boxes_ = json::object();
  std::map<std::string, size_t> boxesOfKey_;
};

// Rank 0's part: the metadata of the files every rank wrote into `tmp`.
Metadata gatherMetadata(const std::string& tmp, int world, const std::string& trainState) {
  Metadata m;
  m.trainState = trainState;
  std::map<std::string, size_t> index;
  for (int r = 0; r < world; ++r) {
    const std::string file = detail::fileName(r, world);
    std::error_code ec;
    if (!fs::exists(fs::path(tmp) / file, ec)) continue;
    const st::Reader reader((fs::path(tmp) / file).string());
    const auto it = reader.header().metadata.find("keel_boxes");
    KEEL_CHECK(it != reader.header().metadata.end(), file, ": no keel_boxes in its header");
    const json boxes = json::parse(it->second);
    const uint32_t fileIndex = uint32_t(m.files.size());
    m.files.push_back(file);
    for (const st::TensorEntry& e : reader.header().tensors) {
      const json& b = boxes.at(e.name);
      const std::string key = b.at("key").get<std::string>();
      auto [at, fresh] = index.emplace(key, m.keys.size());
      if (fresh) m.keys.push_back({key, e.dtype, b.at("global").get<Dims>(), -1, {}});
      ShardInfo s;
      s.offset = b.at("offset").get<Dims>();
      s.shape = e.shape;
      s.replica = r;
      s.file = fileIndex;
      s.begin = reader.header().dataStart + e.begin;
      s.end = reader.header().dataStart + e.end;
      if (e.name != key) s.tensor = e.name;
      m.keys[at->second].shards.push_back(std::move(s));
    }
  }
  for (const KeyInfo& k : m.keys) checkTiling(k, tmp);
  return m;
}

size_t saveRankShards(Trainer& tr, const std::string& dir, const std::string& trainState) {
  const int rank = dist::worldRank(), world = dist::worldSize();
  const int dpRank = dist::group("dp").rank, tpRank = dist::group("tp").rank;
  const int edpRank = dist::group("edp").rank;
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  std::string error;
  if (rank == 0) {
    try {
      checkNothingToReplace(dir);  // Note [A save replaces nothing]
      if (!fs::create_directory(tmp, ec))
        error = tmp + ": cannot create (" + (ec ? ec.message() : "it exists") + ")";
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!everyRankOk(error.empty()))
    throw Error(error.empty() ? dir + ": rank 0 could not create " + tmp : error);
  try {
    nn::GPT& model = tr.model();
    auto& opt = tr.optimizer();
    const auto* zero = dynamic_cast<const optim::ShardedAdamW*>(&opt);
    RankFile file;
    // Which replica of parameter p this rank holds: its place among the ranks with the same
    // experts for an expert's (Note [Expert-parallel MoE]), among the dp ranks otherwise.
    auto replica = [&](const Tensor& p) {
      return nn::GPT::isExpertParameter(p.name()) ? edpRank : dpRank;
    };
    // Who writes a tensor of parameter p: its tp part by every tp rank (a replicated key by tp
    // rank 0), of the first replica — or by every dp rank, its rows, for --zero's moments.
    auto add = [&](const std::string& key, const Tensor& p, const Tensor& t, bool zeroRows,
                   int64_t rowOffset) {
      const nn::Shard s = model.parameterShard(p.name());
      if ((!s.on() && tpRank != 0) || (!zeroRows && replica(p) != 0)) return;
      Shape global = p.shape();
      if (s.on()) global[size_t(s.axis)] *= s.parts;
      file.add(key, t, rowOffset, s, global);
    };
    for (const auto& [name, p] : model.namedParameters()) add(name, p, p, false, 0);
    for (size_t i = 0; i < opt.params().size(); ++i) {
      const Tensor& p = opt.params()[i];
      for (const auto& [sname, t] : opt.paramState(i)) {
        const std::string key = p.name() + std::string(aoa::kStateSeparator) + sname;
        if (t.dim() == 0) {  // a step counter: by the parameter's first writer
          if (tpRank == 0 && replica(p) == 0) file.add(key, t, 0, {}, {});
        } else if (zero) {
          add(key, p, t, true, zero->ownedRows(i).first);
        } else {
          add(key, p, t, false, 0);
        }
      }
    }
    if (!file.empty()) file.write((fs::path(tmp) / detail::fileName(rank, world)).string());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!everyRankOk(error.empty()))
    throw Error(error.empty() ? dir + ": another rank could not write its shards" : error);
  // How many ranks wrote a file (a rank with no part of its own writes none: dp replica 1 of a
  // dp-only run), for the caller's summary.
  int32_t wrote = fs::exists(fs::path(tmp) / detail::fileName(rank, world), ec) ? 1 : 0, files = 0;
  dist::allReduce({"all_reduce", "world", DType::Int32, 1, 0}, &wrote, &files, dist::ReduceOp::Sum);
  if (rank == 0) {
    try {
      detail::writeMetadata(tmp, gatherMetadata(tmp, world, trainState), true);
      fs::rename(tmp, dir, ec);  // fails on a folder that appeared meanwhile: never replaced
      if (ec) error = dir + ": cannot move the checkpoint into place (" + ec.message() + ")";
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) fs::remove_all(tmp, ec);
  }
  if (!everyRankOk(error.empty()))
    throw Error(error.empty() ? dir + ": rank 0 could not finish the checkpoint" : error);
  return size_t(files);
}

}  // namespace

size_t saveTrainingCheckpoint(Trainer& tr, const std::string& dir, int tp) {
  json state = {{"step", tr.stepsDone()},
                {"seed", tr.seed()},
                {"optimizer", tr.config().optimizer},
                {"config_name", tr.config().name},
                {"config", json::parse(gptConfigJson(tr.config()))},
                {"data_tokens", tr.dataset().numTokens()},
                {"batch_generator", generatorJson(tr.batchGenerator())},
                {"dropout_generator", generatorJson(tr.model().dropoutGenerator())}};
  if (dist::worldSize() > 1) return saveRankShards(tr, dir, state.dump());
  std::vector<Tensor> keep;
  std::vector<HostTensor> tensors;
  auto add = [&](const std::string& key, const Tensor& t) {
    Tensor h = hostContiguous(t);
    keep.push_back(h);
    tensors.push_back({key, toSt(h.dtype()), h.shape(), h.data()});
  };
  auto& opt = tr.optimizer();
  for (const auto& [name, p] : tr.model().namedParameters()) add(name, p);
  for (size_t i = 0; i < opt.params().size(); ++i)
    for (const auto& [sname, t] : opt.paramState(i))
      add(opt.params()[i].name() + std::string(aoa::kStateSeparator) + sname, t);
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  checkNothingToReplace(dir);  // Note [A save replaces nothing]
  TargetSpec spec;
  spec.tp = tp;
  ConvertOptions digests;
  digests.fileDigests = true;  // Note [Checkpoint file digests]: verified when resumed
  try {
    saveTensors(tmp, tensors, spec, state.dump(), digests);
  } catch (...) {
    fs::remove_all(tmp, ec);  // a failed save leaves no step-N.tmp behind
    throw;
  }
  // (rename() replaces an empty folder that appeared meanwhile, and fails on any other.)
  fs::rename(tmp, dir, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove_all(tmp, ec);
    throw Error(dir + ": cannot move the checkpoint into place (" + why + ")");
  }
  return size_t(tp);
}

namespace {

// Note [Resumed settings]
// Resuming with another config than the checkpoint's is legitimate (fine-tuning with another
// learning rate or dropout) as long as the model's shapes agree (else refused), but it no longer
// continues the saved run: the loss curve differs, and nothing said so. train_state records the
// config's name and, since they were added, every field ("config"); the fields that change
// training (all but the name, the allocator and the validation settings) are compared, and the
// difference is named in one warning. A checkpoint that records only the name is compared by name.
std::string settingsWarning(const json& state, const GptConfig& cfg, const std::string& path) {
  const std::string savedName = state.contains("config_name") && state["config_name"].is_string()
                                    ? state["config_name"].get<std::string>()
                                    : std::string();
  std::vector<std::string> differ;
  if (state.contains("config") && state["config"].is_object()) {
    const json now = json::parse(gptConfigJson(cfg));
    for (const auto& [field, saved] : state["config"].items()) {
      if (field == "name" || field == "allocator" || field == "eval_every" ||
          field == "eval_batches" || !now.contains(field) || now[field] == saved)
        continue;
      differ.push_back(field + " " + clipText(saved.dump(), 40) + " vs " + now[field].dump());
    }
  }
  const bool otherName = state.contains("config_name") && savedName != cfg.name;
  if (!otherName && differ.empty()) return {};
  std::string w = path + " was saved by a run of config '" + savedName + "'";
  if (otherName) w += ", and this run's config is '" + cfg.name + "'";
  if (!differ.empty())
    w += std::string(otherName ? "; " : " with other settings; ") +
         "saved vs this run: " + joinText(differ, ", ");
  return w + ": the resumed run trains with this run's settings, not the saved run's";
}

// Note [Resumed architecture]
// Some fields change what the saved weights mean while every shape stays the same: n_head (how
// the qkv rows and the attention output split into heads, and the softmax scale), position (a
// learned embedding or rotary q/k) and norm (layernorm or rmsnorm). A resume with another of
// these went ahead with a "settings" warning and trained another function from weights made for
// the first. They are refused in one line (Note [Resumed settings] keeps the rest a warning);
// fields that change shapes are refused by the load, naming the key.
constexpr const char* kArchitectureFields[] = {"n_head", "position", "norm"};

void checkArchitecture(const json& state, const GptConfig& cfg, const std::string& path) {
  if (!state.contains("config") || !state["config"].is_object()) return;  // an older checkpoint
  const json& saved = state["config"];
  const json now = json::parse(gptConfigJson(cfg));
  std::vector<std::string> differ;
  for (const char* field : kArchitectureFields)
    if (saved.contains(field) && now.contains(field) && saved[field] != now[field])
      differ.push_back(std::string(field) + " " + clipText(saved[field].dump(), 40) + " vs " +
                       now[field].dump());
  KEEL_CHECK(differ.empty(), path, " was saved by a model of another architecture (saved vs this ",
             "run: ", joinText(differ, ", "),
             "): its weights mean something else in this model; resume with the config it was "
             "saved with");
}

// The optimizer's per-parameter step counters (AdamW's '::step') must agree with train_state's
// step: the highest counter is the step (every step updates the embedding). An edited or
// mismatched step resumed silently at another point of the learning-rate schedule.
void checkStepCounters(const Checkpoint& ck, const aoa::Program* rules,
                       const std::vector<HostTensor>& counters, int64_t step,
                       const std::string& path) {
  if (counters.empty()) return;
  std::vector<int64_t> values(counters.size(), 0);
  std::vector<HostTensor> targets = counters;
  for (size_t i = 0; i < targets.size(); ++i) targets[i].data = &values[i];
  LoadOptions lo;
  lo.allowUnused = true;
  loadTensors(ck, rules, targets, lo);
  const size_t top = size_t(std::max_element(values.begin(), values.end()) - values.begin());
  KEEL_CHECK(values[top] == step, path, ": train_state says step ", step,
             " but the optimizer's step counters say ", values[top], " ('", targets[top].key,
             "'): the metadata and the tensors disagree (edited, or put together from two "
             "checkpoints); refusing to resume");
}

}  // namespace

std::string loadTrainingCheckpoint(Trainer& tr, const std::string& dir, const aoa::Program* rules,
                                   std::string* warning) {
  const std::string path = resolveCheckpoint(dir);
  Checkpoint ck = Checkpoint::open(path);
  ck.verifyFiles();  // Note [Checkpoint file digests]: a damaged file is named, not trained on
  const std::string& text = ck.metadata().trainState;
  KEEL_CHECK(!text.empty(), path, ": not a training checkpoint (its metadata has no train_state)");
  checkJsonDepth(text, path + ": train_state");  // Note [Bounded JSON]
  json state = json::parse(text);
  const std::string what = path + ": train_state";
  KEEL_CHECK(state.is_object(), what, " must be a JSON object, got ", state.type_name());
  for (const char* field : {"step", "seed", "batch_generator", "dropout_generator"})
    KEEL_CHECK(state.contains(field), what, " needs step, seed, batch_generator and ",
               "dropout_generator (it lacks ", field, ")");
  // A step or seed present but not a whole number in range says which and what it holds.
  KEEL_CHECK(state["step"].is_number_integer() && state["step"].get<int64_t>() >= 0, what,
             ".step must be a whole number ≥ 0, got ", clipText(state["step"].dump(), 40));
  KEEL_CHECK(state["seed"].is_number_unsigned(), what,
             ".seed must be a whole number in [0, 2^64-1], got ",
             clipText(state["seed"].dump(), 40));
  if (state.contains("optimizer") && state["optimizer"].is_string())
    KEEL_CHECK(state["optimizer"].get<std::string>() == tr.config().optimizer, path,
               ": saved with optimizer ", state["optimizer"].get<std::string>(),
               " but the config uses ", tr.config().optimizer);
  if (state.contains("data_tokens") && state["data_tokens"].is_number_integer())
    KEEL_CHECK(state["data_tokens"].get<int64_t>() == tr.dataset().numTokens(), path,
               ": saved on a dataset of ", state["data_tokens"].get<int64_t>(),
               " tokens, this run's has ", tr.dataset().numTokens(),
               " (resume with the same --data)");

  // The keys the checkpoint offers after the rules decide which optimizer states exist.
  aoa::Result keys = aoa::apply(rules, detail::sourceKeys(ck.metadata()));
  std::map<std::string, const aoa::TargetKey*> present;  // by name: Note [Linear headers]
  for (const auto& k : keys.keys) present.emplace(k.name, &k);

  std::vector<HostTensor> targets;
  std::vector<Tensor> params;
  nn::GPT& model = tr.model();
  // A sharded parameter is read whole, then cut (Note [Multi-rank checkpoints]).
  auto wholeShape = [&](const Tensor& p) {
    const nn::Shard s = model.parameterShard(p.name());
    Shape g = p.shape();
    if (s.on()) g[size_t(s.axis)] *= s.parts;
    return g;
  };
  struct Joined {
    Tensor param, whole;
  };
  std::vector<Joined> joined;
  for (const auto& [name, p] : model.namedParameters()) {
    KEEL_CHECK(p.device().isHost() && p.isContiguous(), "resume: parameter '", name,
               "' is not in contiguous host memory");
    params.push_back(p);
    if (model.parameterShard(p.name()).on()) {
      joined.push_back({p, Tensor::empty(wholeShape(p), p.dtype(), Device(Backend::Cpu))});
      targets.push_back(
          {name, toSt(p.dtype()), joined.back().whole.shape(), joined.back().whole.data()});
      continue;
    }
    targets.push_back({name, toSt(p.dtype()), p.shape(), p.data()});
  }
  auto& opt = tr.optimizer();
  struct Pending {
    size_t param;
    std::string name;
    Tensor t;
  };
  std::vector<Pending> states;
  // A parameter's optimizer state is all there or not there at all (never updated): a part of
  // it (a rule dropped 'w::step') trained on from a fresh counter or failed inside the update.
  const std::vector<std::string> stateNames = opt.stateNames();
  const std::string optimizerName = tr.config().optimizer;
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    const std::string prefix = p.name() + std::string(aoa::kStateSeparator);
    std::vector<std::string> have;
    for (auto it = present.lower_bound(prefix);
         it != present.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string sname = it->first.substr(prefix.size());
      KEEL_CHECK(std::find(stateNames.begin(), stateNames.end(), sname) != stateNames.end(), path,
                 ": '", it->first, "' is not a state of ", optimizerName,
                 stateNames.empty() ? std::string(" (it keeps none)")
                                    : " (its states: " + joinText(stateNames, ", ") + ")");
      have.push_back(sname);
    }
    if (!have.empty() && have.size() != stateNames.size()) {
      std::vector<std::string> missing;
      for (const std::string& n : stateNames)
        if (std::find(have.begin(), have.end(), n) == have.end()) missing.push_back(prefix + n);
      throw Error(path + ": the optimizer state of '" + p.name() + "' lacks '" +
                  joinText(missing, "', '") + "' (" + optimizerName +
                  " keeps all of its states or none): resuming would not continue the run");
    }
    for (auto it = present.lower_bound(prefix);
         it != present.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string sname = it->first.substr(prefix.size());
      const aoa::TargetKey* k = it->second;
      Tensor t = k->shape.empty() ? Tensor::empty({}, DType::Int64, Device(Backend::Cpu))
                                  : Tensor::empty(wholeShape(p), p.dtype(), Device(Backend::Cpu));
      states.push_back({i, sname, t});
      targets.push_back({it->first, toSt(t.dtype()), t.shape(), t.data()});
    }
  }
  // A checkpoint of another model (another config's name, parameters this model lacks or lacks
  // itself) says so in the user's terms: the AOA hint the loader would give ("drop it with
  // 'key -> _'") means nothing to keel train, which takes no rules.
  if (!rules && state.contains("config_name") && state["config_name"].is_string() &&
      state["config_name"].get<std::string>() != tr.config().name) {
    std::set<std::string> wanted;
    for (const HostTensor& t : targets) wanted.insert(t.key);
    // The first parameter that differs (an optimizer state only when no parameter does).
    auto isState = [](const std::string& n) {
      return n.find(aoa::kStateSeparator) != std::string::npos;
    };
    std::string foreign, lacking;
    for (const auto& [name, k] : present)
      if (!wanted.count(name) && !nn::GPT::isExpertParameter(name) &&
          (foreign.empty() || (isState(foreign) && !isState(name))))
        foreign = name;
    for (const std::string& name : wanted)
      if (!present.count(name) && (lacking.empty() || (isState(lacking) && !isState(name))))
        lacking = name;
    KEEL_CHECK(foreign.empty() && lacking.empty(), path, ": saved by a run of config '",
               state["config_name"].get<std::string>(), "', and this run's config is '",
               tr.config().name, "': the models differ (",
               foreign.empty() ? "this model's '" + lacking + "' is not in the checkpoint"
                               : "the checkpoint's '" + foreign + "' is not in this model",
               "); resume with the config the checkpoint was saved with");
  }
  {
    std::vector<HostTensor> counters;
    for (const HostTensor& t : targets)
      if (t.shape.empty() && t.key.size() > 6 &&
          t.key.compare(t.key.size() - 6, 6, std::string(aoa::kStateSeparator) + "step") == 0)
        counters.push_back(t);
    checkStepCounters(ck, rules, counters, state["step"].get<int64_t>(), path);
  }
  checkArchitecture(state, tr.config(), path);  // Note [Resumed architecture]
  if (warning) *warning = settingsWarning(state, tr.config(), path);
  LoadOptions lo;
  // Under expert parallelism the other ranks' experts are in the checkpoint too: leave those
  // keys, and only those, unread (anything else unused is still an error).
  if (model.expertParallel().on()) {
    std::set<std::string> wanted;
    for (const HostTensor& t : targets) wanted.insert(t.key);
    lo.allowUnused = std::all_of(present.begin(), present.end(), [&](const auto& k) {
      return wanted.count(k.first) || nn::GPT::isExpertParameter(k.first);
    });
  }
  for (auto& p : params) beforeBufferWrite(p);  // See Observer::onBufferWrite
  loadTensors(ck, rules, targets, lo);
  for (const Joined& j : joined) {
    const Tensor part = nn::cutShard(j.whole, model.parameterShard(j.param.name()));
    std::memcpy(j.param.data(), part.data(), size_t(part.nbytes()));
  }
  for (auto& s : states) {
    const Tensor& p = opt.params()[s.param];
    const nn::Shard sh = model.parameterShard(p.name());
    opt.setParamState(s.param, s.name,
                      sh.on() && s.t.shape() == wholeShape(p) ? nn::cutShard(s.t, sh) : s.t);
  }
  for (auto& p : params) p.bumpVersion();
  restoreGenerator(tr.batchGenerator(), state["batch_generator"], what + " batch_generator");
  restoreGenerator(tr.model().dropoutGenerator(), state["dropout_generator"],
                   what + " dropout_generator");
  tr.restoreProgress(state["step"].get<int64_t>(), state["seed"].get<uint64_t>());
  return path;
}

// Note [Training inputs]
// Comparing a Keel run with the same model in another framework (tests/python/keel_gpt.py,
// docs/torch.md) needs that framework to start from Keel's weights and read Keel's batches. A run
// is a pure function of its config, seed, data and position (Note [Resume bit for bit]), so both
// can be written before the first step: the training checkpoint of the position (dir/init; it
// also resumes with keel train --resume), and the next `steps` batches, drawn from a copy of the
// batch generator, which the run's own draws then repeat exactly. They are the global batches of
// a process alone: a multi-rank run's ranks read slices of them, so it is refused.
void saveTrainingInputs(Trainer& tr, const std::string& dir, int64_t steps) {
  KEEL_CHECK(dist::worldSize() == 1, "--save-inputs: a process alone only (this run has ",
             dist::worldSize(), " ranks)");
  KEEL_CHECK(steps >= 1, "--save-inputs: no steps to save batches for");
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  KEEL_CHECK(!existed || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec)), dir,
             " exists and is not an empty directory (--save-inputs writes a new one)");
  fs::create_directories(dir, ec);
  KEEL_CHECK(!ec, dir, ": cannot create the directory (", ec.message(), ")");
  const GptConfig& cfg = tr.config();
  const int64_t rows = cfg.batch_size, cols = cfg.seq_len;
  const std::vector<int64_t> shape{steps, rows, cols};
  const std::string path = dir + "/batches.safetensors";
  try {
    saveTrainingCheckpoint(tr, dir + "/init", 1);
    Generator gen = tr.batchGenerator();  // a copy: the run draws the same batches after
    st::Writer w(
        path, {{"idx", st::DType::I64, shape}, {"targets", st::DType::I64, shape}},
        {{"first_step", std::to_string(tr.stepsDone() + 1)}, {"seed", std::to_string(tr.seed())}});
    const uint64_t stepBytes = uint64_t(rows * cols) * sizeof(int64_t);
    for (int64_t s = 0; s < steps; ++s) {  // one step's batch in memory at a time
      auto [x, y] = tr.dataset().getBatch(rows, cols, gen, data::Split::Train, Device{});
      const std::vector<int64_t> xs = x.toVector<int64_t>(), ys = y.toVector<int64_t>();
      w.write(0, uint64_t(s) * stepBytes, xs.data(), xs.size() * sizeof(int64_t));
      w.write(1, uint64_t(s) * stepBytes, ys.data(), ys.size() * sizeof(int64_t));
    }
    w.close();
  } catch (...) {
    // Only what this call created goes: a directory that was there (empty) stays.
    fs::remove_all(dir + "/init", ec);
    fs::remove(path, ec);
    if (!existed) fs::remove(dir, ec);
    throw;
  }
}

}  // namespace keel::ckpt
