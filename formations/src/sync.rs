//! Taking a `std::sync::Mutex`, in one place for the whole crate. The
//! formations' mutexes guard values that a panicking holder leaves valid
//! (a child process's handle, the forwarder's connection tasks), and the
//! panic reports itself; so a poisoned lock is taken as it is, rather
//! than spreading the panic to every later caller (a formation's `Drop`
//! among them, which must still stop its servers).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`, locked, whether or not a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
