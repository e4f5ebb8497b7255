// One record-a-run sequence: the same config gives the same allocator, run metadata and op MD5s
// in `keel record` (the real binary) and in a studio live session (capture::RecordingRun under
// both). The studio once ignored the config's "allocator" key and stored "" for no config.
#include <QFile>
#include <QSignalSpy>
#include <QtTest>

#include "keel/storage/reader.h"
#include "session.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::Session;

namespace {

// The config with "allocator" set (or, kind "", as it is).
QString configWith(const QString& dir, const QString& kind) {
  QFile in(KEEL_SOURCE_DIR "/tests/fixtures/gpt-tiny.json");
  if (!in.open(QIODevice::ReadOnly)) return {};
  QByteArray text = in.readAll();
  if (!kind.isEmpty())
    text.replace("\"name\"", "\"allocator\": \"" + kind.toUtf8() + "\",\n  \"name\"");
  const QString path = dir + "/tiny-" + (kind.isEmpty() ? QString("default") : kind) + ".json";
  QFile out(path);
  if (!out.open(QIODevice::WriteOnly)) return {};
  out.write(text);
  return path;
}

bool runSession(const QString& config, const QString& output) {
  Session s;
  studio::SessionConfig c;
  c.configPath = config;
  c.seed = 4;
  c.steps = 1;
  c.output = output;
  c.capture.md5 = c.capture.stats = c.capture.stacks = c.capture.allocator = true;
  QSignalSpy finished(&s, &Session::finished);
  QObject::connect(&s, &Session::stateChanged, &s, [&s](Session::State st) {
    if (st == Session::State::Paused) s.run();
  });
  s.start(c);
  return QTest::qWaitFor([&] { return finished.count() > 0; }, 120000) &&
         s.state() == Session::State::Finished;
}

}  // namespace

class SessionParityTest : public QObject {
  Q_OBJECT
 private slots:
  void sameConfigSameRunInKeelRecordAndTheStudio_data() {
    QTest::addColumn<QString>("kind");
    QTest::addColumn<QString>("expected");
    QTest::newRow("config says caching") << "caching"
                                         << "caching";
    QTest::newRow("config says host") << "host"
                                      << "host";
    // No key: KEEL_ALLOCATOR's choice, else the build's default (vmm; host under ASan).
#if defined(__SANITIZE_ADDRESS__)
    QTest::newRow("no allocator key") << ""
                                      << "host";
#else
    QTest::newRow("no allocator key") << ""
                                      << "vmm";
#endif
  }
  void sameConfigSameRunInKeelRecordAndTheStudio() {
    QFETCH(QString, kind);
    QFETCH(QString, expected);
    const QString dir = views::test::tempDir();
    const QString config = configWith(dir, kind);
    QVERIFY(!config.isEmpty());
    const QString cliDb = dir + "/cli-" + expected + ".db",
                  studioDb = dir + "/studio-" + expected + ".db";
    std::string out;
    const int rc = views::test::runKeel("record --config '" + config.toStdString() +
                                            "' --steps 1 --seed 4 --md5 --stats --stacks "
                                            "--allocator -o '" +
                                            cliDb.toStdString() + "'",
                                        &out, "KEEL_ALLOCATOR=");
    QVERIFY2(rc == 0, out.c_str());
    QVERIFY(runSession(config, studioDb));

    storage::Recording a = storage::Recording::open(cliDb.toStdString());
    storage::Recording b = storage::Recording::open(studioDb.toStdString());
    const storage::RunInfo ra = a.run(), rb = b.run();
    QCOMPARE(QString::fromStdString(ra.allocator), expected);
    QCOMPARE(QString::fromStdString(rb.allocator), expected);
    QCOMPARE(rb.backend, ra.backend);
    QCOMPARE(rb.device, ra.device);
    QCOMPARE(rb.host, ra.host);
    QCOMPARE(rb.configJson, ra.configJson);
    QCOMPARE(rb.seed, ra.seed);
    QCOMPARE(rb.engineVersion, ra.engineVersion);
    QCOMPARE(rb.captureOptionsJson, ra.captureOptionsJson);
    QCOMPARE(QString::fromStdString(ra.status), QString("finished"));
    QCOMPARE(QString::fromStdString(rb.status), QString("finished"));

    // Initialisation and the first step: the same ops with the same output MD5s, in order.
    for (int64_t step : {0, 1}) {
      const auto oa = a.stepOps(step), ob = b.stepOps(step);
      QCOMPARE(ob.size(), oa.size());
      QVERIFY(oa.size() > 20);
      for (size_t i = 0; i < oa.size(); ++i) {
        QCOMPARE(ob[i].name, oa[i].name);
        QCOMPARE(ob[i].tensors.size(), oa[i].tensors.size());
        for (size_t t = 0; t < oa[i].tensors.size(); ++t)
          QVERIFY2(ob[i].tensors[t].md5 == oa[i].tensors[t].md5,
                   qPrintable(QString("step %1 op %2 (%3) tensor %4")
                                  .arg(step)
                                  .arg(i)
                                  .arg(QString::fromStdString(oa[i].name))
                                  .arg(t)));
      }
    }
    // The allocator really was the one named: caching reserves segments, vmm maps chunks.
    bool reserve = false, map = false;
    for (const auto& m : b.memEvents({})) {
      reserve = reserve || m.kind == MemEventKind::Reserve;
      map = map || m.kind == MemEventKind::Map;
    }
    QCOMPARE(reserve, expected == "caching");
    QCOMPARE(map, expected == "vmm");
  }
};

QTEST_MAIN(SessionParityTest)
#include "session_parity_test.moc"
