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
  plot->axisRect()->insetLayout()->take(legend);
  plot->plotLayout()->addElement(1, 0, legend);
  plot->plotLayout()->setRowStretchFactor(1, 0.001);
}

}  // namespace keel::views
