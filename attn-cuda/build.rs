//! Compiles the CUDA kernels with nvcc into one fatbin per family file (sm_90a SASS, sm_80 SASS and
//! compute_80 PTX) and embeds them in the crate.
//!
//! nvcc is found through `NVCC`, then `PATH`, then `CUDA_HOME/bin`. Without nvcc the crate still
//! builds (with a cargo warning) and every call returns `KernelsNotBuilt`; with
//! `ATTN_REQUIRE_NVCC=1` a missing nvcc or any nvcc error fails the build.
//!
//! `ATTN_CUDA_GENCODE` (space-separated nvcc `-gencode=...` flags) replaces the default targets,
//! e.g. `-gencode=arch=compute_90a,code=sm_90a` alone to cut build time while iterating on an H100.
//!
//! nvcc takes minutes on two cores, and cargo runs this script once per profile (check, test,
//! release). Built fatbins are therefore cached under `<target dir>/attn-cuda-fatbins/`, one per
//! kernel file, keyed by a hash of nvcc's path, the flags, the file and the headers it includes: a
//! second profile with the same inputs copies them instead of compiling again, and an edit to one
//! header recompiles only the files that include it.

use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::thread;

/// The kernel files: (module name, source), each beside the headers of its family. One fatbin per file.
const KERNELS: [(&str, &str); 8] = [
    ("softmax", "kernels/flash/softmax.cu"),
    ("cosine_sim", "kernels/flash/cosine_sim.cu"),
    ("simt_f32", "kernels/common/simt_f32.cu"),
    ("common", "kernels/common/common.cu"),
    ("taylor", "kernels/taylor/taylor.cu"),
    ("hyperbolic", "kernels/hyperbolic/hyperbolic.cu"),
    ("taylor_flash", "kernels/taylor/taylor_flash.cu"),
    ("decode", "kernels/decode/decode.cu"),
];

/// The kernels' folders, by family: common (mma, loads, masks, parameters, tiles), flash (the
/// FlashAttention skeletons and their scores), taylor and hyperbolic. Cargo re-runs this script when
/// any file in them changes, or one is added (a fixed list of headers goes stale); which kernel files
/// see a header is read from their includes, which name it relative to the including file.
const KERNEL_DIRS: [&str; 5] = [
    "kernels/common",
    "kernels/flash",
    "kernels/taylor",
    "kernels/hyperbolic",
    "kernels/decode",
];

const GENCODE: [&str; 3] = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_80,code=compute_80",
];

fn main() -> Result<(), String> {
    for (_, src) in KERNELS {
        println!("cargo:rerun-if-changed={src}");
    }
    // Folders: cargo re-runs the script when any file in them changes, or one is added.
    for dir in KERNEL_DIRS {
        println!("cargo:rerun-if-changed={dir}");
    }
    for var in [
        "NVCC",
        "PATH",
        "CUDA_HOME",
        "ATTN_REQUIRE_NVCC",
        "ATTN_CUDA_GENCODE",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| format!("CARGO_MANIFEST_DIR: {e}"))?);
    let required = env::var("ATTN_REQUIRE_NVCC").map(|v| v == "1").unwrap_or(false);

    let generated = out_dir.join("kernels.rs");
    let Some(nvcc) = find_nvcc() else {
        let msg = "nvcc not found (looked at NVCC, PATH and CUDA_HOME/bin): the CUDA kernels are not built and \
                   every attn-cuda call returns KernelsNotBuilt; run `cargo xtask setup-cuda` for a pinned nvcc";
        if required {
            return Err(format!("ATTN_REQUIRE_NVCC=1: {msg}"));
        }
        println!("cargo:warning={msg}");
        return write(
            &generated,
            "pub(crate) const FATBINS: Option<&[(&str, &[u8])]> = None;\n",
        );
    };

    let gencode = gencode();
    // Each file's cached fatbin, when there is one for its exact inputs; the others compile.
    let mut built = Vec::new();
    let mut to_compile = Vec::new();
    for &(name, src) in &KERNELS {
        let cached = cache_path(&manifest, &nvcc, &gencode, name, src)?;
        let to = out_dir.join(format!("{name}.fatbin"));
        match &cached {
            // Copied into OUT_DIR so the crate never depends on the cache staying in place.
            Some(from) if from.is_file() => {
                fs::copy(from, &to).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
                built.push((name, to));
            }
            _ => to_compile.push((name, src, cached)),
        }
    }

    // Compile every file concurrently; collect every error before failing.
    let jobs: Vec<_> = to_compile
        .into_iter()
        .map(|(name, src, cached)| {
            let nvcc = nvcc.clone();
            let gencode = gencode.clone();
            let src = manifest.join(src);
            let out = out_dir.join(format!("{name}.fatbin"));
            thread::spawn(move || compile(&nvcc, &gencode, &src, &out).map(|()| (name, out, cached)))
        })
        .collect();
    let mut errors = Vec::new();
    for job in jobs {
        match job.join() {
            Ok(Ok((name, out, cached))) => {
                // Best effort: a failed copy only means the next build compiles this file again.
                if let Some(cached) = cached {
                    if cached.parent().is_some_and(|d| fs::create_dir_all(d).is_ok()) {
                        let _ = fs::copy(&out, cached);
                    }
                }
                built.push((name, out));
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("an nvcc worker thread panicked".to_string()),
        }
    }
    if !errors.is_empty() {
        let msg = errors.join("\n");
        if required {
            return Err(format!("ATTN_REQUIRE_NVCC=1 and nvcc failed:\n{msg}"));
        }
        for line in msg.lines().take(40) {
            println!("cargo:warning={line}");
        }
        println!("cargo:warning=nvcc failed: every attn-cuda call returns KernelsNotBuilt");
        return write(
            &generated,
            "pub(crate) const FATBINS: Option<&[(&str, &[u8])]> = None;\n",
        );
    }
    built.sort_by_key(|(name, _)| KERNELS.iter().position(|(n, _)| n == name));
    write(&generated, &embed(built))
}

