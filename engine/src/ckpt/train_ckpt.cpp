// Training checkpoints: a Trainer's parameters, optimizer state and progress saved as a sharded
// FlexCheckpoint, and restored so that the run continues bit for bit. See Note [Resume bit for
// bit].
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt_internal.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/nn.h"
#include "keel/observer.h"
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
// of view, so a run at tp > 1 joins each sharded parameter and its optimizer state (an all_gather
// over the tensor-parallel group, key by key) and world rank 0 writes the files; the dp replicas
// hold the same values and write nothing. Resuming, every rank reads the full keys it needs and
// keeps its own part (nn::cutShard, the layers' cut), whatever layout saved them — 4 ranks at
// dp 2 x tp 2, 2 at tp 2 or 1 — so a run resumes bit for bit on another layout.

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

std::string resolveCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kMetadataFile, ec)) return dir;
  KEEL_CHECK(fs::is_directory(dir, ec), dir, ": no such checkpoint directory");
  int64_t best = -1;
  std::string bestPath;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 20) continue;
    if (!std::all_of(name.begin() + 5, name.end(), ::isdigit)) continue;
    if (!fs::exists(e.path() / kMetadataFile, ec)) continue;
    int64_t step = std::stoll(name.substr(5));
    if (step > best) best = step, bestPath = e.path().string();
  }
  KEEL_CHECK(best >= 0, dir, ": no checkpoint here (no ", kMetadataFile,
             ", and no step-* directory holding one)");
  return bestPath;
}

void saveTrainingCheckpoint(Trainer& tr, const std::string& dir, int tp) {
  std::vector<Tensor> keep;
  std::vector<HostTensor> tensors;
  auto add = [&](const std::string& key, const Tensor& t) {
    Tensor h = hostContiguous(t);
    keep.push_back(h);
    tensors.push_back({key, toSt(h.dtype()), h.shape(), h.data()});
  };
  nn::GPT& model = tr.model();
  // A sharded parameter, or a state shaped like it, joined (Note [Multi-rank checkpoints]).
  auto whole = [&](const Tensor& param, const Tensor& t) {
    const nn::Shard s = model.parameterShard(param.name());
    return s.on() && t.shape() == param.shape() ? nn::joinShards(t, s, model.tensorParallel().group)
                                                : t;
  };
  auto& opt = tr.optimizer();
  for (const auto& [name, p] : model.namedParameters()) add(name, whole(p, p));
  for (size_t i = 0; i < opt.params().size(); ++i)
    for (const auto& [sname, t] : opt.paramState(i))
      add(opt.params()[i].name() + std::string(aoa::kStateSeparator) + sname,
          whole(opt.params()[i], t));
  if (dist::worldRank() != 0) return;  // rank 0 writes for the run
  json state = {{"step", tr.stepsDone()},
                {"seed", tr.seed()},
                {"optimizer", tr.config().optimizer},
                {"config_name", tr.config().name},
                {"data_tokens", tr.dataset().numTokens()},
                {"batch_generator", generatorJson(tr.batchGenerator())},
                {"dropout_generator", generatorJson(tr.model().dropoutGenerator())}};
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  TargetSpec spec;
  spec.tp = tp;
  try {
    saveTensors(tmp, tensors, spec, state.dump());
  } catch (...) {
    fs::remove_all(tmp, ec);  // a failed save leaves no step-N.tmp behind
    throw;
  }
  if (fs::exists(dir, ec)) fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  KEEL_CHECK(!ec, dir, ": cannot move the checkpoint into place (", ec.message(), ")");
}

std::string loadTrainingCheckpoint(Trainer& tr, const std::string& dir, const aoa::Program* rules) {
  const std::string path = resolveCheckpoint(dir);
  Checkpoint ck = Checkpoint::open(path);
  const std::string& text = ck.metadata().trainState;
  KEEL_CHECK(!text.empty(), path, ": not a training checkpoint (its metadata has no train_state)");
  checkJsonDepth(text, path + ": train_state");  // Note [Bounded JSON]
  json state = json::parse(text);
  const std::string what = path + ": train_state";
  KEEL_CHECK(state.contains("step") && state["step"].is_number_integer() &&
                 state.contains("seed") && state["seed"].is_number_unsigned() &&
                 state.contains("batch_generator") && state.contains("dropout_generator"),
             what, " needs step, seed, batch_generator and dropout_generator");
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
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    const std::string prefix = p.name() + std::string(aoa::kStateSeparator);
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
  LoadOptions lo;
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

}  // namespace keel::ckpt
