//! Developer tasks: `cargo xtask <command>`.
//!
//! - `setup-cuda`: install the pinned nvcc wheels (GPU.md) into `.toolchain/nvcc` and print the
//!   environment to build the CUDA kernels with. Idempotent: a working install is reused.
//! - `test-gpu`: build and run the GPU tests of attn-cuda (`--ignored`) where a GPU is present;
//!   say clearly that it skipped, and why, where none is.
//! - `gpu-bundle`: build the GPU test binaries (release, `ATTN_REQUIRE_NVCC=1`), strip them and pack
//!   them with a run script into `target/gpu-bundle/`, and that folder into
//!   `target/gpu-bundle.tar.xz` (the embedded fatbins compress ~8×), for a GPU machine without a
//!   Rust toolchain: `tar -xJf gpu-bundle.tar.xz && gpu-bundle/run.sh`.
//!
//! Plain Rust on std: one `match` on the subcommand, cargo called through `$CARGO`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The five nvcc wheels of GPU.md, all pinned (nvcc's own dependencies are unpinned upstream).
const NVCC_WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// The test binaries of attn-cuda that need a GPU (each a `tests/*.rs` file). `gpu_bench` is the
/// kernel stopwatch (`--bench`); without that flag it does nothing.
const GPU_TEST_BINARIES: [&str; 4] = ["gpu_softmax_like", "gpu_runtime", "gpu_bench", "gpu_taylor"];

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup-cuda") => setup_cuda().map(|nvcc| print_env(&nvcc)),
        Some("test-gpu") => test_gpu(&args[1..]),
        Some("gpu-bundle") => gpu_bundle(),
        Some("help") | Some("--help") | Some("-h") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`; run `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask <command>\n\n\
         setup-cuda   install the pinned nvcc wheels into .toolchain/nvcc and print PATH/NVCC exports\n\
         test-gpu     build and run the attn-cuda GPU tests (--ignored) if a GPU is present, else skip\n\
         \x20            (extra arguments go to the test binaries, e.g. a test-name filter)\n\
         gpu-bundle   pack release GPU test binaries and a run script into target/gpu-bundle/"
    );
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

fn cargo() -> String {
    env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

/// The nvcc inside the venv, if the wheels are installed and it runs.
fn venv_nvcc(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let entries = fs::read_dir(&lib).ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("python3") {
            continue;
        }
        let nvcc = entry.path().join("site-packages/nvidia/cu13/bin/nvcc");
        let ok = Command::new(&nvcc)
            .arg("--version")
            .stdout(Stdio::piped())
            .output()
            .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("13.0"))
            .unwrap_or(false);
        if ok {
            return Some(nvcc);
        }
    }
    None
}

fn setup_cuda() -> Result<PathBuf> {
    let venv = workspace_root().join(".toolchain/nvcc");
    if let Some(nvcc) = venv_nvcc(&venv) {
        eprintln!("xtask: nvcc already installed in {}", venv.display());
        return Ok(nvcc);
    }
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    eprintln!(
        "xtask: creating {} and installing {}",
        venv.display(),
        NVCC_WHEELS.join(" ")
    );
    run(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(NVCC_WHEELS))?;
    venv_nvcc(&venv).ok_or_else(|| {
        format!(
            "the wheels installed but no working nvcc 13.0 was found under {}",
            venv.display()
        )
    })
}

fn print_env(nvcc: &Path) {
    let bin = nvcc.parent().unwrap_or(nvcc);
    println!("export PATH={}:$PATH", bin.display());
    println!("export NVCC={}", nvcc.display());
}

/// Whether a CUDA GPU is usable here: a driver library and at least one device (nvidia-smi).
fn gpu_present() -> std::result::Result<(), String> {
    match Command::new("nvidia-smi")
        .arg("-L")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("GPU") => Ok(()),
        Ok(_) => Err("nvidia-smi found no GPU".into()),
        Err(_) => Err("nvidia-smi is not installed (no NVIDIA driver on this machine)".into()),
    }
}

fn test_gpu(extra: &[String]) -> Result<()> {
    if let Err(why) = gpu_present() {
        println!("xtask test-gpu: SKIPPED, no GPU tests were run: {why}.");
        println!("xtask test-gpu: build them for a GPU machine with `cargo xtask gpu-bundle`.");
        return Ok(());
    }
    let mut cmd = Command::new(cargo());
    cmd.args(["test", "--release", "-p", "attn-cuda"]);
    for t in GPU_TEST_BINARIES {
        cmd.args(["--test", t]);
    }
    cmd.args(["--", "--ignored", "--test-threads=1"]).args(extra);
    cmd.env("ATTN_REQUIRE_NVCC", "1");
    run(&mut cmd)
}

