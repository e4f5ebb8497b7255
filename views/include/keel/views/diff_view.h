// The diff panel: one row per aligned op pair of a DiffReport, the first divergence on top (row 0,
// marked; the root divergence next when it differs), then every other pair in alignment order.
// A summary line gives the verdict; one proxy filters to mismatches. Rows select both ops.
#pragma once
#include <QHash>
#include <QSortFilterProxyModel>
#include <QWidget>
#include <vector>

#include "keel/views/record_table_model.h"
#include "keel/views/run_data.h"

class QCheckBox;
class QLabel;
class QLineEdit;
class QTableView;

namespace keel::views {

class Selection;

class DiffModel : public RecordTableModel {
  Q_OBJECT
 public:
  enum Column {
    Status,
    Step,
    SeqA,
    SeqB,
    Name,
    Phase,
    Scope,
    MaxAbs,
    MaxRel,
    Basis,
    Kernel,  // whether both runs ran the same kernel variant (Note [Kernel identity])
    Detail,
    ColumnCount
  };
  enum Mark { NoMark = 0, FirstDivergence = 1, RootDivergence = 2 };  // flags
  enum Role {
    StatusRole = Qt::UserRole + 1,  // int: storage::DiffStatus (any column)
    MarkRole,                       // int: Mark flags (any column)
    SortRole,                       // numbers for numeric columns (NaN: not compared)
  };

  explicit DiffModel(QObject* parent = nullptr);

  void setReport(DiffPtr report);  // nullptr empties the table
  DiffPtr report() const { return report_; }
  const storage::OpPair* pairAt(int row) const;
  int markAt(int row) const;
  // Row of the pair holding op `seq` on `side`, or -1.
  int rowOf(Side side, uint64_t seq) const;

  // Largest maxAbs / maxRel over the pair's outputs; NaN when no output was compared by values.
  static double maxAbs(const storage::OpPair& p);
  static double maxRel(const storage::OpPair& p);

  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

 private:
  int recordCount() const override;

  DiffPtr report_;
  std::vector<const storage::OpPair*> rows_;  // into report_ (pairs, or first/root's pair)
  std::vector<int> marks_;
  QHash<quint64, int> rowOfA_, rowOfB_;
};

// "Mismatches only": keeps Diverged and Unmatched pairs (drops Equal and WithinTolerance).
class DiffFilterProxy : public QSortFilterProxyModel {
  Q_OBJECT
 public:
  explicit DiffFilterProxy(QObject* parent = nullptr);
  void setMismatchesOnly(bool on);
  bool mismatchesOnly() const { return mismatchesOnly_; }

 protected:
  bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

 private:
  bool mismatchesOnly_ = false;
};

class DiffView : public QWidget {
  Q_OBJECT
 public:
  // `side` is unused by the diff (a row selects both sides); kept for the panels' one signature.
  DiffView(Selection* selection, Side side = Side::A, QWidget* parent = nullptr);

  void setReport(DiffPtr report);
  void clear() { setReport(nullptr); }
  // The comparison could not be made (a damaged row in B): says so where the report would be
  // ("No comparison. Open a second recording" read as if none had been asked for).
  void showFailure(const QString& message);
  void setMismatchesOnly(bool on);  // the checkbox follows
  // The report no longer describes run A as it is now (a live session that has run on since it
  // was compared): `note` says so on the summary's first line, before the verdict; "" for a
  // report that is current. setReport and clear keep it; the caller says when it is current
  // again. See Note [A live comparison] in app/studio/main_window.cpp.
  void setOutOfDate(const QString& note);
  QString outOfDateNote() const { return outOfDate_; }
  // The comparison of the whole runs (Note [Comparing whole runs] in keel/views/run_data.h):
  // rank by rank, a line per rank above the shown rank's verdict (`shownRank`: the rank of A and
  // B the table compares, -1 when none); by parameter, its report instead of the table. nullptr:
  // none. setReport and clear keep it.
  void setRuns(RunsPtr runs, int shownRank = -1);
  RunsPtr runs() const { return runs_; }
  // The tolerances the fields show (a comparison's own, or the window's for the next one).
  void setTolerance(double atol, double rtol, uint64_t ulps);
  // The atol, rtol and ULPs fields: an error for a field that does not hold a finite number
  // >= 0 (ULPs: a whole one), "" when all three do.
  QString toleranceError() const;

 signals:
  // The user changed a tolerance field to a valid value (Enter or leaving the field): compare
  // again with these.
  void toleranceChanged(double atol, double rtol, quint64 ulps);

 public:
  DiffModel* model() const { return model_; }
  DiffFilterProxy* proxy() const { return proxy_; }
  QTableView* table() const { return table_; }
  QString summaryText() const;

 private:
  QString failure_;    // showFailure's message; cleared by setReport
  QString outOfDate_;  // setOutOfDate's note
  RunsPtr runs_;
  int runsRank_ = -1;
  QString runsText() const;  // the runs block of the summary (rich text), "" without one
  void applyTolerance();
  void onSelected(Side side, quint64 seq);
  void selectRow(const QModelIndex& proxyIndex);
  void updateSummary();

  Selection* selection_;
  DiffModel* model_;
  DiffFilterProxy* proxy_;
  QLabel* summary_;
  QCheckBox* mismatches_;
  QLineEdit *atol_, *rtol_, *ulps_;
  QLabel* byParameter_;  // in the table's place for a comparison by parameter
  QTableView* table_;
  bool syncing_ = false;  // true while the view itself moves the current row
};

}  // namespace keel::views
