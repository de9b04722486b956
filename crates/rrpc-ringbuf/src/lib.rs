//! RB² distributed ring buffer over the rrpc fabric (to be built: issue 3).
