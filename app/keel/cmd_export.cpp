// `keel export graph|trace|csv`: writes a recording's op calls as Graphviz DOT or SVG (one step:
// the studio's graph, by the same analysis::buildGraphDot), a Chrome trace (JSON, opens in
// Perfetto) or CSV, to a file or stdout. Every output is valid UTF-8 (keel/base/utf8.h), and
// replaces an existing file only where it is an earlier export of the same kind.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli_common.h"
#include "keel/analysis/graph_dot.h"
#include "keel/analysis/graph_layout.h"
#include "keel/base/output_path.h"
#include "keel/base/utf8.h"
#include "keel/error.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

struct ExportArgs {
  std::string recording, output, phase = "both", format = "dot", steps;
  int64_t step = 1;
  int64_t rank = -1;  // with a run folder: the rank whose recording (--rank)
  bool tensors = false, collapse = false;
  std::vector<std::string> expand;
};

// trace and csv --steps A:B ("2:3", "2:" to the end, "3" alone): the steps exported; every step
// (the initialisation, step 0, included) without it.
struct StepFilter {
  int64_t first = 0, last = std::numeric_limits<int64_t>::max();
  bool has(int64_t step) const { return step >= first && step <= last; }
};

StepFilter parseStepFilter(const std::string& text) {
  StepFilter f;
  if (text.empty()) return f;
  auto whole = [&](const std::string& part, int64_t& v) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos ||
        part.size() > 18)
      throw Error("--steps: expected A:B, A: or A (steps, e.g. 2:3), got '" + text + "'");
    v = std::stoll(part);
  };
  const size_t colon = text.find(':');
  whole(text.substr(0, colon), f.first);
  if (colon == std::string::npos)
    f.last = f.first;
  else if (colon + 1 < text.size())
    whole(text.substr(colon + 1), f.last);
  if (f.last < f.first) throw Error("--steps " + text + ": the last step is before the first");
  return f;
}

// An export written as it is made, piece by piece (a CSV of a long run page by page: it was
// built whole in memory first, about 24 times the recording's size), to stdout or to a file
// replaced only once it is complete (see writeOut).
class PieceWriter {
 public:
  explicit PieceWriter(const std::string& output)
      : output_(output), toStdout_(output.empty() || output == "-") {
    if (toStdout_) return;
    catchInterrupts(true);
    file_.emplace(output);
    f_ = file_->open();
    if (!f_) throw Error("cannot write " + output + ": " + std::strerror(errno));
  }
  ~PieceWriter() {
    if (f_) std::fclose(f_);
  }
  // false once a signal asks to stop (the file is then removed, see finish()).
  bool write(const std::string& piece) {
    if (toStdout_) {
      if (!piece.empty()) std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      writeAll(f_, piece.data(), piece.size(), output_);
    }
    bytes_ += piece.size();
    return interruptSignal() == 0;
  }
  int finish() {
    if (toStdout_) return flushStdout();
    std::FILE* f = std::exchange(f_, nullptr);
    if (std::fclose(f) != 0) return fail("cannot write " + output_ + ": " + std::strerror(errno));
    if (const int sig = interruptSignal(); sig != 0) {  // file_ removes the unfinished file
      std::fflush(stdout);
      std::fprintf(stderr, "keel: %s: %s not written\n", interruptReason().c_str(),
                   output_.c_str());
      return 128 + sig;
    }
    file_->commit();
    std::printf("wrote %s (%zu bytes)\n", output_.c_str(), bytes_);
    return 0;
  }

 private:
  std::string output_;
  bool toStdout_;
  std::optional<ReplaceOnCommit> file_;
  std::FILE* f_ = nullptr;
  size_t bytes_ = 0;
};

// stdout ("" or "-"), or a file replaced only once it is complete (Note [Outputs never destroy
// inputs]); a write error (a full disk, a closed pipe) is an error, and a partial file is removed.
// Ctrl-C or SIGTERM while the file is written stops the write between two pieces and removes the
// unfinished file too (it stayed behind as a hidden .NAME.partial-PID): exit 128 + the signal,
// an existing output kept as it was. (Before the write a signal ends keel as usual: nothing is
// on disk yet.)
int writeOut(const std::string& text, const std::string& output) {
  PieceWriter out(output);
  constexpr size_t kPiece = size_t(1) << 20;
  for (size_t at = 0; at < text.size(); at += kPiece)
    if (!out.write(text.substr(at, std::min(kPiece, text.size() - at)))) break;
  return out.finish();
}

