//! Tests of the kernel dispatch: supported combinations, kernel names, tiles, grids and shared memory.
//!
//! Compiled only for `cargo test` (`#[cfg(test)] mod tests;` in dispatch.rs): every `assert!`,
//! `assert_eq!` and `expect` here is a test's check on specs the test itself builds, never reached
//! from a user's call.

use super::*;
use crate::config::Route;
use attn_core::{Aggregation, AttnProblem, Family, HypScore};

fn spec(family: Family, dtype: DType, d: usize) -> AttnSpec {
    AttnProblem::new(family, dtype, 2, 4, 2, 100, 130, d)
        .validate()
        .expect("valid problem")
}

#[test]
fn every_supported_combination_resolves_to_a_named_kernel() {
    for (family, kind) in [
        (Family::softmax(), FamilyKind::Softmax),
        (Family::cosine_sim(), FamilyKind::CosineSim),
        (
            Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint),
            FamilyKind::Hyperbolic,
        ),
        (
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
            FamilyKind::Hyperbolic,
        ),
    ] {
        for &d in head_dims(kind) {
            for dtype in DType::ALL {
                let s = spec(family, dtype, d);
                check_supported(&s, Pass::Forward).expect("supported");
                for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
                    let k = flash_kernel(&s, stage, Hopper::default()).expect("kernel");
                    let stem = format!("attn_{}_{}", s.family().label(), stage.name());
                    assert!(k.name.starts_with(&stem), "{k:?}");
                    assert_eq!(
                        kind == FamilyKind::Hyperbolic,
                        k.module == Module::Hyperbolic,
                        "{k:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn hyperbolic_kernels_carry_their_column_scalars_in_shared_memory() {
    let fam = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    let (h, s) = (
        spec(fam, DType::BF16, 128),
        spec(Family::softmax(), DType::BF16, 128),
    );
    let fwd = |x: &AttnSpec| {
        flash_kernel(x, Stage::Forward, Hopper::default())
            .expect("kernel")
            .smem
    };
    // log γ for two key blocks of 32 keys (k0 takes the cosine norms' slots).
    assert_eq!(fwd(&h), fwd(&s) + 2 * 32 * 4);
    assert_eq!(
        flash_kernel(&h, Stage::Forward, Hopper::default())
            .expect("kernel")
            .name,
        "attn_hyperbolic_sq_lorentz_fwd_bf16_d128"
    );
    let f32 = spec(fam, DType::F32, 64);
    let k = flash_kernel(&f32, Stage::BwdDq, Hopper::default()).expect("kernel");
    assert_eq!(
        (k.module, k.name.as_str()),
        (Module::Hyperbolic, "attn_hyperbolic_sq_lorentz_bwd_dq_f32")
    );
    // One launch over the 4 query heads, then the 2 key heads; blocks for the longer of 100 queries
    // and 130 keys: 4 rows a block in f32 (a warp each), 32 in bf16 at D = 64 (8 a warp).
    let rows = row_kernel(&f32, RowKernel::HypRows);
    assert_eq!(
        (rows.module, rows.name.as_str(), rows.grid),
        (Module::Hyperbolic, "attn_hyp_rows_f32", (33, 6, 2))
    );
    let rows = row_kernel(&spec(fam, DType::BF16, 64), RowKernel::HypRows);
    assert_eq!(rows.grid, (5, 6, 2));
}

const ON: Hopper = Hopper {
    on: true,
    fused: Route::Everywhere,
    ws: Route::Off,
    bwd_ws: false,
    taylor_dense: Route::Measured,
    taylor_wg: Route::Measured,
    hyp_exact: false,
};

#[test]
fn warp_specialised_backward_kernels_unless_turned_off() {
    let ws = Hopper { bwd_ws: true, ..ON };
    let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    for (family, dtype, d, expect) in [
        (Family::softmax(), DType::BF16, 128, true),
        (Family::cosine_sim(), DType::F16, 128, true),
        (Family::softmax(), DType::F16, 64, true),
        (Family::cosine_sim(), DType::BF16, 64, true),
        (hyp, DType::BF16, 128, true),
        (hyp, DType::BF16, 64, true),
    ] {
        let s = spec(family, dtype, d);
        let k = flash_kernel(&s, Stage::BwdDkdv, ws).expect("kernel");
        assert_eq!(k.name.contains("_bwd_dkdv_ws_"), expect, "{k:?}");
        let lorentz = family.kind() == FamilyKind::Hyperbolic;
        if expect {
            // 130 keys → two tiles of 128 per kv head; 384 threads; three stages of Q and dO
            // (64 queries at D = 128 and for the hyperbolic scores, 128 at D = 64) with their
            // LSE, δ and a row of ones (q0).
            let bm = if d == 128 || lorentz { 64 } else { 128 };
            assert_eq!((k.grid, k.threads, k.hopper), ((2, 2, 2), 384, true), "{k:?}");
            // bf16 hyperbolic: a panel of q0's pieces per stage (the tensor-core row sums).
            let panel = if lorentz && dtype == DType::BF16 {
                3 * bm * 128
            } else {
                0
            };
            assert_eq!(
                k.smem,
                1024 + (2 * 128 + 6 * bm) * d * 2 + 9 * bm * 4 + panel,
                "{k:?}"
            );
        } else {
            assert!(k.name.contains("_bwd_dkdv_wg_"), "{k:?}");
        }
        // The dQ kernel for every score: 100 queries → one block of 128 (384 threads); Q, dO, four
        // K and three V stages of 128 (D = 64) or 64 (D = 128) keys, k0 and log γ with each K
        // stage (bf16 hyperbolic: and a panel of k0's pieces, the tensor-core row sums).
        // `ws_backward` off keeps the wgmma kernels.
        let dq = flash_kernel(&s, Stage::BwdDq, ws).expect("kernel");
        assert!(dq.name.contains("_bwd_dq_ws_"), "{dq:?}");
        let bn = if d == 128 { 64 } else { 128 };
        let k0_panel = if lorentz && dtype == DType::BF16 {
            4 * bn * 128
        } else {
            0
        };
        assert_eq!((dq.grid, dq.threads, dq.hopper), ((1, 4, 2), 384, true), "{dq:?}");
        assert_eq!(
            dq.smem,
            1024 + (2 * 128 + 7 * bn) * d * 2 + 8 * bn * 4 + k0_panel,
            "{dq:?}"
        );
        for stage in [Stage::BwdDq, Stage::BwdDkdv] {
            let k = flash_kernel(&s, stage, ON).expect("kernel");
            assert!(k.name.contains("_wg_"), "{k:?}");
        }
    }
    // Other head dims and f32 keep their kernels.
    for (dtype, d) in [(DType::BF16, 96), (DType::F32, 64)] {
        for stage in [Stage::BwdDq, Stage::BwdDkdv] {
            let k = flash_kernel(&spec(Family::softmax(), dtype, d), stage, ws).expect("kernel");
            assert!(!k.name.contains("_ws_") && !k.hopper, "{k:?}");
        }
    }
}

#[test]
fn warp_specialised_forward_where_the_head_dim_allows_unless_turned_off() {
    let ws = Hopper {
        ws: Route::Everywhere,
        ..ON
    };
    let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint);
    for (family, dtype, d) in [
        (Family::softmax(), DType::BF16, 128),
        (Family::cosine_sim(), DType::F16, 128),
        (hyp, DType::BF16, 128),
        (Family::softmax(), DType::F16, 64),
        (hyp, DType::BF16, 64),
    ] {
        let s = spec(family, dtype, d);
        let k = flash_kernel(&s, Stage::Forward, ws).expect("kernel");
        assert!(k.name.contains("_fwd_ws_"), "{k:?}");
        // 100 queries → one block of 128 rows (D = 128: 384 threads) or 192 (D = 64: 512); the
        // wgmma forward's shared memory with 128 keys per stage (plus log γ for the hyperbolic
        // scores).
        // One block per tile (4 heads × 2 batch entries); the other kernels keep their grids.
        let (bm, threads) = if d == 128 { (128, 384) } else { (192, 512) };
        assert_eq!(
            (k.grid, k.threads, k.hopper, k.tiles_q),
            ((8, 1, 1), threads, true, 1),
            "{k:?}"
        );
        let dq = flash_kernel(&s, Stage::BwdDq, ws).expect("kernel");
        assert_eq!((dq.grid, dq.tiles_q), ((1, 4, 2), 0));
        // The scalars hold three stages; the hyperbolic scores add three of log γ, and on bf16 the
        // panels of q0's and −k0's pieces (a 128-byte row per query and per key of two K stages).
        // Two K and two V stages for every score (cosine-sim reads k̂ from the row kernels).
        let lorentz = if matches!(family, Family::Hyperbolic(_)) {
            3 * 128 * 4 + (bm + 2 * 128) * 128
        } else {
            0
        };
        assert_eq!(
            k.smem,
            1024 + (bm + 4 * 128) * d * 2 + (2 * 128 + bm) * 4 + lorentz
        );
        // `ws_forward` governs the forward only (ON: no warp-specialised backward); with
        // `Route::Off`, the wgmma forward.
        let dq = flash_kernel(&s, Stage::BwdDq, ws).expect("kernel");
        assert!(dq.name.contains("_bwd_dq_wg_"), "{dq:?}");
        let k = flash_kernel(&s, Stage::Forward, ON).expect("kernel");
        assert!(k.name.contains("_fwd_wg_"), "{k:?}");
    }
    // By default: D = 128 every call; D = 64 the geodesic score, and without a causal mask or
    // window cosine-sim and squared Lorentz on bf16 (its q0·k0 panels) at every length, the other
    // scores from 8192 keys; causal, squared Lorentz on bf16 from 16384 keys.
    let measured = Hopper {
        ws: Route::Measured,
        ..ON
    };
    let geo = Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean);
    let causal = |family: Family, d: usize| {
        AttnProblem::new(family, DType::BF16, 2, 4, 2, 100, 130, d)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid problem")
    };
    let long = |family: Family, d: usize| {
        AttnProblem::new(family, DType::BF16, 1, 2, 2, 100, 8192, d)
            .validate()
            .expect("valid problem")
    };
    for (family, d, kind) in [
        (Family::softmax(), 128, "ws"),
        (Family::cosine_sim(), 128, "ws"),
        (geo, 128, "ws"),
        (geo, 64, "ws"),
        (Family::softmax(), 64, "wg"),
        (Family::cosine_sim(), 64, "ws"),
        (hyp, 64, "ws"),
    ] {
        let k = flash_kernel(&spec(family, DType::BF16, d), Stage::Forward, measured).expect("kernel");
        assert!(
            k.name.contains(&format!("_fwd_{kind}_")),
            "{family:?} D = {d}: {k:?}"
        );
        let k = flash_kernel(&causal(family, d), Stage::Forward, measured).expect("kernel");
        let kind = if d == 128 || family == geo { "ws" } else { "wg" };
        assert!(
            k.name.contains(&format!("_fwd_{kind}_")),
            "causal {family:?} D = {d}: {k:?}"
        );
    }
    for family in [Family::softmax(), hyp] {
        let k = flash_kernel(&long(family, 64), Stage::Forward, measured).expect("kernel");
        assert!(k.name.contains("_fwd_ws_"), "{k:?}");
    }
    // f16 squared Lorentz (no panels) keeps softmax's rule; causal bf16 takes the warp-specialised
    // kernel from 16384 keys.
    let k = flash_kernel(&spec(hyp, DType::F16, 64), Stage::Forward, measured).expect("kernel");
    assert!(k.name.contains("_fwd_wg_"), "{k:?}");
    for (n, kind) in [(8192, "wg"), (16384, "ws")] {
        let s = AttnProblem::new(hyp, DType::BF16, 1, 2, 2, n, n, 64)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid problem");
        let k = flash_kernel(&s, Stage::Forward, measured).expect("kernel");
        assert!(k.name.contains(&format!("_fwd_{kind}_")), "causal N = {n}: {k:?}");
    }
    // D = 96 has only the mma.sync forward.
    let k = flash_kernel(&spec(Family::softmax(), DType::BF16, 96), Stage::Forward, ws).expect("kernel");
    assert!(!k.name.contains("_ws_") && !k.hopper, "{k:?}");
}

#[test]
fn hopper_forward_where_the_device_and_head_dim_allow() {
    let hyp = Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint);
    for (family, d, dtype, wg) in [
        (Family::softmax(), 128, DType::BF16, true),
        (Family::cosine_sim(), 64, DType::F16, true),
        (hyp, 64, DType::BF16, true),
        (Family::softmax(), 96, DType::BF16, false),
        (Family::softmax(), 256, DType::F16, false),
        (Family::softmax(), 64, DType::F32, false),
    ] {
        let s = spec(family, dtype, d);
        let k = flash_kernel(&s, Stage::Forward, ON).expect("kernel");
        assert_eq!(k.name.contains("_fwd_wg_"), wg, "{k:?}");
        assert_eq!(
            (k.threads, k.hopper),
            if wg { (256, true) } else { (128, false) },
            "{k:?}"
        );
        if wg {
            // 100 queries → one block of 128; the Einstein midpoint's log γ rides along.
            assert_eq!(k.grid, (1, 4, 2));
            let hyp = matches!(family, Family::Hyperbolic(_));
            let bn = if d == 64 { 64 } else { 128 };
            let lorentz = if hyp { 2 * bn * 4 } else { 0 };
            assert_eq!(
                k.smem,
                1024 + (128 + 4 * bn) * d * 2 + (2 * bn + 128) * 4 + lorentz,
                "{k:?}"
            );
        }
        // The backward likewise: dQ over 100 queries in one block of 128, dK/dV over 130 keys in
        // two of 128.
        let dq = flash_kernel(&s, Stage::BwdDq, ON).expect("kernel");
        let dkdv = flash_kernel(&s, Stage::BwdDkdv, ON).expect("kernel");
        assert_eq!(dq.name.contains("_bwd_dq_wg_"), wg, "{dq:?}");
        assert_eq!(dkdv.name.contains("_bwd_dkdv_wg_"), wg, "{dkdv:?}");
        if wg {
            // dQ: 128 keys per streamed block at D = 64, 64 at D = 128; dK/dV: 128 queries per
            // streamed block at D = 64, 64 at D = 128.
            let (bn, bm) = if d == 64 { (128, 128) } else { (64, 64) };
            assert_eq!((dq.grid, dq.threads, dq.hopper), ((1, 4, 2), 256, true));
            assert_eq!(dq.smem, 1024 + (2 * 128 + 5 * bn) * d * 2 + 6 * bn * 4);
            assert_eq!((dkdv.grid, dkdv.threads), ((2, 2, 2), 256));
            assert_eq!(dkdv.smem, 1024 + (2 * 128 + 4 * bm) * d * 2 + 6 * bm * 4);
        }
        // Without the Hopper kernels, the mma.sync kernels.
        for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
            let k = flash_kernel(&s, stage, Hopper::default()).expect("kernel");
            assert!(!k.name.contains("_wg_"), "{k:?}");
        }
    }
}

