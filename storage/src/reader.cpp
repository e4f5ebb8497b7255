// Recording: validates a file (exists, SQLite, Keel application_id, schema version, quick_check)
// and answers the read API with prepared statements. Strings are resolved through an id-indexed
// cache that grows when a live writer adds new ones; nothing here writes except a migration. What
// a row must hold to be read is checked as it is read: see Note [Damaged recordings].
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <variant>

#include "keel/base/dtype.h"
#include "keel/base/text.h"
#include "keel/base/values.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"
#include "keel/storage/schema.h"
#include "packed.h"
#include "schema_impl.h"
#include "sqlite.h"

namespace keel::storage {

namespace {

// Note [Damaged recordings]
// A file can open cleanly (a Keel recording, quick_check passes) and still be wrong inside: rows
// written by another tool, a flipped bit, a fuzzer. The reader checks what it and the commands
// and views after it rely on, where each row is read, and reports a violation as one
// DamagedRecording: "damaged recording <file>: <what>, in <table> row <id>" (the CLI prints it as
// one line and exits 2, the studio shows it in a dialog). Nothing the file claims sizes work or
// memory beyond what the file holds. Detected:
//  - strings: an id far past the rows before it (the cache is a vector indexed by id; a writer
//    assigns ids densely from 1, so an id past twice the rows read plus 1024 is damage, and it
//    would size the cache); a text longer than kMaxStringBytes (64 KiB: strings are names,
//    scopes, attributes, dtypes, frames and kernel variants, a few hundred bytes at most; a 10 MB
//    "name" would stall every view that draws it); any *_sid naming a string the table lacks.
//  - ops: seq below 1 (0 means "no op" in forward_seq and op_seq columns, and a negative seq
//    would sort before the initialisation); step outside 0 .. 2^31 - 1 (the studio's step box is
//    an int); begin_ns or end_ns outside 0 .. 2^62 (views subtract them); forward_seq neither 0
//    nor an earlier seq (a backward op differentiates an op that ran before it, so forward links
//    only point back and can never form a cycle); a scope nested more than 64 modules deep (a
//    model nests a few; the graph builds one cluster per level and every prefix of the path); an
//    unknown phase; a kernel_id the kernels table lacks; an op of another step inside a step's seq
//    range (the engine dispatches ops on one thread, so each step's ops are one seq range: stepOps
//    reads that range, and steps woven into each other would make reading every step quadratic).
//  - op_tensors: a truncated, malformed or overlong BLOB; an entry with an index past 2^31 - 1, a
//    negative size, or 2^40 or more elements or bytes (packed.h, kMaxTensorElements).
//  - steps: step outside 1 .. 2^31 - 1, times outside 0 .. 2^62.
//  - logs: a level outside 0 (error) .. 4 (verbose).
//  - mem_events: an unknown kind or tag; bytes past 2^44 (as keel/alloc_trace.h's kMaxTraceBlock:
//    bytes -1 read as 2^64 - 1 made memory replay reserve without bound).
//  - dumps: a role other than 0 or 1; an index past 2^31 - 1; raw_bytes negative or past
//    kMaxDumpBytes (1 GiB); a zstd frame whose data could not expand to raw_bytes (zstd expands
//    at most kZstdMaxRatio times), or whose header names another size: a damaged raw_bytes of
//    3 GiB made the studio allocate 3 GB when the op was selected. (Not damage but the same
//    bound: dumpValues reads at most 2^27 values, 1 GiB as doubles.)
//  - nonfinite_ops: an op the ops table lacks.
// Tolerated (read as stored):
//  - references to ops the ops table lacks: ops.forward_seq, logs, mem_events and dumps op_seq.
//    A capture filter or --step-range records some ops and not others, so a forward op or a
//    log's op may be absent; readers of these links look the op up and treat a miss as none.
//    op_tensors rows without an op are never read.
//  - stack ids the stacks table lacks (ops and mem_events): stack() answers nullopt. A batch lost
//    to a full disk takes a new stack's row with it while later ops still name that stack (the
//    writer's string and kernel caches are reloaded then; capture's stack ids are not).
//  - frames a stack_frames row names but the frames table lacks: the stack reads shorter.
//  - values that are only shown or compared: tensor statistics, strides and offsets, addresses,
//    thread ids, allocator figures, times of logs and allocator events (in any order), counts in
//    op_counts and dropped, the run row's texts (JSON Keel parses is depth-checked first).
//  - a log message longer than kMaxStringBytes: read cut there, saying how much was left out.
using detail::kMaxStringBytes;
constexpr int64_t kMaxScopeDepth = 64;
constexpr int64_t kMaxStep = INT32_MAX;
constexpr int64_t kMaxTimeNs = int64_t(1) << 62;
constexpr int64_t kMaxDumpBytes = int64_t(1) << 30;
// The most a zstd frame expands: an RLE block is 4 bytes for up to 128 KiB.
constexpr int64_t kZstdMaxRatio = 32768;

constexpr const char* kOpColumns =
    "seq, step, phase_sid, name_sid, attrs_sid, scope_sid, thread, begin_ns, end_ns, forward_seq,"
    " stack_id, kernel_id";

// Binds collected while building a dynamic WHERE clause.
struct Binds {
  std::vector<std::variant<int64_t, std::string>> values;
  std::string where;
  void add(const std::string& cond, int64_t v) { addCond(cond, v); }
  void add(const std::string& cond, const std::string& v) { addCond(cond, v); }
  template <class T>
  void addCond(const std::string& cond, T v) {
    values.emplace_back(std::move(v));
    std::string c = cond;
    // "?" in cond stands for this value's parameter number.
    std::string num = "?" + std::to_string(values.size());
    for (size_t p = c.find('?'); p != std::string::npos; p = c.find('?', p + num.size()))
      c.replace(p, 1, num);
    where += where.empty() ? " WHERE " : " AND ";
    where += c;
  }
  void apply(sql::Stmt& s) const {
    for (size_t i = 0; i < values.size(); ++i) {
      int n = static_cast<int>(i + 1);
      if (auto* v = std::get_if<int64_t>(&values[i]))
        s.bind(n, *v);
      else
        s.bindText(n, std::get<std::string>(values[i]));
    }
  }
};

// Resets a cached statement however the scope is left, so a throw mid-iteration never leaves it
// running (holding a read transaction open).
struct ResetOnExit {
  sql::Stmt& stmt;
  ~ResetOnExit() { stmt.reset(); }
};

// At most 80 bytes of a stored text, for a message.
std::string excerpt(std::string_view text) {
  return text.size() <= 80 ? std::string(text) : std::string(text.substr(0, 80)) + "...";
}

std::string limitClause(int64_t limit) {
  return limit >= 0 ? " LIMIT " + std::to_string(limit) : std::string();
}

// keel_scope_within(scope, prefix) in SQL is keel::scopeWithin itself, so the scope filter of
// Recording::ops is the one scope rule, not a second spelling of it in SQL.
void sqlScopeWithin(sqlite3_context* ctx, int, sqlite3_value** argv) {
  const auto text = [](sqlite3_value* v) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_value_text(v));
    return p ? std::string_view(p, size_t(sqlite3_value_bytes(v))) : std::string_view();
  };
  const std::string_view scope = text(argv[0]);
  sqlite3_result_int(ctx, scopeWithin(scope, text(argv[1])) ? 1 : 0);
}

