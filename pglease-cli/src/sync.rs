//! Taking a `std::sync::Mutex`, in one place for the command line. Its
//! mutexes guard values that a panicking holder leaves valid (a count, a
//! process group), and the panic reports itself; so a poisoned lock is
//! taken as it is, rather than spreading the panic to every later caller
//! (the code that stops CMD among them).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`, locked, whether or not a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