/// Test executables cargo reports for `--message-format=json`, by target name.
fn built_test_binaries(json: &str) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for line in json.lines() {
        if !line.contains("\"reason\":\"compiler-artifact\"") || !line.contains("\"test\":true") {
            continue;
        }
        let name = field(line, "\"name\":\"");
        let exe = field(line, "\"executable\":\"");
        if let (Some(name), Some(exe)) = (name, exe) {
            if GPU_TEST_BINARIES.contains(&name.as_str()) {
                out.push((name, PathBuf::from(exe)));
            }
        }
    }
    out
}

/// The string value following `key` in one line of cargo's JSON (paths here have no escapes).
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs the attn-cuda GPU tests of this bundle. Usage: run.sh [extra test-harness arguments]
# SANITIZE=memcheck|racecheck runs each binary under compute-sanitizer.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
status=0
summary=""
for bin in "$here"/bin/*; do
  name="$(basename "$bin")"
  # gpu_bench is the kernel stopwatch (bin/gpu_bench --bench), not a test harness.
  [ "$name" = gpu_bench ] && continue
  if [ -n "${SANITIZE:-}" ]; then
    out="$(compute-sanitizer --tool "$SANITIZE" --error-exitcode 99 "$bin" --ignored --test-threads=1 "$@" 2>&1)"
  else
    out="$("$bin" --ignored --test-threads=1 "$@" 2>&1)"
  fi
  rc=$?
  echo "$out"
  line="$(echo "$out" | grep -E '^test result:' | tail -n 1)"
  summary="$summary$name${SANITIZE:+ [$SANITIZE]}: rc=$rc $line"$'\n'
  [ $rc -ne 0 ] && status=1
done
echo "---- summary"
printf '%s' "$summary"
exit $status
"#;

fn gpu_bundle() -> Result<()> {
    let root = workspace_root();
    let mut cmd = Command::new(cargo());
    cmd.args([
        "test",
        "--release",
        "--no-run",
        "--message-format=json",
        "-p",
        "attn-cuda",
    ]);
    for t in GPU_TEST_BINARIES {
        cmd.args(["--test", t]);
    }
    cmd.env("ATTN_REQUIRE_NVCC", "1").stderr(Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the GPU tests failed ({})", out.status));
    }
    let bins = built_test_binaries(&String::from_utf8_lossy(&out.stdout));
    if bins.len() != GPU_TEST_BINARIES.len() {
        return Err(format!(
            "expected test binaries {GPU_TEST_BINARIES:?}, cargo reported {bins:?}"
        ));
    }
    let target = env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let bundle = target.join("gpu-bundle");
    let bin_dir = bundle.join("bin");
    if bundle.exists() {
        fs::remove_dir_all(&bundle).map_err(|e| format!("cannot clear {}: {e}", bundle.display()))?;
    }
    fs::create_dir_all(&bin_dir).map_err(|e| format!("cannot create {}: {e}", bin_dir.display()))?;
    for (name, exe) in &bins {
        let dst = bin_dir.join(name);
        fs::copy(exe, &dst).map_err(|e| format!("cannot copy {}: {e}", exe.display()))?;
        run(Command::new("strip").arg(&dst))?;
    }
    let script = bundle.join("run.sh");
    fs::write(&script, RUN_SCRIPT).map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    run(Command::new("chmod").arg("+x").arg(&script))?;
    let archive = target.join("gpu-bundle.tar.xz");
    let packed = Command::new("tar")
        .arg("-C")
        .arg(&target)
        .args(["-cf", "-", "gpu-bundle"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run tar: {e}"))?;
    let out_file =
        fs::File::create(&archive).map_err(|e| format!("cannot create {}: {e}", archive.display()))?;
    let tar_out = packed.stdout.ok_or("tar gave no output pipe")?;
    run(Command::new("xz")
        .args(["-T2", "-3"])
        .stdin(tar_out)
        .stdout(out_file))?;
    let size = fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
    println!(
        "xtask gpu-bundle: {} ({} binaries) packed as {} ({:.1} MiB); on the GPU machine: \
         tar -xJf gpu-bundle.tar.xz && gpu-bundle/run.sh",
        bundle.display(),
        bins.len(),
        archive.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}
