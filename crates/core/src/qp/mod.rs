//! Queue pairs: the IBA state machine, attributes, and (in sibling modules)
//! the requester, responder and completer that one QP owns.

pub mod attr;
pub mod state;
