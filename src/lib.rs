//! agentbox: a coding agent whose every tool call runs inside a locked-down Docker container.
//!
//! The library exists so integration tests and benchmarks drive the same code the binary runs.

pub mod app;
pub mod cli;
pub mod commands;
pub mod config;
pub mod image;
pub mod sandbox;
pub mod workspace;
