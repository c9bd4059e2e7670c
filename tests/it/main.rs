//! The integration tests of agentbox: one test binary (`cargo test --test it`), each file a
//! module, so the library and the helpers in `support` are linked and compiled once rather than
//! once per file. Filter by module: `cargo test --test it -- hostile::` runs `hostile.rs`'s
//! tests only (libtest matches substrings of `module::test_name`).
//!
//! Tests of every module run at once in this one process: what a test shares with the others
//! (the process's environment, its current directory, its pid, what the daemon holds) must be
//! scoped to the test (a child's `Command::env`, a session's label, a unique name).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report

mod support;

mod agent;
mod aids;
mod chat;
mod cli;
mod corpus;
mod detect;
mod egress;
mod engine_podman;
mod engine_remote;
mod env_branch;
mod env_fork;
mod env_rewind;
mod envs;
mod eval;
mod faults;
mod gateway;
mod gvisor;
mod hostile;
mod hostile_git;
mod hostile_isolate;
mod hostile_kernel;
mod hostile_terminal;
mod hostile_verdict;
mod images;
mod isolate;
mod mcp;
mod oneshot;
mod pool;
mod processes;
mod publish;
mod render;
mod repair;
mod sandbox;
mod services;
mod setup;
mod shell;
mod terminal_compile;
