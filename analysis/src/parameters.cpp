// Parameters across layouts (Note [Parameters across layouts] in keel/analysis/ranks.h): the
// pieces of each parameter's value and gradient, combined over the ranks that hold them, compared
// step by step between two runs of different parallel layouts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "keel/analysis/ranks.h"
#include "keel/storage/errors.h"
#include "keel/storage/reader.h"
#include "run_folder_util.h"

namespace keel::analysis {

namespace {

using storage::OpRecord;
using storage::Recording;
using storage::RunManifest;
using storage::TensorRecord;

// One tensor made of pieces: their statistics combined exactly (population std).
struct Whole {
  int64_t n = 0;
  double sum = 0, sumSq = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double absMax = 0;
  int64_t nans = 0, infs = 0;
  void add(const TensorRecord& t) {
    int64_t k = 1;
    for (int64_t d : t.shape) k *= d;
    if (k == 0) return;
    const storage::TensorStats& s = t.stats;
    n += k;
    sum += s.mean * double(k);
    sumSq += (s.std * s.std + s.mean * s.mean) * double(k);
    min = std::min(min, s.min);
    max = std::max(max, s.max);
    absMax = std::max(absMax, s.absMax);
    nans += s.nanCount;
    infs += s.infCount;
  }
  double mean() const { return n ? sum / double(n) : 0.0; }
  double stdev() const {
    const double v = n ? sumSq / double(n) - mean() * mean() : 0.0;
    return v > 0 ? std::sqrt(v) : 0.0;
  }
};

bool isUpdate(const OpRecord& op) {
  return op.phase == Phase::Optimizer && (op.name == "adamw_step" || op.name == "sgd_step");
}

// A run folder or one recording, read step by step: per parameter (in update order), the value
// before its update (input 0) and its gradient (input 1), whole.
class Source {
 public:
  explicit Source(const std::string& path) {
    if (storage::isRunFolder(path)) {
      m_ = storage::readManifest(path);
      recs_ = detail::openRanks(path, m_);
      layout_ = storage::layoutText(m_.dp, m_.tp, m_.ep, m_.cp, m_.zero, m_.vocab) + " (" +
                std::to_string(m_.worldSize) + " ranks)";
    } else {
      recs_.push_back(Recording::open(path));
      layout_ = "one process";
    }
    steps_ = detail::finishedSteps(recs_);
    path_ = path;
  }
  const std::string& layout() const { return layout_; }
  int64_t steps() const { return steps_; }

  struct Parameter {
    std::string name;
    Whole value, gradient;
  };
  // The parameters updated in `step`, in the first rank's update order.
  std::vector<Parameter> step(int64_t step) {
    std::vector<Parameter> out;
    std::map<std::string, size_t> index;
    // One replica of each piece: under --zero every dp rank's rows, else the first replica (an
    // expert: each rank of the first ep group); among tp ranks, identical pieces are one
    // replicated tensor — except the vocabulary rows of a --vocab-parallel run, which are each
    // tp rank's own even when two are alike (the all-zero gradients of tokens no batch used).
    std::set<std::tuple<std::string, int, int64_t, int64_t, std::vector<int64_t>, int64_t,
                        std::string, double, double>>
        seen;
    for (size_t r = 0; r < recs_.size(); ++r) {
      const int64_t d = int64_t(r) / m_.tp;
      for (const OpRecord& op : recs_[r].stepOps(step)) {
        if (!isUpdate(op)) continue;
        if (!m_.zero && d != 0 && !(detail::isExpertScope(op.scope) && d < m_.ep)) continue;
        auto [it, fresh] = index.emplace(op.scope, out.size());
        if (fresh) out.push_back({op.scope, {}, {}});
        for (const TensorRecord& t : op.tensors) {
          if (t.role != storage::Role::Input || t.index > 1) continue;
          if (!t.hasStats)
            throw storage::StorageError(path_ + ": " +
                                        (recs_.size() > 1
                                             ? "rank " + std::to_string(r) + "'s recording"
                                             : std::string("the recording")) +
                                        " has no tensor statistics; record with --stats or --all "
                                        "to compare parameters");
          const bool vocabRows =
              m_.vocab && (op.scope == "wte.weight" || op.scope == "lm_head.weight");
          const auto key = std::make_tuple(op.scope, int(t.index), m_.zero ? d : int64_t(0),
                                           vocabRows ? int64_t(r) % m_.tp : int64_t(-1), t.shape,
                                           t.offset, t.md5, t.stats.mean, t.stats.std);
          if (!seen.insert(key).second) continue;
          (t.index == 0 ? out[it->second].value : out[it->second].gradient).add(t);
        }
      }
    }
    return out;
  }

