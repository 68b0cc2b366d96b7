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
//! release). Built fatbins are therefore cached under `<target dir>/attn-cuda-fatbins/<key>/`,
//! keyed by a hash of nvcc's path, the flags and every kernel source: a second profile with the
//! same inputs copies them instead of compiling again.

use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

/// The kernel files: (module name, source). One family per file.
const KERNELS: [(&str, &str); 7] = [
    ("softmax", "kernels/softmax.cu"),
    ("cosine_sim", "kernels/cosine_sim.cu"),
    ("simt_f32", "kernels/simt_f32.cu"),
    ("common", "kernels/common.cu"),
    ("taylor", "kernels/taylor.cu"),
    ("hyperbolic", "kernels/hyperbolic.cu"),
    ("taylor_flash", "kernels/taylor_flash.cu"),
];

/// Headers every kernel file may include.
/// Every header the kernels include: the whole `kernels/include` folder, read at build time (a
/// fixed list went stale when a header was added: the build then neither re-ran on its edits nor
/// keyed the fatbin cache on it).
const INCLUDE_DIR: &str = "kernels/include";

fn headers(manifest: &Path) -> Result<Vec<String>, String> {
    let dir = manifest.join(INCLUDE_DIR);
    let mut names = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            names.push(format!("{INCLUDE_DIR}/{}", entry.file_name().to_string_lossy()));
        }
    }
    names.sort();
    Ok(names)
}

const GENCODE: [&str; 3] = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_80,code=compute_80",
];

fn main() -> Result<(), String> {
    for (_, src) in KERNELS {
        println!("cargo:rerun-if-changed={src}");
    }
    // A folder: cargo re-runs the script when any file in it changes, or one is added.
    println!("cargo:rerun-if-changed={INCLUDE_DIR}");
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
    let cache = cache_dir(&manifest, &nvcc, &gencode, &headers(&manifest)?)?;
    if let Some(cache) = &cache {
        let cached: Vec<PathBuf> = KERNELS
            .iter()
            .map(|(name, _)| cache.join(format!("{name}.fatbin")))
            .collect();
        if cached.iter().all(|p| p.is_file()) {
            // Copied into OUT_DIR so the crate never depends on the cache staying in place.
            let mut entries = Vec::new();
            for ((name, _), from) in KERNELS.iter().zip(&cached) {
                let to = out_dir.join(format!("{name}.fatbin"));
                fs::copy(from, &to).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
                entries.push((*name, to));
            }
            return write(&generated, &embed(entries));
        }
    }

    // Compile every file concurrently; collect every error before failing.
    let jobs: Vec<_> = KERNELS
        .iter()
        .map(|&(name, src)| {
            let nvcc = nvcc.clone();
            let gencode = gencode.clone();
            let src = manifest.join(src);
            let out = out_dir.join(format!("{name}.fatbin"));
            thread::spawn(move || compile(&nvcc, &gencode, &src, &out).map(|()| (name, out)))
        })
        .collect();
    let mut built = Vec::new();
    let mut errors = Vec::new();
    for job in jobs {
        match job.join() {
            Ok(Ok(ok)) => built.push(ok),
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
    if let Some(cache) = &cache {
        // Best effort: a failed copy only means the next profile compiles again.
        if fs::create_dir_all(cache).is_ok() {
            for (name, path) in &built {
                let _ = fs::copy(path, cache.join(format!("{name}.fatbin")));
            }
        }
    }
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

/// `<target dir>/attn-cuda-fatbins/<hash of nvcc, flags and sources>`, or None when the target
/// dir cannot be told (the build then simply compiles).
fn cache_dir(
    manifest: &Path,
    nvcc: &Path,
    gencode: &[String],
    headers: &[String],
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
    for file in KERNELS
        .iter()
        .map(|(_, src)| *src)
        .chain(headers.iter().map(String::as_str))
    {
        let text = fs::read(manifest.join(file)).map_err(|e| format!("cannot read {file}: {e}"))?;
        file.hash(&mut h);
        text.hash(&mut h);
    }
    Ok(Some(
        target
            .join("attn-cuda-fatbins")
            .join(format!("{:016x}", h.finish())),
    ))
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
