// The inspector's picture of a FlashMask mask, on a recording of a sliding-window model made by
// the real keel binary: the recorded attributes carry the kind, block sparsity and tile map, and
// the painted picture has exactly the recorded map's cells in each colour, for the forward and
// the backward op. (The tile-map parser on its own: tests/analysis/tile_map_test.cpp. No raw
// string literals here: moc 6.4 stops finding the test class after one.)
#include <QDir>
#include <QJsonDocument>
#include <QLabel>
#include <QTabWidget>
#include <QtTest>
#include <algorithm>
#include <array>

#include "keel/storage/reader.h"
#include "keel/views/inspector.h"
#include "keel/views/mask_picture.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::analysis::kTileClassCount;
using keel::analysis::maskSummaryFromAttrs;
using keel::analysis::TileClass;
using keel::storage::Recording;
using keel::views::test::loadOp;

namespace {

// Sliding window 128 over 256 tokens in 64 × 64 tiles (tests/fixtures/gpt-tiny-window.json):
// skipped above the diagonal and past the window, partial on the diagonal and the window's edge.
const char* const kWindowMap = "psss/fpss/pfps/spfp";

// Cells of the painted picture by colour, read back from its pixels (the centre of each cell).
std::array<int, kTileClassCount> paintedCounts(MaskPicture* pic) {
  const QImage img = pic->grab().toImage();
  const qreal dpr = img.devicePixelRatio();
  std::array<int, kTileClassCount> n{};
  for (int r = 0; r < pic->grid().rows; ++r)
    for (int c = 0; c < pic->grid().cols; ++c) {
      const QPoint at = pic->cellRect(r, c).center();
      const QColor px = img.pixelColor(int(at.x() * dpr), int(at.y() * dpr));
      for (int k = 0; k < kTileClassCount; ++k)
        if (px == tileClassColor(TileClass(k))) ++n[size_t(k)];
    }
  return n;
}

std::array<int, kTileClassCount> mapCounts(const QString& map) {
  return {int(map.count('s')), int(map.count('p')), int(map.count('f'))};
}

}  // namespace

class MaskTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    registerViewTypes();
    path_ = test::tempDir() + "/window.db";
    QVERIFY(test::recordFixture(path_, "--steps 1 --seed 3", "", "gpt-tiny-window.json"));
  }

  void pictureOfForwardAndBackwardMatchesTheRecordedTileMap() {
    Recording rec = Recording::open(path_.toStdString());
    const auto ops = rec.stepOps(1);
    for (const char* name : {"flashmask_attention", "flashmask_attention_backward"}) {
      auto it = std::find_if(ops.begin(), ops.end(), [&](const auto& o) { return o.name == name; });
      QVERIFY2(it != ops.end(), name);
      OpDetailsPtr d = loadOp(path_, it->seq);
      QVERIFY(d && d->error.empty());
      auto recorded = maskSummaryFromAttrs(d->op.attrsJson);
      QVERIFY2(recorded, d->op.attrsJson.c_str());
      QCOMPARE(recorded->kind, std::string("sliding_window"));
      QCOMPARE(recorded->blockSparsity, 7.0 / 16.0);
      const QString map =
          QJsonDocument::fromJson(QByteArray::fromStdString(d->op.attrsJson))["tile_map"]
              .toString();
      QCOMPARE(map, QString(kWindowMap));

      Selection sel;
      InspectorView view(&sel, Side::A);
      QVERIFY(test::showAt(view, {540, 640}));
      view.setDetails(d);
      QVERIFY(view.tabs()->isTabVisible(InspectorView::Mask));
      QCOMPARE(view.tabs()->currentIndex(), int(InspectorView::Mask));  // opens on the mask
      auto* pic = view.findChild<MaskPicture*>("maskPicture");
      QVERIFY(pic && pic->isVisible());
      QCOMPARE(pic->grid().rows, 4);
      QCOMPARE(pic->grid().cols, 4);
      const auto painted = paintedCounts(pic);
      QCOMPARE(painted, mapCounts(map));
      QCOMPARE(painted, (std::array<int, kTileClassCount>{7, 6, 3}));
      // Every cell is large enough to see, and the grid fits the picture.
      const QRect last = pic->cellRect(3, 3);
      QVERIFY(last.width() >= 8);
      QVERIFY(pic->rect().contains(last));
      // The summary and legend name the kind, the sparsity and the counts.
      auto* summary = view.findChild<QLabel*>("inspectorMaskSummary");
      QVERIFY(summary->text().contains("<b>sliding_window</b>"));
      QVERIFY(summary->text().contains("43.8%"));
      QVERIFY(summary->text().contains("256 queries × 256 keys"));
      QVERIFY(summary->text().contains("4 × 4 tiles of 64 × 64"));
      QVERIFY(view.findChild<QLabel*>("inspectorMaskLegendSkipped")->text().contains("</b> 7 "));
      QVERIFY(view.findChild<QLabel*>("inspectorMaskLegendPartial")->text().contains("</b> 6 "));
      QVERIFY(view.findChild<QLabel*>("inspectorMaskLegendFull")->text().contains("</b> 3 "));

      // Another op has no Mask tab; the inspector falls back to the tensors.
      auto other =
          std::find_if(ops.begin(), ops.end(), [](const auto& o) { return o.name == "matmul"; });
      QVERIFY(other != ops.end());
      view.setDetails(loadOp(path_, other->seq));
      QVERIFY(!view.tabs()->isTabVisible(InspectorView::Mask));
      QCOMPARE(view.tabs()->currentIndex(), int(InspectorView::Tensors));
      // A tab the user picked stays picked across flashmask ops.
      view.tabs()->setCurrentIndex(InspectorView::Stack);
      view.setDetails(d);
      QCOMPARE(view.tabs()->currentIndex(), int(InspectorView::Stack));
      QVERIFY(view.tabs()->isTabVisible(InspectorView::Mask));

      // KEEL_PANEL_SHOTS=<dir>: also save the picture, to look at (as panels_test does).
      const QString dir = test::panelShotsDir();
      if (!dir.isEmpty()) {
        view.tabs()->setCurrentIndex(InspectorView::Mask);
        QTest::qWait(50);
        QVERIFY(view.grab().save(dir + "/inspector_mask_" + QString(name) + ".png"));
      }
    }
  }

  void coarsenedMapsSayWhatACellIs() {
    // A recorded 64 × 64 map of a longer sequence: the summary says a cell is a block of tiles.
    QString map;
    for (int r = 0; r < 64; ++r) {
      if (r) map += '/';
      for (int c = 0; c < 64; ++c) map += c < r ? 'f' : c == r ? 'p' : 's';
    }
    auto d = std::make_shared<OpDetails>();
    d->op.seq = 7;
    d->op.name = "flashmask_attention";
    d->op.attrsJson =
        "{\"causal\":true,\"mask\":\"causal\",\"block_sparsity\":0.49,\"tile_shape\":[64,64],"
        "\"tile_map\":\"" +
        map.toStdString() + "\"}";
    for (int i = 0; i < 2; ++i) {
      keel::storage::TensorRecord t;
      t.role = keel::storage::Role::Input;
      t.index = i;
      t.shape = {1, 8192, 2, 64};
      d->op.tensors.push_back(t);
    }
    Selection sel;
    InspectorView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {540, 640}));
    view.setDetails(d);
    auto* summary = view.findChild<QLabel*>("inspectorMaskSummary");
    QVERIFY2(summary->text().contains("128 × 128 tiles of 64 × 64"), qPrintable(summary->text()));
    QVERIFY(summary->text().contains("shown as 64 × 64 cells"));
    auto* pic = view.findChild<MaskPicture*>("maskPicture");
    QCOMPARE(paintedCounts(pic), (std::array<int, kTileClassCount>{2016, 64, 2016}));
  }

 private:
  QString path_;
};

QTEST_MAIN(MaskTest)
#include "mask_test.moc"
