//! `attn-bench check` on arbitrary input bytes: [`attn_bench::check::parse`] (the size limit, the
//! safetensors parser, the shape extraction of `q`, `k`, `v`, `cu_seqlens_*`, `key_lens`, `bias`,
//! `do`, validation), then, for a call small enough to run in a few milliseconds,
//! [`attn_bench::check::check_bytes`] on the CPU reference, in memory (no files). The first byte picks
//! the options (family, layout, causal mask, window); the rest is the file. Every input either is a
//! typed error or runs; a panic is a crash.

#![no_main]

use attn_bench::check::{check_bytes, parse, CheckDevice, CheckOptions};
use attn_bench::grid::FamilyId;
use attn_core::{AttnSpec, Causal, Layout};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

/// Whether the reference runs on a parsed call: its score matrix (B·Hq·Nq·Nk) and its tensors stay
/// small, so that one input takes milliseconds (the parser, not the reference, is what is fuzzed).
fn small(spec: &AttnSpec) -> bool {
    let scores = spec.total_q() as u128 * spec.heads_q() as u128 * spec.seq_k() as u128;
    let elements = (spec.q_len() + spec.k_len() + spec.v_len()) as u128;
    scores * spec.head_dim() as u128 <= 1 << 22 && elements <= 1 << 18
}

/// `ATTN_FUZZ_VERBOSE=1`: print each input's outcome (to see what a corpus reaches).
fn verbose() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("ATTN_FUZZ_VERBOSE").is_some())
}

fuzz_target!(|data: &[u8]| {
    let Some((&opts, file)) = data.split_first() else {
        return;
    };
    let families = FamilyId::ALL;
    let family = families[(opts & 0x7) as usize % families.len()].family();
    let layout = if opts & 0x8 != 0 {
        Layout::Bhnd
    } else {
        Layout::Bnhd
    };
    let causal =
        [Causal::None, Causal::TopLeft, Causal::BottomRight, Causal::None][(opts >> 4 & 0x3) as usize];
    let window = match opts >> 6 {
        0 | 1 => None,
        2 => Some((Some(1), Some(0))),
        _ => Some((Some(2), None)),
    };
    let options = CheckOptions {
        family,
        layout,
        causal,
        window,
        device: CheckDevice::Cpu,
        reference: false,
    };
    let result = parse(file, &options).and_then(|call| {
        if small(&call.spec) {
            check_bytes(file, Path::new("out.safetensors"), &options, "fuzz").map(|(s, _)| s.description)
        } else {
            Ok(format!("parsed, not run: {:?}", call.spec.q_shape()))
        }
    });
    if verbose() {
        eprintln!("{options:?}: {result:?}");
    } else if let Err(e) = result {
        let _ = e.to_string();
    }
});
