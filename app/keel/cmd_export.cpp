// `keel export graph|trace|csv`: writes a recording's op calls as Graphviz DOT or SVG (one step:
// the studio's graph, by the same analysis::buildGraphDot), a Chrome trace (JSON, opens in
// Perfetto) or CSV, to a file or stdout.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli_common.h"
#include "keel/analysis/graph_dot.h"
#include "keel/analysis/graph_layout.h"
#include "keel/base/output_path.h"
#include "keel/error.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

struct ExportArgs {
  std::string recording, output, phase = "both", format = "dot";
  int64_t step = 1;
  bool tensors = false, collapse = false;
  std::vector<std::string> expand;
};

// stdout ("" or "-"), or a file replaced only once it is complete (Note [Outputs never destroy
// inputs]); a write error (a full disk, a closed pipe) is an error, and a partial file is removed.
int writeOut(const std::string& text, const std::string& output) {
  if (output.empty() || output == "-") return writeToStdout(text);
  ReplaceOnCommit file(output);
  std::FILE* f = std::fopen(file.path().c_str(), "wb");
  if (!f) return fail("cannot write " + output + ": " + std::strerror(errno));
  try {
    writeAll(f, text.data(), text.size(), output);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) return fail("cannot write " + output + ": " + std::strerror(errno));
  file.commit();
  std::printf("wrote %s (%zu bytes)\n", output.c_str(), text.size());
  return 0;
}

// The output guard, before the recording is opened: never the recording, and an existing file
// only where it is an earlier export of the same kind (its first bytes `magic`) or empty --
// `export csv -o other.db` replaced another recording.
void checkOutput(const ExportArgs& a, std::string_view magic, const std::string& what) {
  if (a.output.empty() || a.output == "-") return;  // stdout (an explicit "" is refused)
  checkOutputPath("-o", a.output, {{"the recording", a.recording}});
  checkReplacesOnly("-o", a.output, magic, what);
}

int runGraph(const ExportArgs& a) {
  if (a.format != "dot" && a.format != "svg")
    return fail("--format: expected dot or svg, got '" + a.format + "'");
  const analysis::GraphPhase phase = analysis::parseGraphPhase(a.phase);
  if (a.phase != analysis::toString(phase))
    return fail("--phase: expected forward, backward, both or optimizer, got '" + a.phase + "'");
  checkOutput(a, a.format == "svg" ? std::string_view("<?xml") : std::string_view("digraph"),
              a.format == "svg" ? "an SVG picture" : "a DOT graph");
  // What the studio's graph of this step shows with the same phase and expansion: every op of the
  // step as the studio loads it, through the one DOT builder (with its fixed text metrics).
  storage::Recording rec = storage::Recording::open(a.recording);
  const std::vector<storage::OpRecord> ops = rec.stepOps(a.step);
  if (analysis::countGraphOps(ops, phase) == 0)
    return fail("recording " + a.recording + " has no " +
                (a.phase == "both" ? std::string() : a.phase + " ") + "ops in step " +
                std::to_string(a.step));
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
  const analysis::GraphDot graph = analysis::buildGraphDot(ops, o);
  if (a.format == "dot") return writeOut(graph.dot, a.output);
  const analysis::GraphSvg svg = analysis::renderSvg(graph.dot);
  if (!svg.error.empty()) throw Error(svg.error);
  return writeOut(svg.svg, a.output);
}

int runTrace(const ExportArgs& a) {
  checkOutput(a, "{", "a JSON trace");
  storage::Recording rec = storage::Recording::open(a.recording);
  return writeOut(storage::toChromeTrace(rec.ops({}), rec.steps(), rec.logs({}), rec.memEvents({})),
                  a.output);
}

int runCsv(const ExportArgs& a) {
  checkOutput(a, "seq,step,", "a CSV export");
  storage::Recording rec = storage::Recording::open(a.recording);
  if (a.tensors) {
    storage::OpQuery q;
    q.withTensors = true;
    return writeOut(storage::toTensorCsv(rec.ops(q)), a.output);
  }
  return writeOut(storage::toCsv(rec.ops({})), a.output);
}

}  // namespace

Command addExportCommand(CLI::App& root) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* c = root.add_subcommand("export", "write a recording as DOT, a Chrome trace or CSV");
  c->require_subcommand(1);
  CLI::App* graph =
      c->add_subcommand("graph", "dataflow graph of one step (Graphviz DOT): the studio's graph");
  graph->add_option("recording", a->recording, "recording file (.db)")
      ->required()
      ->check(nonEmptyName());
  graph->add_option("--step", a->step, "training step")
      ->check(wholeNumber(0))
      ->capture_default_str();
  graph->add_option("--phase", a->phase, "forward | backward | both | optimizer")
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
  trace->add_option("recording", a->recording, "recording file (.db)")
      ->required()
      ->check(nonEmptyName());
  trace->add_option("-o,--output", a->output, "output file (default: stdout)")
      ->check(nonEmptyValue());
  CLI::App* csv = c->add_subcommand("csv", "one row per op call (or per tensor: --tensors)");
  csv->add_option("recording", a->recording, "recording file (.db)")
      ->required()
      ->check(nonEmptyName());
  csv->add_flag("--tensors", a->tensors,
                "one row per tensor an op read or wrote: shape, dtype, MD5s, statistics");
  csv->add_option("-o,--output", a->output, "output file (default: stdout)")
      ->check(nonEmptyValue());
  return {c, [a, graph, trace] {
            if (graph->parsed()) return runGraph(*a);
            if (trace->parsed()) return runTrace(*a);
            return runCsv(*a);
          }};
}

}  // namespace keel::cli
