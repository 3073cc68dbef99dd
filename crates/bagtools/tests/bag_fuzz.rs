//! Property/fuzz tests of the rosbag2 readers (MCAP, sqlite3, a bag
//! folder's metadata.yaml), with the product's fuzz harness
//! (`tests/fuzz/harness.rs`: hang watchdog, peak-RSS bound,
//! `SELECTINFER_FUZZ_CASES` inputs per reader, `SELECTINFER_FUZZ_SEED` to
//! replay): each reader answers Ok with the messages in time order or an
//! error naming the file, never panics, hangs or allocates from an
//! unchecked length. Plus the fuzz-found MCAP input, kept as a fixed case.

#[macro_use]
#[allow(dead_code)]
#[path = "../../../tests/fuzz/harness.rs"]
mod harness;
#[path = "fixtures/bags.rs"]
mod bags;
#[allow(dead_code)]
#[path = "../../../tests/fuzz/mutate.rs"]
mod mutate;

use harness::{clear, file_bytes, fuzz, inputs, refused};
use selectinfer_bagtools::bag::read_bag;
use std::path::Path;

/// Reads bag `path` (a file or a folder): Ok with messages in time order,
/// or an error naming `file`.
fn check_bag(path: &Path, file: &Path) -> Result<bool, String> {
    let r = read_bag(path);
    clear(&r, file)?;
    let Ok(m) = r else { return Ok(false) };
    check!(
        m.windows(2).all(|w| w[0].time_ns <= w[1].time_ns),
        "messages out of time order"
    );
    Ok(true)
}

#[test]
fn bag_reader_mcap() {
    let tmp = tempfile::tempdir().unwrap();
    let valid = [
        bags::mcap(true, false),
        bags::mcap(false, false),
        bags::mcap(true, true),
    ];
    let path = tmp.path().join("fuzz.mcap");
    for v in &valid {
        std::fs::write(&path, v).unwrap();
        assert_eq!(read_bag(&path).unwrap().len(), 4, "the valid MCAP");
    }
    fuzz("bag mcap", inputs(3, 0), |input| {
        std::fs::write(&path, file_bytes(&valid, b"\x89MCAP0\r\n", &input)).unwrap();
        check_bag(&path, &path)
    });
}

#[test]
fn bag_reader_sqlite3() {
    let tmp = tempfile::tempdir().unwrap();
    let valid = [bags::db3(&tmp.path().join("valid.db3"))];
    let path = tmp.path().join("fuzz.db3");
    assert_eq!(read_bag(&tmp.path().join("valid.db3")).unwrap().len(), 4);
    fuzz("bag sqlite3", inputs(1, 0), |input| {
        std::fs::write(&path, file_bytes(&valid, b"SQLite format 3\0", &input)).unwrap();
        check_bag(&path, &path)
    });
}

#[test]
fn bag_reader_folder_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fuzz_bag");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("fuzz_bag_0.mcap"), bags::mcap(true, false)).unwrap();
    let valid = [bags::bag_metadata("fuzz_bag_0.mcap").into_bytes()];
    let yaml = dir.join("metadata.yaml");
    std::fs::write(&yaml, &valid[0]).unwrap();
    assert_eq!(read_bag(&dir).unwrap().len(), 4, "the valid bag folder");
    fuzz("bag metadata.yaml", inputs(1, 0), |input| {
        std::fs::write(
            &yaml,
            file_bytes(&valid, b"rosbag2_bagfile_information:", &input),
        )
        .unwrap();
        // Errors name the folder (metadata.yaml and the storage file are in it).
        check_bag(&dir, &dir)
    });
}

#[test]
fn mcap_chunk_whose_record_claims_a_huge_length_is_refused() {
    // The fuzz-found input: the rosbag2-style (zstd) MCAP with bit 0 of the
    // chunk's 10th byte from its end flipped, which makes a record inside
    // the chunk claim ~7e18 bytes; mcap's MessageStream reserved that
    // before reading it (an abort). The record limit refuses it.
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = bags::mcap(true, false);
    // Magic (8), then the header record, then the chunk record.
    let record =
        |b: &[u8], at: usize| 9 + u64::from_le_bytes(b[at + 1..at + 9].try_into().unwrap());
    let chunk = 8 + record(&bytes, 8) as usize;
    assert_eq!(bytes[chunk], 0x06, "a chunk record");
    let end = chunk + record(&bytes, chunk) as usize;
    bytes[end - 10] ^= 1;
    let path = tmp.path().join("huge-record.mcap");
    std::fs::write(&path, bytes).unwrap();
    refused(read_bag(&path), &path, "corrupt or truncated MCAP");
}
