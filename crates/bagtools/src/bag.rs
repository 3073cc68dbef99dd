//! rosbag2 bags read without ROS: MCAP (the default storage of current ROS 2)
//! and sqlite3 storage. Gives every message's topic, type, receive time and
//! serialized (CDR) bytes in time order ([`read_bag`]), and decodes the two
//! prompt types a bag of prompts holds, `selectinfer_msgs/msg/Prompt` and
//! `std_msgs/msg/String`, with a plain CDR reader ([`decode_prompt`],
//! [`read_prompts`]: the profiler's bag datasets). The replay tool decodes
//! with the ROS type support instead.

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

/// Type name of the node's prompt message.
pub const PROMPT_TYPE: &str = "selectinfer_msgs/msg/Prompt";
/// Type name of a plain-text prompt.
pub const STRING_TYPE: &str = "std_msgs/msg/String";

/// A prompt decoded from a recorded message (a `std_msgs/msg/String` fills
/// only `prompt`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordedPrompt {
    pub request_id: String,
    /// The last user turn (may be empty when `messages` ends with one).
    pub prompt: String,
    /// The task the prompt asked for ("" = the node's).
    pub task: String,
    /// Earlier turns of the conversation, (role, content), oldest first.
    pub messages: Vec<(String, String)>,
}

/// Decodes a serialized prompt of type `msg_type`: CDR (little or big
/// endian) with its 4-byte encapsulation header. A message too short for
/// its fields, a string without its NUL or not UTF-8, and any other type
/// are errors naming the field or the type. `selectinfer_msgs/msg/Prompt`
/// is read whole (msg/msg/Prompt.msg), so a message cut anywhere is refused.
pub fn decode_prompt(msg_type: &str, data: &[u8]) -> Result<RecordedPrompt> {
    match msg_type {
        STRING_TYPE => {
            let mut r = CdrReader::new(data)?;
            Ok(RecordedPrompt {
                prompt: r.string("data")?,
                ..RecordedPrompt::default()
            })
        }
        // Today's layout; else the one before tool calls (bags recorded
        // then), whichever reads the whole message.
        PROMPT_TYPE => decode_prompt_msg(data, true).or_else(|e| {
            decode_prompt_msg(data, false)
                .map_err(|_| e.context("(nor as the layout before tool calls)"))
        }),
        other => bail!(
            "message type {other} is not a prompt (prompts are {PROMPT_TYPE} or {STRING_TYPE})"
        ),
    }
}

/// `selectinfer_msgs/msg/Prompt` as msg/msg/Prompt.msg lays it out;
/// `tool_fields` false: as it was before tool calls (no `tool_calls` in a
/// turn, no `tools`, `tool_choice`, `parallel_tool_calls`).
fn decode_prompt_msg(data: &[u8], tool_fields: bool) -> Result<RecordedPrompt> {
    let mut r = CdrReader::new(data)?;
    let request_id = r.string("request_id")?;
    let prompt = r.string("prompt")?;
    let task = r.string("task")?;
    r.take(4, 4, "max_new_tokens")?;
    r.take(4, 4, "temperature")?;
    r.take(4, 4, "top_p")?;
    r.take(8, 8, "seed")?;
    let mut messages = Vec::new();
    for i in 0..r.u32("messages (length)")? {
        let role = r.string(&format!("messages[{i}].role"))?;
        let content = r.string(&format!("messages[{i}].content"))?;
        if tool_fields {
            for j in 0..r.u32(&format!("messages[{i}].tool_calls (length)"))? {
                for f in ["id", "name", "arguments"] {
                    r.string(&format!("messages[{i}].tool_calls[{j}].{f}"))?;
                }
            }
        }
        messages.push((role, content));
    }
    for i in 0..r.u32("stop (length)")? {
        r.string(&format!("stop[{i}]"))?;
    }
    r.string("json_schema")?;
    r.string("grammar")?;
    if tool_fields {
        r.string("tools")?;
        r.string("tool_choice")?;
        r.take(1, 1, "parallel_tool_calls")?;
    }
    Ok(RecordedPrompt {
        request_id,
        prompt,
        task,
        messages,
    })
}

/// Reads classic CDR (what ROS 2 records): primitives aligned to their
/// size, counted from the end of the 4-byte encapsulation header.
struct CdrReader<'a> {
    body: &'a [u8],
    pos: usize,
    little_endian: bool,
}

impl<'a> CdrReader<'a> {
    fn new(data: &'a [u8]) -> Result<Self> {
        let Some((header, body)) = data.split_first_chunk::<4>() else {
            bail!(
                "{} bytes: too short for the 4-byte CDR encapsulation header",
                data.len()
            );
        };
        let little_endian = match [header[0], header[1]] {
            [0, 0] => false,
            [0, 1] => true,
            [a, b] => bail!(
                "CDR encapsulation {a:#04x} {b:#04x} is not plain CDR (0x00 0x00 or 0x00 0x01)"
            ),
        };
        Ok(Self {
            body,
            pos: 0,
            little_endian,
        })
    }

