//! Builds `agentbox-init` (`src/oneshot.c`), the static PID 1 of `exec`'s one-shot sandboxes,
//! for embedding. A static binary needs nothing from the image it runs in. Where it cannot be
//! built (no C compiler or no static libc, or a build for another machine), an empty file is
//! embedded instead and `exec` starts its sandboxes the usual way.

// A build script speaks to cargo on stdout (nothing here reaches a terminal as text from the
// sandbox), and has no caller to hand an error to: cargo shows the panic.
#![allow(clippy::disallowed_macros, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/oneshot.c");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("agentbox-init");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok()
        && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let built = native
        && Command::new(&cc)
            .args(["-static", "-Os", "-s", "-Wall", "-o"])
            .arg(&out)
            .arg("src/oneshot.c")
            .status()
            .is_ok_and(|s| s.success());
    if !built {
        println!(
            "cargo:warning=agentbox-init was not built (a static C build with `{cc}`): `agentbox exec` will start its sandboxes the usual way"
        );
        std::fs::write(&out, b"").expect("write an empty agentbox-init");
    }
}
