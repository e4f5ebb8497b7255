// `keel export graph|trace|csv`: writes a recording's op calls as Graphviz DOT (one step, one or
// both phases), a Chrome trace (JSON, opens in Perfetto) or CSV, to a file or stdout.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli_common.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

struct ExportArgs {
  std::string recording, output, phase = "both", format = "dot";
  int64_t step = 1;
};

int writeOut(const std::string& text, const std::string& output) {
  if (output.empty() || output == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream out(output, std::ios::binary);
  out << text;
  out.close();
  if (!out) return fail("cannot write '" + output + "'");
  std::printf("wrote %s (%zu bytes)\n", output.c_str(), text.size());
  return 0;
}

int runGraph(const ExportArgs& a) {
  if (a.format != "dot")
    return fail(
        "--format " + a.format +
        ": only dot is written here; pipe it to Graphviz: keel export graph ... | dot -Tsvg");
  if (a.phase != "forward" && a.phase != "backward" && a.phase != "both")
    return fail("--phase: expected forward, backward or both, got '" + a.phase + "'");
  storage::Recording rec = storage::Recording::open(a.recording);
  storage::OpQuery q;
  q.step = a.step;
  if (a.phase != "both") q.phase = a.phase;
  auto ops = rec.ops(q);
  if (ops.empty())
    return fail("recording " + a.recording + " has no " +
                (a.phase == "both" ? std::string() : a.phase + " ") + "ops in step " +
                std::to_string(a.step));
  if (a.phase == "both")  // forward and backward only: optimizer updates are not part of the graph
    std::erase_if(ops, [](const storage::OpRecord& o) { return o.phase == "optimizer"; });
  return writeOut(storage::toDot(ops, "step " + std::to_string(a.step) + " " + a.phase), a.output);
}

int runTrace(const ExportArgs& a) {
  storage::Recording rec = storage::Recording::open(a.recording);
  return writeOut(storage::toChromeTrace(rec.ops({}), rec.steps()), a.output);
}

int runCsv(const ExportArgs& a) {
  storage::Recording rec = storage::Recording::open(a.recording);
  return writeOut(storage::toCsv(rec.ops({})), a.output);
}

}  // namespace

Command addExportCommand(CLI::App& root) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* c = root.add_subcommand("export", "write a recording as DOT, a Chrome trace or CSV");
  c->require_subcommand(1);
  CLI::App* graph = c->add_subcommand("graph", "dataflow graph of one step (Graphviz DOT)");
  graph->add_option("recording", a->recording, "recording file (.db)")->required();
  graph->add_option("--step", a->step, "training step")->capture_default_str();
  graph->add_option("--phase", a->phase, "forward | backward | both")->capture_default_str();
  graph->add_option("--format", a->format, "dot")->capture_default_str();
  graph->add_option("-o,--output", a->output, "output file (default: stdout)");
  CLI::App* trace = c->add_subcommand("trace", "Chrome trace event JSON (Perfetto)");
  trace->add_option("recording", a->recording, "recording file (.db)")->required();
  trace->add_option("-o,--output", a->output, "output file (default: stdout)");
  CLI::App* csv = c->add_subcommand("csv", "one row per op call");
  csv->add_option("recording", a->recording, "recording file (.db)")->required();
  csv->add_option("-o,--output", a->output, "output file (default: stdout)");
  return {c, [a, graph, trace] {
            if (graph->parsed()) return runGraph(*a);
            if (trace->parsed()) return runTrace(*a);
            return runCsv(*a);
          }};
}

}  // namespace keel::cli
