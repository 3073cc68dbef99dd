//! rosbag2 bags read without ROS: MCAP (the default storage of current ROS 2)
//! and sqlite3 storage. Gives every message's topic, type, receive time and
//! serialized (CDR) bytes in time order; decoding is the caller's business
//! (the replay tool uses the ROS type support).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// One recorded message.
#[derive(Debug, Clone, PartialEq)]
pub struct BagMessage {
    pub topic: String,
    /// ROS type name, e.g. `std_msgs/msg/String`.
    pub msg_type: String,
    /// Receive (log) time, nanoseconds.
    pub time_ns: i64,
    /// The serialized message (CDR with its 4-byte encapsulation header).
    pub data: Vec<u8>,
}

const MCAP_MAGIC: &[u8] = b"\x89MCAP0\r\n";
const SQLITE_MAGIC: &[u8] = b"SQLite format 3\0";

/// Reads a bag: a rosbag2 folder (metadata.yaml + storage files) or a single
/// `.mcap` / `.db3` file. Messages are sorted by time.
pub fn read_bag(path: &Path) -> Result<Vec<BagMessage>> {
    let files = storage_files(path)?;
    let mut messages = Vec::new();
    for f in &files {
        let head = read_head(f)?;
        if head.starts_with(MCAP_MAGIC) {
            messages.extend(read_mcap(f)?);
        } else if head.starts_with(SQLITE_MAGIC) {
            messages.extend(read_sqlite(f)?);
        } else {
            bail!(
                "bag file {} is neither MCAP nor sqlite3 (unknown header)",
                f.display()
            );
        }
    }
    messages.sort_by_key(|m| m.time_ns);
    Ok(messages)
}

fn read_head(f: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(16);
    std::fs::File::open(f)
        .with_context(|| format!("opening bag file {}", f.display()))?
        .take(16)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading bag file {}", f.display()))?;
    Ok(buf)
}

/// The storage files of a bag folder (from metadata.yaml, else by
/// extension), or the file itself.
fn storage_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        bail!("bag {} does not exist", path.display());
    }
    let meta = path.join("metadata.yaml");
    if meta.is_file() {
        let text = std::fs::read_to_string(&meta)
            .with_context(|| format!("reading {}", meta.display()))?;
        let doc: serde_yaml::Value = serde_yaml::from_str(&text)
            .with_context(|| format!("{} is not valid YAML", meta.display()))?;
        let info = &doc["rosbag2_bagfile_information"];
        let compression = info["compression_mode"].as_str().unwrap_or("");
        if !compression.is_empty() && compression != "none" {
            bail!(
                "bag {}: file-level compression ({compression}) is not supported; decompress it first",
                path.display()
            );
        }
        if let Some(files) = info["relative_file_paths"].as_sequence() {
            let files: Vec<PathBuf> = files
                .iter()
                .filter_map(|f| f.as_str())
                .map(|f| path.join(f))
                .collect();
            if let Some(missing) = files.iter().find(|f| !f.is_file()) {
                bail!(
                    "bag {}: metadata.yaml lists {}, which is missing",
                    path.display(),
                    missing.display()
                );
            }
            if !files.is_empty() {
                return Ok(files);
            }
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("listing bag folder {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("mcap" | "db3")))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("bag folder {} has no .mcap or .db3 file", path.display());
    }
    Ok(files)
}

/// Largest record taken, uncompressed chunks included, unless the file is
/// larger (rosbag2 writes chunks of 768 KiB).
const MCAP_RECORD_MAX: usize = 1 << 28;

fn read_mcap(f: &Path) -> Result<Vec<BagMessage>> {
    use mcap::sans_io::LinearReaderOptions;
    let file = std::fs::File::open(f).with_context(|| format!("reading {}", f.display()))?;
    let size = file.metadata().map_or(0, |m| m.len());
    // A record length or a chunk's uncompressed size is allocated before
    // it is read: past this limit they are refused, not allocated
    // (mcap's MessageStream has no limit).
    let limit = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .max(MCAP_RECORD_MAX);
    let stream = mcap::io::MessageReader::new_with_options(
        std::io::BufReader::new(file),
        LinearReaderOptions::default().with_record_length_limit(limit),
    );
    let mut out = Vec::new();
    for m in stream {
        let m = m.with_context(|| {
            format!(
                "bag file {}: corrupt or truncated MCAP after {} messages",
                f.display(),
                out.len()
            )
        })?;
        let encoding = &m.channel.message_encoding;
        if encoding != "cdr" {
            bail!(
                "bag file {}: topic {} has message encoding `{encoding}`; only ROS 2 CDR is supported",
                f.display(),
                m.channel.topic
            );
        }
        let msg_type = m
            .channel
            .schema
            .as_ref()
            .map(|s| s.name.clone())
            .with_context(|| {
                format!(
                    "bag file {}: topic {} has no schema (message type unknown)",
                    f.display(),
                    m.channel.topic
                )
            })?;
        out.push(BagMessage {
            topic: m.channel.topic.clone(),
            msg_type,
            time_ns: m.log_time as i64,
            data: m.data.into_owned(),
        });
    }
    Ok(out)
}

fn read_sqlite(f: &Path) -> Result<Vec<BagMessage>> {
    use rusqlite::{Connection, OpenFlags};
    let ctx = || {
        format!(
            "bag file {}: not a readable rosbag2 sqlite3 database",
            f.display()
        )
    };
    let conn =
        Connection::open_with_flags(f, OpenFlags::SQLITE_OPEN_READ_ONLY).with_context(ctx)?;
    let mut stmt = conn
        .prepare(
            "SELECT t.name, t.type, t.serialization_format, m.timestamp, m.data \
             FROM messages m JOIN topics t ON m.topic_id = t.id ORDER BY m.timestamp, m.id",
        )
        .with_context(ctx)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, Vec<u8>>(4)?,
            ))
        })
        .with_context(ctx)?;
    let mut out = Vec::new();
    for row in rows {
        let (topic, msg_type, format, time_ns, data) = row.with_context(ctx)?;
        if format != "cdr" {
            bail!(
                "bag file {}: topic {topic} is serialized as `{format}`; only ROS 2 CDR is supported",
                f.display()
            );
        }
        out.push(BagMessage {
            topic,
            msg_type,
            time_ns,
            data,
        });
    }
    Ok(out)
}
