//! `attn-bench check` on arbitrary input files: the safetensors parser, the shape extraction
//! (`q`, `k`, `v`, `cu_seqlens_*`, `key_lens`, `bias`, `do`), validation, and the CPU reference on
//! whatever validates. The first byte picks the options (family, layout, causal mask, window); the
//! rest is the file. Every input either is a typed error or writes an output file; a panic is a
//! crash.
//!
//! `check` reads and writes paths, so each input goes through a file in a per-process scratch
//! folder (tmpfs on CI's machine).

#![no_main]

use attn_bench::check::{check, CheckDevice, CheckOptions};
use attn_bench::grid::FamilyId;
use attn_core::{Causal, Layout};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("attn-fuzz-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzzer's scratch folder");
        dir
    })
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
    let input = scratch().join("in.safetensors");
    let output = scratch().join("out.safetensors");
    std::fs::write(&input, file).expect("write the input to the scratch folder");
    let result = check(&input, &output, &options, "fuzz");
    if verbose() {
        eprintln!("{options:?}: {:?}", result.map(|s| s.description));
    } else if let Err(e) = result {
        let _ = e.to_string();
    }
});
