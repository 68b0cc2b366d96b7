//! The JSON schema every producer writes (this CLI, `python/run_baselines.py`) and `run --merge`
//! reads.
//!
//! A file is one [`BenchFile`]: `rows` holds one [`Row`] per measurement, `skipped` one [`Skipped`]
//! per (implementation, point) that was not measured, with the reason — a missing baseline is never
//! a zero or a pass. A row carries exactly the required fields (`impl`, `family`, `params`,
//! `dtype`, `pass`, `batch`, `heads_q`, `heads_kv`, `seq_q`, `seq_k`, `head_dim`, `causal`,
//! `ms_median`, `ms_min`, `tflops`, `tokens_per_s`, `peak_mib`, `gpu`, `commit`, `date`) followed by
//! optional extras (`ms_spread`, `runs`, `bytes_moved`, `bandwidth_pct`, `peak_source`, `timer`)
//! that older or foreign producers may leave out.

use crate::error::BenchError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;

/// Version of the file layout written in [`BenchFile::schema`].
pub const SCHEMA_VERSION: u32 = 1;

/// One measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `attn-cuda`, `attn-cpu-ref` or a baseline (`sdpa_flash`, `candle_naive`, ...).
    #[serde(rename = "impl")]
    pub implementation: String,
    /// `softmax`, `cosine_sim`, `taylor1`, `taylor2`, `hyperbolic_geodesic`, `hyperbolic_sq_lorentz`.
    pub family: String,
    /// The family's parameters, e.g. `scale=0.125` (and for baselines, how they were run).
    pub params: String,
    /// `f32`, `f16` or `bf16`.
    pub dtype: String,
    /// `fwd`, `bwd` or `fwd_bwd`.
    pub pass: String,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub ms_median: f64,
    pub ms_min: f64,
    /// By the formulas of [`crate::flops`], from the median time.
    pub tflops: f64,
    /// `B·Nq` per second, from the median time.
    pub tokens_per_s: f64,
    /// Peak memory of one call in MiB (what `peak_source` says), when known.
    pub peak_mib: Option<f64>,
    /// The device name, e.g. `NVIDIA H100 80GB HBM3`, or `cpu: <model> (<n> threads)`.
    pub gpu: String,
    pub commit: String,
    /// UTC date of the run, `YYYY-MM-DD`.
    pub date: String,
    /// Interquartile range (p75 − p25) of the timed runs, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms_spread: Option<f64>,
    /// Number of timed runs after warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<usize>,
    /// Compulsory bytes of the pass (linear family), see [`crate::flops::bytes_moved`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_moved: Option<f64>,
    /// `bytes_moved` per median time as a percentage of the file's `bandwidth_gbs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_pct: Option<f64>,
    /// How `peak_mib` was measured: `rss_hwm_delta` (CPU: peak resident set during set-up and one
    /// call, minus the resident set before), `cuda_pool_used_high` (the stream-ordered pool's
    /// high-water mark over set-up and one call, [`crate`]'s `gpu` module), `torch_max_allocated`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_source: Option<String>,
    /// How the runs were timed: `host_clock` (wall clock around each call) or `cuda_event` (device
    /// events around each call on its stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<String>,
}

/// An (implementation, point) that was not measured, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    #[serde(rename = "impl")]
    pub implementation: String,
    pub family: String,
    pub dtype: String,
    pub pass: String,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub reason: String,
}

/// The identity of a measured point, shared by rows and skips of every implementation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PointKey {
    pub family: String,
    pub pass: String,
    pub dtype: String,
    pub head_dim: usize,
    pub causal: bool,
    pub seq_q: usize,
    pub seq_k: usize,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
}

impl Row {
    pub fn key(&self) -> PointKey {
        PointKey {
            family: self.family.clone(),
            pass: self.pass.clone(),
            dtype: self.dtype.clone(),
            head_dim: self.head_dim,
            causal: self.causal,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            batch: self.batch,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
        }
    }
}

impl Skipped {
    pub fn key(&self) -> PointKey {
        PointKey {
            family: self.family.clone(),
            pass: self.pass.clone(),
            dtype: self.dtype.clone(),
            head_dim: self.head_dim,
            causal: self.causal,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            batch: self.batch,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
        }
    }
}

/// One results file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    pub schema: u32,
    /// Where it ran: `cpu: ...` or the GPU name.
    pub device: String,
    pub commit: String,
    pub date: String,
    /// The bandwidth ceiling `bandwidth_pct` refers to, in GB/s (measured copy bandwidth).
    #[serde(default)]
    pub bandwidth_gbs: Option<f64>,
    pub rows: Vec<Row>,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Requested points that could not be built, with the reason.
    #[serde(default)]
    pub bad_points: Vec<String>,
}