void registerScopeWithin(const sql::Db& db) {
  const int rc = sqlite3_create_function_v2(db.get(), "keel_scope_within", 2,
                                            SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS,
                                            nullptr, sqlScopeWithin, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) db.fail("cannot register keel_scope_within", rc);
}

}  // namespace

struct Recording::Impl {
  sql::Db db;
  int version = 0;
  mutable std::vector<std::string> strings;  // index = strings.id
  mutable std::vector<bool> known;
  mutable sql::Stmt tensorsOfOp, tensorsInRange, opBySeq;
  mutable std::unordered_map<int64_t, KernelRecord> kernels;

  mutable size_t stringRows = 0;  // rows read into `strings`

  // See Note [Damaged recordings].
  [[noreturn]] void damaged(const std::string& what, const char* table, int64_t row) const {
    throw DamagedRecording(db.path(), what, table, row);
  }

  // A stored name as its vocabulary enum; a name this keel does not know is damage.
  template <typename E>
  E enumOf(std::optional<E> (*parse)(std::string_view), const std::string& text, const char* what,
           const char* table, int64_t row) const {
    if (auto e = parse(text)) return *e;
    damaged("unknown " + std::string(what) + " '" + excerpt(text) + "'", table, row);
  }
  // The string `id` that row `row` of `table` names.
  const std::string& str(int64_t id, const char* table, int64_t row) const {
    if (id < 0 || static_cast<size_t>(id) >= strings.size() || !known[static_cast<size_t>(id)]) {
      loadStrings();
      if (id < 0 || static_cast<size_t>(id) >= strings.size() || !known[static_cast<size_t>(id)])
        damaged("string " + std::to_string(id) + " is not in the strings table", table, row);
    }
    return strings[static_cast<size_t>(id)];
  }

  void loadStrings() const {
    sql::Stmt s(db, "SELECT id, text FROM strings WHERE id >= ?1 ORDER BY id");
    s.bind(1, static_cast<int64_t>(strings.size()));
    while (s.step()) {
      const int64_t id = s.i64(0);
      if (uint64_t(id) > 2 * uint64_t(stringRows) + 1024)
        damaged("string id " + std::to_string(id) + " lies far past the " +
                    std::to_string(stringRows) + " strings before it",
                "strings", id);
      const std::string_view text = s.textView(1);
      if (text.size() > kMaxStringBytes)
        damaged("string " + std::to_string(id) + " is " + std::to_string(text.size()) +
                    " bytes long (names, scopes and attributes are at most " +
                    std::to_string(kMaxStringBytes) + ")",
                "strings", id);
      if (size_t(id) >= strings.size()) {
        strings.resize(size_t(id) + 1);
        known.resize(size_t(id) + 1, false);
      }
      strings[size_t(id)] = std::string(text);
      known[size_t(id)] = true;
      ++stringRows;
    }
  }

