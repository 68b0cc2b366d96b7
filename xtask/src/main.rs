//! Developer tasks: `cargo xtask <command>`.
//!
//! - `setup-cuda`: install the pinned nvcc wheels ([`NVCC_WHEELS`]) into `.toolchain/nvcc` and print the
//!   environment to build the CUDA kernels with. Idempotent: a working install is reused.
//! - `setup-candle-cuda`: install the nvcc wheels plus cuBLAS, cuRAND and NVRTC ([`CANDLE_WHEELS`])
//!   into `<target>/candle-cuda/venv`, build a CUDA home `<target>/candle-cuda/cuda`
//!   (unversioned `lib64/` links and a link-time `libcuda.so` stub generated from cudarc's driver
//!   bindings) and print its environment: `eval "$(cargo xtask setup-candle-cuda)"`, then
//!   `cargo build -p attn-candle --features cuda` works on a machine without CUDA.
//! - `test-gpu`: build and run the GPU tests of attn-cuda, and attn-candle's CUDA tests when a
//!   candle CUDA toolchain is set up (`--ignored`) where a GPU is present; say clearly that it
//!   skipped, and why, where none is.
//! - `gpu-bundle`: build the GPU test binaries (release, `ATTN_REQUIRE_NVCC=1`; with the candle
//!   toolchain also attn-candle's `candle_cuda` tests and its `overhead` and `generate` examples),
//!   strip them and pack them with a run script into `target/gpu-bundle/`, and that folder into
//!   `target/gpu-bundle.tar.xz` (xz with a dictionary that spans the binaries, so the fatbins they
//!   all embed are stored once), for a GPU machine without a Rust toolchain:
//!   `tar -xJf gpu-bundle.tar.xz && gpu-bundle/run.sh`. `--sm90a` compiles the kernels for sm_90a
//!   only ([`SM90A_GENCODE`], in `<target>/sm90a` so the default build is kept): every binary then
//!   carries one architecture's fatbins, and the archive stays under [`BUNDLE_LIMIT`].
//!
//! Plain Rust on std: one `match` on the subcommand, cargo called through `$CARGO`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The five nvcc wheels (CUDA 13.0), all pinned (nvcc's own dependencies are unpinned upstream).
const NVCC_WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// The test binaries of attn-cuda that need a GPU (each a `tests/*.rs` file), each run once with
/// `--ignored`: a test that covers several kernel configurations (attn_cuda::KernelConfig) runs its
/// cases under each of them in-process (attn-cuda/tests/common: `flash_configs`, `taylor_configs`).
/// `gpu_bench`, `gpu_bench_taylor` and `gpu_bench_decode` are kernel stopwatches (`--bench`); without that flag they do
/// nothing.
const GPU_TEST_BINARIES: [&str; 8] = [
    "gpu_softmax_like",
    "gpu_runtime",
    "gpu_hyperbolic",
    "gpu_taylor",
    "gpu_decode",
    "gpu_bench",
    "gpu_bench_taylor",
    "gpu_bench_decode",
];

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup-cuda") => setup_cuda().map(|nvcc| print_env(&nvcc)),
        Some("setup-candle-cuda") => setup_candle_cuda().map(|home| print_candle_env(&home)),
        Some("test-gpu") => test_gpu(&args[1..]),
        Some("gpu-bundle") => gpu_bundle(&args[1..]),
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
         setup-candle-cuda  install the CUDA wheels candle needs under <target>/candle-cuda, build a\n\
         \x20            CUDA home with a libcuda stub, print its exports (eval \"$(cargo xtask ...)\")\n\
         test-gpu     build and run the GPU tests (--ignored) if a GPU is present, else skip\n\
         \x20            (extra arguments go to the test binaries, e.g. a test-name filter)\n\
         gpu-bundle   pack release GPU test binaries (attn-cuda; attn-candle with the candle toolchain)\n\
         \x20            and a run script into target/gpu-bundle/; --sm90a builds the kernels for sm_90a\n\
         \x20            only (in <target>/sm90a), which keeps the archive under a GPU run's 64 MiB"
    );
}