    /// `size` bytes of `field` at the next multiple of `align`.
    fn take(&mut self, size: usize, align: usize, field: &str) -> Result<&'a [u8]> {
        let start = self.pos.next_multiple_of(align);
        let end = start.checked_add(size).filter(|&e| e <= self.body.len());
        let Some(end) = end else {
            bail!(
                "truncated: field {field} needs {size} bytes at byte {}, the message has {}",
                start + 4,
                self.body.len() + 4
            );
        };
        self.pos = end;
        Ok(&self.body[start..end])
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        let b: [u8; 4] = self.take(4, 4, field)?.try_into().expect("4 bytes");
        Ok(if self.little_endian {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }

    /// A string: u32 length (with the NUL), the bytes, the NUL.
    fn string(&mut self, field: &str) -> Result<String> {
        let len = self.u32(field)? as usize;
        if len == 0 {
            // Some writers give the empty string no NUL.
            return Ok(String::new());
        }
        let bytes = self.take(len, 1, field)?;
        let (&last, text) = bytes.split_last().expect("len > 0");
        if last != 0 {
            bail!("field {field}: string of {len} bytes does not end with NUL");
        }
        String::from_utf8(text.to_vec()).with_context(|| format!("field {field}: not UTF-8"))
    }
}

/// The prompts recorded on one topic of a bag.
#[derive(Debug, Clone)]
pub struct RecordedPrompts {
    /// In time order: the topic's message i is `prompts[i]`.
    pub prompts: Vec<RecordedPrompt>,
    /// sha256 of the topic's serialized messages in time order (each
    /// preceded by its length as u64 LE): the same recording gives the same
    /// hash whatever the storage (MCAP or sqlite3).
    pub sha256: String,
}

/// Reads the prompts recorded on `topic` (a leading `/` may be left out).
/// A topic without messages is an error listing the bag's topics; a
/// message that is not a valid prompt is an error naming the bag, the topic
/// and the message's index on the topic.
pub fn read_prompts(path: &Path, topic: &str) -> Result<RecordedPrompts> {
    use sha2::{Digest, Sha256};
    use std::collections::{BTreeMap, BTreeSet};
    let messages = read_bag(path)?;
    let topic = if topic.starts_with('/') {
        topic.to_string()
    } else {
        format!("/{topic}")
    };
    let on_topic: Vec<&BagMessage> = messages.iter().filter(|m| m.topic == topic).collect();
    if on_topic.is_empty() {
        let mut topics: BTreeMap<&str, (BTreeSet<&str>, usize)> = BTreeMap::new();
        for m in &messages {
            let t = topics.entry(&m.topic).or_default();
            t.0.insert(&m.msg_type);
            t.1 += 1;
        }
        if topics.is_empty() {
            bail!(
                "bag {}: no messages on topic {topic}: the bag holds no messages at all",
                path.display()
            );
        }
        let list: Vec<String> = topics
            .iter()
            .map(|(name, (types, n))| {
                let types: Vec<&str> = types.iter().copied().collect();
                let plural = if *n == 1 { "" } else { "s" };
                format!("{name} ({}, {n} message{plural})", types.join(" | "))
            })
            .collect();
        bail!(
            "bag {}: no messages on topic {topic}; the bag's topics are: {}",
            path.display(),
            list.join(", ")
        );
    }
    let mut hasher = Sha256::new();
    let mut prompts = Vec::with_capacity(on_topic.len());
    for (i, m) in on_topic.iter().enumerate() {
        let p = decode_prompt(&m.msg_type, &m.data).with_context(|| {
            format!(
                "bag {}: message {i} on topic {topic} ({}) is not a valid prompt",
                path.display(),
                m.msg_type
            )
        })?;
        hasher.update((m.data.len() as u64).to_le_bytes());
        hasher.update(&m.data);
        prompts.push(p);
    }
    Ok(RecordedPrompts {
        prompts,
        sha256: format!("{:x}", hasher.finalize()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CDR writer (test side): fields aligned from the header's end.
    struct W(Vec<u8>, bool);

    impl W {
        fn new(little_endian: bool) -> Self {
            W(vec![0, u8::from(little_endian), 0, 0], little_endian)
        }
        fn pad(&mut self, align: usize) -> &mut Self {
            while !(self.0.len() - 4).is_multiple_of(align) {
                self.0.push(0);
            }
            self
        }
        fn u32(&mut self, v: u32) -> &mut Self {
            self.pad(4);
            let b = if self.1 {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            self.0.extend(b);
            self
        }
        fn raw(&mut self, align: usize, bytes: &[u8]) -> &mut Self {
            self.pad(align);
            self.0.extend(bytes);
            self
        }
        fn string(&mut self, s: &str) -> &mut Self {
            self.u32(s.len() as u32 + 1);
            self.0.extend(s.as_bytes());
            self.0.push(0);
            self
        }
    }

    fn cdr(strings: &[&str], little_endian: bool) -> Vec<u8> {
        let mut w = W::new(little_endian);
        for s in strings {
            w.string(s);
        }
        w.0
    }

    /// A whole `selectinfer_msgs/msg/Prompt` (little endian), with one
    /// earlier turn and one stop string.
    fn prompt_msg(request_id: &str, prompt: &str) -> Vec<u8> {
        let mut w = W::new(true);
        w.string(request_id).string(prompt).string("qa");
        w.raw(4, &(-1i32).to_le_bytes())
            .raw(4, &(-1f32).to_le_bytes())
            .raw(4, &0.9f32.to_le_bytes())
            .raw(8, &(-1i64).to_le_bytes());
        w.u32(1).string("system").string("be brief").u32(0);
        w.u32(1).string("\n\n");
        w.string("").string("").string("").string("");
        w.raw(1, &[1]);
        w.0
    }

    #[test]
    fn strings_decode_in_both_byte_orders() {
        for le in [true, false] {
            let p = decode_prompt(STRING_TYPE, &cdr(&["pick up the cup"], le)).unwrap();
            assert_eq!(p.prompt, "pick up the cup");
        }
        // The empty string, with and without its NUL.
        assert_eq!(
            decode_prompt(STRING_TYPE, &cdr(&[""], true))
                .unwrap()
                .prompt,
            ""
        );
        assert_eq!(
            decode_prompt(STRING_TYPE, &[0, 1, 0, 0, 0, 0, 0, 0])
                .unwrap()
                .prompt,
            ""
        );
    }

    #[test]
    fn a_whole_prompt_message_decodes() {
        // "abcde" makes the second string start unaligned before padding.
        let p = decode_prompt(PROMPT_TYPE, &prompt_msg("abcde", "go to the door")).unwrap();
        assert_eq!(
            p,
            RecordedPrompt {
                request_id: "abcde".into(),
                prompt: "go to the door".into(),
                task: "qa".into(),
                messages: vec![("system".into(), "be brief".into())],
            }
        );
    }

    #[test]
    fn a_prompt_recorded_before_tool_calls_still_decodes() {
        let mut w = W::new(true);
        w.string("old").string("go to the door").string("qa");
        w.raw(4, &(-1i32).to_le_bytes())
            .raw(4, &(-1f32).to_le_bytes())
            .raw(4, &0.9f32.to_le_bytes())
            .raw(8, &(-1i64).to_le_bytes());
        w.u32(1).string("system").string("be brief");
        w.u32(0).string("").string("");
        let p = decode_prompt(PROMPT_TYPE, &w.0).unwrap();
        assert_eq!((p.request_id.as_str(), p.messages.len()), ("old", 1));
    }

    #[test]
    fn cut_or_corrupt_messages_are_refused_naming_the_field() {
        let full = prompt_msg("r1", "go to the door");
        for cut in 0..full.len() {
            let e = decode_prompt(PROMPT_TYPE, &full[..cut]).unwrap_err();
            let e = format!("{e:#}");
            assert!(
                e.contains("truncated") || e.contains("too short"),
                "cut at {cut}: {e}"
            );
        }
        let e = format!(
            "{:#}",
            decode_prompt(STRING_TYPE, &cdr(&["stop"], true)[..9]).unwrap_err()
        );
        assert!(e.contains("field data") && e.contains("truncated"), "{e}");
        let mut no_nul = cdr(&["stop"], true);
        *no_nul.last_mut().unwrap() = b'!';
        let e = format!("{:#}", decode_prompt(STRING_TYPE, &no_nul).unwrap_err());
        assert!(e.contains("does not end with NUL"), "{e}");
        let mut bad_utf8 = cdr(&["stop"], true);
        bad_utf8[8] = 0xff;
        let e = format!("{:#}", decode_prompt(STRING_TYPE, &bad_utf8).unwrap_err());
        assert!(e.contains("not UTF-8"), "{e}");
        let e = format!(
            "{:#}",
            decode_prompt(STRING_TYPE, &[0, 7, 0, 0, 1, 0, 0, 0, 0]).unwrap_err()
        );
        assert!(e.contains("not plain CDR"), "{e}");
        let e = format!(
            "{:#}",
            decode_prompt("sensor_msgs/msg/Image", &cdr(&["x"], true)).unwrap_err()
        );
        assert!(e.contains("sensor_msgs/msg/Image"), "{e}");
    }
}
