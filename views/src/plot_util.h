// What the studio's QCustomPlot plots (the loss plot, the memory timeline) share.
#pragma once
#include <QFont>

class QCustomPlot;

namespace keel::views {

// The legend in its own row under the plot, its entries side by side in `font`, on translucent
// white without a border: inside the axis rect it hid the curves of a small (docked) plot.
void putLegendBelow(QCustomPlot* plot, const QFont& font);
// Shows or hides that legend. Hidden, it waits in the axis rect's inset layout: an empty legend
// left in the plot's layout limits the plot's column to its own (tiny) maximum width, which
// shrank a plot without curves (a run whose every loss is NaN) to a corner of its dock.
void showLegendBelow(QCustomPlot* plot, bool shown);

}  // namespace keel::views