/// The workspace of the xtask crate: from `CARGO_MANIFEST_DIR` as `cargo run` sets it for this run (a
/// binary built in another checkout, e.g. a git worktree sharing the target directory, must not act on
/// that checkout), else as it was at build time.
fn workspace_root() -> PathBuf {
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
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

/// The wheels candle's `cuda` feature needs on top of nvcc (with CUDA): the
/// libraries a candle binary links against. nvidia-cuda-runtime is in the nvcc set already.
const CANDLE_WHEELS: [&str; 3] = [
    "nvidia-cublas==13.0.2.14",
    "nvidia-curand==10.4.0.35",
    "nvidia-cuda-nvrtc==13.0.88",
];

/// `lib64/` links of the CUDA home: unversioned name → the wheel's versioned file in `cu13/lib`
/// (which is linked under its own name as well).
const CANDLE_LIBS: [(&str, &str); 5] = [
    ("libcublas.so", "libcublas.so.13"),
    ("libcublasLt.so", "libcublasLt.so.13"),
    ("libcurand.so", "libcurand.so.10"),
    ("libnvrtc.so", "libnvrtc.so.13"),
    ("libcudart.so", "libcudart.so.13"),
];

/// The error every stub driver function returns: `CUDA_ERROR_STUB_LIBRARY`.
const CUDA_ERROR_STUB_LIBRARY: u32 = 34;

fn target_dir() -> PathBuf {
    env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"))
}

/// The candle CUDA toolchain folder: `<target>/candle-cuda/{venv, cuda}`.
fn candle_cuda_dir() -> PathBuf {
    target_dir().join("candle-cuda")
}

/// `site-packages/nvidia/cu13` of a venv, where every CUDA 13 wheel installs.
fn venv_cu13(venv: &Path) -> Option<PathBuf> {
    fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cu13"))
        .find(|p| p.is_dir())
}

/// Install the nvcc set and the candle wheels into one venv under the target dir, and build a
/// CUDA home from it: `bin/`, `include/`, `nvvm/` from the wheels, `lib64/` with the unversioned
/// links the linker looks for plus a stub `libcuda.so` (no driver ships on PyPI). Returns the home.
/// Idempotent: a venv whose marker lists the same wheels is reused; the home is rebuilt each time
/// (cheap), so the stub follows the cudarc version in Cargo.lock.
fn setup_candle_cuda() -> Result<PathBuf> {
    let dir = candle_cuda_dir();
    let venv = dir.join("venv");
    let wheels: Vec<&str> = NVCC_WHEELS.iter().chain(&CANDLE_WHEELS).copied().collect();
    let marker = venv.join("attn-wheels.txt");
    let wanted = wheels.join("\n");
    let installed = fs::read_to_string(&marker).is_ok_and(|m| m == wanted) && venv_nvcc(&venv).is_some();
    if installed {
        eprintln!("xtask: CUDA wheels already installed in {}", venv.display());
    } else {
        let python = env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
        eprintln!(
            "xtask: creating {} and installing {} (~1.2 GB)",
            venv.display(),
            wheels.join(" ")
        );
        run(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(&wheels))?;
        fs::write(&marker, &wanted).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    }
    let cu13 =
        venv_cu13(&venv).ok_or_else(|| format!("no site-packages/nvidia/cu13 under {}", venv.display()))?;
    let home = dir.join("cuda");
    if home.exists() {
        fs::remove_dir_all(&home).map_err(|e| format!("cannot clear {}: {e}", home.display()))?;
    }
    let lib64 = home.join("lib64");
    fs::create_dir_all(&lib64).map_err(|e| format!("cannot create {}: {e}", lib64.display()))?;
    for sub in ["bin", "include", "nvvm"] {
        symlink(&cu13.join(sub), &home.join(sub))?;
    }
    for (link, file) in CANDLE_LIBS {
        let real = cu13.join("lib").join(file);
        if !real.is_file() {
            return Err(format!("{} is missing from the wheels", real.display()));
        }
        symlink(&real, &lib64.join(link))?;
        // The versioned name too: the linker resolves a library's DT_NEEDED (libcublas needs
        // libcublasLt.so.13) by that name.
        symlink(&real, &lib64.join(file))?;
    }
    build_libcuda_stub(&dir, &lib64)?;
    Ok(home)
}

fn symlink(target: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| format!("cannot link {} → {}: {e}", link.display(), target.display()))
}

