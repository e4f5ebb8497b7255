// The metrics plot (views::LossPlot) on recordings made by the real keel binary: every recorded
// per-step metric is plotted with the recording's exact values, a 1-step run gets a real axis
// range, NaN losses are marked rather than dropped, and a comparison draws two distinct curves.
#include <QComboBox>
#include <QDir>
#include <QLabel>
#include <QStandardItemModel>
#include <QtTest>
#include <cmath>
#include <limits>
#include <memory>

#include "keel/storage/reader.h"
#include "keel/views/loss_plot.h"
#include "keel/views/run_source.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::storage::Recording;

namespace {

SummaryPtr summaryOf(const QString& path) {
  return loadSummary(Recording::open(path.toStdString()), path);
}

// Each metric's field of a step record, in Metric's order: the test's own reading of a metric,
// which keel::views::metricValue (the plot's) is checked against.
using keel::storage::StepRecord;
constexpr double StepRecord::*kFieldOf[kMetricCount] = {
    &StepRecord::loss,    &StepRecord::lr,           &StepRecord::gradNorm,
    &StepRecord::auxLoss, &StepRecord::tokensPerSec, &StepRecord::valLoss};
double valueOf(const StepRecord& s, Metric m) {
  return s.*kFieldOf[int(m)];
}

}  // namespace

class MetricsTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    pathA_ = test::tempDir() + "/a.db";
    pathB_ = test::tempDir() + "/b.db";
    pathOne_ = test::tempDir() + "/one.db";
    pathNaN_ = test::tempDir() + "/nan.db";
    QVERIFY(test::recordFixture(pathA_, "--steps 3 --seed 5"));
    QVERIFY(test::recordFixture(pathB_, "--steps 3 --seed 5", "KEEL_TEST_PERTURB=matmul:5"));
    QVERIFY(test::recordFixture(pathOne_, "--steps 1 --seed 5"));
    QVERIFY(test::recordFixture(pathNaN_, "--steps 3 --seed 5", "KEEL_TEST_PERTURB=matmul:20:nan"));
    pathEval_ = test::tempDir() + "/eval.db";
    pathEvalNaN_ = test::tempDir() + "/eval-nan.db";
    QVERIFY(test::recordFixture(pathEval_, "--steps 4 --seed 5", "", "gpt-tiny-eval.json"));
    QVERIFY(test::recordFixture(pathEvalNaN_, "--steps 4 --seed 5",
                                "KEEL_TEST_PERTURB=matmul:20:nan", "gpt-tiny-eval.json"));
  }

  // eval_every 2: the validation loss of steps 2 and 4, exactly as recorded, and no marker for
  // the steps that did not evaluate; once the weights are NaN, the evaluated steps are marked.
  void validationLossIsPlottedOnTheEvaluatedSteps() {
    SummaryPtr e = summaryOf(pathEval_);
    QCOMPARE(int(e->steps.size()), 4);
    for (const auto& s : e->steps)  // evaluated on steps 2 and 4 only (Note [Reported NaN])
      QCOMPARE(s.reported(keel::storage::StepMetric::ValLoss), s.step % 2 == 0);
    LossPlot plot;
    plot.setRuns(e);
    QVERIFY(plot.isAvailable(Metric::ValidationLoss));
    plot.setMetric(Metric::ValidationLoss);
    QCOMPARE(plot.metric(), Metric::ValidationLoss);
    const QVector<QPointF> pts = plot.points(0);
    QCOMPARE(pts.size(), 2);
    for (int k = 0; k < 2; ++k) {
      const auto& s = e->steps[size_t(2 * k + 1)];
      QCOMPARE(s.step, int64_t(2 * k + 2));
      QCOMPARE(pts[k], QPointF(double(s.step), s.valLoss));
    }
    QVERIFY(plot.markedSteps().isEmpty());
    plot.setRuns(summaryOf(pathEvalNaN_));
    plot.setMetric(Metric::ValidationLoss);
    QCOMPARE(plot.markedSteps(), (QVector<double>{2, 4}));
    QCOMPARE(plot.pointCount(0), 0);
  }

  void metricValueReadsEachMetricsOwnField() {
    StepRecord s;
    s.loss = 1, s.lr = 2, s.gradNorm = 3, s.auxLoss = 4, s.tokensPerSec = 5, s.valLoss = 6;
    for (int i = 0; i < kMetricCount; ++i) {
      QCOMPARE(metricValue(s, Metric(i)), valueOf(s, Metric(i)));
      QCOMPARE(metricValue(s, Metric(i)), double(i + 1));
    }
  }

  void plotsEachRecordedMetricWithTheRecordedValues() {
    SummaryPtr a = summaryOf(pathA_);
    QCOMPARE(int(a->steps.size()), 3);
    LossPlot plot;
    plot.setRuns(a);
    int shown = 0;
    for (int i = 0; i < kMetricCount; ++i) {
      const Metric m = Metric(i);
      const bool recorded = std::any_of(a->steps.begin(), a->steps.end(),
                                        [&](const auto& s) { return !std::isnan(valueOf(s, m)); });
      QCOMPARE(plot.isAvailable(m), recorded);
      // The combo offers exactly the recorded metrics.
      auto* model = qobject_cast<QStandardItemModel*>(plot.metricCombo()->model());
      QCOMPARE(model->item(i)->isEnabled(), recorded);
      if (!recorded) {
        QVERIFY(model->item(i)->text().contains("not recorded"));
        continue;
      }
      plot.metricCombo()->setCurrentIndex(i);
      QCOMPARE(plot.metric(), m);
      QCOMPARE(plot.graphCount(), 1);
      const QVector<QPointF> pts = plot.points(0);
      QCOMPARE(pts.size(), 3);
      for (int k = 0; k < 3; ++k) {
        QCOMPARE(pts[k].x(), double(a->steps[size_t(k)].step));
        QCOMPARE(pts[k].y(), valueOf(a->steps[size_t(k)], m));  // exact, not rounded
      }
      const auto [y0, y1] = plot.yRange();
      for (const QPointF& p : pts) QVERIFY(p.y() > y0 && p.y() < y1);
      ++shown;
    }
    // keel train prints (and the recording keeps) at least loss, learning rate and tokens/s.
    QVERIFY(plot.isAvailable(Metric::Loss));
    QVERIFY(plot.isAvailable(Metric::LearningRate));
    QVERIFY(plot.isAvailable(Metric::TokensPerSec));
    QVERIFY(shown >= 3);
    QVERIFY(!plot.isAvailable(Metric::ValidationLoss));  // no eval_every in gpt-tiny
    plot.setMetric(Metric::ValidationLoss);              // refused: stays where it was
    QVERIFY(plot.metric() != Metric::ValidationLoss);
  }

  void oneStepRunHasANonDegenerateRange() {
    SummaryPtr one = summaryOf(pathOne_);
    QCOMPARE(int(one->steps.size()), 1);
    LossPlot plot;
    plot.setRuns(one);
    for (Metric m : {Metric::Loss, Metric::LearningRate, Metric::TokensPerSec}) {
      plot.setMetric(m);
      QCOMPARE(plot.pointCount(0), 1);
      const QPointF p = plot.points(0)[0];
      const auto [x0, x1] = plot.xRange();
      const auto [y0, y1] = plot.yRange();
      QVERIFY2(x1 - x0 >= 1.0 && x0 < p.x() && p.x() < x1, qPrintable(QString::number(x1 - x0)));
      // The value sits inside a range of its own scale (a learning rate of 1e-3 is not lost in
      // a 0..1 axis, nor squeezed to zero height).
      QVERIFY(y1 > y0 && y0 < p.y() && p.y() < y1);
      QVERIFY((y1 - y0) <= std::max(std::abs(p.y()), 1e-12) * 1.0);
      QVERIFY((y1 - y0) >= std::abs(p.y()) * 0.05);
    }
  }

  void nanLossStepsAreMarkedNotDropped() {
    SummaryPtr n = summaryOf(pathNaN_);
    QCOMPARE(int(n->steps.size()), 3);
    QVector<double> nanSteps;
    for (const auto& s : n->steps)
      if (std::isnan(s.loss)) nanSteps << double(s.step);
    QVERIFY2(!nanSteps.isEmpty(), "the perturbed run's loss should become NaN");
    QVERIFY(nanSteps.size() < 3);  // step 1 is still finite
    LossPlot plot;
    plot.setRuns(n);
    QCOMPARE(plot.metric(), Metric::Loss);
    QCOMPARE(plot.markedSteps(), nanSteps);
    for (const QString& l : plot.markerLabels()) QCOMPARE(l, QString("NaN"));
    QCOMPARE(plot.pointCount(0), 3 - int(nanSteps.size()));
    const auto [x0, x1] = plot.xRange();
    for (double s : nanSteps) QVERIFY(x0 < s && s < x1);  // the markers are on the plot
    // A finite metric of the same run has no markers.
    plot.setMetric(Metric::LearningRate);
    QVERIFY(plot.markedSteps().isEmpty());
    QCOMPARE(plot.pointCount(0), 3);
    // Comparing: the labels say whose step it is.
    plot.setRuns(summaryOf(pathA_), n);
    plot.setMetric(Metric::Loss);
    QCOMPARE(plot.markedSteps(), nanSteps);
    for (const QString& l : plot.markerLabels()) QCOMPARE(l, QString("B: NaN"));
    // Hovering a NaN step says so for B and gives A's value in full.
    const SummaryPtr a = summaryOf(pathA_);  // (held: a1 refers into it)
    const auto& a1 = a->steps[size_t(nanSteps[0]) - 1];
    QCOMPARE(plot.valuesAtStep(int64_t(nanSteps[0])), QString("step %1, loss: A: %2 · B: NaN")
                                                          .arg(int64_t(nanSteps[0]))
                                                          .arg(QString::number(a1.loss, 'g', 8)));
    QVERIFY(plot.valuesAtStep(99).isEmpty());
  }

  // In a short docked plot (as at 1366x768) the NaN labels sit above the curves, clear of every
  // point, and stay inside the plot on the left; a run with no finite value still gets the whole
  // width (its empty legend used to shrink the plot to a corner).
  void nanLabelsStayClearOfTheCurvesInAShortPlot() {
    SummaryPtr n = summaryOf(pathNaN_);
    LossPlot plot;
    plot.setRuns(summaryOf(pathA_), n);
    QVERIFY(test::showAt(plot, {560, 150}));
    const QVector<QRectF> labels = plot.markerLabelRects();
    QVERIFY(!labels.isEmpty());
    const QRect axes = plot.axisRectGeometry();
    for (const QRectF& l : labels) {
      QVERIFY2(l.left() >= axes.left(), "a label runs over the y axis");
      for (const QPointF& p : plot.pointPixels(0) + plot.pointPixels(1))
        QVERIFY2(!l.adjusted(-4, -4, 4, 4).contains(p),
                 qPrintable(QString("label (%1,%2 %3x%4) over the point at (%5,%6)")
                                .arg(l.x())
                                .arg(l.y())
                                .arg(l.width())
                                .arg(l.height())
                                .arg(p.x())
                                .arg(p.y())));
    }
    // Every loss NaN: no curve, no legend, the axes across the widget.
    auto allNaN = std::make_shared<RunSummary>(*n);
    for (auto& st : allNaN->steps) {  // reported NaNs (Note [Reported NaN])
      st.loss = std::numeric_limits<double>::quiet_NaN();
      st.nanMetrics |= keel::storage::stepMetricBit(keel::storage::StepMetric::Loss);
    }
    plot.setRuns(allNaN);
    QCOMPARE(plot.graphCount(), 0);
    QCOMPARE(plot.markedSteps().size(), 3);
    // Compared, it keeps its key entry, which says why it has no curve.
    plot.setRuns(summaryOf(pathA_), allNaN);
    QCOMPARE(plot.graphCount(), 2);
    QCOMPARE(plot.pointCount(1), 0);
    QVERIFY2(
        plot.graphName(1).startsWith("B: ") && plot.graphName(1).endsWith(" — no finite value"),
        qPrintable(plot.graphName(1)));
    plot.setRuns(allNaN);
    QVERIFY2(plot.axisRectGeometry().width() > 560 * 3 / 4,
             qPrintable(QString::number(plot.axisRectGeometry().width())));
    // No steps at all (an imported memory snapshot): no curve, no legend entry, and the note
    // says why; the combo shows its whole "— not recorded" text.
    auto noSteps = std::make_shared<RunSummary>(*n);
    noSteps->steps.clear();
    plot.setRuns(noSteps);
    QCOMPARE(plot.graphCount(), 0);
    QCOMPARE(plot.findChild<QLabel*>("metricNote")->text(), QString("no training steps recorded"));
    QComboBox* combo = plot.metricCombo();
    QVERIFY(combo->currentText().endsWith("not recorded"));
    QVERIFY2(combo->width() >= combo->fontMetrics().horizontalAdvance(combo->currentText()),
             qPrintable(QString::number(combo->width())));
  }

  // A plot docked short (beside the memory view at 1366x768) cut its legend row in half at the
  // dock's edge: short, one run's legend is left out and two runs' sits inside the axis rect;
  // tall enough, it has its own row under the axes. Always inside the widget.
  void aShortPlotKeepsItsLegendInsideTheWidget() {
    SummaryPtr a = summaryOf(pathA_), b = summaryOf(pathB_);
    LossPlot plot;
    plot.setRuns(a);
    QVERIFY(test::showAt(plot, {560, 130}));
    QVERIFY(plot.legendGeometry().isEmpty());
    plot.setRuns(a, b);
    // Two runs, short: a key in the header row, nothing over the curves (inside the axis rect the
    // legend covered them and the NaN markers' labels).
    QVERIFY(plot.legendGeometry().isEmpty());
    auto* key = plot.findChild<QLabel*>("metricKey");
    QVERIFY(key && key->isVisible());
    QVERIFY2(key->text().contains("</b></span>&nbsp;A") && key->text().contains("&nbsp;B"),
             qPrintable(key->text()));
    QVERIFY2(key->toolTip().startsWith("A: a.db") && key->toolTip().contains("\nB: b.db"),
             qPrintable(key->toolTip()));
    QVERIFY(key->geometry().bottom() < 40);  // in the header row, above the plot
    plot.resize(560, 300);
    QTest::qWait(50);
    QVERIFY(!key->isVisible());  // tall: the legend's own row under the axes
    QRect legend = plot.legendGeometry();
    QVERIFY(!legend.isEmpty());
    QVERIFY(legend.top() >= plot.axisRectGeometry().bottom());
    QVERIFY(plot.rect().contains(legend));
    plot.setRuns(a);
    QVERIFY(!plot.legendGeometry().isEmpty());  // one run, tall: the row under the axes
  }

  void compareModeDrawsTwoDistinguishableCurves() {
    SummaryPtr a = summaryOf(pathA_), b = summaryOf(pathB_);
    LossPlot plot;
    plot.setRuns(a, b);
    QCOMPARE(plot.graphCount(), 2);
    QCOMPARE(plot.pointCount(0), 3);
    QCOMPARE(plot.pointCount(1), 3);
    QVERIFY(plot.graphName(0).startsWith("A: a.db"));
    QVERIFY(plot.graphName(1).startsWith("B: b.db"));
    QVERIFY(plot.graphName(0).contains("(cpu)"));
    const QPen pa = plot.graphPen(0), pb = plot.graphPen(1);
    QVERIFY(pa.color() != pb.color());
    QCOMPARE(pa.style(), Qt::SolidLine);
    QCOMPARE(pb.style(), Qt::DashLine);  // B dashed on top: A shows through where they coincide
    QVERIFY(pa.widthF() > pb.widthF());
    // Both curves are inside the view.
    const auto [y0, y1] = plot.yRange();
    for (int g = 0; g < 2; ++g)
      for (const QPointF& p : plot.points(g)) QVERIFY(p.y() > y0 && p.y() < y1);
    plot.clear();
    QCOMPARE(plot.graphCount(), 0);
  }

  // KEEL_PANEL_SHOTS=<dir>: saves pictures of the plot (compare, NaN, one step) to look at.
  void screenshots() {
    const QString dir = test::panelShotsDir();
    if (dir.isEmpty()) QSKIP("set KEEL_PANEL_SHOTS=<dir> to save screenshots");
    auto shoot = [&](LossPlot& w, const QString& name, QSize size) {
      QVERIFY(test::saveShot(&w, size, dir, "metrics_" + name));
    };
    LossPlot v;
    v.setRuns(summaryOf(pathA_), summaryOf(pathB_));
    shoot(v, "compare", {540, 300});
    v.setMetric(Metric::LearningRate);
    shoot(v, "compare_lr", {540, 300});
    v.setMetric(Metric::TokensPerSec);
    shoot(v, "compare_tps", {540, 300});
    v.setRuns(summaryOf(pathNaN_));
    v.setMetric(Metric::Loss);
    shoot(v, "nan", {540, 300});
    v.setRuns(summaryOf(pathOne_));
    shoot(v, "one", {540, 300});
  }

 private:
  QString pathA_, pathB_, pathOne_, pathNaN_, pathEval_, pathEvalNaN_;
};

QTEST_MAIN(MetricsTest)
#include "metrics_test.moc"