impl BenchFile {
    pub fn new(device: String, commit: String, date: String) -> Self {
        BenchFile {
            schema: SCHEMA_VERSION,
            device,
            commit,
            date,
            bandwidth_gbs: None,
            rows: Vec::new(),
            skipped: Vec::new(),
            bad_points: Vec::new(),
        }
    }

    pub fn to_json(&self) -> Result<String, BenchError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    pub fn from_json(text: &str) -> Result<Self, BenchError> {
        let file: BenchFile = serde_json::from_str(text)?;
        if file.schema != SCHEMA_VERSION {
            return Err(BenchError::InvalidArgument {
                arg: "schema",
                reason: format!(
                    "file has schema {}, this tool reads {SCHEMA_VERSION}",
                    file.schema
                ),
            });
        }
        Ok(file)
    }

    pub fn read(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
        Self::from_json(&text).map_err(|e| BenchError::InvalidArgument {
            arg: "merge",
            reason: format!("{}: {e}", path.display()),
        })
    }

    pub fn write(&self, path: &Path) -> Result<(), BenchError> {
        std::fs::write(path, self.to_json()? + "\n").map_err(|e| BenchError::io(path, e))
    }

    /// Append another file's rows, skips and bad points. The device, commit and date of `self`
    /// stay (each `unknown` or empty one is taken from `other`); every row keeps its own.
    pub fn merge(&mut self, other: BenchFile) {
        let missing = |s: &str| s.is_empty() || s == "unknown" || s == "no GPU";
        if missing(&self.commit) && !missing(&other.commit) {
            self.commit = other.commit.clone();
        }
        if missing(&self.device) && !missing(&other.device) {
            self.device = other.device.clone();
        }
        if self.date.is_empty() {
            self.date = other.date.clone();
        }
        self.rows.extend(other.rows);
        self.skipped.extend(other.skipped);
        self.bad_points.extend(other.bad_points);
        if self.bandwidth_gbs.is_none() {
            self.bandwidth_gbs = other.bandwidth_gbs;
        }
    }

    /// Resolve what merged files say twice about a point: a row whose implementation, parameters and
    /// point an earlier row already measured is dropped, so the file given first wins (run_on_gpu.sh
    /// puts the call's own results first and earlier runs after them); a skip of an (implementation,
    /// point) that some row measured is dropped, since the measurement stands (skips carry no
    /// `params`, so they match rows on [`PointKey`]). Returns how many rows and skips were dropped.
    pub fn drop_superseded(&mut self) -> (usize, usize) {
        let (rows, skips) = (self.rows.len(), self.skipped.len());
        let mut seen = BTreeSet::new();
        self.rows
            .retain(|r| seen.insert((r.implementation.clone(), r.params.clone(), r.key())));
        let measured: BTreeSet<(String, PointKey)> = self
            .rows
            .iter()
            .map(|r| (r.implementation.clone(), r.key()))
            .collect();
        self.skipped
            .retain(|s| !measured.contains(&(s.implementation.clone(), s.key())));
        (rows - self.rows.len(), skips - self.skipped.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            implementation: "attn-cpu-ref".into(),
            family: "taylor2".into(),
            params: "a=1,1,0.5 scale=0.125".into(),
            dtype: "f32".into(),
            pass: "fwd_bwd".into(),
            batch: 1,
            heads_q: 8,
            heads_kv: 8,
            seq_q: 1024,
            seq_k: 1024,
            head_dim: 64,
            causal: true,
            ms_median: 12.5,
            ms_min: 11.75,
            tflops: 0.0123,
            tokens_per_s: 81920.0,
            peak_mib: Some(3.5),
            gpu: "cpu: test".into(),
            commit: "abc1234".into(),
            date: "2026-11-23".into(),
            ms_spread: Some(0.25),
            runs: Some(30),
            bytes_moved: Some(1.5e6),
            bandwidth_pct: Some(0.5),
            peak_source: Some("rss_hwm_delta".into()),
            timer: Some("host_clock".into()),
        }
    }

