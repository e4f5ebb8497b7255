// keel-studio's command line, read before Qt's application object exists: Qt takes some options
// as its own (`-session`/`--session` is X11 session management) and removes them from argv, so
// Keel's options are split from Qt's first (see Note [Studio options before Qt]). Parsing is a
// pure function of the argument list; it never needs a display, so --help and errors work anywhere.
#pragma once
#include <QSize>
#include <QString>
#include <QStringList>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "keel/base/output_path.h"
#include "keel/storage/diff.h"
#include "session.h"

namespace keel::studio {

struct StudioCommandLine {
  enum class Action { Open, Help, Version, Error };
  Action action = Action::Open;
  QString message;          // Help: the help text; Version: the version line; Error: one line
  QStringList qtArguments;  // argv[0] and the options meant for Qt (-platform, -style, ...)

  QString recording;  // replay this recording ("" none)
  QString compare;    // and compare it with this one ("" none)
  // The comparison's tolerances (keel diff's defaults).
  double atol = storage::DiffOptions{}.atol, rtol = storage::DiffOptions{}.rtol;
  uint64_t ulps = 0;
  int64_t step = -1;  // step to show (-1: the first; a finished live session: the last)
  int rank = -1;      // a run folder's rank to show (-1: rank 0)
  bool selectFirstDivergence = false;
  std::optional<uint64_t> selectOp;  // op sequence number to select
  QString screenshot;                // save a picture of the window here and exit
  QString viewsDir;                  // with screenshot: each view as a PNG here
  QSize size{1600, 1000};            // window size for the screenshot
  QString show;                      // bottom dock view to raise (one of kStudioViews; "" ops)
  // A live session (--session): configPath set; output "" means the default session path.
  std::optional<SessionConfig> session;
  bool run = false;    // start the session running at once
  Breakpoints breaks;  // --break-on: the session's breakpoints from its start
};

// The bottom dock's views, by --show name (MainWindow::showView).
inline const QStringList kStudioViews = {"ops", "diff", "logs", "memory", "timeline", "ranks"};

// Parses keel-studio's arguments (args[0] is the program). Never touches the file system except
// to check that named inputs exist.
StudioCommandLine parseStudioCommandLine(const QStringList& args);
// Note [Outputs never destroy inputs]: why a screenshot may not be saved at `path` (`option` names
// it: "--screenshot", "screenshot"), "" when it may. Never over one of `inputs` or a device; it
// is named .png and replaces only a PNG picture or an empty file (--screenshot and File > Save
// screenshot alike: the menu's replaced a recording with a picture).
QString screenshotRefusal(const QString& option, const QString& path,
                          const std::vector<keel::NamedInput>& inputs);
// The --help text (needs a QCoreApplication for the program name; no display).
QString studioHelpText();
// Checks what the command line asks of its recording against the recording itself: a --step it
// does not have, a --select-op that is no op of it ("--step 99: a.db has training steps 1 to 2").
// "" when fine, or when the recording cannot be read (the window reports that as it opens). A run
// folder is not checked here.
QString checkRecordingRequests(const StudioCommandLine& cli);
// Why the window cannot open, or "": no platform chosen (-platform, QT_QPA_PLATFORM), no -display
// and neither DISPLAY nor WAYLAND_DISPLAY set — Qt would print its platform-plugin help and abort.
// `env` holds the variables (QProcessEnvironment::systemEnvironment() in main).
QString missingDisplayReason(const QStringList& qtArguments,
                             const std::function<QString(const char*)>& env);

}  // namespace keel::studio