/// The cudarc version Cargo.lock pins (the one candle-core and attn-cuda share).
fn locked_cudarc_version() -> Result<String> {
    let lock_path = workspace_root().join("Cargo.lock");
    let lock =
        fs::read_to_string(&lock_path).map_err(|e| format!("cannot read {}: {e}", lock_path.display()))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"cudarc\"" {
            if let Some(v) = lines.next().and_then(|l| l.trim().strip_prefix("version = \"")) {
                return Ok(v.trim_end_matches('"').to_string());
            }
        }
    }
    Err(format!("no cudarc package in {}", lock_path.display()))
}

/// cudarc's driver bindings in the cargo registry (`cargo fetch` puts them there).
fn cudarc_driver_bindings(version: &str) -> Result<PathBuf> {
    let cargo_home = env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map_err(|_| "neither CARGO_HOME nor HOME is set".to_string())?;
    let src = cargo_home.join("registry/src");
    let rel = format!("cudarc-{version}/src/driver/sys/mod.rs");
    fs::read_dir(&src)
        .map_err(|e| format!("cannot read {}: {e}", src.display()))?
        .flatten()
        .map(|index| index.path().join(&rel))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{rel} not found under {} (run `cargo fetch`)", src.display()))
}

/// Every driver function the bindings declare: the `cu*` names of `pub unsafe fn cu...(`.
fn driver_symbols(bindings: &str) -> Vec<String> {
    let mut names: Vec<String> = bindings
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub unsafe fn "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("cu") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A stand-in `libcuda.so` (soname `libcuda.so.1`) to link against: it exports every driver
/// function cudarc names, each returning `CUDA_ERROR_STUB_LIBRARY`. At run time the loader finds
/// the real `libcuda.so.1` of the GPU machine instead.
fn build_libcuda_stub(dir: &Path, lib64: &Path) -> Result<()> {
    let version = locked_cudarc_version()?;
    let bindings_path = cudarc_driver_bindings(&version)?;
    let bindings = fs::read_to_string(&bindings_path)
        .map_err(|e| format!("cannot read {}: {e}", bindings_path.display()))?;
    let names = driver_symbols(&bindings);
    if names.len() < 100 {
        return Err(format!(
            "only {} driver functions found in {}; the bindings' format changed",
            names.len(),
            bindings_path.display()
        ));
    }
    let mut c = format!(
        "/* Generated by `cargo xtask setup-candle-cuda` from cudarc {version}'s driver bindings: */\n\
         /* a link-time stand-in for libcuda.so.1; every function fails. */\n"
    );
    for n in &names {
        c.push_str(&format!(
            "int {n}(void) {{ return {CUDA_ERROR_STUB_LIBRARY}; }}\n"
        ));
    }
    let src = dir.join("libcuda_stub.c");
    fs::write(&src, c).map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    run(Command::new(cc)
        .args(["-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(lib64.join("libcuda.so"))
        .arg(&src))?;
    eprintln!(
        "xtask: libcuda stub with {} driver functions (cudarc {version}) in {}",
        names.len(),
        lib64.display()
    );
    Ok(())
}

/// Exports for `eval "$(cargo xtask setup-candle-cuda)"`. The link search goes through
/// `LIBRARY_PATH` (and cudarc's build script, which searches `$CUDA_HOME/lib64`), not `RUSTFLAGS`:
/// a `RUSTFLAGS` change would rebuild every crate of the target dir.
fn print_candle_env(home: &Path) {
    let h = home.display();
    println!("export PATH={h}/bin:$PATH");
    println!("export NVCC={h}/bin/nvcc");
    println!("export CUDA_HOME={h}");
    println!("export CUDA_COMPUTE_CAP=90");
    println!("export LIBRARY_PATH={h}/lib64${{LIBRARY_PATH:+:$LIBRARY_PATH}}");
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

/// The CUDA home `setup-candle-cuda` built under this target dir, if it is complete.
fn candle_toolchain() -> Option<PathBuf> {
    let home = candle_cuda_dir().join("cuda");
    (home.join("lib64/libcuda.so").is_file() && home.join("bin/nvcc").is_file()).then_some(home)
}

/// The environment of [`print_candle_env`], set on a command.
fn with_candle_env<'c>(cmd: &'c mut Command, home: &Path) -> &'c mut Command {
    let path = env::var("PATH").unwrap_or_default();
    let lib64 = home.join("lib64");
    let library_path = match env::var("LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", lib64.display()),
        _ => lib64.display().to_string(),
    };
    cmd.env("PATH", format!("{}:{path}", home.join("bin").display()))
        .env("NVCC", home.join("bin/nvcc"))
        .env("CUDA_HOME", home)
        .env("CUDA_COMPUTE_CAP", "90")
        .env("LIBRARY_PATH", library_path)
}

/// The attn-candle test binary of the `cuda` feature (`tests/candle_cuda/`), and the examples
/// bundled with it: the per-call overhead and the generation example (tokens/s against candle).
const CANDLE_TEST_BINARY: &str = "candle_cuda";
const CANDLE_EXAMPLES: [&str; 2] = ["overhead", "generate"];

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
    let cuda_tests = run(&mut cmd);

    // attn-candle's CUDA tests: with the toolchain of setup-candle-cuda, or a CUDA install the
    // environment already describes (CUDA_COMPUTE_CAP set).
    let mut cmd = Command::new(cargo());
    cmd.args(["test", "--release", "-p", "attn-candle", "--features", "cuda"])
        .args([
            "--test",
            CANDLE_TEST_BINARY,
            "--",
            "--ignored",
            "--test-threads=1",
        ])
        .args(extra)
        .env("ATTN_REQUIRE_NVCC", "1");
    match candle_toolchain() {
        Some(home) => {
            with_candle_env(&mut cmd, &home);
        }
        None if env::var_os("CUDA_COMPUTE_CAP").is_some() => {}
        None => {
            println!(
                "xtask test-gpu: attn-candle CUDA tests SKIPPED: no candle CUDA toolchain \
                 (run `cargo xtask setup-candle-cuda`, or set CUDA_COMPUTE_CAP with a CUDA install)."
            );
            return cuda_tests;
        }
    }
    let candle_tests = run(&mut cmd);
    cuda_tests.and(candle_tests)
}

