//! One file per subcommand; each returns the process exit status.

pub mod chat;
pub mod demo;
pub mod doctor;
pub mod eval;
pub mod exec;
pub mod gc;
pub mod image;
pub mod mcp;
pub mod run;
pub mod shell;
