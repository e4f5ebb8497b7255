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
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTableWidget>
#include <QVBoxLayout>
#include <algorithm>
#include <functional>
#include <limits>

#include "keel/base/output_path.h"
#include "keel/capture/recording_run.h"
#include "keel/device.h"
#include "keel/registry.h"

namespace keel::studio {

QStringList configDirectories() {
  QStringList dirs;
  // Installed next to the binary (<prefix>/bin/../share/keel/configs, whatever the prefix), the
  // configured install prefix, then the source tree of a development build.
  // The command line is read before the application object exists: the binary's folder then
  // comes from /proc.
  const QString binDir =
      QCoreApplication::instance()
          ? QCoreApplication::applicationDirPath()
          : QFileInfo(QFileInfo("/proc/self/exe").canonicalFilePath()).absolutePath();
  const QString besideBinary = QDir(binDir + "/../share/keel/configs").absolutePath();
  for (const QString& d :
       {besideBinary, QString(KEEL_INSTALLED_CONFIG_DIR), QString(KEEL_SOURCE_CONFIG_DIR)})
    if (QDir(d).exists() && !dirs.contains(QDir(d).absolutePath())) dirs << QDir(d).absolutePath();
  return dirs;
}

QString namedConfig(const QString& name) {
  if (name.isEmpty() || name.contains('/')) return {};
  const QString file = name.endsWith(".json") ? name : name + ".json";
  for (const QString& dir : configDirectories())
    if (QFileInfo(dir + "/" + file).isFile()) return QDir(dir).absoluteFilePath(file);
  return {};
}

QString defaultSessionPath(const QString& configPath) {
  QString dir =
      QStandardPaths::writableLocation(QStandardPaths::AppLocalDataLocation) + "/sessions";
  QDir().mkpath(dir);
  const QString name = QFileInfo(configPath).completeBaseName();  // none: the workload's own
  return dir + "/" + (name.isEmpty() ? QString("session") : name) + "-" +
         QDateTime::currentDateTime().toString("yyyyMMdd-hhmmss") + ".db";
}

namespace {
const QString kWorkloadDefaults = "(none: the workload's defaults)";

// The config the combo box names: a listed name's file, the workload's defaults (""), or the text
// typed into it, a path (typed text does not change the current item, so its data was the
// previous choice's: Start ran gpt-mini whatever path was typed).
QString chosenConfig(const QComboBox* combo) {
  const QString text = combo->currentText().trimmed();
  // The current item first: a browsed file may share a listed config's name.
  if (combo->currentIndex() >= 0 && combo->itemText(combo->currentIndex()) == text)
    return combo->currentData().toString();
  const int listed = combo->findText(text);
  if (listed >= 0) return combo->itemData(listed).toString();
  return text;
}

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

NewSessionDialog::NewSessionDialog(const SessionConfig* previous, QWidget* parent)
    : QDialog(parent) {
  setWindowTitle("New session");
  auto* form = new QFormLayout;
  configCombo_ = new QComboBox;
  configCombo_->setEditable(true);
  for (const QString& dir : configDirectories())  // a name once: the first folder's (installed)
    for (const QFileInfo& f : QDir(dir).entryInfoList({"*.json"}, QDir::Files, QDir::Name))
      if (configCombo_->findText(f.completeBaseName()) < 0)
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
  // CUDA devices where the CUDA backend loads and finds some (Note [CUDA backend plugin]).
  for (int i = 0, n = keel::cudaDevices(); i < n; ++i)
    backendCombo_->addItem(QString("cuda:%1").arg(i));
  form->addRow("Backend", backendCombo_);
  seedSpin_ = new QSpinBox;
  seedSpin_->setRange(0, std::numeric_limits<int>::max());
  seedSpin_->setValue(0);  // keel record's default: a reference it recorded is followed
  form->addRow("Seed", seedSpin_);
  stepsSpin_ = new QSpinBox;
  stepsSpin_->setRange(1, 1000000);
  stepsSpin_->setValue(50);  // as keel-studio --session's --steps
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
  defaultOutput_ = defaultSessionPath(chosenConfig(configCombo_));
  output_ = new QLineEdit(defaultOutput_);
  // The whole path where it fits, else its start (the folder): it showed "/gpt-mini-2026…db".
  output_->setMinimumWidth(output_->fontMetrics().horizontalAdvance(QString(64, QChar('x'))));
  auto showStart = [this] { output_->setCursorPosition(0); };
  connect(output_, &QLineEdit::editingFinished, this, showStart);
  showStart();
  // Another config, another default name; a name the user gave is kept.
  connect(configCombo_, &QComboBox::currentTextChanged, this, [this] {
    if (output_->text() != defaultOutput_) return;
    defaultOutput_ = defaultSessionPath(chosenConfig(configCombo_));
    output_->setText(defaultOutput_);
    output_->setCursorPosition(0);
  });
  form->addRow("Recording file", withBrowse(output_, [this] {
                 // Replacing is asked on Start (accept), once, whichever way the name came.
                 return QFileDialog::getSaveFileName(this, "Recording file", output_->text(),
                                                     "Keel recordings (*.db)", nullptr,
                                                     QFileDialog::DontConfirmOverwrite);
               }));
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  buttons->button(QDialogButtonBox::Ok)->setText("Start");
  connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* top = new QVBoxLayout(this);
  top->addLayout(form);
  top->addWidget(buttons);
  if (previous) {
    const SessionConfig& p = *previous;
    int i = configCombo_->findData(p.configPath);
    if (i < 0 && !p.configPath.isEmpty()) {
      configCombo_->addItem(QFileInfo(p.configPath).completeBaseName(), p.configPath);
      i = configCombo_->count() - 1;
    }
    if (i >= 0) configCombo_->setCurrentIndex(i);
    workload_->setText(p.workloadPath);
    if (p.configPath.isEmpty() && !p.workloadPath.isEmpty())
      configCombo_->setCurrentIndex(configCombo_->findText(kWorkloadDefaults));
    if (int b = backendCombo_->findText(p.backend); b >= 0) backendCombo_->setCurrentIndex(b);
    seedSpin_->setValue(int(p.seed));
    stepsSpin_->setValue(int(p.steps));
    stacks_->setChecked(p.capture.stacks);
    md5_->setChecked(p.capture.md5);
    stats_->setChecked(p.capture.stats);
    allocator_->setChecked(p.capture.allocator);
    dumps_->setChecked(p.capture.dumps);
    QStringList ops;
    for (const std::string& op : p.capture.dumpFilter.ops) ops << QString::fromStdString(op);
    dumpOps_->setText(ops.join(','));
    if (!QFileInfo::exists(p.output)) output_->setText(p.output);
    output_->setCursorPosition(0);
  }
}

void NewSessionDialog::accept() {
  const QString out = output_->text();
  // A file that is not a recording is refused now, not after a "Replace it?" answered Yes.
  try {
    checkReplacesOnlyARecording("output", out.toStdString());
    checkWritable(out.toStdString());
  } catch (const std::exception& e) {
    QMessageBox::warning(this, "Recording file", QString::fromStdString(e.what()));
    return;
  }
  if (QFileInfo::exists(out) &&
      QMessageBox::question(
          this, "Replace recording",
          QString("%1 exists.\n\nA live session writes its recording in place as it runs: the "
                  "file is replaced from the first op, even if the session then fails or is "
                  "stopped.\n\nReplace it?")
              .arg(QDir::toNativeSeparators(out))) != QMessageBox::Yes)
    return;
  QDialog::accept();
}

SessionConfig NewSessionDialog::config() const {
  SessionConfig c;
  c.configPath = chosenConfig(configCombo_);
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
  resize(620, 420);
  table_ = new QTableWidget(0, 2);
  table_->setObjectName("breakpointTable");
  table_->setHorizontalHeaderLabels({"On", "Condition"});
  table_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->verticalHeader()->hide();
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  for (const Breakpoint& p : b.list) addBreakpoint(p.item, p.enabled);

  kind_ = new QComboBox;
  kind_->setObjectName("breakpointKind");
  kind_->addItem("After every call of op", "op:");
  kind_->addItem("After every op in scope", "scope:");
  kind_->addItem("At the end of step", "step:");
  kind_->addItem("At the first NaN / Inf output", "nan");
  kind_->addItem("When the gradient norm is above", "grad-norm>");
  kind_->addItem("When the loss is above k × its mean, k =", "loss>");
  kind_->addItem("At the first MD5 differing from recording", "md5-ref:");
  value_ = new QComboBox;
  value_->setObjectName("breakpointValue");
  value_->setEditable(true);
  value_->setMinimumWidth(200);
  hits_ = new QSpinBox;
  hits_->setObjectName("breakpointHits");
  hits_->setRange(0, 1000000);
  hits_->setSpecialValueText("every hit");
  hits_->setPrefix("hit ");
  hits_->setToolTip("Stop only at the Nth time the condition holds");
  auto updateValues = [this] {
    const QString k = kind_->currentData().toString();
    value_->clear();
    if (k == "op:") {
      QStringList names;
      for (int i = 0; i < Registry::get().size(); ++i)
        names << QString::fromStdString(Registry::get().op(i).name);
      names.sort();
      value_->addItems(names);
    }
    value_->setEnabled(k != "nan");
    value_->lineEdit()->setPlaceholderText(k == "scope:"       ? "e.g. blocks.1.attn"
                                           : k == "step:"      ? "step number"
                                           : k == "md5-ref:"   ? "reference recording (.db)"
                                           : k == "grad-norm>" ? "e.g. 10"
                                           : k == "loss>"      ? "e.g. 2"
                                                               : QString());
    value_->setCurrentText(k == "op:" ? "matmul" : QString());
    // A step ends once: a hit count there would never pause (step:2@3 was accepted).
    if (k == "step:") hits_->setValue(0);
    hits_->setEnabled(k != "step:");
  };
  connect(kind_, &QComboBox::currentIndexChanged, this, updateValues);
  updateValues();
  auto* browse = new QPushButton("…");
  browse->setToolTip("Choose a reference recording");
  connect(browse, &QPushButton::clicked, this, [this] {
    QString p = QFileDialog::getOpenFileName(this, "Reference recording", QString(),
                                             "Keel recordings (*.db)");
    if (p.isEmpty()) return;
    kind_->setCurrentIndex(kind_->findData("md5-ref:"));
    value_->setCurrentText(p);
  });
  auto* add = new QPushButton("Add");
  add->setObjectName("breakpointAdd");
  connect(add, &QPushButton::clicked, this, [this] {
    // Checked here, as OK checks the list: "step:abc" went into the list and failed on OK.
    const QString item =
        itemFor(kind_->currentData().toString(), value_->currentText().trimmed(), hits_->value());
    if (const QString err = problem(item); !err.isEmpty()) {
      showError(err);
      return;
    }
    addBreakpoint(item);
    showError(breakpoints().error());
    if (error_->isHidden()) showWarning(seedWarning(item));
  });
  auto* remove = new QPushButton("Remove");
  remove->setObjectName("breakpointRemove");
  connect(remove, &QPushButton::clicked, this, [this] {
    QList<int> rows;
    for (const QModelIndex& i : table_->selectionModel()->selectedRows()) rows << i.row();
    std::sort(rows.begin(), rows.end(), std::greater<int>());
    for (int r : rows) table_->removeRow(r);
    showError(breakpoints().error());  // the removed row's error went with it
  });
  auto* addRow = new QHBoxLayout;
  addRow->addWidget(kind_);
  addRow->addWidget(value_, 1);
  addRow->addWidget(browse);
  addRow->addWidget(hits_);
  addRow->addWidget(add);
  auto* help = new QLabel(
      "Conditions read as <code>keel record --break-on</code> items: op:NAME, scope:SCOPE, "
      "step:N, nan, grad-norm&gt;X, loss&gt;K*mean, md5-ref:REF.db, each optionally @N (the Nth "
      "hit). Op-level ones pause after the op, step-level ones at the step's end.");
  help->setWordWrap(true);
  error_ = new QLabel;
  error_->setObjectName("breakpointError");
  error_->setStyleSheet("color: #c62828");
  error_->setWordWrap(true);
  error_->hide();
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  buttons->addButton(remove, QDialogButtonBox::ActionRole);
  connect(buttons, &QDialogButtonBox::accepted, this, &BreakpointsDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* top = new QVBoxLayout(this);
  top->addWidget(table_, 1);
  top->addLayout(addRow);
  top->addWidget(help);
  top->addWidget(error_);
  top->addWidget(buttons);
}

QString BreakpointsDialog::itemFor(const QString& kind, const QString& value, int hits) {
  QString item = kind == "nan"     ? QString("nan")
                 : kind == "loss>" ? "loss>" + value + "*mean"
                                   : kind + value;
  if (hits > 1) item += "@" + QString::number(hits);
  return item;
}

void BreakpointsDialog::addBreakpoint(const QString& item, bool enabled) {
  const int row = table_->rowCount();
  table_->insertRow(row);
  auto* on = new QTableWidgetItem;
  on->setFlags(Qt::ItemIsUserCheckable | Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  on->setCheckState(enabled ? Qt::Checked : Qt::Unchecked);
  table_->setItem(row, 0, on);
  table_->setItem(row, 1, new QTableWidgetItem(item));
}

Breakpoints BreakpointsDialog::breakpoints() const {
  Breakpoints b;
  for (int r = 0; r < table_->rowCount(); ++r) {
    const QString item = table_->item(r, 1) ? table_->item(r, 1)->text().trimmed() : QString();
    if (!item.isEmpty()) b.add(item, table_->item(r, 0)->checkState() == Qt::Checked);
  }
  return b;
}

void BreakpointsDialog::showError(const QString& err) {
  error_->setStyleSheet("color: #c62828");
  error_->setText(err);
  error_->setVisible(!err.isEmpty());
}

void BreakpointsDialog::showWarning(const QString& text) {
  error_->setStyleSheet("color: #8a5300");
  error_->setText(text.isEmpty() ? text : "Warning: " + text);
  error_->setVisible(!text.isEmpty());
}

void BreakpointsDialog::setSession(uint64_t seed, int64_t steps) {
  seed_ = seed;
  steps_ = steps;
}

QString BreakpointsDialog::problem(const QString& item) const {
  Breakpoints one;
  one.add(item);
  if (const QString err = one.error(); !err.isEmpty()) return err;
  for (const Breakpoint& p : breakpoints().list)
    if (p.item.trimmed() == item.trimmed()) return item + " is in the list already";
  const capture::BreakCondition c = capture::BreakCondition::parse(item.trimmed().toStdString());
  if (c.kind == capture::BreakCondition::Kind::Step && steps_ > 0 && c.value > double(steps_))
    return QString("%1 lies past the session's %2 step%3: it would never pause it")
        .arg(item)
        .arg(steps_)
        .arg(steps_ == 1 ? "" : "s");
  if (c.kind == capture::BreakCondition::Kind::Step && c.hitCount > 1)
    return item + " would never pause: a step ends once";
  return {};
}

// As keel record warns (RecordingRun::referenceWarning): a reference recorded with another seed
// differs from the session from its first random op, so the breakpoint pauses there.
QString BreakpointsDialog::seedWarning(const QString& item) const {
  if (!seed_) return {};
  try {
    const capture::BreakCondition c = capture::BreakCondition::parse(item.trimmed().toStdString());
    if (c.kind != capture::BreakCondition::Kind::Md5Ref) return {};
    capture::BreakSpec one;
    one.conditions.push_back(c);
    const capture::BreakConditions check(std::move(one));
    for (const auto& [path, seed] : check.referenceSeeds())
      if (seed != *seed_)
        return QString(
                   "%1 was recorded with seed %2 and this session uses seed %3: their MD5s "
                   "differ from the first random op, where it will pause (start a session "
                   "with seed %2 to follow it)")
            .arg(QString::fromStdString(path))
            .arg(seed)
            .arg(*seed_);
  } catch (const std::exception&) {
  }
  return {};
}

void BreakpointsDialog::accept() {
  const QString err = breakpoints().error();
  showError(err);
  if (err.isEmpty()) QDialog::accept();
}

}  // namespace keel::studio