#[test]
fn fused_backward_only_where_it_is_exact_and_allowed() {
    let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    let geo = Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint);
    // (family, dtype, d, the fused kernel with the warp-specialised kernels on, with the wgmma ones only)
    for (family, dtype, d, ws, wg) in [
        (Family::softmax(), DType::BF16, 128, Some("ws"), true),
        (Family::cosine_sim(), DType::F16, 128, Some("ws"), true),
        (Family::softmax(), DType::BF16, 64, Some("ws"), false),
        (Family::cosine_sim(), DType::BF16, 64, Some("ws"), false),
        (Family::softmax(), DType::BF16, 96, None, false),
        (Family::softmax(), DType::F32, 64, None, false),
        (Family::softmax(), DType::F32, 128, None, false),
        // The hyperbolic scores: the warp-specialised fused kernel at D = 64 and 128; the wgmma one at 128.
        (hyp, DType::BF16, 64, Some("ws"), false),
        (geo, DType::F16, 64, Some("ws"), false),
        (hyp, DType::BF16, 128, Some("ws"), true),
        (geo, DType::BF16, 128, Some("ws"), true),
        (hyp, DType::BF16, 96, None, false),
        (hyp, DType::F32, 128, None, false),
    ] {
        let s = spec(family, dtype, d);
        let ws_on = Hopper { bwd_ws: true, ..ON };
        assert_eq!(
            fused_backward(&s, ws_on),
            ws.is_some(),
            "{family:?} {dtype:?} {d}"
        );
        assert_eq!(fused_backward(&s, ON), wg, "{family:?} {dtype:?} {d}");
        let lorentz = family.kind() == FamilyKind::Hyperbolic;
        for (hopper, kind) in [(ws_on, ws), (ON, wg.then_some("wg"))] {
            let k = flash_kernel(&s, Stage::BwdFused, hopper);
            assert_eq!(k.is_ok(), kind.is_some(), "{k:?}");
            assert_eq!(fused_dq_tiled(&s, hopper), kind == Some("ws"));
            let Ok(k) = k else { continue };
            if kind == Some("ws") {
                assert!(k.name.contains("_bwd_fused_ws_"), "{k:?}");
                // 130 keys → two tiles of 128 per kv head; a producer warpgroup beside the two.
                assert_eq!((k.grid, k.threads), ((2, 2, 2), 384));
                // The hyperbolic scores' tile: 64 queries at D = 64 too (LorentzWsDkvTile).
                let bm = if d == 128 || lorentz { 64 } else { 128 };
                // bf16 hyperbolic (the geodesic at D = 64 only): a panel of the keys' k0 pieces (dQ's
                // row sums in the dQ product) whose other chunks hold q0's pieces per stage (the
                // tensor-core row sums of dK).
                let squared = matches!(
                    s.family(),
                    FamilySpec::Hyperbolic {
                        score: HypScore::SquaredLorentz,
                        ..
                    }
                );
                let panel = if lorentz && dtype == DType::BF16 && (d == 64 || squared) {
                    128 * 128
                } else {
                    0
                };
                assert_eq!(
                    k.smem,
                    1024 + (2 * 128 + 4 * bm) * d * 2
                        + 2 * 128 * bm * 2
                        + 6 * bm * 4
                        + 8 * 16 * 64 * 4
                        + panel
                );
            } else {
                assert!(k.name.contains("_bwd_fused_wg_"), "{k:?}");
                // dS'ᵀ of a 64-query block and ‖q‖ ride along.
                assert_eq!((k.grid, k.threads), ((2, 2, 2), 256));
                assert_eq!(
                    k.smem,
                    1024 + (2 * 128 + 4 * 64) * d * 2 + 6 * 64 * 4 + 128 * 64 * 2 + 2 * 64 * 4
                );
            }
        }
    }
    let s = spec(Family::softmax(), DType::BF16, 128);
    let det = AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 100, 130, 128)
        .with_deterministic(true)
        .validate()
        .expect("valid problem");
    let bias = AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 100, 130, 128)
        .with_bias(1, 4)
        .validate()
        .expect("valid problem");
    assert!(!fused_backward(&det, ON) && !fused_backward(&bias, ON));
    for off in [
        Hopper::default(),
        Hopper {
            fused: Route::Off,
            ..ON
        },
    ] {
        assert!(!fused_backward(&s, off), "{off:?}");
    }
    // The default mode: the warp-specialised fused kernel only (softmax, cosine-sim, the hyperbolic
    // scores), never the wgmma one.
    let default = Hopper {
        fused: Route::Measured,
        bwd_ws: true,
        ..ON
    };
    let (hyp64, hyp128) = (spec(hyp, DType::BF16, 64), spec(hyp, DType::BF16, 128));
    assert!(
        fused_dq_tiled(&s, default) && fused_dq_tiled(&hyp64, default) && fused_dq_tiled(&hyp128, default)
    );
    assert!(!fused_backward(
        &s,
        Hopper {
            bwd_ws: false,
            ..default
        }
    ));
    assert!(!fused_backward(&det, default) && !fused_backward(&bias, default));
}

