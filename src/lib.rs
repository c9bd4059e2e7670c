//! agentbox: a coding agent whose every tool call runs inside a locked-down Docker container.
//!
//! The library exists so integration tests and benchmarks drive the same code the binary runs.

#[macro_use]
pub mod output;

pub mod agent;
pub mod app;
pub mod cli;
pub mod cli_reference;
pub mod commands;
pub mod config;
pub mod config_file;
pub mod egress;
pub mod env_branch;
pub mod env_checkpoint;
pub mod env_fork;
pub mod env_merge;
pub mod env_view;
pub mod envs;
pub mod eval;
pub mod events;
pub mod exit;
/// The fuzz targets' door to the parsers of hostile bytes (`fuzz/`; not public API).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
/// The host's side of a sandbox: the project's scans, `--isolate`'s copy and read-back, git
/// quoting — its own crate (`crates/agentbox-hostfs`).
pub use agentbox_hostfs as hostfs;
pub mod mcp;
mod messages;
/// The model layer, its own crate (`crates/agentbox-model`).
pub use agentbox_model as model;
pub mod project;
pub mod repair;
pub mod report;
/// The sandbox layer, its own crate (`crates/agentbox-sandbox`).
pub use agentbox_sandbox as sandbox;
pub mod session;
pub mod terminal;
pub mod toolchain;
pub mod tools;
pub mod workspace;