  // A step number (`what` says whose) in min .. 2^31 - 1: 0 (initialisation) for ops, 1 for steps.
  void checkStep(int64_t step, int64_t min, const std::string& what, const char* table,
                 int64_t row) const {
    if (step < min || step > kMaxStep)
      damaged(what + " " + std::to_string(step) + " is out of range (" + std::to_string(min) +
                  " .. 2^31 - 1)",
              table, row);
  }
  void checkTimes(int64_t begin, int64_t end, const std::string& what, const char* table,
                  int64_t row) const {
    for (int64_t t : {begin, end})
      if (t < 0 || t > kMaxTimeNs)
        damaged(what + ": time " + std::to_string(t) + " ns is out of range (0 .. 2^62)", table,
                row);
  }

  // An ops row (kOpColumns). See Note [Damaged recordings].
  OpRecord readOp(const sql::Stmt& s) const {
    OpRecord o;
    const int64_t seq = s.i64(0);
    if (seq < 1) damaged("op seq " + std::to_string(seq) + " is not positive", "ops", seq);
    const std::string op = "op " + std::to_string(seq);
    o.seq = uint64_t(seq);
    o.step = s.i64(1);
    checkStep(o.step, 0, op + ": step", "ops", seq);
    o.phase = enumOf(parsePhase, str(s.i64(2), "ops", seq), "phase", "ops", seq);
    o.name = str(s.i64(3), "ops", seq);
    o.attrsJson = str(s.i64(4), "ops", seq);
    o.scope = str(s.i64(5), "ops", seq);
    if (const auto dots = std::count(o.scope.begin(), o.scope.end(), '.'); dots >= kMaxScopeDepth)
      damaged(op + ": scope nests " + std::to_string(dots + 1) + " modules deep (at most " +
                  std::to_string(kMaxScopeDepth) + ")",
              "ops", seq);
    o.thread = s.i64(6);
    o.beginNs = s.i64(7);
    o.endNs = s.i64(8);
    checkTimes(o.beginNs, o.endNs, op, "ops", seq);
    const int64_t forward = s.i64(9);
    if (forward < 0 || forward >= seq)
      damaged(
          op + " links to forward op " + std::to_string(forward) + ", which did not run before it",
          "ops", seq);
    o.forwardSeq = uint64_t(forward);
    o.stackId = s.isNull(10) ? -1 : s.i64(10);
    if (!s.isNull(11)) o.kernel = kernel(s.i64(11), "ops", seq);
    return o;
  }

  // Whether the op counts were summarised (the recording was closed by its writer or migrated).
  bool hasOpCounts() const {
    sql::Stmt s(db, "SELECT 1 FROM op_counts LIMIT 1");
    return s.step();
  }

  // The kernels table is small (a run repeats a handful); read once, again on an unknown id (a
  // recording still being written). `table` and `row` name who asks.
  const KernelRecord& kernel(int64_t id, const char* table, int64_t row) const {
    auto it = kernels.find(id);
    if (it == kernels.end()) {
      sql::Stmt k(db, "SELECT id, backend_sid, variant_sid, params_sid FROM kernels");
      while (k.step()) {
        const int64_t kid = k.i64(0);
        kernels[kid] = KernelRecord{str(k.i64(1), "kernels", kid), str(k.i64(2), "kernels", kid),
                                    str(k.i64(3), "kernels", kid)};
      }
      it = kernels.find(id);
      if (it == kernels.end())
        damaged("kernel " + std::to_string(id) + " is not in the kernels table", table, row);
    }
    return it->second;
  }

  // Appends the op's packed tensors from a row (op_seq, count, data) of op_tensors.
  void readTensors(const sql::Stmt& s, OpRecord& o) const {
    const auto* p = static_cast<const uint8_t*>(s.blob(2));
    const int64_t row = int64_t(o.seq);
    detail::unpackTensors(
        p, s.blobSize(2), s.i64(1), [&](int64_t id) { return str(id, "op_tensors", row); },
        o.tensors,
        [&](const std::string& problem) {
          return DamagedRecording(db.path(), "op " + std::to_string(row) + ": " + problem,
                                  "op_tensors", row);
        });
  }