#[test]
fn every_tile_fast_calls_take_the_even_fused_kernel() {
    let hopper = Hopper {
        fused: Route::Measured,
        bwd_ws: true,
        ..ON
    };
    let problem = |family, dtype, d, nq, nk| AttnProblem::new(family, dtype, 2, 4, 2, nq, nk, d);
    let sq = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    let sq_mid = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint);
    let geo = Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean);
    let name = |p: AttnProblem, hopper| {
        let s = p.validate().expect("valid problem");
        flash_kernel(&s, Stage::BwdFused, hopper).expect("kernel")
    };
    // Lengths multiples of 128, no mask, Euclidean aggregation: the 128-query tile.
    let k = name(problem(sq, DType::BF16, 64, 256, 384), hopper);
    assert_eq!(k.name, "attn_hyperbolic_sq_lorentz_bwd_fused_ws_even_bf16_d64");
    assert_eq!((k.grid, k.threads), ((3, 2, 2), 384));
    // 1 KiB of slack, K, V, two stages of Q and dO, two dS'ᵀ tiles, the scalars, dQ's rows and the k0
    // panel: 217 088 bytes, within the 227 KiB a block may have.
    assert_eq!(k.smem, 217_088);
    assert_eq!(
        k.smem,
        heuristics::ws_fused_smem(heuristics::WS_FUSED_EVEN_TILE, 64, 2, true)
    );
    // Packed sequences and key padding whose every length is a multiple of 128 qualify too.
    let packed = problem(sq, DType::BF16, 64, 256, 256).with_varlen(vec![0, 128, 384], vec![0, 256, 384]);
    assert!(name(packed, hopper).name.contains("_even_"));
    let padded = problem(sq, DType::BF16, 64, 256, 384).with_key_lens(vec![256, 128]);
    assert!(name(padded, hopper).name.contains("_even_"));
    // Anything that masks an element or leaves a partial tile, another score, dtype or head dim: the
    // general fused kernel.
    for (p, hopper) in [
        (
            problem(sq, DType::BF16, 64, 256, 384).with_causal(Causal::TopLeft),
            hopper,
        ),
        (
            problem(sq, DType::BF16, 64, 256, 384).with_window(Some(64), None),
            hopper,
        ),
        (problem(sq, DType::BF16, 64, 256, 320), hopper),
        (problem(sq, DType::BF16, 64, 200, 384), hopper),
        (
            problem(sq, DType::BF16, 64, 256, 384).with_key_lens(vec![256, 100]),
            hopper,
        ),
        (problem(sq, DType::F16, 64, 256, 384), hopper),
        (problem(sq, DType::BF16, 128, 256, 384), hopper),
        (problem(geo, DType::BF16, 64, 256, 384), hopper),
        (problem(sq_mid, DType::BF16, 64, 256, 384), hopper),
    ] {
        let k = name(p, hopper);
        assert!(!k.name.contains("_even"), "{k:?}");
        assert!(k.name.contains("_bwd_fused_ws_"), "{k:?}");
    }
}

