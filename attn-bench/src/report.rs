//! The markdown report of a results file: one table per family with a ratio column per baseline,
//! the Taylor-vs-softmax crossover, and every skip and bad point with its reason.
//!
//! Ratios are `×b = t_b / t_ours` on median times (above 1: ours is faster), where "ours" is the
//! first of `attn-cuda`, `attn-cpu-fast`, `attn-cpu-ref` that has rows for the family. A baseline that was not
//! measured at a point shows `skip` (the reason is listed below the tables), an absent one `—`.

use crate::impls::is_ours_label;
use crate::schema::{BenchFile, PointKey, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Three significant digits, plain notation.
///
/// ```
/// use attn_bench::report::sig3;
/// assert_eq!(sig3(1234.6), "1235");
/// assert_eq!(sig3(12.345), "12.3");
/// assert_eq!(sig3(0.012345), "0.0123");
/// ```
pub fn sig3(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    let decimals = if a >= 100.0 || a == 0.0 {
        0
    } else {
        (2 - a.log10().floor() as i32).max(0) as usize
    };
    format!("{x:.decimals$}")
}

/// Our implementations, in the order that picks the one the ratios compare with.
pub(crate) const OURS_ORDER: [&str; 3] = ["attn-cuda", "attn-cpu-fast", "attn-cpu-ref"];

/// Order families the way the library lists them, unknown labels last.
fn family_rank(f: &str) -> usize {
    crate::grid::FamilyId::ALL
        .iter()
        .position(|x| x.label() == f)
        .unwrap_or(usize::MAX)
}

/// The families of a file's rows and skips, in the library's order (unknown labels last, by name).
pub(crate) fn families(file: &BenchFile) -> Vec<&str> {
    let mut families: Vec<&str> = file
        .rows
        .iter()
        .map(|r| r.family.as_str())
        .chain(file.skipped.iter().map(|s| s.family.as_str()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    families.sort_by_key(|f| (family_rank(f), f.to_string()));
    families
}

/// The markdown document for a file.
pub fn markdown(file: &BenchFile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# attn-bench results — {}\n", file.device);
    let _ = writeln!(out, "- commit `{}`, date {}", file.commit, file.date);
    let commits: BTreeSet<&str> = file.rows.iter().map(|r| r.commit.as_str()).collect();
    if commits.len() > 1 || commits.iter().any(|c| *c != file.commit) {
        let list: Vec<String> = commits.into_iter().map(|c| format!("`{c}`")).collect();
        let _ = writeln!(out, "- rows from commits {}", list.join(", "));
    }
    let devices: BTreeSet<&str> = file.rows.iter().map(|r| r.gpu.as_str()).collect();
    if devices.len() > 1 {
        let list: Vec<&str> = devices.into_iter().collect();
        let _ = writeln!(out, "- rows from several devices: {}", list.join("; "));
    }
    let timers: BTreeSet<&str> = file.rows.iter().filter_map(|r| r.timer.as_deref()).collect();
    if !timers.is_empty() {
        let list: Vec<&str> = timers.into_iter().collect();
        let _ = writeln!(out, "- timed by: {}", list.join(", "));
    }
    if let Some(bw) = file.bandwidth_gbs {
        let _ = writeln!(
            out,
            "- `% BW` is relative to a measured copy bandwidth of {bw:.1} GB/s"
        );
    }
    let _ = writeln!(
        out,
        "- times are medians in ms; `×b` = time of baseline b / time of ours (above 1: ours is faster); \
         TFLOP/s by the FlashAttention formulas (Taylor: its factorised FLOPs); peak MiB = {}\n",
        peak_sources(file)
    );

    for family in families(file) {
        family_table(&mut out, file, family);
    }
    crossover_table(&mut out, file);
    let decode = crate::summary::decode_table(file);
    if !decode.is_empty() {
        let _ = writeln!(out, "## decode\n\n{decode}");
    }
    skips(&mut out, file);
    out
}

fn peak_sources(file: &BenchFile) -> String {
    let set: BTreeSet<&str> = file
        .rows
        .iter()
        .filter_map(|r| r.peak_source.as_deref())
        .collect();
    if set.is_empty() {
        return "not measured".into();
    }
    set.into_iter()
        .map(|s| match s {
            "rss_hwm_delta" => {
                "peak resident set during set-up and one call minus the resident set before (rss_hwm_delta)"
            }
            "torch_max_allocated" => {
                "torch.cuda.max_memory_allocated during set-up and one call (torch_max_allocated)"
            }
            "cuda_pool_used_high" => {
                "high-water mark of the CUDA memory pool over set-up and one call, scratch included, \
                 minus its use before (cuda_pool_used_high)"
            }
            "cuda_mem_get_info_delta" => {
                "device free memory before set-up minus after one call (cuda_mem_get_info_delta)"
            }
            other => other,
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn family_table(out: &mut String, file: &BenchFile, family: &str) {
    let rows: Vec<&Row> = file.rows.iter().filter(|r| r.family == family).collect();
    let mut impls: BTreeSet<&str> = rows.iter().map(|r| r.implementation.as_str()).collect();
    impls.extend(
        file.skipped
            .iter()
            .filter(|s| s.family == family)
            .map(|s| s.implementation.as_str()),
    );
    let ours: Vec<&str> = OURS_ORDER
        .iter()
        .copied()
        .filter(|o| rows.iter().any(|r| r.implementation == *o))
        .collect();
    let primary = ours.first().copied();
    let baselines: Vec<&str> = impls.iter().copied().filter(|i| !is_ours_label(i)).collect();
    // `% BW` where memory bounds the call: the linear family and the decode rows (fewer queries
    // than keys: the KV cache read once).
    let linear = family.starts_with("taylor") || rows.iter().any(|r| r.bandwidth_pct.is_some());

    let mut by_key: BTreeMap<PointKey, BTreeMap<&str, &Row>> = BTreeMap::new();
    for r in &rows {
        by_key
            .entry(r.key())
            .or_default()
            .insert(r.implementation.as_str(), r);
    }
    let skipped: BTreeSet<(PointKey, &str)> = file
        .skipped
        .iter()
        .filter(|s| s.family == family)
        .map(|s| (s.key(), s.implementation.as_str()))
        .collect();
    for (key, imp) in &skipped {
        if !by_key.contains_key(key) && impls.contains(imp) {
            by_key.entry(key.clone()).or_default();
        }
    }

    let _ = writeln!(out, "## {family}\n");
    let mut header = vec!["pass", "dtype", "D", "causal", "B", "H", "N"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    for o in &ours {
        header.push(format!("{o} ms"));
        header.push("TFLOP/s".into());
        if linear {
            header.push("% BW".into());
        }
        header.push("MiB".into());
    }
    for b in &baselines {
        header.push(format!("{b} ms"));
        if primary.is_some() {
            header.push(format!("×{b}"));
        }
    }
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));

    let mut keys: Vec<&PointKey> = by_key.keys().collect();
    keys.sort_by_key(|k| {
        (
            k.pass.clone(),
            k.dtype.clone(),
            k.head_dim,
            k.causal,
            k.seq_q,
            k.batch,
        )
    });
    for key in keys {
        let at = &by_key[key];
        let cell = |imp: &str| -> Option<&Row> { at.get(imp).copied() };
        let missing = |imp: &str| {
            if skipped.contains(&(key.clone(), imp)) {
                "skip".to_string()
            } else {
                "—".to_string()
            }
        };
        let n = if key.seq_q == key.seq_k {
            key.seq_q.to_string()
        } else {
            format!("{}×{}", key.seq_q, key.seq_k)
        };
        let h = if key.heads_q == key.heads_kv {
            key.heads_q.to_string()
        } else {
            format!("{}/{}", key.heads_q, key.heads_kv)
        };
        let mut line = vec![
            key.pass.clone(),
            key.dtype.clone(),
            key.head_dim.to_string(),
            if key.causal { "yes".into() } else { "no".into() },
            key.batch.to_string(),
            h,
            n,
        ];
        for o in &ours {
            match cell(o) {
                Some(r) => {
                    line.push(sig3(r.ms_median));
                    line.push(sig3(r.tflops));
                    if linear {
                        line.push(r.bandwidth_pct.map(sig3).unwrap_or_else(|| "—".into()));
                    }
                    line.push(r.peak_mib.map(sig3).unwrap_or_else(|| "—".into()));
                }
                None => {
                    let m = missing(o);
                    line.extend(std::iter::repeat_n(m, if linear { 4 } else { 3 }));
                }
            }
        }
        let ours_ms = primary.and_then(cell).map(|r| r.ms_median);
        for b in &baselines {
            match cell(b) {
                Some(r) => {
                    line.push(sig3(r.ms_median));
                    if primary.is_some() {
                        line.push(
                            ours_ms
                                .map(|o| sig3(r.ms_median / o))
                                .unwrap_or_else(|| "—".into()),
                        );
                    }
                }
                None => {
                    line.push(missing(b));
                    if primary.is_some() {
                        line.push("—".into());
                    }
                }
            }
        }
        let _ = writeln!(out, "| {} |", line.join(" | "));
    }
    let _ = writeln!(out);
}

/// Smallest N from which a Taylor order beats softmax, per implementation and slice.
pub fn crossovers(file: &BenchFile) -> Vec<(String, String, Option<usize>)> {
    // (impl, pass, dtype, D, causal) → family → N → ms
    type Slice = (String, String, String, usize, bool);
    let mut t: BTreeMap<Slice, BTreeMap<&str, BTreeMap<usize, f64>>> = BTreeMap::new();
    for r in &file.rows {
        if r.seq_q != r.seq_k {
            continue;
        }
        let slice = (
            r.implementation.clone(),
            r.pass.clone(),
            r.dtype.clone(),
            r.head_dim,
            r.causal,
        );
        t.entry(slice)
            .or_default()
            .entry(r.family.as_str())
            .or_default()
            .insert(r.seq_q, r.ms_median / (r.batch * r.heads_q) as f64);
    }
    let mut out = Vec::new();
    for ((imp, pass, dtype, d, causal), fams) in &t {
        let Some(soft) = fams.get("softmax") else { continue };
        for order in ["taylor1", "taylor2"] {
            let Some(tay) = fams.get(order) else { continue };
            let common: Vec<usize> = tay.keys().filter(|n| soft.contains_key(n)).copied().collect();
            if common.is_empty() {
                continue;
            }
            // First N from which Taylor stays faster at every larger measured N.
            let mut from = None;
            for &n in common.iter().rev() {
                if tay[&n] < soft[&n] {
                    from = Some(n);
                } else {
                    break;
                }
            }
            let slice = format!(
                "{imp} {pass} {dtype} D={d}{} (N {}..{})",
                if *causal { " causal" } else { "" },
                common[0],
                common[common.len() - 1]
            );
            out.push((slice, order.to_string(), from));
        }
    }
    out
}

fn crossover_table(out: &mut String, file: &BenchFile) {
    let c = crossovers(file);
    if c.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Taylor vs softmax crossover\n");
    let _ = writeln!(
        out,
        "Time per (batch, head) compared at equal N; \"from N\" is the smallest measured N from which \
         Taylor is faster at every larger measured N.\n"
    );
    let _ = writeln!(
        out,
        "| implementation and slice | order | Taylor faster from N |\n|---|---|---|"
    );
    for (slice, order, from) in c {
        let from = from
            .map(|n| n.to_string())
            .unwrap_or_else(|| "not in range".into());
        let _ = writeln!(out, "| {slice} | {order} | {from} |");
    }
    let _ = writeln!(out);
}

fn skips(out: &mut String, file: &BenchFile) {
    if !file.skipped.is_empty() {
        let mut groups: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
        for s in &file.skipped {
            groups
                .entry((s.implementation.as_str(), s.reason.as_str()))
                .or_default()
                .push(format!("{} {} N={} D={}", s.family, s.pass, s.seq_q, s.head_dim));
        }
        let _ = writeln!(out, "## Skipped\n");
        for ((imp, reason), points) in groups {
            let shown: Vec<&str> = points.iter().take(3).map(String::as_str).collect();
            let more = if points.len() > 3 {
                format!(", … ({} points)", points.len())
            } else {
                String::new()
            };
            let _ = writeln!(out, "- **{imp}**: {reason} — {}{more}", shown.join(", "));
        }
        let _ = writeln!(out);
    }
    if !file.bad_points.is_empty() {
        let _ = writeln!(out, "## Grid points not built\n");
        for b in &file.bad_points {
            let _ = writeln!(out, "- {b}");
        }
        let _ = writeln!(out);
    }
}

/// Row and skip fixtures, shared with [`crate::summary`]'s tests.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::schema::Skipped;

    /// A CPU f32 forward row: B = 1, H = 2, `N × N`, D = 64, not causal, `ms` for every time.
    pub(crate) fn row(imp: &str, family: &str, n: usize, ms: f64) -> Row {
        Row {
            implementation: imp.into(),
            family: family.into(),
            params: String::new(),
            dtype: "f32".into(),
            pass: "fwd".into(),
            batch: 1,
            heads_q: 2,
            heads_kv: 2,
            seq_q: n,
            seq_k: n,
            head_dim: 64,
            causal: false,
            ms_median: ms,
            ms_min: ms,
            tflops: 1.0,
            tokens_per_s: 1.0,
            peak_mib: None,
            gpu: "cpu".into(),
            commit: "c".into(),
            date: "d".into(),
            ms_spread: None,
            runs: None,
            bytes_moved: None,
            bandwidth_pct: None,
            peak_source: None,
            timer: None,
        }
    }

    /// The skip of `r`'s implementation at `r`'s point.
    pub(crate) fn skip(r: &Row, reason: &str) -> Skipped {
        Skipped {
            implementation: r.implementation.clone(),
            family: r.family.clone(),
            dtype: r.dtype.clone(),
            pass: r.pass.clone(),
            batch: r.batch,
            heads_q: r.heads_q,
            heads_kv: r.heads_kv,
            seq_q: r.seq_q,
            seq_k: r.seq_k,
            head_dim: r.head_dim,
            causal: r.causal,
            reason: reason.into(),
        }
    }

    #[test]
    fn ratio_column_is_baseline_over_ours() {
        let mut f = BenchFile::new("cpu".into(), "c".into(), "d".into());
        f.rows.push(row("attn-cpu-ref", "softmax", 256, 2.0));
        f.rows.push(row("candle_naive", "softmax", 256, 5.0));
        f.skipped
            .push(skip(&row("sdpa_flash", "softmax", 256, 0.0), "no GPU"));
        let md = markdown(&f);
        assert!(md.contains("| candle_naive ms | ×candle_naive |"), "{md}");
        assert!(md.contains("| 5.00 | 2.50 |"), "{md}");
        assert!(md.contains("| skip | — |"), "{md}");
        assert!(md.contains("**sdpa_flash**: no GPU"), "{md}");
    }

    #[test]
    fn a_skip_where_another_merged_file_measured_the_point_is_not_listed() {
        let measured = row("attn-cuda", "taylor1", 1024, 3.0);
        let mut older = BenchFile::new("gpu".into(), "old".into(), "d".into());
        older.skipped.push(skip(&measured, "named symbol not found"));
        older
            .skipped
            .push(skip(&row("attn-cuda", "taylor1", 2048, 0.0), "still not found"));
        let mut newer = BenchFile::new("gpu".into(), "new".into(), "d".into());
        newer.rows.push(measured);
        newer.merge(older);
        assert_eq!(newer.drop_superseded(), (0, 1));
        let md = markdown(&newer);
        assert!(!md.contains("named symbol not found"), "{md}");
        assert!(
            md.contains("**attn-cuda**: still not found — taylor1 fwd N=2048 D=64"),
            "{md}"
        );
    }

    #[test]
    fn header_names_every_commit_of_the_rows() {
        let mut f = BenchFile::new("gpu".into(), "abc".into(), "d".into());
        f.rows.push(row("attn-cuda", "softmax", 256, 2.0));
        let mut r = row("sdpa_flash", "softmax", 256, 5.0);
        r.commit = "def".into();
        f.rows.push(r);
        let md = markdown(&f);
        assert!(md.contains("commit `abc`"), "{md}");
        assert!(md.contains("rows from commits `c`, `def`"), "{md}");
    }

    #[test]
    fn crossover_is_the_first_n_from_which_taylor_stays_faster() {
        let mut f = BenchFile::new("cpu".into(), "c".into(), "d".into());
        for (n, soft, tay) in [
            (128, 1.0, 3.0),
            (256, 2.0, 1.5),
            (512, 4.0, 4.5),
            (1024, 9.0, 5.0),
            (2048, 30.0, 9.0),
        ] {
            f.rows.push(row("attn-cpu-ref", "softmax", n, soft));
            f.rows.push(row("attn-cpu-ref", "taylor2", n, tay));
        }
        let c = crossovers(&f);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].1, "taylor2");
        assert_eq!(c[0].2, Some(1024));
    }
}
