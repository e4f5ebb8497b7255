// The studio's two dialogs: "New session…" (model config, backend, seed, steps, capture options,
// recording file) and "Breakpoints…" (a list editor: op name, scope, step, first NaN/Inf, gradient
// norm, loss spike, reference recording; each with a hit count, on or off).
#pragma once
#include <QDialog>
#include <optional>

#include "session.h"

class QCheckBox;
class QComboBox;
class QLineEdit;
class QSpinBox;
class QLabel;
class QTableWidget;

namespace keel::studio {

// Directories searched for model configs (the source tree's configs/, the installed share dir).
QStringList configDirectories();
// The config a bare name stands for ("gpt-mini" or "gpt-mini.json": the first configDirectories()
// folder's); "" when the name has a folder in it or no folder has it.
QString namedConfig(const QString& name);
// A fresh recording path under the user's data directory: sessions/<name>-<time>.db.
QString defaultSessionPath(const QString& configPath);

class NewSessionDialog : public QDialog {
  Q_OBJECT
 public:
  // `previous`: the last session's settings, shown again (a failed Start lost them); its
  // recording file is kept only if it does not exist yet.
  explicit NewSessionDialog(const SessionConfig* previous = nullptr, QWidget* parent = nullptr);
  SessionConfig config() const;
  // Start: an existing recording file is replaced only once the user says so (Note [A session
  // never replaces a recording]).
  void accept() override;

 private:
  QComboBox* configCombo_;
  QComboBox* backendCombo_;
  QSpinBox* seedSpin_;
  QSpinBox* stepsSpin_;
  QCheckBox *stacks_, *md5_, *stats_, *allocator_, *dumps_;
  QLineEdit* dumpOps_;
  QLineEdit* output_;
  QString defaultOutput_;  // the name output_ was given for the config: replaced while untouched
  QLineEdit* workload_;
};

// The breakpoint list: one row per breakpoint (on/off, its `--break-on` item, editable); below,
// a kind, a value and a hit count make a new one (Add), and Remove drops the selected rows. OK
// refuses a list with an item capture cannot read and says why.
class BreakpointsDialog : public QDialog {
  Q_OBJECT
 public:
  BreakpointsDialog(const Breakpoints& current, QWidget* parent = nullptr);
  Breakpoints breakpoints() const;
  // The item the add row makes for a kind ("op:", "scope:", "step:", "nan", "grad-norm>",
  // "loss>", "md5-ref:"), a value and a hit count (0: every hit).
  static QString itemFor(const QString& kind, const QString& value, int hits);
  void addBreakpoint(const QString& item, bool enabled = true);  // appends a row
  QTableWidget* table() const { return table_; }
  // The live session the breakpoints are for: an item that could never pause it is refused
  // (step:N past its steps), and a reference recorded with another seed is warned about.
  void setSession(uint64_t seed, int64_t steps);

 private:
  void showError(const QString& err);  // "" hides the error line
  void showWarning(const QString& text);
  QString problem(const QString& item) const;  // why `item` cannot be added; "" if it can
  QString seedWarning(const QString& item) const;
  void accept() override;

  QTableWidget* table_;
  QComboBox* kind_;
  QComboBox* value_;
  QSpinBox* hits_;
  QLabel* error_;
  std::optional<uint64_t> seed_;
  int64_t steps_ = 0;  // 0: no session
};

}  // namespace keel::studio
