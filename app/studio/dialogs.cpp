// See dialogs.h.
#include "dialogs.h"

#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QDateTime>
#include <QDialogButtonBox>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QStandardPaths>
#include <QVBoxLayout>
#include <functional>

#include "keel/registry.h"

namespace keel::studio {

QStringList configDirectories() {
  QStringList dirs;
  // Installed next to the binary (<prefix>/bin/../share/keel/configs, whatever the prefix), the
  // configured install prefix, then the source tree of a development build.
  const QString besideBinary =
      QDir(QCoreApplication::applicationDirPath() + "/../share/keel/configs").absolutePath();
  for (const QString& d :
       {besideBinary, QString(KEEL_INSTALLED_CONFIG_DIR), QString(KEEL_SOURCE_CONFIG_DIR)})
    if (QDir(d).exists() && !dirs.contains(QDir(d).absolutePath())) dirs << QDir(d).absolutePath();
  return dirs;
}

QString defaultSessionPath(const QString& configPath) {
  QString dir =
      QStandardPaths::writableLocation(QStandardPaths::AppLocalDataLocation) + "/sessions";
  QDir().mkpath(dir);
  return dir + "/" + QFileInfo(configPath).completeBaseName() + "-" +
         QDateTime::currentDateTime().toString("yyyyMMdd-hhmmss") + ".db";
}

namespace {
const QString kWorkloadDefaults = "(none: the workload's defaults)";

QWidget* withBrowse(QLineEdit* edit, std::function<QString()> pick) {
  auto* w = new QWidget;
  auto* l = new QHBoxLayout(w);
  l->setContentsMargins(0, 0, 0, 0);
  l->addWidget(edit, 1);
  auto* b = new QPushButton("Browse…");
  l->addWidget(b);
  QObject::connect(b, &QPushButton::clicked, edit, [edit, pick] {
    QString p = pick();
    if (!p.isEmpty()) edit->setText(p);
  });
  return w;
}
}  // namespace

NewSessionDialog::NewSessionDialog(QWidget* parent) : QDialog(parent) {
  setWindowTitle("New session");
  auto* form = new QFormLayout;
  configCombo_ = new QComboBox;
  configCombo_->setEditable(true);
  for (const QString& dir : configDirectories())
    for (const QFileInfo& f : QDir(dir).entryInfoList({"*.json"}, QDir::Files, QDir::Name))
      configCombo_->addItem(f.completeBaseName(), f.absoluteFilePath());
  int mini = configCombo_->findText("gpt-mini");
  if (mini >= 0) configCombo_->setCurrentIndex(mini);
  auto* browse = new QPushButton("Browse…");
  connect(browse, &QPushButton::clicked, this, [this] {
    QString p = QFileDialog::getOpenFileName(this, "Model config", QString(), "JSON (*.json)");
    if (!p.isEmpty()) {
      configCombo_->addItem(QFileInfo(p).completeBaseName(), p);
      configCombo_->setCurrentIndex(configCombo_->count() - 1);
    }
  });
  auto* cfgRow = new QHBoxLayout;
  cfgRow->addWidget(configCombo_, 1);
  cfgRow->addWidget(browse);
  form->addRow("Model config", cfgRow);
  // A workload library (docs/api.md) runs the user's own model; its config is the one above, or
  // none (the workload's defaults), which choosing a library selects.
  workload_ = new QLineEdit;
  workload_->setPlaceholderText("built-in GPT / MoE trainer (or a workload lib*.so)");
  form->addRow("Workload library", withBrowse(workload_, [this] {
                 return QFileDialog::getOpenFileName(this, "Workload library", QString(),
                                                     "Shared libraries (*.so)");
               }));
  connect(workload_, &QLineEdit::textChanged, this, [this](const QString& text) {
    if (text.isEmpty()) return;
    int none = configCombo_->findText(kWorkloadDefaults);
    if (none < 0) {
      configCombo_->addItem(kWorkloadDefaults, QString());
      none = configCombo_->count() - 1;
    }
    configCombo_->setCurrentIndex(none);
  });
  backendCombo_ = new QComboBox;
  backendCombo_->addItems({"cpu", "cpu-ref"});
  form->addRow("Backend", backendCombo_);
  seedSpin_ = new QSpinBox;
  seedSpin_->setRange(0, 1 << 30);
  seedSpin_->setValue(1);
  form->addRow("Seed", seedSpin_);
  stepsSpin_ = new QSpinBox;
  stepsSpin_->setRange(1, 1000000);
  stepsSpin_->setValue(20);
  form->addRow("Steps", stepsSpin_);
  stacks_ = new QCheckBox("call stacks");
  md5_ = new QCheckBox("MD5 of every tensor");
  stats_ = new QCheckBox("statistics (min/max/mean/std, NaN/Inf)");
  allocator_ = new QCheckBox("allocator events");
  dumps_ = new QCheckBox("dump values of ops:");
  for (QCheckBox* c : {stacks_, md5_, stats_, allocator_}) c->setChecked(true);
  dumpOps_ = new QLineEdit;
  dumpOps_->setPlaceholderText("e.g. matmul,softmax");
  auto* capture = new QVBoxLayout;
  for (QCheckBox* c : {stacks_, md5_, stats_, allocator_}) capture->addWidget(c);
  auto* dumpRow = new QHBoxLayout;
  dumpRow->addWidget(dumps_);
  dumpRow->addWidget(dumpOps_, 1);
  capture->addLayout(dumpRow);
  form->addRow("Record", capture);
  output_ = new QLineEdit(defaultSessionPath(configCombo_->currentData().toString()));
  connect(configCombo_, &QComboBox::currentIndexChanged, this,
          [this] { output_->setText(defaultSessionPath(configCombo_->currentData().toString())); });
  form->addRow("Recording file", withBrowse(output_, [this] {
                 return QFileDialog::getSaveFileName(this, "Recording file", output_->text(),
                                                     "Keel recordings (*.db)");
               }));
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  buttons->button(QDialogButtonBox::Ok)->setText("Start");
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* top = new QVBoxLayout(this);
  top->addLayout(form);
  top->addWidget(buttons);
}

SessionConfig NewSessionDialog::config() const {
  SessionConfig c;
  c.configPath = configCombo_->currentData().toString();
  if (c.configPath.isEmpty() && configCombo_->currentText() != kWorkloadDefaults)
    c.configPath = configCombo_->currentText();
  c.workloadPath = workload_->text().trimmed();
  c.backend = backendCombo_->currentText();
  c.seed = uint64_t(seedSpin_->value());
  c.steps = stepsSpin_->value();
  c.output = output_->text();
  c.capture.stacks = stacks_->isChecked();
  c.capture.md5 = md5_->isChecked();
  c.capture.stats = stats_->isChecked();
  c.capture.allocator = allocator_->isChecked();
  c.capture.dumps = dumps_->isChecked();
  for (const QString& op : dumpOps_->text().split(',', Qt::SkipEmptyParts))
    c.capture.dumpFilter.ops.push_back(op.trimmed().toStdString());
  return c;
}

BreakpointsDialog::BreakpointsDialog(const Breakpoints& b, QWidget* parent) : QDialog(parent) {
  setWindowTitle("Breakpoints");
  auto* form = new QFormLayout;
  opName_ = new QComboBox;
  opName_->setEditable(true);
  opName_->addItem(QString());
  QStringList names;
  for (int i = 0; i < Registry::get().size(); ++i)
    names << QString::fromStdString(Registry::get().op(i).name);
  names.sort();
  opName_->addItems(names);
  opName_->setCurrentText(b.opName);
  form->addRow("After every call of op", opName_);
  scope_ = new QLineEdit(b.scope);
  scope_->setPlaceholderText("e.g. blocks.1.attn");
  form->addRow("After every op in scope", scope_);
  nonFinite_ = new QCheckBox("at the first op with a NaN or Inf output");
  nonFinite_->setChecked(b.nonFinite);
  form->addRow("NaN / Inf", nonFinite_);
  reference_ = new QLineEdit(b.referencePath);
  reference_->setPlaceholderText("a recording of the same config and seed");
  form->addRow("First MD5 differing from", withBrowse(reference_, [this] {
                 return QFileDialog::getOpenFileName(this, "Reference recording", QString(),
                                                     "Keel recordings (*.db)");
               }));
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* top = new QVBoxLayout(this);
  top->addLayout(form);
  top->addWidget(buttons);
}

Breakpoints BreakpointsDialog::breakpoints() const {
  Breakpoints b;
  b.opName = opName_->currentText().trimmed();
  b.scope = scope_->text().trimmed();
  b.nonFinite = nonFinite_->isChecked();
  b.referencePath = reference_->text().trimmed();
  return b;
}

}  // namespace keel::studio