 private:
  std::string path_, layout_;
  RunManifest m_;
  std::vector<Recording> recs_;
  int64_t steps_ = 0;
};

}  // namespace

ParameterReport compareParameters(const std::string& a, const std::string& b, double atol,
                                  double rtol) {
  Source sa(a), sb(b);
  ParameterReport report;
  report.layoutA = sa.layout();
  report.layoutB = sb.layout();
  report.steps = std::min(sa.steps(), sb.steps());
  for (int64_t step = 1; step <= report.steps && !report.first; ++step) {
    const std::vector<Source::Parameter> pa = sa.step(step), pb = sb.step(step);
    report.parameters = std::max<int64_t>(report.parameters, int64_t(pb.size()));
    std::map<std::string, const Source::Parameter*> byName;
    for (const auto& p : pa) byName[p.name] = &p;
    for (const Source::Parameter& p : pb) {
      auto diff = [&](const std::string& what, const std::string& stat, double x, double y) {
        report.first = ParameterDifference{step, p.name, what, stat, x, y};
      };
      const auto it = byName.find(p.name);
      if (it == byName.end()) {
        diff("value before the update", "missing", 0, double(p.value.n));
        break;
      }
      for (const auto& [what, x, y] :
           {std::make_tuple(std::string("value before the update"), &it->second->value, &p.value),
            std::make_tuple(std::string("gradient"), &it->second->gradient, &p.gradient)}) {
        ++report.compared;
        const std::pair<const char*, std::pair<double, double>> stats[] = {
            {"elements", {double(x->n), double(y->n)}},
            {"NaN count", {double(x->nans), double(y->nans)}},
            {"Inf count", {double(x->infs), double(y->infs)}},
            {"mean", {x->mean(), y->mean()}},
            {"std", {x->stdev(), y->stdev()}},
            {"min", {x->min, y->min}},
            {"max", {x->max, y->max}},
            {"abs-max", {x->absMax, y->absMax}}};
        for (const auto& [name, v] : stats) {
          const bool exact = std::string(name) == "elements" ||
                             std::string(name).find("count") != std::string::npos;
          const double tol = exact ? 0.0 : atol + rtol * std::fabs(v.second);
          if (std::fabs(v.first - v.second) > tol || std::isnan(v.first) != std::isnan(v.second)) {
            diff(what, name, v.first, v.second);
            break;
          }
        }
        if (report.first) break;
      }
      if (report.first) break;
    }
  }
  return report;
}

std::string parameterText(const ParameterReport& r, double atol, double rtol) {
  char line[512];
  std::snprintf(line, sizeof line,
                "keel diff by parameter: A is %s, B is %s; %lld steps, %lld parameters, each "
                "one's value and gradient whole (the pieces the ranks hold combined)\n",
                r.layoutA.c_str(), r.layoutB.c_str(), static_cast<long long>(r.steps),
                static_cast<long long>(r.parameters));
  std::string out = line;
  if (!r.first) {
    std::snprintf(line, sizeof line,
                  "equal within tolerance (atol %g, rtol %g): %lld values and gradients compared "
                  "by their statistics\n",
                  atol, rtol, static_cast<long long>(r.compared));
    return out + line;
  }
  const ParameterDifference& d = *r.first;
  std::snprintf(line, sizeof line,
                "first difference: step %lld, parameter %s, %s: %s %.9g in A, %.9g in B\n",
                static_cast<long long>(d.step), d.parameter.c_str(), d.what.c_str(),
                d.statistic.c_str(), d.a, d.b);
  return out + line;
}

std::string parameterJson(const ParameterReport& r) {
  nlohmann::json j = {{"layout_a", r.layoutA},
                      {"layout_b", r.layoutB},
                      {"steps", r.steps},
                      {"parameters", r.parameters},
                      {"compared", r.compared},
                      {"equal", !r.first.has_value()},
                      // As every keel diff --json says it (an op diff's, a folder diff's).
                      {"verdict", r.first ? "diverged" : "equal"},
                      {"exit_code", r.first ? 1 : 0}};
  if (r.first)
    j["first"] = {{"step", r.first->step}, {"parameter", r.first->parameter},
                  {"what", r.first->what}, {"statistic", r.first->statistic},
                  {"a", r.first->a},       {"b", r.first->b}};
  return j.dump(2);
}

}  // namespace keel::analysis