// The output guard, before the recording is read: never the recording, never a file this user
// may not write, and an existing file only where it is an earlier export of the same kind as
// keel writes it (`kinds`: its exact first bytes) or empty -- `export csv -o other.db` replaced
// another recording, and `export trace -o config.json` a model config (any JSON starts with `{`).
void checkOutput(const ExportArgs& a, const std::string& recording,
                 const std::vector<OutputSignature>& kinds, const std::string& what) {
  if (a.output.empty() || a.output == "-") return;  // stdout (an explicit "" is refused)
  checkOutputPath("-o", a.output, {{"the recording", recording}});
  checkReplacesOnly("-o", a.output, kinds, what);
  checkWritable(a.output);
}

// --steps that hold no op of the recording: an error naming the steps it has (an empty export
// read like a recording without ops).
std::string noOpsInSteps(const ExportArgs& a, const storage::Recording& rec) {
  const auto all = rec.steps();
  return "recording " + a.recording + " has no ops in steps " + a.steps +
         (all.empty() ? std::string(" (it has no steps)")
                      : " (it has steps " + std::to_string(all.front().step) + " to " +
                            std::to_string(all.back().step) + ")");
}

// The steps of `rec` within `f`, the initialisation (step 0) included, in order.
std::vector<int64_t> recordedSteps(const storage::Recording& rec, const StepFilter& f) {
  std::vector<int64_t> out;
  if (f.has(0)) out.push_back(0);
  for (const storage::StepRecord& st : rec.steps())
    if (st.step != 0 && f.has(st.step)) out.push_back(st.step);
  return out;
}

// The note for an export of a recording that holds no op calls (--no-graph): its output is
// valid and says nothing of why it is empty.
void noteMissingOps(const std::string& recording, const storage::Recording& rec) {
  if (rec.opCount() != 0) return;
  if (const std::string why = whyNoOps(rec.run(), -1); !why.empty())
    warn("recording " + recording + ": " + why);
}

int runGraph(const ExportArgs& a) {
  if (a.format != "dot" && a.format != "svg")
    return fail("--format: expected dot or svg, got '" + a.format + "'");
  const analysis::GraphPhase phase = analysis::parseGraphPhase(a.phase);
  if (a.phase != analysis::toString(phase))
    return fail("--phase: expected forward, backward, both or optimizer, got '" + a.phase + "'");
  const std::string file = recordingOfRank(a.recording, a.rank);
  if (a.format == "svg")  // Graphviz's SVG of the graph named "step"
    checkOutput(a, file, {{"<?xml", {"<!-- Generated by graphviz ", "<!-- Title: step Pages: "}}},
                "an SVG graph export");
  else
    checkOutput(a, file, {{analysis::kGraphDotStart}}, "a DOT graph export");
  // What the studio's graph of this step shows with the same phase and expansion: every op of the
  // step as the studio loads it, through the one DOT builder (with its fixed text metrics).
  storage::Recording rec = storage::Recording::open(file);
  const std::vector<storage::OpRecord> ops = rec.stepOps(a.step);
  if (analysis::countGraphOps(ops, phase) == 0) {
    // A step the capture left out says why (--step-range, --no-graph): it read like a damaged
    // recording.
    const std::string why = ops.empty() ? whyNoOps(rec.run(), a.step) : std::string();
    return fail("recording " + a.recording +
                (why.empty() ? " has no " + (a.phase == "both" ? std::string() : a.phase + " ") +
                                   "ops in step " + std::to_string(a.step)
                             : ": " + why));
  }
  analysis::GraphDotOptions o;
  o.phase = phase;
  o.expandAll = !a.collapse && a.expand.empty();
  for (const std::string& scope : a.expand) {
    // A module the step does not have would draw the default picture without a word.
    const bool known = std::any_of(ops.begin(), ops.end(), [&](const storage::OpRecord& op) {
      return analysis::inGraphPhase(op, phase) && op.scope.starts_with(scope) &&
             (op.scope.size() == scope.size() || op.scope[scope.size()] == '.');
    });
    if (!known) {
      std::set<std::string> top;
      for (const auto& op : ops)
        if (analysis::inGraphPhase(op, phase) && !op.scope.empty())
          top.insert(op.scope.substr(0, op.scope.find('.')));
      std::string names;
      for (const std::string& t : top) names += (names.empty() ? "" : ", ") + t;
      return fail("--expand: step " + std::to_string(a.step) + " has no module '" + scope + "'" +
                  (names.empty() ? "" : " (its top-level modules: " + names + ")"));
    }
    for (std::string& s : analysis::scopePrefixes(scope)) o.expanded.insert(std::move(s));
  }
  // Names that are not UTF-8 as U+FFFD, as in the trace (Graphviz read them as Latin-1 and
  // wrote an SVG no XML parser reads). The studio lays out the DOT as it is.
  const std::string dot = validUtf8(analysis::buildGraphDot(ops, o).dot);
  if (a.format == "dot") return writeOut(dot, a.output);
  const analysis::GraphSvg svg = analysis::renderSvg(dot);
  if (!svg.error.empty()) throw Error(svg.error);
  return writeOut(svg.svg, a.output);
}

