// `keel export graph|trace|csv`: writes a recording's op calls as Graphviz DOT or SVG (one step,
// one or both phases), a Chrome trace (JSON, opens in Perfetto) or CSV, to a file or stdout.
#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli_common.h"
#include "keel/error.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

struct ExportArgs {
  std::string recording, output, phase = "both", format = "dot";
  int64_t step = 1;
  bool tensors = false;
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

// Lays out and renders DOT text as SVG with Graphviz (cgraph + gvc, the dot engine).
std::string dotToSvg(const std::string& dot) {
  GVC_t* gvc = gvContext();
  if (!gvc) throw Error("graphviz: cannot create a context");
  Agraph_t* g = agmemread(dot.c_str());
  if (!g) {
    gvFreeContext(gvc);
    throw Error("graphviz: cannot parse the generated graph");
  }
  std::string svg;
  char* data = nullptr;
  unsigned int len = 0;
  int rc = gvLayout(gvc, g, "dot");
  if (rc == 0) {
    rc = gvRenderData(gvc, g, "svg", &data, &len);
    if (rc == 0 && data) svg.assign(data, len);
    gvFreeRenderData(data);
    gvFreeLayout(gvc, g);
  }
  agclose(g);
  gvFreeContext(gvc);
  if (rc != 0 || svg.empty()) throw Error("graphviz: layout or SVG rendering failed");
  return svg;
}

int runGraph(const ExportArgs& a) {
  if (a.format != "dot" && a.format != "svg")
    return fail("--format: expected dot or svg, got '" + a.format + "'");
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
  std::string dot = storage::toDot(ops, "step " + std::to_string(a.step) + " " + a.phase);
  return writeOut(a.format == "svg" ? dotToSvg(dot) : dot, a.output);
}

int runTrace(const ExportArgs& a) {
  storage::Recording rec = storage::Recording::open(a.recording);
  return writeOut(storage::toChromeTrace(rec.ops({}), rec.steps()), a.output);
}

int runCsv(const ExportArgs& a) {
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
  CLI::App* graph = c->add_subcommand("graph", "dataflow graph of one step (Graphviz DOT)");
  graph->add_option("recording", a->recording, "recording file (.db)")->required();
  graph->add_option("--step", a->step, "training step")->capture_default_str();
  graph->add_option("--phase", a->phase, "forward | backward | both")->capture_default_str();
  graph->add_option("--format", a->format, "dot | svg (laid out with Graphviz)")
      ->capture_default_str();
  graph->add_option("-o,--output", a->output, "output file (default: stdout)");
  CLI::App* trace = c->add_subcommand("trace", "Chrome trace event JSON (Perfetto)");
  trace->add_option("recording", a->recording, "recording file (.db)")->required();
  trace->add_option("-o,--output", a->output, "output file (default: stdout)");
  CLI::App* csv = c->add_subcommand("csv", "one row per op call (or per tensor: --tensors)");
  csv->add_option("recording", a->recording, "recording file (.db)")->required();
  csv->add_flag("--tensors", a->tensors,
                "one row per tensor an op read or wrote: shape, dtype, MD5s, statistics");
  csv->add_option("-o,--output", a->output, "output file (default: stdout)");
  return {c, [a, graph, trace] {
            if (graph->parsed()) return runGraph(*a);
            if (trace->parsed()) return runTrace(*a);
            return runCsv(*a);
          }};
}

}  // namespace keel::cli
