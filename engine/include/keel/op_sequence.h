// The numbering of op calls: every dispatched op gets the next number of one process-wide
// sequence (OpEvent::seq, lastOpSeq() in keel/dispatch.h), and a recording stores it.
#pragma once

namespace keel::detail {

// Note [Op numbers per run]: restarts the sequence, so the next op call is #1. For a host that
// runs several recorded runs one after another in one process (Keel Studio's sessions): the
// second session's ops were numbered from the first's (#2880), so "#293" named different ops in
// equal runs, and `--select-op 1` failed. Call it only while no op runs and no run that reads the
// numbers (a recorder, breakpoints) is alive.
void restartOpSequence();

}  // namespace keel::detail
