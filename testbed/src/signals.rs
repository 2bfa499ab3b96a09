//! Ctrl-C / SIGTERM / SIGHUP as a flag, so long-running commands can tear their rig down (RAII
//! drop) instead of dying with namespaces left behind.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the handlers (idempotent) and returns the flag they set.
pub fn stop_flag() -> &'static AtomicBool {
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            tracing::warn!(?sig, error = %e, "could not install signal handler");
        }
    }
    &STOP
}

/// Whether a stop was requested.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