#[test]
fn the_wgmma_forward_forms_q0_and_its_row_kernel_reads_only_keys() {
    let hopper = Hopper {
        ws: Route::Measured,
        ..ON
    };
    let sq = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    let causal = AttnProblem::new(sq, DType::BF16, 2, 4, 2, 100, 130, 64)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid problem");
    // Causal at D = 64 below 16384 keys: the wgmma forward, which forms q0 from its Q tile.
    let k = flash_kernel(&causal, Stage::Forward, hopper).expect("kernel");
    assert!(k.name.contains("_fwd_wg_"), "{k:?}");
    assert!(forward_forms_q0(&causal, &k));
    let rows = row_kernel(&causal, RowKernel::HypRowsKeys);
    // The 2 key heads only: 130 keys at 32 rows a block.
    assert_eq!(
        (rows.name.as_str(), rows.grid),
        ("attn_hyp_rows_k_bf16", (5, 2, 2))
    );
    // Without a mask the warp-specialised forward (q0's panels from the row kernel), and off Hopper
    // the mma.sync forward: both read q0.
    let dense = spec(sq, DType::BF16, 64);
    let ws = flash_kernel(&dense, Stage::Forward, hopper).expect("kernel");
    assert!(
        ws.name.contains("_fwd_ws_") && !forward_forms_q0(&dense, &ws),
        "{ws:?}"
    );
    let simt = flash_kernel(&causal, Stage::Forward, Hopper::default()).expect("kernel");
    assert!(!forward_forms_q0(&causal, &simt), "{simt:?}");
    // Softmax's wgmma forward has no q0.
    let soft = AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 100, 130, 64)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid problem");
    let k = flash_kernel(&soft, Stage::Forward, hopper).expect("kernel");
    assert!(!forward_forms_q0(&soft, &k));
}