  // The dumps of one op, with their row ids, in (role, idx, id) order; rows checked (Note
  // [Damaged recordings]).
  std::vector<std::pair<int64_t, DumpRecord>> readDumps(uint64_t opSeq) const {
    sql::Stmt s(db,
                "SELECT id, op_seq, role, idx, dtype_sid, shape, codec_sid, raw_bytes, data FROM "
                "dumps WHERE op_seq = ?1 ORDER BY role, idx, id");
    s.bind(1, opSeq);
    std::vector<std::pair<int64_t, DumpRecord>> out;
    while (s.step()) {
      const int64_t id = s.i64(0);
      DumpRecord d;
      d.opSeq = s.u64(1);
      const int64_t role = s.i64(2), index = s.i64(3);
      const std::string what = "dump of op " + std::to_string(s.i64(1));
      if (role != 0 && role != 1)
        damaged(what + ": role " + std::to_string(role) + " is out of range (0 input, 1 output)",
                "dumps", id);
      if (index < 0 || index > INT32_MAX)
        damaged(what + ": index " + std::to_string(index) + " is out of range (0 .. 2^31 - 1)",
                "dumps", id);
      d.role = static_cast<Role>(role);
      d.index = static_cast<int32_t>(index);
      d.dtype = str(s.i64(4), "dumps", id);
      d.shape = detail::parseDims(s.textView(5));
      d.codec = str(s.i64(6), "dumps", id);
      d.rawBytes = s.i64(7);
      if (d.rawBytes < 0 || d.rawBytes > kMaxDumpBytes)
        damaged(what + (role ? " output " : " input ") + std::to_string(index) + " claims " +
                    std::to_string(d.rawBytes) + " bytes (out of range 0 .. 2^30)",
                "dumps", id);
      const auto* p = static_cast<const uint8_t*>(s.blob(8));
      d.data.assign(p, p + s.blobSize(8));
      out.emplace_back(id, std::move(d));
    }
    return out;
  }

  static void sortTensors(OpRecord& o) {
    std::stable_sort(o.tensors.begin(), o.tensors.end(), [](const auto& a, const auto& b) {
      return std::pair(a.role, a.index) < std::pair(b.role, b.index);
    });
  }

  // Fills tensors of `ops` (sorted by seq): one range scan when the ops are dense in seq, else one
  // lookup per op.
  void loadTensors(std::vector<OpRecord>& ops) const {
    if (ops.empty()) return;
    uint64_t lo = ops.front().seq, hi = ops.back().seq;
    if (hi - lo <= 4 * ops.size() + 64) {
      sql::Stmt& s = tensorsInRange;
      ResetOnExit guard{s};
      s.bind(1, lo);
      s.bind(2, hi);
      size_t i = 0;
      while (s.step()) {
        uint64_t seq = s.u64(0);
        while (i < ops.size() && ops[i].seq < seq) ++i;
        if (i == ops.size()) break;
        if (ops[i].seq == seq) readTensors(s, ops[i]);
      }
    } else {
      sql::Stmt& s = tensorsOfOp;
      for (OpRecord& o : ops) {
        ResetOnExit guard{s};
        s.bind(1, o.seq);
        if (s.step()) readTensors(s, o);
      }
    }
    for (OpRecord& o : ops) sortTensors(o);
  }

  std::vector<OpRecord> queryOps(const std::string& sqlText, const Binds& b, bool tensors) const {
    sql::Stmt s(db, sqlText);
    b.apply(s);
    std::vector<OpRecord> out;
    while (s.step()) out.push_back(readOp(s));
    if (tensors) loadTensors(out);
    return out;
  }
};

namespace {
// What a file that is not a recording looks like, where a user may have meant it as one: a
// pickle (a PyTorch memory snapshot, which keel import turns into a recording) or a zip archive
// (torch.save). "" for anything else.
std::string notARecordingHint(const std::string& path) {
  if (looksLikePickle(path))
    return " (it is a Python pickle: a PyTorch memory snapshot is opened after `keel import "
           "torch-memory " +
           path + " -o run.db`)";
  unsigned char head[4] = {};
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(head), sizeof head);
  if (f.gcount() == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0)
    return " (it is a zip archive, as torch.save writes: not a recording)";
  return {};
}
}  // namespace

bool looksLikePickle(const std::string& path) {
  unsigned char head[2] = {};
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(head), sizeof head);
  return f.gcount() == 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5;
}

SqliteHeader sqliteHeader(const std::string& path) {
  char header[16] = {};
  std::ifstream f(path, std::ios::binary);
  if (!f) return SqliteHeader::Unreadable;
  f.read(header, sizeof header);
  if (f.gcount() == 0) return SqliteHeader::Empty;
  return f.gcount() == 16 && std::memcmp(header, "SQLite format 3", 16) == 0 ? SqliteHeader::Sqlite
                                                                             : SqliteHeader::Other;
}

