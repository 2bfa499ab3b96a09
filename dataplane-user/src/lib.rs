//! ringside agent library.
