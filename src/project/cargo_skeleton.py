# Setup's pre-build for a Rust project: compile what Cargo.lock pins from the registry into the
# build cache, without running any code of the project's own.
#
#   python3 cargo_skeleton.py SKELETON TARGET
#
# The project's packages are copied as a skeleton: their manifests, the lockfile and cargo's
# configuration, with every target's source an empty stub (no build script, no proc macro, no
# code of the project's). `cargo test --no-run` in the skeleton then builds the dependencies with
# the features and profile the project's own `cargo test` asks for, into TARGET. What it built
# of the stubs is cleaned out again: cargo trusts a local package's artifacts while its sources
# are older than them, so a stub left there would be taken for the real crate.
#
# Exit 0: TARGET holds the dependencies. Exit 1: it did not finish (the reason is the last line
# printed), and whatever TARGET holds is still only dependencies. Any other end (a crash, a
# timeout) may have left stubs there: the caller removes TARGET.
import json
import os
import shutil
import subprocess
import sys

ROOT = "/workspace"
# Read where cargo reads them, relative to the workspace root.
ROOT_FILES = [
    "Cargo.toml",
    "Cargo.lock",
    ".cargo/config.toml",
    ".cargo/config",
    "rust-toolchain",
    "rust-toolchain.toml",
]
LIB_KINDS = {"lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro"}
LIB_STUB = "#![allow(warnings)]\n"
MAIN_STUB = "#![allow(warnings)]\nfn main() {}\n"


class Skip(Exception):
    pass


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def metadata(cwd):
    r = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--offline", "--locked"],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise Skip("cargo metadata failed: " + last_line(r.stderr))
    return json.loads(r.stdout)


def relative(path):
    p = os.path.normpath(path)
    if p != ROOT and not p.startswith(ROOT + "/"):
        raise Skip(f"{path} is outside the project")
    return os.path.relpath(p, ROOT)


def copy(skeleton, rel):
    src = os.path.join(ROOT, rel)
    # A link is not followed: the skeleton holds only the project's own regular files.
    if os.path.islink(src) or not os.path.isfile(src):
        return
    dst = os.path.join(skeleton, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)


def stub(skeleton, rel, kinds, written):
    dst = os.path.join(skeleton, rel)
    # A source shared by a library and a binary gets the binary's stub (a library may hold a
    # `main`); a manifest is never overwritten.
    text = LIB_STUB if set(kinds) <= LIB_KINDS else MAIN_STUB
    if written.get(rel) == MAIN_STUB or rel.endswith("Cargo.toml"):
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "w") as f:
        f.write(text)
    written[rel] = text


def build(skeleton, target):
    found = metadata(ROOT)
    shutil.rmtree(skeleton, ignore_errors=True)
    os.makedirs(skeleton)
    root = relative(found["workspace_root"])
    for f in ROOT_FILES:
        copy(skeleton, os.path.join(root, f))
    written = {}
    local = [p for p in found["packages"] if p.get("source") is None]
    for package in local:
        copy(skeleton, relative(package["manifest_path"]))
    for package in local:
        for t in package["targets"]:
            stub(skeleton, relative(t["src_path"]), t["kind"], written)
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    print(
        f"pre-building the dependencies of {len(local)} package(s) of the project as stubs",
        flush=True,
    )
    built = subprocess.run(
        ["cargo", "test", "--no-run", "--offline", "--locked"],
        cwd=os.path.join(skeleton, root),
        env=env,
    )
    names = sorted({p["name"] for p in local})
    if names:
        args = ["cargo", "clean", "--offline", "--locked"]
        for n in names:
            args += ["-p", n]
        cleaned = subprocess.run(args, cwd=os.path.join(skeleton, root), env=env)
        if cleaned.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise Skip("cargo clean of the stubs failed: the pre-built cache is dropped")
    if built.returncode != 0:
        raise Skip(f"cargo test --no-run failed (exit {built.returncode}); what it built is kept")


def main():
    skeleton, target = sys.argv[1], sys.argv[2]
    try:
        build(skeleton, target)
    except Skip as e:
        print(e)
        return 1
    except Exception as e:
        print(f"pre-building failed: {e!r}")
        return 2
    finally:
        shutil.rmtree(skeleton, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
