//! What a run records about where and when it ran: device name, commit, date, host, the copy
//! bandwidth the linear family is compared with, and the peak resident memory of a call.
//!
//! The commit of a row is [`source_commit`]: `ATTN_COMMIT` from the environment when set (the GPU
//! script passes the binary's own to the python baselines, so both sides of a merged table agree),
//! else the commit baked in at build time, else `git describe` of the source directory.
//!
//! Peak memory on the CPU is measured, not modelled: the allocator gives back what it can
//! (`malloc_trim`), the kernel's resident-set high-water mark is reset (`/proc/self/clear_refs`,
//! value 5), and after set-up plus one call the mark (`VmHWM`) minus the resident set before
//! (`VmRSS`) is the call's peak. Inputs, outputs and every temporary of the implementation count.

use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// `cpu: <model name> (<n> threads)` from /proc/cpuinfo, for the `gpu` field of CPU rows.
pub fn cpu_name() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("cpu: {model} ({threads} threads)")
}

/// Short host name, for result file names.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// `git describe --always --dirty --abbrev=12` of the directory, or `unknown`.
pub fn git_commit(dir: &Path) -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The commit baked into this binary by build.rs (`unknown` where git was missing at build time).
pub const BUILD_COMMIT: &str = env!("ATTN_BENCH_COMMIT");

/// The commit the rows of this run are attributed to (see the module doc).
pub fn source_commit() -> String {
    if let Some(c) = std::env::var("ATTN_COMMIT")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
    {
        return c;
    }
    if BUILD_COMMIT != "unknown" {
        return BUILD_COMMIT.to_string();
    }
    git_commit(Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// The attn-cuda settings of this process's environment (every `ATTN_CUDA_*` variable: kernel choices
/// and tile experiments), as [`format_overrides`] writes them; empty when none is set.
pub fn attn_cuda_overrides() -> String {
    format_overrides(std::env::vars().filter(|(k, _)| k.starts_with("ATTN_CUDA_")))
}

/// `K=V` pairs sorted by name and joined by spaces, so that rows measured under different settings say
/// so in their `params`.
///
/// ```
/// use attn_bench::machine::format_overrides;
/// let vars = [("ATTN_CUDA_TAYLOR1_CHAIN_RES", "1"), ("ATTN_CUDA_TAYLOR1_SEG", "128")];
/// let pairs = vars.iter().rev().map(|(k, v)| (k.to_string(), v.to_string()));
/// assert_eq!(format_overrides(pairs), "ATTN_CUDA_TAYLOR1_CHAIN_RES=1 ATTN_CUDA_TAYLOR1_SEG=128");
/// assert_eq!(format_overrides(std::iter::empty()), "");
/// ```
pub fn format_overrides(vars: impl Iterator<Item = (String, String)>) -> String {
    let mut pairs: Vec<String> = vars.map(|(k, v)| format!("{k}={}", v.trim())).collect();
    pairs.sort();
    pairs.join(" ")
}

/// The civil (proleptic Gregorian, UTC) date of a day count since 1970-01-01, as `YYYY-MM-DD`.
///
/// ```
/// use attn_bench::machine::civil_date;
/// assert_eq!(civil_date(0), "1970-01-01");
/// assert_eq!(civil_date(19_723), "2024-01-01");
/// assert_eq!(civil_date(11_016), "2000-02-29");
/// ```
pub fn civil_date(days_since_epoch: i64) -> String {
    // Howard Hinnant's days-to-civil algorithm (eras of 400 years).
    let z = days_since_epoch + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Today's UTC date, `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    civil_date(secs.div_euclid(86_400))
}

/// Best-of-five copy bandwidth in GB/s (bytes read plus bytes written), over buffers well beyond
/// the last-level cache.
pub fn copy_bandwidth_gbs() -> f64 {
    const LEN: usize = 32 << 20; // 32 Mi f32 = 128 MiB per buffer
    let src = vec![1.0f32; LEN];
    let mut dst = vec![0.0f32; LEN];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (LEN * 4) as f64 / best / 1e9
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Measures the peak resident memory of a stretch of work (see the module doc).
pub struct PeakMemory {
    base_kib: u64,
}

impl PeakMemory {
    /// Trim the allocator, reset the high-water mark and remember the resident set; `None` where
    /// the kernel does not offer the mark or its reset.
    pub fn start() -> Option<Self> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free heap pages to the kernel; it takes no pointers.
        unsafe {
            libc::malloc_trim(0);
        }
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        let base_kib = status_kib("VmRSS:")?;
        Some(PeakMemory { base_kib })
    }

    /// Peak MiB above the starting resident set since [`PeakMemory::start`].
    pub fn peak_mib(&self) -> Option<f64> {
        let hwm = status_kib("VmHWM:")?;
        Some(hwm.saturating_sub(self.base_kib) as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_across_month_and_year_boundaries() {
        assert_eq!(civil_date(-1), "1969-12-31");
        assert_eq!(civil_date(59), "1970-03-01");
        assert_eq!(civil_date(10_957), "2000-01-01");
        assert_eq!(civil_date(20_780), "2026-11-23");
    }

    #[test]
    fn peak_memory_sees_a_large_allocation() {
        let Some(m) = PeakMemory::start() else {
            eprintln!("skipped: /proc/self/clear_refs is not writable here");
            return;
        };
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let peak = m.peak_mib().expect("VmHWM is readable once clear_refs is");
        drop(v);
        assert!(peak >= 60.0, "peak {peak} MiB after touching 64 MiB");
    }
}