#[test]
fn grids_cover_tails_and_split_columns() {
    let s = spec(Family::softmax(), DType::BF16, 256);
    assert_eq!(
        flash_kernel(&s, Stage::Forward, Hopper::default())
            .expect("kernel")
            .grid,
        (2, 4, 2)
    );
    // 130 keys → 3 key tiles of 64, two column blocks each, one block per kv head.
    assert_eq!(
        flash_kernel(&s, Stage::BwdDkdv, Hopper::default())
            .expect("kernel")
            .grid,
        (6, 2, 2)
    );
    let f = spec(Family::softmax(), DType::F32, 64);
    assert_eq!(
        flash_kernel(&f, Stage::BwdDq, Hopper::default())
            .expect("kernel")
            .grid,
        (25, 4, 2)
    );
}

#[test]
fn unsupported_combinations_are_typed_errors() {
    let bad_dim = spec(Family::softmax(), DType::BF16, 48);
    assert!(matches!(
        check_supported(&bad_dim, Pass::Forward),
        Err(AttnError::Unsupported { .. })
    ));
    let softmax16 = spec(Family::softmax(), DType::F16, 16);
    assert!(matches!(
        check_supported(&softmax16, Pass::Forward),
        Err(AttnError::Unsupported { .. })
    ));
    let taylor = spec(Family::taylor(2), DType::F32, 64);
    assert!(matches!(
        check_supported(&taylor, Pass::Backward),
        Err(AttnError::Unsupported { .. })
    ));
    let flat = Family::Hyperbolic(attn_core::HyperbolicParams {
        score: HypScore::Geodesic,
        curvature: 1e-20,
        ..Default::default()
    });
    let err = check_supported(&spec(flat, DType::BF16, 64), Pass::Forward).expect_err("tiny c");
    assert!(err.to_string().contains("curvature"), "{err}");
    let hyp48 = spec(
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
        DType::BF16,
        48,
    );
    assert!(check_supported(&hyp48, Pass::Forward)
        .expect_err("no D = 48")
        .to_string()
        .contains("hyperbolic head dim 48"));
    let dv = AttnProblem::new(Family::softmax(), DType::BF16, 1, 1, 1, 8, 8, 64)
        .with_head_dim_v(32)
        .validate()
        .expect("valid problem");
    let err = check_supported(&dv, Pass::Forward).expect_err("Dv != D");
    assert!(err.to_string().contains("value head dim 32"), "{err}");
}

