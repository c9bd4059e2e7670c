# agentbox tasks. `just` lists them.
set shell := ["bash", "-euo", "pipefail", "-c"]

bin := "target/release/agentbox"

_default:
    @just --list

# Build the agentbox binary (release).
build:
    cargo build --release --locked

# Make sure the sandbox image exists (through Docker, or offline from Debian packages).
image: build
    scripts/ensure-image {{bin}}

# The main job: the agent fixes the bundled example (a live model with an API key, else a replay).
demo: image
    {{bin}} demo

# Every test: unit, and integration against the real Docker daemon and image.
test: image
    cargo test --locked --all-targets

# Formatting and lints, as CI expects them.
lint:
    cargo fmt --check
    cargo clippy --all-targets --locked -- -D warnings

# Remove containers and volumes left by killed agentbox processes.
gc: build
    {{bin}} gc