/// The generated module: every fatbin embedded with include_bytes.
fn embed(built: Vec<(&str, PathBuf)>) -> String {
    let mut code = String::from("pub(crate) const FATBINS: Option<&[(&str, &[u8])]> = Some(&[\n");
    for (name, path) in built {
        code.push_str(&format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("]);\n");
    code
}

fn gencode() -> Vec<String> {
    match env::var("ATTN_CUDA_GENCODE") {
        Ok(flags) if !flags.trim().is_empty() => flags.split_whitespace().map(String::from).collect(),
        _ => GENCODE.iter().map(|s| s.to_string()).collect(),
    }
}

/// `<target dir>/attn-cuda-fatbins/<name>-<hash>.fatbin`, the hash of nvcc's path, the flags, the
/// kernel file and every header it includes (`#include "…"`, followed transitively), so an edit
/// recompiles only the files that see it; None when the target dir cannot be told (the build then
/// simply compiles).
fn cache_path(
    manifest: &Path,
    nvcc: &Path,
    gencode: &[String],
    name: &str,
    src: &str,
) -> Result<Option<PathBuf>, String> {
    let target = match env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => match manifest.parent() {
            Some(root) => root.join("target"),
            None => return Ok(None),
        },
    };
    let mut h = DefaultHasher::new();
    nvcc.hash(&mut h);
    gencode.hash(&mut h);
    NVCC_FLAGS.hash(&mut h);
    let mut seen = Vec::new();
    let mut todo = vec![manifest.join(src)];
    while let Some(file) = todo.pop() {
        if seen.contains(&file) {
            continue;
        }
        let text = fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        for line in text.lines() {
            let quoted = line.trim_start().strip_prefix("#include").map(str::trim);
            if let Some(inc) = quoted
                .and_then(|q| q.strip_prefix('"'))
                .and_then(|q| q.split('"').next())
            {
                todo.push(normalise(&dir.join(inc)));
            }
        }
        file.strip_prefix(manifest).unwrap_or(&file).hash(&mut h);
        text.hash(&mut h);
        seen.push(file);
    }
    Ok(Some(
        target
            .join("attn-cuda-fatbins")
            .join(format!("{name}-{:016x}.fatbin", h.finish())),
    ))
}

/// `path` with its `.` and `dir/..` components folded away (without touching the file system), so a
/// header reached as `flash/../common/mma.h` and as `taylor/../common/mma.h` is one file.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = env::var_os("NVCC").map(PathBuf::from) {
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let p = PathBuf::from(env::var_os("CUDA_HOME")?).join("bin/nvcc");
    p.is_file().then_some(p)
}

/// Flags besides the targets.
const NVCC_FLAGS: [&str; 4] = ["-std=c++17", "-O3", "-lineinfo", "-Xfatbin=-compress-all"];

fn compile(nvcc: &Path, gencode: &[String], src: &Path, out: &Path) -> Result<(), String> {
    let output = Command::new(nvcc)
        .arg("-fatbin")
        .args(NVCC_FLAGS)
        .args(gencode)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {} failed ({}):\n{}{}",
            nvcc.display(),
            src.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