int runTrace(const ExportArgs& a) {
  const std::string file = recordingOfRank(a.recording, a.rank);
  const StepFilter steps = parseStepFilter(a.steps);
  checkOutput(a, file, {{storage::kChromeTraceStart}}, "a Chrome trace export");
  storage::Recording rec = storage::Recording::open(file);
  // One process per rank: two ranks' traces load side by side in Perfetto.
  const storage::RunInfo run = rec.run();
  storage::TraceProcess process;
  process.pid = run.rank + 1;
  process.name = "keel " + file.substr(file.rfind('/') + 1);
  if (run.worldSize > 1)
    process.name +=
        " (rank " + std::to_string(run.rank) + " of " + std::to_string(run.worldSize) + ")";
  noteMissingOps(a.recording, rec);
  if (a.steps.empty())
    return writeOut(
        storage::toChromeTrace(rec.ops({}), rec.steps(), rec.logs({}), rec.memEvents({}), process),
        a.output);
  // --steps: the ops, steps, log lines and memory events of those steps only (a long run's
  // trace of a few steps opens in Perfetto; the whole one may not).
  // Only those steps' ops and log lines are read (the tensors of every op were read to be
  // dropped); memory events carry their step, and are few beside them.
  std::vector<storage::OpRecord> ops;
  std::vector<storage::LogRecord> logs;
  for (const int64_t step : recordedSteps(rec, steps)) {
    storage::OpQuery q;
    q.step = step;
    for (storage::OpRecord& op : rec.ops(q)) ops.push_back(std::move(op));
    storage::LogQuery lq;
    lq.step = step;
    for (storage::LogRecord& l : rec.logs(lq)) logs.push_back(std::move(l));
  }
  if (ops.empty()) return fail(noOpsInSteps(a, rec));
  auto keep = [&](auto records) {
    std::erase_if(records, [&](const auto& r) { return !steps.has(r.step); });
    return records;
  };
  return writeOut(
      storage::toChromeTrace(ops, keep(rec.steps()), logs, keep(rec.memEvents({})), process),
      a.output);
}

