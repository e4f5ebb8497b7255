// The studio's two dialogs: "New session…" (model config, backend, seed, steps, capture options,
// recording file) and "Breakpoints…" (op name, scope, first NaN/Inf, reference recording).
#pragma once
#include <QDialog>

#include "session.h"

class QCheckBox;
class QComboBox;
class QLineEdit;
class QSpinBox;

namespace keel::studio {

// Directories searched for model configs (the source tree's configs/, the installed share dir).
QStringList configDirectories();
// A fresh recording path under the user's data directory: sessions/<name>-<time>.db.
QString defaultSessionPath(const QString& configPath);

class NewSessionDialog : public QDialog {
  Q_OBJECT
 public:
  explicit NewSessionDialog(QWidget* parent = nullptr);
  SessionConfig config() const;

 private:
  QComboBox* configCombo_;
  QComboBox* backendCombo_;
  QSpinBox* seedSpin_;
  QSpinBox* stepsSpin_;
  QCheckBox *stacks_, *md5_, *stats_, *allocator_, *dumps_;
  QLineEdit* dumpOps_;
  QLineEdit* output_;
  QLineEdit* workload_;
};

class BreakpointsDialog : public QDialog {
  Q_OBJECT
 public:
  BreakpointsDialog(const Breakpoints& current, QWidget* parent = nullptr);
  Breakpoints breakpoints() const;

 private:
  QComboBox* opName_;
  QLineEdit* scope_;
  QCheckBox* nonFinite_;
  QLineEdit* reference_;
};

}  // namespace keel::studio
