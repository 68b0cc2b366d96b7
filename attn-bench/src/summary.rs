//! The short table printed last by `run --summary` (and so by the GPU script): per (family, pass,
//! D), our row at the largest non-causal N and, when a larger N was measured (the memory points are
//! causal), our row at the largest N; at each the fastest baseline measured on the same point with
//! `×best = t_best / t_ours` (above 1: ours is faster). A family without a row of ours gets one
//! line with the reason it was skipped. The full table is the markdown report.

use crate::impls::is_ours_label;
use crate::report::{families, sig3, OURS_ORDER};
use crate::schema::{BenchFile, Row};
use std::collections::BTreeMap;
use std::fmt::Write;

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let cut: String = s.chars().take(n).collect();
        format!("{cut}…")
    }
}

/// The fastest baseline row at `r`'s point.
fn best_baseline<'a>(file: &'a BenchFile, r: &Row) -> Option<&'a Row> {
    let key = r.key();
    file.rows
        .iter()
        .filter(|b| !is_ours_label(&b.implementation) && b.key() == key)
        .min_by(|a, b| a.ms_median.total_cmp(&b.ms_median))
}

/// The short table (module doc).
pub fn summary(file: &BenchFile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "summary: {} (commit {}, {})",
        file.device, file.commit, file.date
    );
    let _ = writeln!(
        out,
        "| family | pass | D | causal | B×H | N | ours | ms | TFLOP/s | MiB | best baseline | ms | ×best |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(13));

    for family in families(file) {
        let ours = OURS_ORDER.iter().copied().find(|o| {
            file.rows
                .iter()
                .any(|r| r.family == family && r.implementation == *o)
        });
        let Some(ours) = ours else {
            let reason = file
                .skipped
                .iter()
                .find(|s| s.family == family && is_ours_label(&s.implementation))
                .map(|s| format!("{} skipped: {}", s.implementation, shorten(&s.reason, 90)))
                .unwrap_or_else(|| "no row of ours".into());
            let _ = writeln!(out, "| {family} | {reason} |");
            continue;
        };
        // Decode rows (fewer queries than keys) have their own table below.
        let mine: Vec<&Row> = file
            .rows
            .iter()
            .filter(|r| r.family == family && r.implementation == ours && r.seq_q >= r.seq_k)
            .collect();
        if mine.is_empty() {
            continue;
        }
        // (pass, D) → (largest-N non-causal row, largest-N row).
        let mut slices: BTreeMap<(&str, usize), (Option<&Row>, &Row)> = BTreeMap::new();
        for r in &mine {
            let slot = slices.entry((r.pass.as_str(), r.head_dim)).or_insert((None, r));
            if !r.causal && slot.0.is_none_or(|a| r.seq_q > a.seq_q) {
                slot.0 = Some(r);
            }
            if r.seq_q > slot.1.seq_q || (r.seq_q == slot.1.seq_q && !r.causal) {
                slot.1 = r;
            }
        }
        let picked = slices.values().flat_map(|(a, b)| match a {
            Some(a) if a.seq_q >= b.seq_q => vec![*a],
            Some(a) => vec![*a, *b],
            None => vec![*b],
        });
        for r in picked {
            let (base, base_ms, ratio) = match best_baseline(file, r) {
                Some(b) => (
                    b.implementation.clone(),
                    sig3(b.ms_median),
                    sig3(b.ms_median / r.ms_median),
                ),
                None => ("—".into(), "—".into(), "—".into()),
            };
            let _ = writeln!(
                out,
                "| {family} | {} | {} | {} | {}×{} | {} | {ours} | {} | {} | {} | {base} | {base_ms} | {ratio} |",
                r.pass,
                r.head_dim,
                if r.causal { "yes" } else { "no" },
                r.batch,
                r.heads_q,
                r.seq_q,
                sig3(r.ms_median),
                sig3(r.tflops),
                r.peak_mib.map(sig3).unwrap_or_else(|| "—".into()),
            );
        }
    }
    let decode = decode_table(file);
    if !decode.is_empty() {
        let _ = writeln!(out, "decode:\n{decode}");
    }
    let ours_rows = file
        .rows
        .iter()
        .filter(|r| is_ours_label(&r.implementation))
        .count();
    let _ = writeln!(
        out,
        "{} rows ({} ours, {} baselines), {} skipped, {} grid points not built",
        file.rows.len(),
        ours_rows,
        file.rows.len() - ours_rows,
        file.skipped.len(),
        file.bad_points.len()
    );
    out
}

