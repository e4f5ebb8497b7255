// What the studio's QCustomPlot plots (the loss plot, the memory timeline) share.
#pragma once
#include <QFont>

class QCustomPlot;

namespace keel::views {

// The legend in its own row under the plot, its entries side by side in `font`, on translucent
// white without a border: inside the axis rect it hid the curves of a small (docked) plot.
void putLegendBelow(QCustomPlot* plot, const QFont& font);

}  // namespace keel::views