Recording::Recording(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recording::Recording(Recording&&) noexcept = default;
Recording& Recording::operator=(Recording&&) noexcept = default;
Recording::~Recording() = default;

Recording Recording::open(const std::string& path, bool verify) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (!fs::exists(st)) throw StorageError("recording " + path + ": no such file");
  if (fs::is_directory(st)) {
    // A run folder's recordings are its rank files: name one (keel memory stats RUN/ said only
    // "is a directory").
    const std::string rank0 = (fs::path(path) / "rank-0.db").string();
    throw StorageError("recording " + path +
                       (fs::exists(fs::path(path) / "manifest.json", ec)
                            ? " is a run folder (a multi-rank run): name one rank's recording, "
                              "e.g. " +
                                  rank0
                            : " is a directory"));
  }
  // A FIFO would block the read below until a writer came; a device is no recording.
  if (const std::string kind = nonRegularKind(path); !kind.empty())
    throw StorageError("recording " + path + " is " + kind + ", not a regular file");
  switch (sqliteHeader(path)) {
    case SqliteHeader::Unreadable:
      throw StorageError("recording " + path + ": cannot read (permission denied?)");
    case SqliteHeader::Empty:
      throw StorageError("recording " + path + " is empty");
    case SqliteHeader::Other:
      throw StorageError("recording " + path + " is not an SQLite file" + notARecordingHint(path));
    case SqliteHeader::Sqlite:
      break;
  }

  auto impl = std::make_unique<Impl>();
  auto openRo = [&] {
    impl->db = sql::Db(path, SQLITE_OPEN_READONLY);
    registerScopeWithin(impl->db);
  };
  openRo();
  if (impl->db.queryInt("PRAGMA application_id") != kApplicationId)
    throw StorageError("recording " + path + " is an SQLite database but not a Keel recording");
  int64_t version = impl->db.queryInt("PRAGMA user_version");
  if (version > kSchemaVersion) throw StorageError(detail::newerVersionMessage(path, version));
  if (version < kSchemaVersion) {
    impl->db.close();
    try {
      migrateRecording(path);
    } catch (const StorageError& e) {
      // A damaged file: that is the news, not the upgrade it stopped.
      if (std::string_view(e.what()).find(" is corrupted or truncated (") != std::string_view::npos)
        throw;
      throw StorageError("recording " + path + " has schema version " + std::to_string(version) +
                         " and could not be upgraded to " + std::to_string(kSchemaVersion) + ": " +
                         e.what());
    }
    openRo();
    version = impl->db.queryInt("PRAGMA user_version");
  }
  impl->version = static_cast<int>(version);
  if (verify) {
    sql::Stmt qc(impl->db, "PRAGMA quick_check(1)");
    if (qc.step() && qc.textView(0) != "ok") {
      throw StorageError("recording " + path + " is corrupted or truncated (" +
                         sql::integrityText(qc.textView(0)) + ")");
    }
  }
  impl->db.exec("PRAGMA cache_size = -65536", "cannot configure reader");
  impl->tensorsOfOp =
      sql::Stmt(impl->db, "SELECT op_seq, count, data FROM op_tensors WHERE op_seq = ?1");
  impl->tensorsInRange = sql::Stmt(
      impl->db,
      "SELECT op_seq, count, data FROM op_tensors WHERE op_seq BETWEEN ?1 AND ?2 ORDER BY op_seq");
  impl->opBySeq =
      sql::Stmt(impl->db, std::string("SELECT ") + kOpColumns + " FROM ops WHERE seq = ?1");
  impl->loadStrings();
  return Recording(std::move(impl));
}

const std::string& Recording::path() const {
  return impl_->db.path();
}
int Recording::schemaVersion() const {
  return impl_->version;
}

RunInfo Recording::run() const {
  sql::Stmt s(impl_->db,
              "SELECT backend, device, host, config_json, seed, engine_version, "
              "start_time_unix_ns, capture_options_json, status, allocator, rank, world_size,"
              " layout FROM run WHERE id = 1");
  if (!s.step()) throw StorageError("recording " + path() + " has no run record");
  RunInfo r;
  r.backend = s.text(0);
  r.device = s.text(1);
  r.host = s.text(2);
  r.configJson = s.text(3);
  r.seed = s.u64(4);
  r.engineVersion = s.text(5);
  r.startTimeUnixNs = s.i64(6);
  r.captureOptionsJson = s.text(7);
  r.status = s.text(8);
  r.allocator = s.text(9);
  r.rank = s.i64(10);
  r.worldSize = s.i64(11);
  r.layout = s.text(12);
  return r;
}

std::vector<StepRecord> Recording::steps() const {
  sql::Stmt s(impl_->db,
              "SELECT step, begin_ns, end_ns, loss, lr, grad_norm, tokens_per_sec, aux_loss, "
              "val_loss, nan_metrics FROM steps ORDER BY step");
  std::vector<StepRecord> out;
  while (s.step()) {
    const int64_t step = s.i64(0);
    impl_->checkStep(step, 1, "step", "steps", step);
    impl_->checkTimes(s.i64(1), s.i64(2), "step " + std::to_string(step), "steps", step);
    out.push_back({step, s.i64(1), s.i64(2), s.f64(3), s.f64(4), s.f64(5), s.f64(6), s.f64(7),
                   s.f64(8), uint8_t(s.i64(9) & 0x3f)});
  }
  return out;
}