/// The decode rows (fewer queries than keys), one line per point of ours: time, `% copy` (the
/// compulsory bytes, the KV cache read once plus q and o, per median time as a percentage of the
/// file's measured copy bandwidth), the fastest baseline on the same point and `×best = t_best /
/// t_ours`, and each paged-cache row of the same shape with its time relative to the contiguous call
/// (`paged/contig`, 1.10 = 10% slower). Empty when the file has no decode row.
pub fn decode_table(file: &BenchFile) -> String {
    let mut out = String::new();
    let mut rows: Vec<&Row> = file
        .rows
        .iter()
        .filter(|r| r.seq_q < r.seq_k && is_ours_label(&r.implementation))
        .collect();
    if rows.is_empty() {
        return out;
    }
    rows.sort_by_key(|r| {
        (
            r.family.clone(),
            r.head_dim,
            r.seq_q,
            r.seq_k,
            r.batch,
            r.heads_q,
            r.implementation.clone(),
        )
    });
    let _ = writeln!(
        out,
        "| family | B | Hq/Hkv | Nq | Nk | D | ours | ms | % copy | best baseline | ms | ×best | paged/contig |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(13));
    for r in rows {
        let contiguous = file.rows.iter().find(|c| {
            c.key() == r.key()
                && c.implementation != r.implementation
                && OURS_ORDER.contains(&c.implementation.as_str())
        });
        let paged = r.implementation.contains("-paged");
        let (base, base_ms, ratio) = match best_baseline(file, r) {
            Some(b) => (
                b.implementation.clone(),
                sig3(b.ms_median),
                sig3(b.ms_median / r.ms_median),
            ),
            None => ("—".into(), "—".into(), "—".into()),
        };
        let vs = match (paged, contiguous) {
            (true, Some(c)) => sig3(r.ms_median / c.ms_median),
            _ => "—".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {base} | {base_ms} | {ratio} | {vs} |",
            r.family,
            r.batch,
            r.heads_q,
            r.heads_kv,
            r.seq_q,
            r.seq_k,
            r.head_dim,
            r.implementation,
            sig3(r.ms_median),
            r.bandwidth_pct.map(sig3).unwrap_or_else(|| "—".into()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{row as cpu_row, skip};
    use crate::schema::Skipped;

    /// A bf16 row of the GPU grid: 16k tokens per batch (B = 16384/N), H = 32.
    fn row(imp: &str, family: &str, pass: &str, n: usize, causal: bool, ms: f64) -> Row {
        Row {
            dtype: "bf16".into(),
            pass: pass.into(),
            batch: 16384usize.div_ceil(n).max(1),
            heads_q: 32,
            heads_kv: 32,
            causal,
            tflops: 100.0,
            peak_mib: Some(12.5),
            gpu: "gpu".into(),
            ..cpu_row(imp, family, n, ms)
        }
    }

    #[test]
    fn picks_the_largest_regular_n_and_every_memory_point_with_the_best_baseline() {
        let mut f = BenchFile::new("gpu".into(), "c".into(), "d".into());
        for (n, ms) in [(1024, 1.0), (16384, 8.0)] {
            f.rows.push(row("attn-cuda", "softmax", "fwd", n, false, ms));
            f.rows
                .push(row("sdpa_flash", "softmax", "fwd", n, false, 2.0 * ms));
            f.rows
                .push(row("sdpa_cudnn", "softmax", "fwd", n, false, 0.5 * ms));
        }
        f.rows.push(row("attn-cuda", "softmax", "fwd", 4096, true, 3.0));
        f.rows
            .push(row("attn-cuda", "taylor2", "fwd_bwd", 1 << 20, true, 300.0));
        let hyp = row("attn-cuda", "hyperbolic_geodesic", "fwd", 64, false, 0.0);
        f.skipped.push(Skipped {
            batch: 1,
            heads_q: 1,
            heads_kv: 1,
            ..skip(&hyp, "unsupported: the hyperbolic family has no kernel")
        });
        let s = summary(&f);
        let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("| ")).collect();
        // Header, softmax fwd at N = 16384 only, taylor2 memory point, hyperbolic skip.
        assert_eq!(lines.len(), 4, "{s}");
        assert!(lines[1].contains("| 16384 | attn-cuda | 8.00 |"), "{s}");
        assert!(lines[1].contains("| sdpa_cudnn | 4.00 | 0.500 |"), "{s}");
        assert!(
            lines[2].contains("| 1048576 |") && lines[2].contains("| — | — | — |"),
            "{s}"
        );
        assert!(lines[3].contains("attn-cuda skipped: unsupported"), "{s}");
        assert!(s.contains("8 rows (4 ours, 4 baselines), 1 skipped"), "{s}");
    }

    #[test]
    fn decode_rows_get_their_own_table_with_copy_bandwidth_and_paged_ratio() {
        let mut f = BenchFile::new("gpu".into(), "c".into(), "d".into());
        let decode = |imp: &str, ms: f64| Row {
            batch: 1,
            heads_q: 32,
            heads_kv: 8,
            seq_q: 1,
            seq_k: 32768,
            head_dim: 128,
            causal: true,
            bandwidth_pct: Some(88.0),
            ..row(imp, "softmax", "fwd", 32768, true, ms)
        };
        f.rows.push(decode("attn-cuda", 0.040));
        f.rows.push(decode("attn-cuda-paged16", 0.044));
        f.rows.push(Row {
            bandwidth_pct: None,
            ..decode("sdpa_cudnn", 0.0405)
        });
        f.rows.push(row("attn-cuda", "softmax", "fwd", 16384, false, 8.0));
        let s = summary(&f);
        let table = decode_table(&f);
        let lines: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert!(
            lines[0].contains("| attn-cuda | 0.0400 | 88.0 | sdpa_cudnn | 0.0405 | 1.01 | — |"),
            "{table}"
        );
        assert!(
            lines[1].contains("| attn-cuda-paged16 | 0.0440 |") && lines[1].ends_with("| 1.10 |"),
            "{table}"
        );
        // The regular table keeps its own row; the decode table follows it.
        assert!(
            s.contains("| 16384 | attn-cuda | 8.00 |") && s.contains("decode:\n| family | B |"),
            "{s}"
        );
    }
}