#[test]
fn taylor_order_2_runs_on_the_hopper_flash_kernels_where_routed() {
    use crate::taylor::dense_on_flash;
    let hopper = Hopper {
        bwd_ws: true,
        fused: Route::Measured,
        ..ON
    };
    let taylor = |order: u8, dtype: DType, d: usize, n: usize, causal: Causal| {
        AttnProblem::new(Family::taylor(order), dtype, 1, 4, 2, n, n, d)
            .with_causal(causal)
            .validate()
            .expect("valid problem")
    };
    for d in [64, 128] {
        let s = taylor(2, DType::BF16, d, 1000, Causal::None);
        assert!(dense_on_flash(&s, Pass::Forward, hopper));
        assert!(dense_on_flash(&s, Pass::Backward, hopper));
        check_supported(&s, Pass::Forward).expect("supported");
        let fwd = flash_kernel(&s, Stage::Forward, hopper).expect("kernel");
        assert_eq!(fwd.module, Module::TaylorFlash);
        assert!(fwd.name.starts_with("attn_taylor2_fwd_"), "{fwd:?}");
        // Deterministic by default (no fused backward): the warp-specialised dQ and dK/dV pair.
        assert!(!fused_backward(&s, hopper));
        assert!(flash_kernel(&s, Stage::BwdFused, hopper).is_err());
        for (stage, stem) in [(Stage::BwdDq, "bwd_dq_ws"), (Stage::BwdDkdv, "bwd_dkdv_ws")] {
            let k = flash_kernel(&s, stage, hopper).expect("kernel");
            assert_eq!(k.name, format!("attn_taylor2_{stem}_bf16_d{d}"));
        }
        // No Hopper kernels: a typed error, never an mma.sync kernel that does not exist.
        assert!(flash_kernel(&s, Stage::Forward, Hopper::default()).is_err());
        let no_ws = Hopper {
            bwd_ws: false,
            ..hopper
        };
        assert!(flash_kernel(&s, Stage::BwdDq, no_ws).is_err());
        assert!(!dense_on_flash(&s, Pass::Backward, no_ws));
        assert!(dense_on_flash(&s, Pass::Forward, no_ws));
    }
    // Where the state kernels run instead.
    for s in [
        taylor(1, DType::BF16, 64, 1000, Causal::None),
        taylor(2, DType::F32, 64, 1000, Causal::None),
        taylor(2, DType::BF16, 32, 1000, Causal::None),
        taylor(2, DType::BF16, 64, 32769, Causal::None),
        taylor(2, DType::BF16, 64, 65537, Causal::BottomRight),
        taylor(2, DType::BF16, 128, 131_073, Causal::None),
    ] {
        assert!(!dense_on_flash(&s, Pass::Forward, hopper), "{:?}", s.family());
    }
    assert!(check_supported(&taylor(1, DType::BF16, 64, 100, Causal::None), Pass::Forward).is_err());
    // The length rule: 32768 keys per query at D = 64 (half the keys causal), 131072 at D = 128 (a
    // forward at D = 64 without a causal mask takes the wgmma state kernels from 4096 keys instead).
    for (d, n, causal, pass) in [
        (64, 32768, Causal::None, Pass::Backward),
        (64, 2048, Causal::None, Pass::Forward),
        (64, 4096, Causal::TopLeft, Pass::Forward),
        (64, 65536, Causal::TopLeft, Pass::Backward),
        (128, 131_072, Causal::None, Pass::Forward),
    ] {
        assert!(dense_on_flash(
            &taylor(2, DType::BF16, d, n, causal),
            pass,
            hopper
        ));
    }
    // The wgmma state forward: order 2, bf16, D = 64, from 4096 keys without a causal mask and from
    // 8192 with one where every sequence has as many queries as keys.
    use crate::taylor::wg_forward;
    let wg = taylor(2, DType::BF16, 64, 4096, Causal::None);
    assert!(wg_forward(&wg, hopper));
    assert!(!dense_on_flash(&wg, Pass::Forward, hopper));
    assert!(dense_on_flash(&wg, Pass::Backward, hopper));
    let causal_nn = |n: usize| {
        AttnProblem::new(Family::taylor(2), DType::BF16, 2, 4, 2, n, n, 64).with_causal(Causal::TopLeft)
    };
    for s in [
        taylor(2, DType::BF16, 64, 8192, Causal::BottomRight),
        taylor(2, DType::BF16, 64, 8192, Causal::TopLeft),
        causal_nn(9000)
            .with_varlen(vec![0, 9000, 9100], vec![0, 9000, 9100])
            .validate()
            .expect("valid"),
    ] {
        assert!(wg_forward(&s, hopper), "{s:?}");
        assert!(!dense_on_flash(&s, Pass::Forward, hopper));
    }
    for s in [
        taylor(2, DType::BF16, 64, 4095, Causal::None),
        taylor(2, DType::BF16, 64, 8191, Causal::TopLeft),
        taylor(2, DType::F16, 64, 8192, Causal::None),
        taylor(2, DType::BF16, 128, 8192, Causal::None),
        taylor(1, DType::BF16, 64, 8192, Causal::None),
        // A causal mask with Nq ≠ Nk, key padding, or packed sequences whose query and key offsets differ.
        AttnProblem::new(Family::taylor(2), DType::BF16, 1, 4, 2, 8000, 8192, 64)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid"),
        causal_nn(8192)
            .with_key_lens(vec![8192, 8000])
            .validate()
            .expect("valid"),
        AttnProblem::new(Family::taylor(2), DType::BF16, 2, 4, 2, 9000, 9001, 64)
            .with_causal(Causal::TopLeft)
            .with_varlen(vec![0, 9000, 9100], vec![0, 9000, 9101])
            .validate()
            .expect("valid"),
    ] {
        assert!(!wg_forward(&s, hopper), "{s:?}");
    }
    assert!(!wg_forward(&wg, Hopper::default()));
    let wg_off = Hopper {
        taylor_wg: Route::Off,
        ..hopper
    };
    let wg_all = Hopper {
        taylor_wg: Route::Everywhere,
        ..hopper
    };
    assert!(!wg_forward(&wg, wg_off) && dense_on_flash(&wg, Pass::Forward, wg_off));
    let tiny = taylor(2, DType::BF16, 64, 100, Causal::None);
    assert!(wg_forward(&tiny, wg_all) && !dense_on_flash(&tiny, Pass::Forward, wg_all));
    // `taylor_dense`: `Off` never, `Everywhere` at every length.
    let long = taylor(2, DType::BF16, 64, 40_000, Causal::None);
    let short = taylor(2, DType::BF16, 64, 100, Causal::None);
    let off = Hopper {
        taylor_dense: Route::Off,
        ..hopper
    };
    let all = Hopper {
        taylor_dense: Route::Everywhere,
        ..hopper
    };
    assert!(!dense_on_flash(&short, Pass::Forward, off));
    assert!(dense_on_flash(&long, Pass::Forward, all));
}

