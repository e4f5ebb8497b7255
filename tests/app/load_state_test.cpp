// LoadState: the main window's loading state as one object (it replaced four hand-kept flags):
// outstanding loads never go negative, a run folder's load counts once, one memory load at a time
// with a remembered request, and a load of a replaced recording is dropped.
#include <QtTest>

#include "load_state.h"

using keel::studio::LoadState;

class LoadStateTest : public QObject {
  Q_OBJECT
 private slots:
  void outstandingLoadsCountAndNeverGoNegative() {
    LoadState s;
    QVERIFY(s.idle());
    s.add(1);
    s.add(1);
    QCOMPARE(s.pending(), 2);
    s.add(-1);
    QVERIFY(!s.idle());
    s.add(-1);
    s.add(-1);  // a stray landing
    QCOMPARE(s.pending(), 0);
    QVERIFY(s.idle());
  }

  void aRunFolderLoadCountsOnceHoweverOftenItIsBegun() {
    LoadState s;
    s.add(1);  // another load
    s.ranksBegun();
    s.ranksBegun();  // a second folder opened before the first landed
    QVERIFY(s.ranksLoading());
    QCOMPARE(s.pending(), 2);
    s.ranksEnded();
    QVERIFY(!s.ranksLoading());
    QCOMPARE(s.pending(), 1);
    s.ranksEnded();  // the second folder's landing: already uncounted
    QCOMPARE(s.pending(), 1);
    s.add(-1);
    QVERIFY(s.idle());
  }

  void oneMemoryLoadAtATimeAndTheNextIsRemembered() {
    LoadState s;
    QVERIFY(s.requestMemory());   // starts
    QVERIFY(!s.requestMemory());  // in flight: remembered
    QVERIFY(s.memoryStale());
    QVERIFY(s.memoryLanded());  // kept
    QVERIFY(!s.memoryInFlight());
    QVERIFY(s.memoryStale());    // so the caller asks again
    QVERIFY(s.requestMemory());  // and it starts
    QVERIFY(!s.memoryStale());
  }

  void aLoadOfAReplacedRecordingIsDropped() {
    LoadState s;
    QVERIFY(s.requestMemory());
    s.recordingReplaced();
    QVERIFY(!s.memoryStale());
    QVERIFY(!s.memoryLanded());  // of the old recording: dropped
    QVERIFY(s.requestMemory());
    QVERIFY(s.memoryLanded());  // the new one's: kept
    s.recordingReplaced();      // nothing in flight: nothing to drop
    QVERIFY(s.requestMemory());
    QVERIFY(s.memoryLanded());
  }

  void aHiddenViewRemembersThatItIsOutdated() {
    LoadState s;
    QVERIFY(!s.memoryStale());
    s.memoryOutdated();
    QVERIFY(s.memoryStale());
    QVERIFY(s.requestMemory());
    QVERIFY(!s.memoryStale());
  }
};

QTEST_GUILESS_MAIN(LoadStateTest)
#include "load_state_test.moc"
