// libFuzzer target: recordings through storage's only read API. An input is an SQLite file image;
// the custom mutator damages it at the page level (libFuzzer's byte mutations) or the row level
// (one value of one row set to an edge case, or one row deleted). See Note [Damaged recordings].
#include <sqlite3.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "keel/analysis/graph_dot.h"
#include "keel/analysis/memory_model.h"
#include "keel/analysis/tile_map.h"
#include "keel/capture/alloc_trace_io.h"
#include "keel/error.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t maxSize);

namespace {

using namespace keel;

// Everything a command or a view may ask of a recording, read in full: steps, every op with its
// tensors, stacks, dumps and their values, mask summaries, logs, allocator events; then what the
// commands and views build from it: each step's graph (DOT text, every module expanded), the
// memory model, the allocation trace `keel memory replay` replays (it must be well formed: every
// free names a live block, no id live twice), a diff with itself, and a module-aligned diff with
// a damaged copy of itself.
void readEverything(const storage::Recording& rec) {
  rec.run();
  rec.steps();
  rec.opCount();
  rec.opCountsByNameAndPhase();
  rec.kernelUses();
  rec.firstNonFinite();
  rec.dropped();
  const std::vector<storage::OpRecord> ops = rec.allOps();
  for (const storage::OpRecord& o : ops) {
    analysis::maskSummaryFromAttrs(o.attrsJson);
    if (o.stackId >= 0) rec.stack(o.stackId);
    for (const storage::DumpRecord& d : rec.dumps(o.seq)) rec.dumpValues(o.seq, d.role, d.index);
  }
  rec.ops({});
  rec.logs({});
  for (const storage::StepRecord& s : rec.steps()) analysis::buildGraphDot(rec.stepOps(s.step), {});
  const analysis::MemoryModel m = analysis::loadMemoryModel(rec);
  if (m.eventCount() > 0) {
    const int64_t last = int64_t(m.eventCount()) - 1;
    m.figuresAtPeak();
    analysis::layoutMemory(m.stateAt(last), analysis::MemScale::Linear);
    m.bands(0, last, 64, 1024);
    try {
      const AllocTrace t = capture::allocTraceFromRecording(rec);
      std::unordered_set<uint64_t> live;
      for (const TraceEvent& e : t.events)
        if ((e.kind == TraceEvent::Alloc &&
             (!live.insert(e.id).second || e.bytes > kMaxTraceBlock)) ||
            (e.kind == TraceEvent::Free && !live.erase(e.id)))
          __builtin_trap();
    } catch (const keel::Error&) {  // no alloc events
    }
  }
  storage::diffRuns(ops, ops, {}, {});
  // The module alignment across frameworks (Note [Diff across frameworks]) on the same ops,
  // against a copy missing every fourth op and changed in every third op's outputs: pairs,
  // one-sided ops and the root search through views all run on damaged records.
  std::vector<storage::OpRecord> other;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i % 4 == 3) continue;
    other.push_back(ops[i]);
    if (i % 3 != 0) continue;
    for (storage::TensorRecord& t : other.back().tensors)
      if (t.role == storage::Role::Output) t.md5 += "x", t.stats.max += 1.0;
  }
  storage::DiffOptions modules;
  modules.align = storage::DiffAlign::Module;
  storage::diffRuns(ops, other, modules, {});
}

// Names and values for the row-level mutator.
const int64_t kEdges[] = {0,
                          1,
                          -1,
                          2,
                          INT32_MAX,
                          int64_t(1) << 31,
                          int64_t(1) << 40,
                          (int64_t(1) << 44) + 1,
                          int64_t(1) << 62,
                          INT64_MAX,
                          INT64_MIN,
                          int64_t(3) << 30};