#[test]
fn hyperbolic_exact_runs_f16_and_bf16_hyperbolic_calls_on_the_simt_kernels() {
    let geo = Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint);
    let sq = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
    let exact = Hopper {
        bwd_ws: true,
        hyp_exact: true,
        ..ON
    };
    for (family, dtype, suffix) in [
        (geo, DType::BF16, "exact_bf16"),
        (sq, DType::F16, "exact_f16"),
        (sq, DType::F32, "f32"),
    ] {
        let s = spec(family, dtype, 64);
        assert!(
            simt(&s, exact) && !fused_backward(&s, exact),
            "{family:?} {dtype:?}"
        );
        for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
            let k = flash_kernel(&s, stage, exact).expect("a SIMT kernel");
            let want = format!("attn_{}_{}_{suffix}", s.family().label(), stage.name());
            assert_eq!(k.name, want);
            assert_eq!((k.module, k.hopper, k.smem), (Module::Hyperbolic, false, 0));
        }
        assert!(flash_kernel(&s, Stage::BwdFused, exact).is_err());
    }
    // The other families, and hyperbolic calls without the switch, keep their kernels.
    let soft = spec(Family::softmax(), DType::BF16, 64);
    assert!(!simt(&soft, exact));
    assert!(!flash_kernel(&soft, Stage::Forward, exact)
        .expect("the flash forward")
        .name
        .contains("exact"));
    let geo_tc = spec(geo, DType::BF16, 64);
    let tc = Hopper {
        hyp_exact: false,
        ..exact
    };
    assert!(!simt(&geo_tc, tc) && fused_backward(&geo_tc, tc));
}