// Note [Streamed CSV]: a CSV is written page by page (kPage ops, by seq), its header once, so a
// long run's export needs the memory of a page, not of the whole table (it was built whole:
// about 24 times the recording's size). --steps keeps the rows of those steps.
int runCsv(const ExportArgs& a) {
  const std::string file = recordingOfRank(a.recording, a.rank);
  const StepFilter steps = parseStepFilter(a.steps);
  checkOutput(a, file, {{storage::kOpCsvHeader}, {storage::kTensorCsvHeader}}, "a CSV export");
  storage::Recording rec = storage::Recording::open(file);
  noteMissingOps(a.recording, rec);
  const std::string_view header = a.tensors ? storage::kTensorCsvHeader : storage::kOpCsvHeader;
  constexpr int64_t kPage = 4096;
  PieceWriter out(a.output);
  bool going = out.write(std::string(header));
  int64_t rows = 0;
  // Every op, page by page; with --steps, each of those steps' ops (no other step is read).
  std::vector<std::optional<int64_t>> parts;
  if (a.steps.empty())
    parts.push_back(std::nullopt);
  else
    for (const int64_t step : recordedSteps(rec, steps)) parts.push_back(step);
  for (const std::optional<int64_t>& step : parts) {
    storage::OpQuery q;
    q.step = step;
    q.withTensors = true;  // the op rows name their tensors and output 0's MD5 too
    q.limit = kPage;
    q.seqBegin = 0;
    while (going) {
      const std::vector<storage::OpRecord> page = rec.ops(q);
      if (page.empty()) break;
      q.seqBegin = page.back().seq + 1;
      rows += int64_t(page.size());
      const std::string text = a.tensors ? storage::toTensorCsv(page) : storage::toCsv(page);
      going = out.write(text.substr(header.size()));  // each page's text starts with the header
      if (int64_t(page.size()) < kPage) break;
    }
  }
  if (!a.steps.empty() && rows == 0 && interruptSignal() == 0) return fail(noOpsInSteps(a, rec));
  return out.finish();
}

}  // namespace

Command addExportCommand(CLI::App& root) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* c = root.add_subcommand("export", "write a recording as DOT, a Chrome trace or CSV");
  c->require_subcommand(1);
  CLI::App* graph = c->add_subcommand(
      "graph",
      "dataflow graph of one step (Graphviz DOT): the studio's graph. Its layout, not the full "
      "dataflow: with --phase both, backward edges are written reversed (consumer -> producer, "
      "dir=back) and the edges from forward ops to the backward ops that read their outputs "
      "(saved activations) are left out");
  graph->add_option("recording", a->recording, "recording file (.db) or run folder (--rank)")
      ->required()
      ->check(nonEmptyName());
  graph->add_option("--step", a->step, "training step")
      ->check(wholeNumber(0))
      ->capture_default_str();
  graph
      ->add_option("--phase", a->phase,
                   "forward | backward | both (forward and backward) | optimizer")
      ->capture_default_str();
  graph->add_option("--format", a->format, "dot | svg (laid out with Graphviz)")
      ->capture_default_str();
  graph->add_flag("--collapse", a->collapse,
                  "draw each top-level module as one node (default: every module expanded)");
  graph
      ->add_option("--expand", a->expand,
                   "expand these modules (and those around them), collapse the others")
      ->delimiter(',')
      ->check(nonEmptyValue());  // '' expanded nothing: the picture of --collapse
  graph->add_option("-o,--output", a->output, "output file (default: stdout)")
      ->check(nonEmptyValue());
  CLI::App* trace = c->add_subcommand("trace",
                                      "Chrome trace event JSON for Perfetto: ops per engine "
                                      "thread, steps, log lines, memory counters");
  trace->add_option("recording", a->recording, "recording file (.db) or run folder (--rank)")
      ->required()
      ->check(nonEmptyName());
  trace->add_option("-o,--output", a->output, "output file (default: stdout)")
      ->check(nonEmptyValue());
  trace->add_option("--steps", a->steps,
                    "only these steps: A:B, A: (to the end) or A (default: every step)");
  CLI::App* csv = c->add_subcommand("csv", "one row per op call (or per tensor: --tensors)");
  csv->add_option("recording", a->recording, "recording file (.db) or run folder (--rank)")
      ->required()
      ->check(nonEmptyName());
  csv->add_flag("--tensors", a->tensors,
                "one row per tensor an op read or wrote: shape, dtype, MD5s, statistics");
  csv->add_option("-o,--output", a->output, "output file (default: stdout)")
      ->check(nonEmptyValue());
  csv->add_option("--steps", a->steps,
                  "only these steps: A:B, A: (to the end) or A (default: every step)");
  for (CLI::App* sub : {graph, trace, csv}) addRankOption(sub, a->rank);
  return {c, [a, graph, trace] {
            if (graph->parsed()) return runGraph(*a);
            if (trace->parsed()) return runTrace(*a);
            return runCsv(*a);
          }};
}

}  // namespace keel::cli
