//! Two things the binary cannot learn from cargo alone:
//!
//! - Links with packed relative relocations (`DT_RELR`, glibc ≥ 2.36). A PIE this size
//!   carries 30,000 relative relocations; as RELA entries they are a 0.7 MB table that the
//!   loader reads whole at every start, and that then stays resident. RELR packs them into a
//!   few kilobytes. The static image (crt-static) relocates itself and keeps the default.
//! - What it was built from, for `--version` and `tether_build_info`: the commit
//!   (`TETHER_COMMIT`) and the compiler (`TETHER_RUSTC`). Neither depends on where or when it
//!   is built, so the image stays reproducible: no path, no timestamp, no dirty flag.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let dynamic_glibc = var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
        && !var("CARGO_CFG_TARGET_FEATURE")
            .split(',')
            .any(|f| f == "crt-static");
    if dynamic_glibc {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rustc-env=TETHER_COMMIT={}", commit());
    println!("cargo:rustc-env=TETHER_RUSTC={}", rustc_version());
}

/// The commit: `TETHER_COMMIT` when set (a build from a source archive has no git), else
/// `git rev-parse HEAD` of the checkout, else `unknown`. Git is asked for its own file
/// paths, so a worktree (whose `.git` is a file) and packed refs are followed too.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=TETHER_COMMIT");
    if let Ok(commit) = std::env::var("TETHER_COMMIT")
        && !commit.trim().is_empty()
    {
        return commit.trim().to_owned();
    }
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let Some(commit) = git(&dir, &["rev-parse", "HEAD"]) else {
        return "unknown".to_owned();
    };
    // HEAD moves on a checkout; its reflog on every commit, reset or checkout; the branch's
    // ref is a loose file or a line of packed-refs. A path that does not exist would make
    // cargo rerun this script on every build, so only existing ones are named.
    let mut watched = vec!["HEAD".to_owned(), "logs/HEAD".into(), "packed-refs".into()];
    if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    commit
}

/// `1.95.0` of `rustc 1.95.0 (59807616e 2026-04-14)`, from the compiler cargo uses.
fn rustc_version() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|line| line.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// One line of git's output in `dir`; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