int64_t Recording::opCount() const {
  return impl_->db.queryInt("SELECT count(*) FROM ops");
}

std::vector<OpRecord> Recording::ops(const OpQuery& q) const {
  Binds b;
  if (q.step) b.add("step = ?", *q.step);
  if (q.phase)
    b.add("phase_sid = (SELECT id FROM strings WHERE text = ?)", std::string(phaseName(*q.phase)));
  if (q.name) b.add("name_sid = (SELECT id FROM strings WHERE text = ?)", *q.name);
  if (q.scopePrefix && !q.scopePrefix->empty())
    b.add("scope_sid IN (SELECT id FROM strings WHERE keel_scope_within(text, ?))", *q.scopePrefix);
  if (q.seqBegin) b.add("seq >= ?", static_cast<int64_t>(*q.seqBegin));
  if (q.seqEnd) b.add("seq < ?", static_cast<int64_t>(*q.seqEnd));
  return impl_->queryOps(std::string("SELECT ") + kOpColumns + " FROM ops" + b.where +
                             " ORDER BY seq" + limitClause(q.limit),
                         b, q.withTensors);
}

std::optional<OpRecord> Recording::op(uint64_t seq) const {
  std::vector<OpRecord> out;
  {
    sql::Stmt& s = impl_->opBySeq;
    ResetOnExit guard{s};
    s.bind(1, seq);
    if (s.step()) out.push_back(impl_->readOp(s));
  }
  if (out.empty()) return std::nullopt;
  impl_->loadTensors(out);
  return std::move(out.front());
}

std::vector<OpCount> Recording::opCountsByNameAndPhase(std::optional<int64_t> step) const {
  Binds b;
  if (step) b.add("step = ?", *step);
  // A closed recording has its op counts summarised (op_counts); a recording being written, or
  // one whose writer was killed, is counted from its ops.
  const bool summarised = impl_->hasOpCounts();
  const char* table = summarised ? "op_counts" : "ops";
  sql::Stmt s(impl_->db, summarised ? "SELECT name_sid, phase_sid, sum(count), min(rowid) FROM "
                                      "op_counts" +
                                          b.where + " GROUP BY name_sid, phase_sid"
                                    : "SELECT name_sid, phase_sid, count(*), min(seq) FROM ops" +
                                          b.where + " GROUP BY name_sid, phase_sid");
  b.apply(s);
  std::vector<OpCount> out;
  while (s.step()) {
    const int64_t row = s.i64(3);
    out.push_back({impl_->str(s.i64(0), table, row),
                   impl_->enumOf(parsePhase, impl_->str(s.i64(1), table, row), "phase", table, row),
                   s.i64(2)});
  }
  std::sort(out.begin(), out.end(), [](const OpCount& a, const OpCount& b) {
    return std::tie(b.count, a.name, a.phase) < std::tie(a.count, b.name, b.phase);
  });
  return out;
}

std::optional<StackRecord> Recording::stack(int64_t id) const {
  sql::Stmt s(impl_->db, "SELECT id FROM stacks WHERE id = ?1");
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  StackRecord r;
  r.id = id;
  sql::Stmt f(impl_->db,
              "SELECT f.address, f.function_sid, f.file_sid, f.line, f.id FROM stack_frames sf "
              "JOIN frames f ON f.id = sf.frame_id WHERE sf.stack_id = ?1 ORDER BY sf.depth");
  f.bind(1, id);
  while (f.step()) {
    const int64_t frame = f.i64(4);
    r.frames.push_back({f.u64(0), impl_->str(f.i64(1), "frames", frame),
                        impl_->str(f.i64(2), "frames", frame), static_cast<int32_t>(f.i64(3))});
  }
  return r;
}

std::vector<LogRecord> Recording::logs(const LogQuery& q) const {
  Binds b;
  if (q.step) b.add("step = ?", *q.step);
  if (q.opSeqBegin) b.add("op_seq >= ?", static_cast<int64_t>(*q.opSeqBegin));
  if (q.opSeqEnd) b.add("op_seq < ?", static_cast<int64_t>(*q.opSeqEnd));
  if (q.maxLevel) b.add("level <= ?", static_cast<int64_t>(*q.maxLevel));
  sql::Stmt s(impl_->db, "SELECT op_seq, step, level, scope_sid, message, time_ns, id FROM logs" +
                             b.where + " ORDER BY id" + limitClause(q.limit));
  b.apply(s);
  std::vector<LogRecord> out;
  while (s.step()) {
    const int64_t id = s.i64(6), level = s.i64(2);
    if (level < 0 || level > int64_t(LogLevel::Verbose))
      impl_->damaged(
          "log level " + std::to_string(level) + " is out of range (0 error .. 4 verbose)", "logs",
          id);
    // A message past kMaxStringBytes is cut there, on a UTF-8 boundary (Note [Damaged
    // recordings]: tolerated, bounded).
    std::string_view text = s.textView(4);
    std::string message = detail::cutText(text, kMaxStringBytes);
    out.push_back({s.u64(0), s.i64(1), static_cast<LogLevel>(level),
                   impl_->str(s.i64(3), "logs", id), std::move(message), s.i64(5)});
  }
  return out;
}

