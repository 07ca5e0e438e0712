//! usermm: Linux's memory-management subsystem rebuilt in user space on userfaultfd.
pub mod sys;
