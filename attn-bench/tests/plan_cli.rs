//! The `plan`, `info` and `run --summary` commands end to end: the plan JSON the python baselines
//! read, the refusal of shape options on a sectioned preset, and a tiny gpu-smoke run on the CPU
//! whose attn-cuda rows are skipped with the reason (never a zero) and whose summary comes last.

use attn_bench::schema::BenchFile;
use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_attn-bench"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("attn-bench-plan-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn plan_writes_the_points_of_the_selected_sections() {
    let dir = scratch("plan");
    let out = dir.join("plan.json");
    let st = bin()
        .args(["plan", "--preset", "h100", "--sections", "memory,taylor"])
        .args(["--families", "taylor2,softmax", "--out"])
        .arg(&out)
        .status()
        .expect("run attn-bench plan");
    assert!(st.success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("plan written")).expect("json");
    assert_eq!(v["preset"], "h100");
    assert_eq!(v["sections"], serde_json::json!(["taylor", "memory"]));
    let points = v["points"].as_array().expect("points");
    // taylor: taylor2 and softmax, 7 N × 2 causal × 2 passes each (without the flash section no
    // softmax point is already taken); memory: softmax and taylor2.
    assert_eq!(points.len(), 28 + 28 + 2);
    for p in points {
        for key in [
            "section", "family", "dtype", "pass", "batch", "heads_q", "heads_kv", "seq", "head_dim", "causal",
        ] {
            assert!(!p[key].is_null(), "{key} missing in {p}");
        }
    }
    let mem: Vec<_> = points.iter().filter(|p| p["section"] == "memory").collect();
    assert_eq!(mem.len(), 2);
    assert_eq!(mem[0]["seq"], 131_072);
    assert_eq!(mem[1]["seq"], 1_048_576);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shape_options_are_refused_on_a_sectioned_preset_and_unknown_sections_named() {
    let o = bin()
        .args(["plan", "--preset", "h100", "--seq-lens", "1024"])
        .output()
        .expect("run");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--seq-lens") && err.contains("h100"), "{err}");
    let o = bin()
        .args(["plan", "--preset", "h100", "--sections", "flash,speed"])
        .output()
        .expect("run");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown section `speed`") && err.contains("memory"),
        "{err}"
    );
}

#[test]
fn info_names_the_commit_and_the_gpu_or_why_there_is_none() {
    let o = bin().arg("info").output().expect("run");
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    let commit = text
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .expect("a commit line");
    assert!(!commit.trim().is_empty());
    assert!(text.contains("attn-cuda: "), "{text}");
    // The commit can be set from outside (the GPU script passes the binary's to the baselines).
    let o = bin()
        .arg("info")
        .env("ATTN_COMMIT", "feedc0ffee12")
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&o.stdout).contains("commit: feedc0ffee12"));
}

#[test]
fn smoke_run_skips_attn_cuda_with_the_reason_and_prints_the_summary_last() {
    let dir = scratch("smoke");
    let o = bin()
        .args(["run", "--preset", "gpu-smoke", "--sections", "memory"])
        .args(["--families", "taylor1", "--runs", "2", "--warmup", "2"])
        .args([
            "--bandwidth-gbs",
            "10",
            "--no-plots",
            "--summary",
            "--name",
            "smoke",
        ])
        .arg("--out")
        .arg(&dir)
        .env("ATTN_COMMIT", "abc123")
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let tail = &stdout[stdout.find("summary:").expect("a summary")..];
    assert!(
        tail.contains("| taylor1 | fwd_bwd | 32 | yes | 1×2 | 2048 | attn-cpu-ref |"),
        "{tail}"
    );
    assert!(tail.trim_end().ends_with("grid points not built"), "{tail}");

    let file = BenchFile::read(&dir.join("smoke.json")).expect("results");
    assert_eq!(file.commit, "abc123");
    assert_eq!(file.rows.len(), 1);
    let r = &file.rows[0];
    assert_eq!(
        (r.implementation.as_str(), r.commit.as_str()),
        ("attn-cpu-ref", "abc123")
    );
    assert!(r.ms_median > 0.0 && r.tflops > 0.0);
    if let Err(reason) = attn_bench::impls::cuda_device() {
        assert_eq!(file.skipped.len(), 1);
        assert_eq!(file.skipped[0].implementation, "attn-cuda");
        assert!(file.skipped[0].reason.contains(&reason));
    }
    let _ = std::fs::remove_dir_all(dir);
}
