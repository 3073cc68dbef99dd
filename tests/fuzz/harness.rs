//! The fuzz harness the property tests share (`tests/fuzz_inputs.rs`, and
//! the bag readers' in `crates/bagtools/tests/bag_fuzz.rs`): [`fuzz`] runs
//! a reader on `SELECTINFER_FUZZ_CASES` inputs under a hang watchdog and a
//! peak-RSS bound, [`clear`] is what a reader's error must say, [`inputs`]
//! the inputs (noise, byte edits of valid files, JSON edits).

/// Fails the case with a message unless `cond` holds.
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

use super::mutate::{apply, edits, json_edits, noise, Edit, JsonEdit, Noise};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use std::fmt::Debug;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Inputs per reader: `SELECTINFER_FUZZ_CASES`, default 256.
pub fn cases() -> u32 {
    std::env::var("SELECTINFER_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

/// Peak RSS a case may reach: the fixtures are tiny, the largest
/// legitimate allocation a reader makes from a header is 256 MiB.
const RSS_LIMIT: u64 = 1 << 30;

/// Held while a case runs (see the peak RSS check).
static ONE_CASE: Mutex<()> = Mutex::new(());

/// Runs `test` on `cases()` inputs of `strategy`; a failure (an assertion
/// or a panic) shrinks to a minimal input and fails the test with it.
/// `test` answers whether the input was accepted (read without error).
/// Prints the count of inputs tried and of those accepted.
pub fn fuzz<S: Strategy>(reader: &str, strategy: S, test: impl Fn(S::Value) -> Result<bool, String>)
where
    S::Value: Debug,
{
    // Each run explores new inputs; SELECTINFER_FUZZ_SEED replays one.
    let seed = std::env::var("SELECTINFER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 512,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    });
    // A watchdog for hangs: the input of a case running over 120 s is
    // printed and the process aborted (a hang would never report itself).
    let current = Arc::new(Mutex::new(String::new()));
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let watchdog = {
        let (current, started, done) = (current.clone(), started.clone(), done.clone());
        let reader = reader.to_string();
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let s = started.load(Ordering::SeqCst);
                if s > 0 && (t0.elapsed().as_millis() as u64).saturating_sub(s) > 120_000 {
                    eprintln!(
                        "fuzz {reader}: a case ran over 120 s (hang) on {} (seed {seed})",
                        current.lock().unwrap()
                    );
                    std::process::abort();
                }
            }
        })
    };
    let (tried, accepted) = (AtomicU64::new(0), AtomicU64::new(0));
    // An allocation failure aborts at once: SELECTINFER_FUZZ_TRACE=1 prints
    // each input first, so the last one printed is the culprit.
    let trace = std::env::var_os("SELECTINFER_FUZZ_TRACE").is_some();
    let result = runner.run(&strategy, |v| {
        // One case at a time in the whole process, so that a peak RSS
        // belongs to the case that made it.
        let _one = ONE_CASE.lock().unwrap_or_else(|e| e.into_inner());
        *current.lock().unwrap() = format!("{v:?}");
        if trace {
            eprintln!("fuzz {reader} input: {v:?}");
        }
        started.store(t0.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
        tried.fetch_add(1, Ordering::Relaxed);
        // Linux: "5" resets the process's peak RSS.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let r = test(v).and_then(|ok| {
            let peak = selectinfer::sys::memory::peak_rss_bytes();
            check!(
                peak <= RSS_LIMIT,
                "peak RSS {} MiB (a length read from the input allocated?)",
                peak >> 20
            );
            accepted.fetch_add(ok as u64, Ordering::Relaxed);
            Ok(())
        });
        let r = r.map_err(TestCaseError::fail);
        started.store(0, Ordering::SeqCst);
        r
    });
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    if let Err(e) = result {
        panic!("fuzz {reader}: {e} (replay: SELECTINFER_FUZZ_SEED={seed})");
    }
    println!(
        "fuzz {reader}: {} inputs, 0 panics ({} accepted, {:.1} s, seed {seed})",
        tried.load(Ordering::Relaxed),
        accepted.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64()
    );
}

/// What a file reader must answer: Ok, or an error whose message names
/// the file.
pub fn clear<T>(r: &anyhow::Result<T>, file: &Path) -> Result<(), String> {
    match r {
        Ok(_) => Ok(()),
        Err(e) => {
            let msg = format!("{e:#}");
            let name = file.file_name().unwrap().to_string_lossy();
            if msg.contains(name.as_ref()) {
                Ok(())
            } else {
                Err(format!("the error does not name {name}: {msg}"))
            }
        }
    }
}

/// One input for a file reader.
#[derive(Debug, Clone)]
pub enum Input {
    Noise(Noise),
    /// Byte edits of valid file number `.0`.
    Bytes(usize, Vec<Edit>),
    /// Edits of the JSON header (`.0 == 0`) or of the JSON document inside
    /// it (`.0 == 1`); with `.1` the header's sizes are made to agree with
    /// the edited shapes (wrapping), so the reader's deeper checks run.
    Json(usize, bool, Vec<JsonEdit>),
}

/// Noise, byte edits of `valid` files and, for `json` > 0, JSON edits.
pub fn inputs(valid: usize, json: usize) -> BoxedStrategy<Input> {
    let bytes = prop_oneof![
        1 => noise().prop_map(Input::Noise),
        3 => (0..valid, edits()).prop_map(|(i, e)| Input::Bytes(i, e)),
    ];
    if json == 0 {
        return bytes.boxed();
    }
    prop_oneof![
        4 => bytes,
        3 => (0..json, any::<bool>(), json_edits()).prop_map(|(i, c, e)| Input::Json(i, c, e)),
    ]
    .boxed()
}

/// `r` is an error naming `file` and saying `what`.
pub fn refused<T>(r: anyhow::Result<T>, file: &Path, what: &str) {
    let Err(e) = r else {
        panic!("{} was accepted", file.display())
    };
    let msg = format!("{e:#}");
    let name = file.file_name().unwrap().to_string_lossy();
    assert!(msg.contains(name.as_ref()) && msg.contains(what), "{msg}");
}

/// The bytes of a binary file reader's `input`.
pub fn file_bytes(valid: &[Vec<u8>], magic: &[u8], input: &Input) -> Vec<u8> {
    match input {
        Input::Noise(n) => n.bytes(magic),
        Input::Bytes(i, e) => apply(&valid[*i], e),
        Input::Json(..) => unreachable!("no JSON in this format"),
    }
}
