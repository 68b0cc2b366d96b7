//! Bakes the source commit into the binary as `ATTN_BENCH_COMMIT`, so rows written far from the
//! repository (a GPU machine with no `.git`) still say which code produced them.
//!
//! The value is `git describe --always --dirty --abbrev=12` of this crate's directory, or `unknown`
//! where git or the repository is missing. The script reruns when HEAD, the current branch or the
//! index moves (a commit, a checkout, a `git add`); an edit that is never staged does not rerun it,
//! so a `-dirty` mark can lag behind such an edit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
    let commit = git(&manifest, &["describe", "--always", "--dirty", "--abbrev=12"])
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ATTN_BENCH_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(git_dir) = git(&manifest, &["rev-parse", "--absolute-git-dir"]) {
        let git_dir = PathBuf::from(git_dir);
        let mut watched: Vec<PathBuf> = ["HEAD", "index", "packed-refs"]
            .iter()
            .map(|f| git_dir.join(f))
            .collect();
        if let Some(branch) = git(&manifest, &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(git_dir.join(branch));
        }
        // A missing path would make cargo rerun the script on every build.
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
