// Stop signals: SIGTERM and SIGINT (what Slurm, Kubernetes and Ctrl-C send) ask a run to stop cleanly.
//
// The handler only records the signal in an atomic flag and puts the default actions back, which is
// all a handler may safely do. The trainer reads the flag at each step boundary and the ranks agree
// on it (launcher/step_agreement.h), so the run stops after the step in progress, saves a checkpoint
// and exits 0: at most one step after the signal, plus the checkpoint's write.
//
// The first signal restores the default action of both signals (SA_RESETHAND, then sigaction in the
// handler), so a second SIGTERM or SIGINT ends the process at once, killed by that signal, for a user
// or a scheduler that will not wait for the checkpoint. Dying by the signal, rather than _exit from
// the handler with a chosen code, tells the parent (the shell, mpirun, Slurm) the true cause.
#pragma once

#include <string>

namespace weft {

// Installs the handler for SIGTERM and SIGINT. Call after MPI is initialised, so that no library
// installs its own handler over it.
void install_stop_signal_handlers();

// Whether a stop signal has arrived since the handlers were installed.
bool stop_requested();

// The first stop signal's name ("SIGTERM", "SIGINT"), or "" when none arrived.
std::string stop_signal_name();

}  // namespace weft
