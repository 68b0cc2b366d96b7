//! Compiles the CUDA kernels with nvcc into one fatbin per family file (sm_90a SASS, sm_80 SASS and
//! compute_80 PTX) and embeds them in the crate.
//!
//! nvcc is found through `NVCC`, then `PATH`, then `CUDA_HOME/bin`. Without nvcc the crate still
//! builds (with a cargo warning) and every call returns `KernelsNotBuilt`; with
//! `ATTN_REQUIRE_NVCC=1` a missing nvcc or any nvcc error fails the build.
//!
//! `ATTN_CUDA_GENCODE` (space-separated nvcc `-gencode=...` flags) replaces the default targets,
//! e.g. `-gencode=arch=compute_90a,code=sm_90a` alone to cut build time while iterating on an H100.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

/// The kernel files: (module name, source). One family per file.
const KERNELS: [(&str, &str); 5] = [
    ("softmax", "kernels/softmax.cu"),
    ("cosine_sim", "kernels/cosine_sim.cu"),
    ("simt_f32", "kernels/simt_f32.cu"),
    ("common", "kernels/common.cu"),
    ("taylor", "kernels/taylor.cu"),
];

/// Headers every kernel file may include.
const HEADERS: [&str; 15] = [
    "kernels/include/params.h",
    "kernels/include/mask.h",
    "kernels/include/mma.h",
    "kernels/include/loads.h",
    "kernels/include/online_softmax.h",
    "kernels/include/score.h",
    "kernels/include/tiles.h",
    "kernels/include/flash_fwd.cuh",
    "kernels/include/flash_bwd.cuh",
    "kernels/include/simt_f32.cuh",
    "kernels/include/taylor_common.cuh",
    "kernels/include/taylor_rows.cuh",
    "kernels/include/taylor_dense.cuh",
    "kernels/include/taylor_state.cuh",
    "kernels/include/taylor_decode.cuh",
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
    for h in HEADERS {
        println!("cargo:rerun-if-changed={h}");
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

    // Compile every file concurrently; collect every error before failing.
    let jobs: Vec<_> = KERNELS
        .iter()
        .map(|&(name, src)| {
            let nvcc = nvcc.clone();
            let src = manifest.join(src);
            let out = out_dir.join(format!("{name}.fatbin"));
            thread::spawn(move || compile(&nvcc, &src, &out).map(|()| (name, out)))
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
    let mut code = String::from("pub(crate) const FATBINS: Option<&[(&str, &[u8])]> = Some(&[\n");
    for (name, path) in built {
        code.push_str(&format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("]);\n");
    write(&generated, &code)
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

fn compile(nvcc: &Path, src: &Path, out: &Path) -> Result<(), String> {
    let gencode: Vec<String> = match env::var("ATTN_CUDA_GENCODE") {
        Ok(flags) if !flags.trim().is_empty() => flags.split_whitespace().map(String::from).collect(),
        _ => GENCODE.iter().map(|s| s.to_string()).collect(),
    };
    let output = Command::new(nvcc)
        .arg("-fatbin")
        .args(["-std=c++17", "-O3", "-lineinfo", "-Xfatbin=-compress-all"])
        .args(&gencode)
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
