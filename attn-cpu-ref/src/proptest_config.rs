//! The proptest configuration of this crate's property tests (the unit tests here and the
//! integration tests under `tests/`, which include this file by path).
//!
//! Every runner starts from one fixed seed, so a failure found once is found again on every run and
//! on CI; `PROPTEST_RNG_SEED=<u64>` explores another seed. A failing case is persisted as a seed
//! line under the crate's `proptest-regressions/` (`src/taylor.rs` → `proptest-regressions/taylor.txt`,
//! `tests/softmax.rs` → `proptest-regressions/tests/softmax.txt`); committed, those files replay the
//! case first on every later run, whatever the seed.

use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, RngSeed};

/// The seed of every runner unless `PROPTEST_RNG_SEED` is set.
pub const SEED: u64 = 0x5eed_0047;

/// `cases` cases from the fixed seed (or `PROPTEST_RNG_SEED`) with ChaCha, failures persisted next
/// to the source file (`proptest!` sets it), under `proptest-regressions/`.
pub fn config(cases: u32) -> Config {
    let mut c = Config {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    };
    // Config::default() has already read PROPTEST_RNG_SEED when it is set.
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(SEED);
    }
    c
}

/// [`config`] for a runner outside `proptest!` (which knows no source file): failures persisted in
/// `proptest-regressions/tests/<file>.txt`, `file` being the test binary's source stem.
#[allow(dead_code)]
pub fn config_for_test_file(cases: u32, file: &str) -> Config {
    let path = format!("proptest-regressions/tests/{file}.txt");
    Config {
        // Proptest wants a `&'static str`; one short string per runner, in a test binary.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(Box::leak(
            path.into_boxed_str(),
        )))),
        ..config(cases)
    }
}