    #[test]
    fn row_has_exactly_the_required_fields_then_the_extras() {
        let v = serde_json::to_value(row()).expect("a row serialises");
        let keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut expected = vec![
            "impl",
            "family",
            "params",
            "dtype",
            "pass",
            "batch",
            "heads_q",
            "heads_kv",
            "seq_q",
            "seq_k",
            "head_dim",
            "causal",
            "ms_median",
            "ms_min",
            "tflops",
            "tokens_per_s",
            "peak_mib",
            "gpu",
            "commit",
            "date",
            "ms_spread",
            "runs",
            "bytes_moved",
            "bandwidth_pct",
            "peak_source",
            "timer",
        ];
        let mut got = keys.clone();
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected);
    }

    #[test]
    fn file_round_trips_through_json() {
        let mut f = BenchFile::new("cpu: test".into(), "abc1234".into(), "2026-11-23".into());
        f.bandwidth_gbs = Some(12.5);
        f.rows.push(row());
        let mut r2 = row();
        r2.implementation = "candle_naive".into();
        r2.peak_mib = None;
        r2.ms_spread = None;
        r2.bytes_moved = None;
        f.rows.push(r2);
        let mut r3 = row();
        r3.implementation = "attn-cuda".into();
        r3.gpu = "NVIDIA H100 80GB HBM3".into();
        r3.peak_source = Some("cuda_pool_used_high".into());
        r3.timer = Some("cuda_event".into());
        f.rows.push(r3);
        f.skipped.push(Skipped {
            implementation: "attn-cuda".into(),
            family: "softmax".into(),
            dtype: "bf16".into(),
            pass: "fwd".into(),
            batch: 16,
            heads_q: 16,
            heads_kv: 16,
            seq_q: 1024,
            seq_k: 1024,
            head_dim: 128,
            causal: false,
            reason: "no GPU".into(),
        });
        f.bad_points.push("softmax N=0: sequence length 0".into());
        let back = BenchFile::from_json(&f.to_json().expect("serialise")).expect("parse");
        assert_eq!(back, f);
    }

    #[test]
    fn minimal_foreign_rows_parse() {
        // A producer that knows only the required fields (as the python scripts may) still merges.
        let text = r#"{"schema":1,"device":"NVIDIA H100 80GB HBM3","commit":"x","date":"2026-11-23",
            "rows":[{"impl":"sdpa_flash","family":"softmax","params":"","dtype":"bf16","pass":"fwd",
            "batch":16,"heads_q":16,"heads_kv":16,"seq_q":1024,"seq_k":1024,"head_dim":128,
            "causal":false,"ms_median":0.5,"ms_min":0.49,"tflops":275.0,"tokens_per_s":3.2e7,
            "peak_mib":null,"gpu":"NVIDIA H100 80GB HBM3","commit":"x","date":"2026-11-23"}]}"#;
        let f = BenchFile::from_json(text).expect("parse");
        assert_eq!(f.rows.len(), 1);
        assert_eq!(f.rows[0].runs, None);
        assert!(f.skipped.is_empty());
    }

    #[test]
    fn merging_fills_an_unknown_commit_and_device() {
        let mut a = BenchFile::new("no GPU".into(), "unknown".into(), "2026-11-23".into());
        let mut b = BenchFile::new(
            "NVIDIA H100 80GB HBM3".into(),
            "abc1234".into(),
            "2026-11-23".into(),
        );
        b.rows.push(row());
        a.merge(b);
        assert_eq!(
            (a.device.as_str(), a.commit.as_str()),
            ("NVIDIA H100 80GB HBM3", "abc1234")
        );
        assert_eq!(a.rows.len(), 1);
        let c = BenchFile::new("cpu: x".into(), "def5678".into(), "2026-11-24".into());
        a.merge(c);
        assert_eq!(a.commit, "abc1234", "a known commit stays");
    }

    #[test]
    fn wrong_schema_is_an_error() {
        let text = r#"{"schema":2,"device":"d","commit":"c","date":"d","rows":[]}"#;
        assert!(BenchFile::from_json(text).is_err());
        assert!(BenchFile::from_json("{").is_err());
    }

    #[test]
    fn the_first_measurement_of_a_point_wins_over_later_merged_ones() {
        let (newer, older, other_params) = (row(), row(), row());
        let mut file = BenchFile::new("dev".into(), "new".into(), "d".into());
        let mut newer = newer;
        newer.ms_median = 1.0;
        let mut older = older;
        older.ms_median = 2.0;
        let mut other_params = other_params;
        other_params.params = "a=1,1,0 scale=0.125".into();
        file.rows = vec![newer, older, other_params];
        assert_eq!(file.drop_superseded(), (1, 0));
        assert_eq!(file.rows.len(), 2);
        assert_eq!(file.rows[0].ms_median, 1.0);
        assert_eq!(file.rows[1].params, "a=1,1,0 scale=0.125");
    }
}
