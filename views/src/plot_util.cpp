// See plot_util.h.
#include "plot_util.h"

#include <qcustomplot.h>

namespace keel::views {

void putLegendBelow(QCustomPlot* plot, const QFont& font) {
  QCPLegend* legend = plot->legend;
  legend->setVisible(true);
  legend->setFont(font);
  legend->setBrush(QColor(255, 255, 255, 220));
  legend->setBorderPen(Qt::NoPen);
  legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  showLegendBelow(plot, true);
}

void showLegendBelow(QCustomPlot* plot, bool shown) {
  QCPLegend* legend = plot->legend;
  QCPLayoutGrid* below = plot->plotLayout();
  QCPLayoutInset* inset = plot->axisRect()->insetLayout();
  legend->setVisible(shown);
  if (shown && legend->layout() != below) {
    inset->take(legend);
    inset->simplify();
    below->addElement(1, 0, legend);
    below->setRowStretchFactor(1, 0.001);
  } else if (!shown && legend->layout() != inset) {
    below->take(legend);
    below->simplify();  // drops the empty row
    inset->addElement(legend, Qt::AlignRight | Qt::AlignTop);
  }
}

}  // namespace keel::views
