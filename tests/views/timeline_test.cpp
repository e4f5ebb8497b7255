// The timeline view on a recording made by the real keel binary (and on a synthetic two-thread
// step): one row per recorded thread, one bar per op at the op's recorded times, sub-pixel bars
// merged, a click selects the op under it, and an op selected elsewhere is highlighted in view.
#include <QDir>
#include <QSignalSpy>
#include <QtTest>
#include <set>

#include "keel/storage/reader.h"
#include "keel/views/selection.h"
#include "keel/views/timeline_view.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::Phase;
using keel::storage::Recording;
using keel::views::test::stepOf;

namespace {

// Ops on two threads: thread 3 runs `n` back-to-back 10 ns ops, thread 1 one long op.
StepPtr syntheticStep(int n) {
  auto d = std::make_shared<StepData>();
  d->step = 1;
  for (int i = 0; i < n; ++i) {
    keel::storage::OpRecord op;
    op.seq = uint64_t(100 + i);
    op.step = 1;
    op.name = "add";
    op.thread = 3;
    op.beginNs = 1'000'000 + i * 10;
    op.endNs = op.beginNs + 10;
    d->ops.push_back(op);
  }
  keel::storage::OpRecord big;
  big.seq = 99;
  big.step = 1;
  big.name = "matmul";
  big.phase = Phase::Backward;
  big.thread = 1;
  big.beginNs = 1'000'000;
  big.endNs = 1'000'000 + int64_t(n) * 10;
  d->ops.insert(d->ops.begin(), big);
  return d;
}

void click(QWidget* w, QPointF at) {
  QTest::mouseClick(w, Qt::LeftButton, Qt::NoModifier, at.toPoint());
}

}  // namespace

class TimelineTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    path_ = test::tempDir() + "/a.db";
    QVERIFY(test::recordFixture(path_, "--steps 2 --seed 5"));
  }

  void oneRowPerThreadOneBarPerOpAtItsTimes() {
    StepPtr step = stepOf(path_, 1);
    QVERIFY(step->ops.size() > 50);
    std::set<int64_t> threads;
    int64_t origin = step->ops.front().beginNs;
    for (const auto& op : step->ops) {
      threads.insert(op.thread);
      origin = std::min(origin, op.beginNs);
    }
    Selection sel;
    TimelineView view(&sel, Side::A);
    view.resize(1000, 200);
    view.setStep(step);
    QCOMPARE(view.rowCount(), int(threads.size()));
    size_t bars = 0;
    auto t = threads.begin();
    for (const TimelineRow& row : view.model().rows) {
      QCOMPARE(row.thread, *t++);
      QCOMPARE(row.label, QString("thread %1").arg(row.thread));
      bars += row.bars.size();
      for (const TimelineBar& b : row.bars) {
        const auto& op = step->ops[size_t(b.op)];
        QCOMPARE(b.seq, op.seq);
        QCOMPARE(op.thread, row.thread);
        QCOMPARE(b.begin, op.beginNs - origin);
        QCOMPARE(b.end, op.endNs - origin);
      }
    }
    QCOMPARE(bars, step->ops.size());
    // Drawn positions are the ops' times on one linear scale.
    const auto [t0, t1] = view.viewRange();
    QCOMPARE(t0, 0.0);
    const auto& first = step->ops.front();
    const auto& last = step->ops.back();
    const QRectF a = view.barRect(first.seq), b = view.barRect(last.seq);
    QVERIFY(!a.isEmpty() && !b.isEmpty());
    const double scale = (b.left() - a.left()) / double(last.beginNs - first.beginNs);
    QVERIFY(scale > 0);
    for (size_t i = 0; i < step->ops.size(); i += 7) {
      const auto& op = step->ops[i];
      QVERIFY(std::abs(view.barRect(op.seq).left() - a.left() -
                       double(op.beginNs - first.beginNs) * scale) < 1e-6);
    }
    QVERIFY(a.left() >= 0 && b.right() <= view.width());
    // Nothing drawn past the window's end: the step fits.
    QVERIFY(t1 >= double(last.endNs - origin));
  }

  // A step without ops says why when the recording says (a --step-range kept none of it): it
  // said "Step 4 has no ops" of a step that had them, unrecorded.
  void anEmptyStepSaysWhy() {
    Selection sel;
    TimelineView view(&sel, Side::A);
    auto empty = std::make_shared<keel::views::StepData>();
    empty->step = 4;
    view.setStep(empty);
    QCOMPARE(view.emptyText(), QString("Step 4 has no ops"));
    view.setEmptyStepNote("This recording holds the ops of steps 2 to 3 only (--step-range).");
    QCOMPARE(view.emptyText(), QString("No ops recorded in step 4. This recording holds the ops "
                                       "of steps 2 to 3 only (--step-range)."));
    view.setStep(nullptr);
    QCOMPARE(view.emptyText(), QString("No step shown"));
  }

  void subPixelBarsAreMerged() {
    Selection sel;
    TimelineView view(&sel, Side::A);
    view.resize(600, 200);
    view.setStep(syntheticStep(20000));  // 20,000 ops of 10 ns over 200 µs on ~500 px
    QCOMPARE(view.rowCount(), 2);
    QCOMPARE(view.model().rows[0].thread, int64_t(1));
    QCOMPARE(view.model().rows[1].bars.size(), size_t(20000));
    const auto& row = view.model().rows[1];
    const double px = 500.0 / double(view.model().spanNs);
    auto rects = TimelineModel::rects(row, 0, px, 500);
    QCOMPARE(rects.size(), size_t(1));  // back to back: one busy rect
    QCOMPARE(rects[0].count, 20000);
    // Zoomed in to 2 ns a pixel every bar is its own rect.
    rects = TimelineModel::rects(row, 0, 0.5, 500);
    QCOMPARE(rects.size(), size_t(101));  // 1000 ns in view: bars 0..100 reach into it
    for (const auto& r : rects) QCOMPARE(r.count, 1);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.repaint();
    QVERIFY(view.paintedRects() <= 4);
  }

  void clickingABarSelectsItsOp() {
    StepPtr step = stepOf(path_, 1);
    Selection sel;
    TimelineView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 200}));
    view.setStep(step);
    // The longest op is wide at the fitted zoom.
    const auto longest = std::max_element(step->ops.begin(), step->ops.end(), [](auto& x, auto& y) {
      return x.endNs - x.beginNs < y.endNs - y.beginNs;
    });
    QSignalSpy spy(&sel, &Selection::selected);
    QRectF r = view.barRect(longest->seq);
    QVERIFY(r.width() > 3);
    click(&view, r.center());
    QCOMPARE(spy.count(), 1);
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(longest->seq));
    QCOMPARE(view.highlighted(), std::optional<uint64_t>(longest->seq));
    // Zoomed onto any op, a click on it selects that op.
    const auto& op = step->ops[step->ops.size() / 2];
    const int64_t origin = view.model().originNs;
    view.setViewRange(double(op.beginNs - origin) - 50, double(op.endNs - origin) + 50);
    r = view.barRect(op.seq);
    QVERIFY(r.width() > 100);
    click(&view, r.center());
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(op.seq));
    // A click on empty space (the gutter) selects nothing.
    click(&view, QPointF(5, r.center().y()));
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(op.seq));
  }

  void anOpSelectedElsewhereIsHighlightedAndScrolledIntoView() {
    Recording rec = Recording::open(path_.toStdString());
    StepPtr step = stepOf(rec, 1);
    Selection sel;
    TimelineView view(&sel, Side::A);
    view.resize(1000, 200);
    view.setStep(step);
    const int64_t origin = view.model().originNs;
    // Zoom onto the first op; then select the last one from "elsewhere".
    const auto& first = step->ops.front();
    const auto& last = step->ops.back();
    view.setViewRange(0, double(first.endNs - origin) + 100);
    QVERIFY(view.viewRange().second < double(last.beginNs - origin));
    sel.select(Side::A, last.seq);
    QCOMPARE(view.highlighted(), std::optional<uint64_t>(last.seq));
    const auto [t0, t1] = view.viewRange();
    QVERIFY(t0 <= double(last.beginNs - origin) && double(last.endNs - origin) <= t1);
    const QRectF r = view.barRect(last.seq);
    QVERIFY(r.left() >= 0 && r.right() <= view.width());
    // The other side's selection and an op not in this step leave it alone.
    sel.select(Side::B, first.seq);
    QCOMPARE(view.highlighted(), std::optional<uint64_t>(last.seq));
    sel.select(Side::A, 999999999);
    QVERIFY(!view.highlighted());
    // A step loaded after the selection highlights it too.
    sel.select(Side::A, first.seq);
    view.setStep(stepOf(rec, 1));
    QCOMPARE(view.highlighted(), std::optional<uint64_t>(first.seq));
    view.clear();
    QCOMPARE(view.rowCount(), 0);
    QVERIFY(!view.highlighted());
  }

  // + and - zoom about the selected op while it is in view (about the centre, + took an op near
  // the edge out of view).
  void zoomKeysKeepTheSelectedOpInView() {
    Recording rec = Recording::open(path_.toStdString());
    StepPtr step = stepOf(rec, 1);
    Selection sel;
    TimelineView view(&sel, Side::A);
    view.resize(1000, 200);
    view.show();
    view.setStep(step);
    const auto& op = step->ops[step->ops.size() / 10];  // near the left edge of the whole step
    sel.select(Side::A, op.seq);
    const double centre = double(op.beginNs + op.endNs) / 2 - double(view.model().originNs);
    for (int i = 0; i < 6; ++i) {
      QTest::keyClick(&view, Qt::Key_Plus);
      const auto [t0, t1] = view.viewRange();
      QVERIFY2(t0 <= centre && centre <= t1,
               qPrintable(QString("after %1 zooms: [%2, %3], the op at %4")
                              .arg(i + 1)
                              .arg(t0)
                              .arg(t1)
                              .arg(centre)));
    }
    const auto [t0, t1] = view.viewRange();
    QVERIFY(t1 - t0 < double(view.model().spanNs) / 32);  // it did zoom
  }

  // KEEL_PANEL_SHOTS=<dir>: saves pictures of the timeline to look at.
  void screenshots() {
    const QString dir = test::panelShotsDir();
    if (dir.isEmpty()) QSKIP("set KEEL_PANEL_SHOTS=<dir> to save screenshots");
    StepPtr step = stepOf(path_, 1);
    Selection sel;
    TimelineView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 160}));
    view.setStep(step);
    sel.select(Side::A, step->ops[step->ops.size() / 3].seq);
    QTest::qWait(50);
    QVERIFY(view.grab().save(dir + "/timeline_fit.png"));
    const auto& op = step->ops[step->ops.size() / 3];
    const double mid = double(op.beginNs - view.model().originNs);
    view.setViewRange(mid - 200'000, mid + 200'000);
    QVERIFY(view.grab().save(dir + "/timeline_zoom.png"));
    view.setStep(syntheticStep(20000));
    QVERIFY(view.grab().save(dir + "/timeline_synthetic.png"));
  }

 private:
  QString path_;
};

QTEST_MAIN(TimelineTest)
#include "timeline_test.moc"