// One value of one row of one table changed, or one row deleted, inside the SQLite image `data`
// (its new size, or 0 when the image is not one SQLite can change or grows past maxSize).
size_t mutateRow(uint8_t* data, size_t size, size_t maxSize, std::mt19937_64& rng) {
  sqlite3* db = nullptr;
  if (sqlite3_open(":memory:", &db) != SQLITE_OK) return 0;
  size_t out = 0;
  auto* copy = static_cast<unsigned char*>(sqlite3_malloc64(size));
  if (copy) {
    std::memcpy(copy, data, size);
    if (sqlite3_deserialize(db, "main", copy, sqlite3_int64(size), sqlite3_int64(size),
                            SQLITE_DESERIALIZE_FREEONCLOSE | SQLITE_DESERIALIZE_RESIZEABLE) !=
        SQLITE_OK)
      copy = nullptr;
  }
  auto column = [&](const std::string& q) {
    std::vector<std::string> r;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, q.c_str(), -1, &st, nullptr) != SQLITE_OK) return r;
    while (sqlite3_step(st) == SQLITE_ROW) {
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
      r.emplace_back(t ? t : "");
    }
    sqlite3_finalize(st);
    return r;
  };
  const std::vector<std::string> tables =
      copy ? column("SELECT name FROM sqlite_master WHERE type = 'table'")
           : std::vector<std::string>();
  if (!tables.empty()) {
    const std::string table = tables[rng() % tables.size()];
    const std::vector<std::string> cols =
        column("SELECT name FROM pragma_table_info('" + table + "')");
    const std::vector<std::string> rows = column("SELECT rowid FROM \"" + table + "\"");
    // (WITHOUT ROWID tables, stack_frames, have no rowid: libFuzzer's byte mutations reach them.)
    const std::string pick = rows.empty() ? "" : "rowid = " + rows[rng() % rows.size()];
    const std::string col = cols.empty() ? "" : cols[rng() % cols.size()];
    std::string sqlText;
    sqlite3_stmt* st = nullptr;
    const unsigned what = unsigned(rng() % 8);
    if (!pick.empty() && !col.empty()) {
      if (what == 0) {
        sqlText = "DELETE FROM \"" + table + "\" WHERE " + pick;
      } else if (what == 1) {  // another row's value
        sqlText = "UPDATE \"" + table + "\" SET \"" + col + "\" = (SELECT \"" + col + "\" FROM \"" +
                  table + "\" ORDER BY random() LIMIT 1) WHERE " + pick;
      } else if (what == 2) {  // off by one
        sqlText = "UPDATE \"" + table + "\" SET \"" + col + "\" = \"" + col + "\" + " +
                  (rng() % 2 ? "1" : "-1") + " WHERE " + pick;
      } else {
        sqlText = "UPDATE \"" + table + "\" SET \"" + col + "\" = ?1 WHERE " + pick;
      }
      if (sqlite3_prepare_v2(db, sqlText.c_str(), -1, &st, nullptr) == SQLITE_OK) {
        std::string text;
        std::vector<uint8_t> blob;
        switch (what) {
          case 3:
          case 4:
            sqlite3_bind_int64(st, 1, kEdges[rng() % std::size(kEdges)]);
            break;
          case 5:
            sqlite3_bind_int64(st, 1, int64_t(rng() % 1000) - 100);
            break;
          case 6:
            text.assign(size_t(rng() % 4 == 0 ? 70000 : rng() % 64), char('a' + rng() % 26));
            sqlite3_bind_text(st, 1, text.data(), int(text.size()), SQLITE_STATIC);
            break;
          case 7:
            blob.resize(size_t(rng() % 48));
            for (uint8_t& b : blob) b = uint8_t(rng());
            if (rng() % 4 == 0)
              sqlite3_bind_null(st, 1);
            else
              sqlite3_bind_blob(st, 1, blob.data(), int(blob.size()), SQLITE_STATIC);
            break;
          default:
            break;
        }
        sqlite3_step(st);
        sqlite3_finalize(st);
        sqlite3_int64 n = 0;
        if (unsigned char* image = sqlite3_serialize(db, "main", &n, 0)) {
          if (n > 0 && size_t(n) <= maxSize) {
            std::memcpy(data, image, size_t(n));
            out = size_t(n);
          }
          sqlite3_free(image);
        }
      }
    }
  }
  sqlite3_close(db);
  return out;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t maxSize,
                                          unsigned int seed) {
  std::mt19937_64 rng(seed);
  if (rng() % 3 != 0)
    if (size_t n = mutateRow(data, size, maxSize, rng)) return n;
  return LLVMFuzzerMutate(data, size, maxSize);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One file per process, removed with its side files when libFuzzer exits.
  struct Scratch {
    std::string path = "/tmp/fuzz_recording_" + std::to_string(::getpid()) + ".db";
    ~Scratch() {
      for (const char* suffix : {"", "-wal", "-shm", "-journal"})
        std::remove((path + suffix).c_str());
    }
  };
  static const Scratch scratch;
  const std::string& path = scratch.path;
  for (const char* suffix : {"-wal", "-shm", "-journal"}) std::remove((path + suffix).c_str());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  try {
    readEverything(storage::Recording::open(path));
  } catch (const storage::StorageError&) {
  }
  return 0;
}