/// Executables cargo reports for `--message-format=json`, by target name, among `names`.
fn built_executables(json: &str, names: &[&str]) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for line in json.lines() {
        if !line.contains("\"reason\":\"compiler-artifact\"") {
            continue;
        }
        let name = field(line, "\"name\":\"");
        let exe = field(line, "\"executable\":\"");
        if let (Some(name), Some(exe)) = (name, exe) {
            if names.contains(&name.as_str()) {
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

/// Run a cargo build with `--message-format=json` and return the executables named `names`
/// (all of them, or an error).
fn cargo_executables(cmd: &mut Command, names: &[&str], what: &str) -> Result<Vec<(String, PathBuf)>> {
    cmd.arg("--message-format=json")
        .env("ATTN_REQUIRE_NVCC", "1")
        .stderr(Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("building {what} failed ({})", out.status));
    }
    let bins = built_executables(&String::from_utf8_lossy(&out.stdout), names);
    if bins.len() != names.len() {
        return Err(format!("expected {what} {names:?}, cargo reported {bins:?}"));
    }
    Ok(bins)
}

/// The most extra data the GPU machine accepts with a run (64 MiB).
const BUNDLE_LIMIT: u64 = 64 << 20;

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs the GPU tests of this bundle (attn-cuda's, and attn-candle's when bundled), each binary once; the
# tests that cover several kernel configurations loop over them in-process and name the failing one.
# Usage: run.sh [extra test-harness arguments]
# PARALLEL=1 runs the binaries at once, each one's output in $OUT/<binary>.log (OUT defaults to /tmp),
# and prints only the failures and the summary: the whole suite then takes about as long as its
# slowest binary (gpu_taylor, about 8 minutes on an H200), not their sum.
# SANITIZE=memcheck|racecheck runs each binary under compute-sanitizer. ATTN_TEST_DIMS=64 and
# ATTN_TEST_DTYPES=bf16 (comma lists) narrow the head dims and dtypes of the tests' case lists (each
# skipped case is reported): racecheck is too slow for gpu_taylor's whole list.
# Not test harnesses, run by hand: bin/gpu_bench --bench, bin/gpu_bench_decode --bench and bin/gpu_bench_taylor --bench (kernel
# stopwatches), bin/overhead (per-call overhead of the candle op over attn-cuda), bin/generate
# --device cuda --preset 1b --dtype bf16 --compare-candle (generation tokens/s against candle),
# profile.sh (ncu per-kernel table of the Taylor sweeps).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
status=0
summary=""
logs="${OUT:-/tmp}"
one() {  # one binary: its output to stdout, its exit status returned
  if [ -n "${SANITIZE:-}" ]; then
    compute-sanitizer --tool "$SANITIZE" --error-exitcode 99 "$1" --ignored --test-threads=1 "${@:2}" 2>&1
  else
    "$1" --ignored --test-threads=1 "${@:2}" 2>&1
  fi
}
names=()
for bin in "$here"/bin/*; do
  name="$(basename "$bin")"
  case "$name" in gpu_bench|gpu_bench_taylor|gpu_bench_decode|overhead|generate) continue ;; esac
  names+=("$name")
  if [ -n "${PARALLEL:-}" ]; then
    ( one "$bin" "$@" > "$logs/$name.log"; echo "rc=$?" >> "$logs/$name.log" ) &
  else
    out="$(one "$bin" "$@")"
    rc=$?
    echo "$out"
    echo "$out" > "$logs/$name.log"
    echo "rc=$rc" >> "$logs/$name.log"
  fi
done
wait
for name in "${names[@]}"; do
  log="$logs/$name.log"
  rc="$(grep -E '^rc=' "$log" | tail -n 1 | cut -d= -f2)"
  [ -n "${PARALLEL:-}" ] && grep -E '^test .* FAILED$|cases failed:|^[^ ].*: .* > ' "$log" | head -n 40
  line="$(grep -E '^test result:' "$log" | tail -n 1)"
  summary="$summary$name${SANITIZE:+ [$SANITIZE]}: rc=$rc $line"$'\n'
  [ "$rc" != 0 ] && status=1
done
echo "---- summary"
printf '%s' "$summary"
exit $status
"#;

/// `profile.sh` of the bundle: one ncu table (time, DRAM and L2 bytes, grid, registers, occupancy) per
/// kernel of the Taylor stopwatch's first calls, for finding the slow kernel without nsys (absent on the
/// GPU machine).
const PROFILE_SCRIPT: &str = r#"#!/usr/bin/env bash
# Per-kernel ncu metrics of the Taylor sweeps: profile.sh [orders (1,2)] [head dim (64)] [max N (1024)]
# ncu runs each kernel alone with cold caches: compare kernels with each other, not with the stopwatch.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
orders="${1:-1,2}"; dim="${2:-64}"; max_n="${3:-1024}"
M=gpu__time_duration.sum,dram__bytes.sum,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
out="${OUT:-/tmp}"
for o in ${orders//,/ }; do
  timeout 200 ncu --metrics "$M" --launch-count 40 --csv "$here/bin/gpu_bench_taylor" --bench --orders "$o" \
    --dims "$dim" --max-n "$max_n" > "$out/ncu_o$o.csv" 2> "$out/ncu_o$o.err" || echo "ncu order $o: rc=$?"
done
python3 - "$out" ${orders//,/ } <<'PY'
import csv, collections, sys
out, orders = sys.argv[1], sys.argv[2:]
names = {"gpu__time_duration.sum": "t", "dram__bytes.sum": "dram", "lts__t_bytes.sum": "L2",
         "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%", "launch__grid_size": "grid",
         "launch__registers_per_thread": "regs", "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%"}
for o in orders:
    try:
        rows = [r for r in csv.reader(open(f"{out}/ncu_o{o}.csv")) if len(r) > 10]
    except OSError:
        rows = []
    if not rows:
        print(f"order {o}: no ncu rows (see {out}/ncu_o{o}.err)")
        continue
    h, rows = rows[0], rows[1:]
    ki, mi, vi, ui, ii = (h.index(x) for x in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit", "ID"))
    per = collections.OrderedDict()
    for r in rows:
        per.setdefault((r[ii], r[ki].split("(")[0]), []).append(f"{names.get(r[mi], r[mi])}={r[vi]}{r[ui]}")
    print(f"== order {o}")
    for (i, k), m in per.items():
        print(i, k, " ".join(m))
PY
"#;

/// The kernels' architectures of `gpu-bundle --sm90a` (attn-cuda's build reads `ATTN_CUDA_GENCODE`):
/// the H200 and H100 only.
const SM90A_GENCODE: &str = "-gencode=arch=compute_90a,code=sm_90a";

fn gpu_bundle(args: &[String]) -> Result<()> {
    let sm90a = match args {
        [] => false,
        [a] if a == "--sm90a" => true,
        other => {
            return Err(format!(
                "gpu-bundle: unexpected arguments {other:?} (only --sm90a)"
            ))
        }
    };
    // The cargo command of each build, on the sm_90a-only target directory with `--sm90a`.
    let cargo_cmd = || {
        let mut cmd = Command::new(cargo());
        if sm90a {
            cmd.env("ATTN_CUDA_GENCODE", SM90A_GENCODE)
                .env("CARGO_TARGET_DIR", target_dir().join("sm90a"));
        }
        cmd
    };
    let mut cmd = cargo_cmd();
    cmd.args(["test", "--release", "--no-run", "-p", "attn-cuda"]);
    for t in GPU_TEST_BINARIES {
        cmd.args(["--test", t]);
    }
    let mut bins = cargo_executables(&mut cmd, &GPU_TEST_BINARIES, "the attn-cuda GPU tests")?;

    match candle_toolchain() {
        Some(home) => {
            let mut cmd = cargo_cmd();
            cmd.args([
                "test",
                "--release",
                "--no-run",
                "-p",
                "attn-candle",
                "--features",
                "cuda",
            ])
            .args(["--test", CANDLE_TEST_BINARY]);
            with_candle_env(&mut cmd, &home);
            bins.extend(cargo_executables(
                &mut cmd,
                &[CANDLE_TEST_BINARY],
                "the attn-candle CUDA tests",
            )?);
            let mut cmd = cargo_cmd();
            cmd.args(["build", "--release", "-p", "attn-candle", "--features", "cuda"]);
            for e in CANDLE_EXAMPLES {
                cmd.args(["--example", e]);
            }
            with_candle_env(&mut cmd, &home);
            bins.extend(cargo_executables(
                &mut cmd,
                &CANDLE_EXAMPLES,
                "the attn-candle examples",
            )?);
        }
        None => println!(
            "xtask gpu-bundle: attn-candle's CUDA tests are not bundled: no candle CUDA toolchain \
             under {} (run `cargo xtask setup-candle-cuda` first)",
            candle_cuda_dir().display()
        ),
    }

    let target = target_dir();
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
    let profile = bundle.join("profile.sh");
    fs::write(&profile, PROFILE_SCRIPT).map_err(|e| format!("cannot write {}: {e}", profile.display()))?;
    run(Command::new("chmod").arg("+x").arg(&profile))?;
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
    // Every binary embeds the same attn-cuda fatbins, stored compressed (so xz cannot shrink one
    // copy); a dictionary larger than the biggest binary lets xz store them once. One thread: xz's
    // threads split the input into blocks that cannot refer to each other.
    run(Command::new("xz")
        .args(["-T1", "--lzma2=preset=3,dict=192MiB"])
        .stdin(tar_out)
        .stdout(out_file))?;
    let size = fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
    if size > BUNDLE_LIMIT {
        eprintln!(
            "xtask gpu-bundle: warning: {} is {:.1} MiB, over the {} MiB a GPU run accepts",
            archive.display(),
            size as f64 / (1024.0 * 1024.0),
            BUNDLE_LIMIT >> 20
        );
    }
    let names: Vec<&str> = bins.iter().map(|(n, _)| n.as_str()).collect();
    println!(
        "xtask gpu-bundle: {} ({} binaries: {}) packed as {} ({:.1} MiB); on the GPU machine: \
         tar -xJf gpu-bundle.tar.xz && gpu-bundle/run.sh",
        bundle.display(),
        bins.len(),
        names.join(", "),
        archive.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}