std::vector<MemRecord> Recording::memEvents(const MemQuery& q) const {
  Binds b;
  if (q.timeBegin) b.add("time_ns >= ?", *q.timeBegin);
  if (q.timeEnd) b.add("time_ns < ?", *q.timeEnd);
  if (q.opSeqBegin) b.add("op_seq >= ?", static_cast<int64_t>(*q.opSeqBegin));
  if (q.opSeqEnd) b.add("op_seq < ?", static_cast<int64_t>(*q.opSeqEnd));
  sql::Stmt s(impl_->db,
              "SELECT kind_sid, device_sid, address, bytes, to_address, op_seq, step, stack_id,"
              " time_ns, allocated_after, reserved_after, buffer_id, tag_sid, label_sid, id"
              " FROM mem_events" +
                  b.where + " ORDER BY id" + limitClause(q.limit));
  b.apply(s);
  std::vector<MemRecord> out;
  while (s.step()) {
    MemRecord m;
    const int64_t id = s.i64(14);
    const char* table = "mem_events";
    m.kind = impl_->enumOf(parseMemEventKind, impl_->str(s.i64(0), table, id), "memory event kind",
                           table, id);
    m.device = impl_->str(s.i64(1), table, id);
    m.address = s.u64(2);
    m.bytes = s.u64(3);
    if (m.bytes > kMaxMemEventBytes)
      impl_->damaged(
          "allocator event claims " + std::to_string(s.i64(3)) + " bytes (out of range 0 .. 2^44)",
          table, id);
    m.toAddress = s.u64(4);
    m.opSeq = s.u64(5);
    m.step = s.i64(6);
    m.stackId = s.isNull(7) ? -1 : s.i64(7);
    m.timeNs = s.i64(8);
    m.allocatedAfter = s.u64(9);
    m.reservedAfter = s.u64(10);
    m.bufferId = s.u64(11);
    if (!s.isNull(12))
      m.tag = impl_->enumOf(parseMemTag, impl_->str(s.i64(12), table, id), "memory tag", table, id);
    if (!s.isNull(13)) m.label = impl_->str(s.i64(13), table, id);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<DumpRecord> Recording::dumps(uint64_t opSeq) const {
  std::vector<DumpRecord> out;
  for (auto& [id, d] : impl_->readDumps(opSeq)) out.push_back(std::move(d));
  return out;
}

std::optional<std::vector<double>> Recording::dumpValues(uint64_t opSeq, Role role,
                                                         int32_t index) const {
  for (auto& [row, d] : impl_->readDumps(opSeq)) {
    if (d.role != role || d.index != index) continue;
    const int64_t id = row;  // (a structured binding: clang 14 does not capture it)
    const std::string what = "dump of op " + std::to_string(opSeq) + " " +
                             (role == Role::Input ? "input " : "output ") + std::to_string(index);
    auto bad = [&](const std::string& problem) {
      return DamagedRecording(impl_->db.path(), what + problem, "dumps", id);
    };
    std::vector<uint8_t> raw;
    if (d.codec == "zstd") {
      // Sized from what the frame can hold (Note [Damaged recordings]), not from raw_bytes alone.
      const unsigned long long framed = ZSTD_getFrameContentSize(d.data.data(), d.data.size());
      if (d.rawBytes > kZstdMaxRatio * int64_t(d.data.size()) + 1024 ||
          (framed != ZSTD_CONTENTSIZE_UNKNOWN && framed != ZSTD_CONTENTSIZE_ERROR &&
           framed != static_cast<unsigned long long>(d.rawBytes)))
        throw bad(" claims " + std::to_string(d.rawBytes) + " bytes, which its " +
                  std::to_string(d.data.size()) + " compressed bytes do not hold");
      raw.resize(size_t(d.rawBytes));
      size_t n = ZSTD_decompress(raw.data(), raw.size(), d.data.data(), d.data.size());
      if (ZSTD_isError(n) || int64_t(n) != d.rawBytes)
        throw bad(std::string(" is not a whole zstd frame (") +
                  (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") + ")");
    } else if (d.codec == "raw") {
      raw = std::move(d.data);
    } else {
      throw bad(" has unknown codec '" + excerpt(d.codec) + "'");
    }
    const std::optional<DType> dtype = tryParseDType(d.dtype);
    if (!dtype || dtypeName(*dtype) != d.dtype)
      throw bad(" has unknown dtype '" + excerpt(d.dtype) + "'");
    const size_t es = dtypeSize(*dtype);
    // Elements from the shape, overflow-checked: only a count the bytes hold is read.
    uint64_t numel = 1;
    for (int64_t s : d.shape) {
      if (s < 0) throw bad(" has a negative size " + std::to_string(s));
      numel = numel == 0 || s == 0               ? 0
              : numel > raw.size() / uint64_t(s) ? raw.size() + 1
                                                 : numel * uint64_t(s);
    }
    if (numel * es != raw.size())
      throw bad(" holds " + std::to_string(raw.size()) + " bytes, not the " + d.dtype +
                " elements of " +
                (d.shape.size() <= 8 ? "shape " + shapeText(d.shape)
                                     : "a rank-" + std::to_string(d.shape.size()) + " shape"));
    // As doubles, a dump is read at most kMaxDumpBytes too (an int8 dump of 1 GiB would take 8).
    if (numel > uint64_t(kMaxDumpBytes) / sizeof(double))
      throw bad(" holds " + std::to_string(numel) +
                " values, more than the 2^27 a dump is read with");
    std::vector<double> out;
    out.reserve(size_t(numel));
    forEachValue(*dtype, raw.data(), int64_t(numel), [&](double v) { out.push_back(v); });
    return out;
  }
  return std::nullopt;
}

std::vector<DroppedCount> Recording::dropped() const {
  sql::Stmt s(impl_->db, "SELECT kind, count FROM dropped ORDER BY kind");
  std::vector<DroppedCount> out;
  while (s.step()) out.push_back({s.text(0), s.i64(1)});
  return out;
}

std::vector<KernelUse> Recording::kernelUses() const {
  const bool summarised = impl_->hasOpCounts();
  const char* table = summarised ? "op_counts" : "ops";
  sql::Stmt s(impl_->db, summarised
                             ? "SELECT kernel_id, name_sid, sum(count), min(rowid) FROM op_counts"
                               " WHERE kernel_id IS NOT NULL GROUP BY kernel_id, name_sid"
                             : "SELECT kernel_id, name_sid, count(*), min(seq) FROM ops WHERE"
                               " kernel_id IS NOT NULL GROUP BY kernel_id, name_sid");
  std::map<int64_t, KernelUse> byId;
  while (s.step()) {
    const int64_t row = s.i64(3);
    KernelUse& u = byId[s.i64(0)];
    if (u.kernel.empty()) u.kernel = impl_->kernel(s.i64(0), table, row);
    u.calls += s.i64(2);
    u.ops.emplace_back(impl_->str(s.i64(1), table, row), s.i64(2));
  }
  std::vector<KernelUse> out;
  for (auto& [id, u] : byId) {
    std::stable_sort(u.ops.begin(), u.ops.end(),
                     [](const auto& x, const auto& y) { return x.second > y.second; });
    out.push_back(std::move(u));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelUse& x, const KernelUse& y) { return x.calls > y.calls; });
  return out;
}

std::optional<OpRecord> Recording::firstNonFinite() const {
  // The index holds, in recordings written before Note [Where non-finite values appear], every
  // op with a NaN/Inf output; the first where they appear is the first that passes.
  sql::Stmt s(impl_->db, "SELECT op_seq FROM nonfinite_ops ORDER BY op_seq");
  while (s.step()) {
    std::optional<OpRecord> o = op(s.u64(0));
    if (!o)
      impl_->damaged("op " + std::to_string(s.i64(0)) + " is not in the ops table", "nonfinite_ops",
                     s.i64(0));
    if (nonFiniteAppearsAt(*o)) return o;
  }
  return std::nullopt;
}

std::vector<OpRecord> Recording::allOps() const {
  std::vector<OpRecord> ops;
  std::vector<int64_t> steps = {0};  // step 0: initialisation (parameter creation)
  for (const auto& s : this->steps()) steps.push_back(s.step);
  for (int64_t s : steps) {
    auto part = stepOps(s);
    ops.insert(ops.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return ops;
}

std::vector<OpRecord> Recording::stepOps(int64_t step) const {
  sql::Stmt r(impl_->db, "SELECT min(seq), max(seq) FROM ops WHERE step = ?1");
  r.bind(1, step);
  if (!r.step() || r.isNull(0)) return {};
  // The step is the seq range from its first op to its last: an op of another step inside it is
  // damage (Note [Damaged recordings]).
  const int64_t first = r.i64(0), last = r.i64(1);
  sql::Stmt s(impl_->db, std::string("SELECT ") + kOpColumns +
                             " FROM ops WHERE seq BETWEEN ?1 AND ?2 ORDER BY seq");
  s.bind(1, first);
  s.bind(2, last);
  std::vector<OpRecord> out;
  while (s.step()) {
    if (s.i64(1) != step)
      impl_->damaged("op " + std::to_string(s.i64(0)) + " of step " + std::to_string(s.i64(1)) +
                         " lies among the ops of step " + std::to_string(step) + " (seq " +
                         std::to_string(first) + " to " + std::to_string(last) + ")",
                     "ops", s.i64(0));
    out.push_back(impl_->readOp(s));
  }
  impl_->loadTensors(out);
  return out;
}

}  // namespace keel::storage
