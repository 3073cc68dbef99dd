//! The profiler on prompts recorded in rosbag2 bags (`selectinfer_profile
//! --bag DIR --topic NAME [--task NAME]`): MCAP and sqlite3 bag folders of
//! real prompts (rows of the SQuAD dev set rendered as text), profiled on
//! the real SmolLM2 weights; a bag without the topic, a message of another
//! type and a truncated message are refused naming what is wrong.

#[allow(dead_code)]
#[path = "fixtures/bags.rs"]
mod bags;
#[path = "../../../tests/common/mod.rs"]
mod common;

use selectinfer::engine::Engine;
use selectinfer::method::ranking::Ranking;
use selectinfer::model::LoadOptions;
use selectinfer::tools::data;
use selectinfer_bagtools::bag::{decode_prompt, read_prompts, PROMPT_TYPE, STRING_TYPE};
use selectinfer_bagtools::profile::{self, DatasetSpec, ProfileConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const MODEL: &str = "smollm2-135m-instruct";
const TOPIC: &str = "/selectinfer_node/prompt";

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::load(&common::model_dir(MODEL), &LoadOptions::default()).unwrap())
}

fn squad() -> PathBuf {
    common::repo_root().join("../shared/data/qa_squad11.dev.jsonl")
}

/// The first three SQuAD dev rows as the instructions a robot would get.
fn prompts() -> Vec<String> {
    data::load_jsonl(&squad(), Some(3))
        .unwrap()
        .iter()
        .map(|e| data::render_template("Context: {context}\n\nQuestion: {question}", e).unwrap())
        .collect()
}

/// A CDR writer: fields aligned from the end of the 4-byte header; keeps
/// where it padded (ROS leaves whatever its buffer held there).
struct Cdr(Vec<u8>, Vec<usize>);

impl Cdr {
    fn new() -> Self {
        Cdr(vec![0, 1, 0, 0], Vec::new())
    }
    fn raw(&mut self, align: usize, bytes: &[u8]) -> &mut Self {
        while !(self.0.len() - 4).is_multiple_of(align) {
            self.1.push(self.0.len());
            self.0.push(0);
        }
        self.0.extend(bytes);
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.raw(4, &(s.len() as u32 + 1).to_le_bytes());
        self.0.extend(s.as_bytes());
        self.0.push(0);
        self
    }
}

/// A serialized `std_msgs/msg/String`.
fn cdr_string(s: &str) -> Vec<u8> {
    Cdr::new().string(s).0.clone()
}

/// A serialized `selectinfer_msgs/msg/Prompt` with the msg file's defaults
/// and the given earlier turns.
fn cdr_prompt(request_id: &str, prompt: &str, messages: &[(&str, &str)]) -> Vec<u8> {
    cdr_prompt_padded(request_id, prompt, messages).0
}

/// [`cdr_prompt`] and the offsets of its padding bytes.
fn cdr_prompt_padded(
    request_id: &str,
    prompt: &str,
    messages: &[(&str, &str)],
) -> (Vec<u8>, Vec<usize>) {
    let mut w = Cdr::new();
    w.string(request_id).string(prompt).string("");
    w.raw(4, &(-1i32).to_le_bytes())
        .raw(4, &(-1f32).to_le_bytes())
        .raw(4, &(-1f32).to_le_bytes())
        .raw(8, &(-1i64).to_le_bytes());
    w.raw(4, &(messages.len() as u32).to_le_bytes());
    for (role, content) in messages {
        w.string(role).string(content);
        w.raw(4, &0u32.to_le_bytes());
    }
    w.raw(4, &0u32.to_le_bytes()).string("").string("");
    // tools, tool_choice, parallel_tool_calls (true by default).
    w.string("").string("").raw(1, &[1]);
    (w.0, w.1)
}

/// One recorded message: topic, type, payload.
type Msg = (&'static str, &'static str, Vec<u8>);

fn metadata(file: &str, storage: &str, count: usize) -> String {
    format!(
        "rosbag2_bagfile_information:\n  version: 9\n  storage_identifier: {storage}\n  \
         message_count: {count}\n  compression_format: \"\"\n  compression_mode: \"\"\n  \
         relative_file_paths:\n    - {file}\n"
    )
}

/// A bag folder as `ros2 bag record -s mcap` writes it (zstd chunks).
fn mcap_bag(dir: &Path, messages: &[Msg]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut w = mcap::WriteOptions::new()
        .use_chunks(true)
        .create(std::io::Cursor::new(Vec::new()))
        .unwrap();
    let mut channels = BTreeMap::new();
    for (i, (topic, ty, data)) in messages.iter().enumerate() {
        let channel = *channels.entry((*topic, *ty)).or_insert_with(|| {
            let schema = w.add_schema(ty, "ros2msg", ty.as_bytes()).unwrap();
            w.add_channel(schema, topic, "cdr", &BTreeMap::new())
                .unwrap()
        });
        let header = mcap::records::MessageHeader {
            channel_id: channel,
            sequence: i as u32,
            log_time: 1_000 + i as u64 * 500,
            publish_time: 1_000 + i as u64 * 500,
        };
        w.write_to_known_channel(&header, data).unwrap();
    }
    w.finish().unwrap();
    std::fs::write(dir.join("bag_0.mcap"), w.into_inner().into_inner()).unwrap();
    std::fs::write(
        dir.join("metadata.yaml"),
        metadata("bag_0.mcap", "mcap", messages.len()),
    )
    .unwrap();
    dir.to_path_buf()
}

/// A bag folder as `ros2 bag record -s sqlite3` writes it.
fn db3_bag(dir: &Path, messages: &[Msg]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let conn = rusqlite::Connection::open(dir.join("bag_0.db3")).unwrap();
    conn.execute_batch(bags::DB3_SCHEMA).unwrap();
    let mut topics: Vec<(&str, &str)> = Vec::new();
    for (i, (topic, ty, data)) in messages.iter().enumerate() {
        let id = match topics.iter().position(|t| *t == (*topic, *ty)) {
            Some(p) => p + 1,
            None => {
                topics.push((topic, ty));
                conn.execute(
                    "INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr', '', '')",
                    rusqlite::params![topics.len() as i64, topic, ty],
                )
                .unwrap();
                topics.len()
            }
        };
        conn.execute(
            "INSERT INTO messages (topic_id, timestamp, data) VALUES (?1, ?2, ?3)",
            rusqlite::params![id as i64, 1_000 + i as i64 * 500, data],
        )
        .unwrap();
    }
    drop(conn);
    std::fs::write(
        dir.join("metadata.yaml"),
        metadata("bag_0.db3", "sqlite3", messages.len()),
    )
    .unwrap();
    dir.to_path_buf()
}

/// The prompts as `std_msgs/msg/String` on [`TOPIC`], with chatter on
/// another topic.
fn string_messages() -> Vec<Msg> {
    let mut m: Vec<Msg> = prompts()
        .iter()
        .map(|p| (TOPIC, STRING_TYPE, cdr_string(p)))
        .collect();
    m.insert(1, ("/chatter", STRING_TYPE, cdr_string("hello")));
    m
}

/// The same prompts as `selectinfer_msgs/msg/Prompt`, the third one given
/// as the last turn of `messages`, with an empty prompt (refused by the
/// node, skipped by the profiler) in between.
fn prompt_messages() -> Vec<Msg> {
    let p = prompts();
    vec![
        (TOPIC, PROMPT_TYPE, cdr_prompt("r0", &p[0], &[])),
        (TOPIC, PROMPT_TYPE, cdr_prompt("empty", "", &[])),
        (TOPIC, PROMPT_TYPE, cdr_prompt("r1", &p[1], &[])),
        (TOPIC, PROMPT_TYPE, cdr_prompt("r2", "", &[("user", &p[2])])),
    ]
}

fn base_config(output: &Path, datasets: Vec<DatasetSpec>) -> ProfileConfig {
    ProfileConfig {
        model: common::model_dir(MODEL),
        output: output.to_path_buf(),
        generated_tokens: 0,
        max_prompt_tokens: 2048,
        datasets,
    }
}

fn profile_cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selectinfer_profile"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// The CLI on an MCAP bag folder: the config's dataset is kept, the bag's
/// prompts are task `robot` with a ranking per layer, scored on exactly the
/// recorded prompts' tokens; `--bag-only` drops the config's datasets.
#[test]
fn cli_profiles_the_prompts_of_an_mcap_bag() {
    let dir = tempfile::tempdir().unwrap();
    let bag = mcap_bag(&dir.path().join("robot_mcap"), &string_messages());
    let out = dir.path().join("robot.safetensors");
    let qa = DatasetSpec {
        task: "qa".into(),
        path: squad(),
        template: "Question: {question}".into(),
        examples: 1,
        skip: 0,
        stride: 1,
        topic: None,
    };
    let cfg_path = dir.path().join("profile.yaml");
    let yaml = serde_yaml::to_string(&base_config(&out, vec![qa])).unwrap();
    std::fs::write(&cfg_path, yaml).unwrap();
    let run = profile_cli(&[
        "--config",
        cfg_path.to_str().unwrap(),
        "--bag",
        bag.to_str().unwrap(),
        "--topic",
        TOPIC,
    ]);
    assert!(run.status.success(), "{}", stderr(&run));

    let r = Ranking::load(&out).unwrap();
    assert_eq!(r.task_names(), ["qa", "robot"]);
    let meta = r.meta.tasks.iter().find(|t| t.name == "robot").unwrap();
    assert_eq!(meta.examples, 3);
    assert_eq!(meta.dataset, format!("{} topic {TOPIC}", bag.display()));
    assert_eq!(meta.prompt_template, "{prompt}");
    assert_eq!(meta.dataset_sha256.len(), 64);
    // generated_tokens 0: exactly the three prompts' chat tokens, which the
    // /chatter message is not among.
    let expected: usize = prompts()
        .iter()
        .map(|p| engine().codec.chat_prompt_ids(p).unwrap().len())
        .sum();
    assert_eq!(meta.tokens, expected as u64);
    let robot = r.task("robot").unwrap();
    assert_eq!(robot.scores.len(), 30, "a ranking per layer");
    for (scores, order) in robot.scores.iter().zip(&robot.order) {
        assert_eq!((scores.len(), order.len()), (1536, 1536));
        assert!(scores.iter().all(|s| s.is_finite() && *s >= 0.0));
        assert!(scores[order[0] as usize] > scores[order[1535] as usize]);
    }
    assert_ne!(robot.scores, r.task("qa").unwrap().scores);

    // --bag-only, another task name, the topic without its leading slash.
    let only = dir.path().join("only.safetensors");
    let run = profile_cli(&[
        "--config",
        cfg_path.to_str().unwrap(),
        "--bag",
        bag.to_str().unwrap(),
        "--topic",
        TOPIC.trim_start_matches('/'),
        "--task",
        "kitchen",
        "--bag-only",
        "--output",
        only.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let r = Ranking::load(&only).unwrap();
    assert_eq!(r.task_names(), ["kitchen"]);
    assert_eq!(r.meta.tasks[0].tokens, expected as u64);
    assert_eq!(r.meta.tasks[0].dataset_sha256, meta.dataset_sha256);

    // --topic without --bag is refused by the parser.
    let run = profile_cli(&["--config", cfg_path.to_str().unwrap(), "--topic", TOPIC]);
    assert!(
        !run.status.success() && stderr(&run).contains("--bag"),
        "{}",
        stderr(&run)
    );
}

/// The same prompts from an MCAP bag of strings, a sqlite3 bag of
/// `selectinfer_msgs/msg/Prompt` (one given as a conversation, one empty)
/// and a JSONL file give the same scores: each prompt is the user turn,
/// chat-formatted as for a JSONL row.
#[test]
fn mcap_db3_and_jsonl_give_the_same_ranking() {
    let dir = tempfile::tempdir().unwrap();
    let mcap = mcap_bag(&dir.path().join("m"), &string_messages());
    let db3 = db3_bag(&dir.path().join("d"), &prompt_messages());
    let jsonl = dir.path().join("prompts.jsonl");
    let rows: Vec<String> = prompts()
        .iter()
        .enumerate()
        .map(|(i, p)| serde_json::json!({"id": i.to_string(), "prompt": p}).to_string())
        .collect();
    std::fs::write(&jsonl, rows.join("\n")).unwrap();
    let from_jsonl = DatasetSpec {
        task: "robot".into(),
        path: jsonl,
        template: "{prompt}".into(),
        examples: 3,
        skip: 0,
        stride: 1,
        topic: None,
    };
    let out = dir.path().join("unused.safetensors");
    let run = |spec: DatasetSpec| {
        let cfg = base_config(&out, vec![spec]);
        profile::run(engine(), &cfg.model, &cfg, true)
            .unwrap()
            .ranking
    };
    let a = run(DatasetSpec::bag("robot", &mcap, TOPIC));
    let b = run(DatasetSpec::bag("robot", &db3, TOPIC));
    let c = run(from_jsonl);
    assert_eq!(b.meta.tasks[0].examples, 3, "the empty prompt is skipped");
    assert_eq!(a.meta.tasks[0].tokens, c.meta.tasks[0].tokens);
    assert_eq!(b.meta.tasks[0].tokens, c.meta.tasks[0].tokens);
    assert_eq!(a.tasks["robot"].scores, c.tasks["robot"].scores);
    assert_eq!(b.tasks["robot"].scores, c.tasks["robot"].scores);
    assert_ne!(
        a.meta.tasks[0].dataset_sha256,
        b.meta.tasks[0].dataset_sha256
    );

    // The same recording in either storage hashes the same.
    let db3_strings = db3_bag(&dir.path().join("d2"), &string_messages());
    assert_eq!(
        read_prompts(&db3_strings, TOPIC).unwrap().sha256,
        a.meta.tasks[0].dataset_sha256
    );
}

/// A topic the bag lacks is refused listing the bag's topics (CLI and
/// library), and so is a bag without messages.
#[test]
fn a_missing_topic_is_refused_with_the_bags_topics() {
    let dir = tempfile::tempdir().unwrap();
    let bag = db3_bag(&dir.path().join("b"), &string_messages());
    let out = dir.path().join("x.safetensors");
    let cfg_path = dir.path().join("profile.yaml");
    let cfg = base_config(&out, vec![DatasetSpec::bag("robot", &bag, TOPIC)]);
    std::fs::write(&cfg_path, serde_yaml::to_string(&cfg).unwrap()).unwrap();
    let run = profile_cli(&[
        "--config",
        cfg_path.to_str().unwrap(),
        "--bag",
        bag.to_str().unwrap(),
        "--topic",
        "/robot/instructions",
        "--bag-only",
    ]);
    let e = stderr(&run);
    assert!(!run.status.success() && !e.contains("panicked"), "{e}");
    assert!(
        e.contains(&bag.display().to_string())
            && e.contains("no messages on topic /robot/instructions")
            && e.contains("/chatter (std_msgs/msg/String, 1 message)")
            && e.contains(&format!("{TOPIC} (std_msgs/msg/String, 3 messages)")),
        "{e}"
    );
    assert!(!out.exists());

    let empty = db3_bag(&dir.path().join("empty"), &[]);
    let e = format!("{:#}", read_prompts(&empty, TOPIC).unwrap_err());
    assert!(e.contains("holds no messages at all"), "{e}");
}

/// A truncated message is refused naming the bag, the topic, the message's
/// index and the field; a message of another type on the topic names the
/// type.
#[test]
fn a_truncated_or_foreign_message_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut messages = prompt_messages();
    let cut = messages[2].2.len() / 2;
    messages[2].2.truncate(cut);
    for (name, bag) in [
        ("db3", db3_bag(&dir.path().join("d"), &messages)),
        ("mcap", mcap_bag(&dir.path().join("m"), &messages)),
    ] {
        let e = format!("{:#}", read_prompts(&bag, TOPIC).unwrap_err());
        assert!(
            e.contains(&bag.display().to_string())
                && e.contains(&format!("message 2 on topic {TOPIC} ({PROMPT_TYPE})"))
                && e.contains("truncated: field prompt"),
            "{name}: {e}"
        );
        // Through the profiler, with the task named.
        let cfg = base_config(
            &dir.path().join("x.safetensors"),
            vec![DatasetSpec::bag("robot", &bag, TOPIC)],
        );
        let e = format!(
            "{:#}",
            profile::run(engine(), &cfg.model, &cfg, true)
                .err()
                .unwrap()
        );
        assert!(
            e.contains("'robot'") && e.contains("message 2 on topic"),
            "{name}: {e}"
        );
    }

    let mut messages = string_messages();
    messages.push((TOPIC, "sensor_msgs/msg/Image", vec![0, 1, 0, 0, 0, 0, 0, 0]));
    let bag = mcap_bag(&dir.path().join("image"), &messages);
    let e = format!("{:#}", read_prompts(&bag, TOPIC).unwrap_err());
    assert!(
        e.contains("message 3 on topic") && e.contains("sensor_msgs/msg/Image is not a prompt"),
        "{e}"
    );
}

/// The plain decoder reads what ROS itself serializes: the node's message
/// type support (r2r, rmw) is the reference.
#[cfg(feature = "ros")]
#[test]
fn the_plain_decoder_reads_what_ros_serializes() {
    use r2r::selectinfer_msgs::msg::{ChatMessage, Prompt};
    use r2r::WrappedTypesupport;
    let p = prompts();
    let msg = Prompt {
        request_id: "abcde".into(),
        prompt: p[0].clone(),
        task: "qa".into(),
        max_new_tokens: 7,
        temperature: 0.5,
        top_p: 0.9,
        seed: 42,
        messages: vec![
            ChatMessage {
                role: "system".into(),
                content: "You are a robot.".into(),
                ..Default::default()
            },
            ChatMessage {
                role: "user".into(),
                content: p[1].clone(),
                ..Default::default()
            },
        ],
        stop: vec!["\n\n".into(), "END".into()],
        json_schema: "{}".into(),
        grammar: String::new(),
        tools: r#"[{"name": "stop", "parameters": {"type": "object"}}]"#.into(),
        tool_choice: "auto".into(),
        parallel_tool_calls: false,
    };
    let bytes = msg.to_serialized_bytes().unwrap();
    let d = decode_prompt(PROMPT_TYPE, &bytes).unwrap();
    assert_eq!(
        (d.request_id.as_str(), d.prompt.as_str(), d.task.as_str()),
        ("abcde", p[0].as_str(), "qa")
    );
    assert_eq!(
        d.messages,
        [
            ("system".to_string(), "You are a robot.".to_string()),
            ("user".to_string(), p[1].clone())
        ]
    );
    for cut in [bytes.len() - 1, bytes.len() / 2, 10] {
        assert!(
            decode_prompt(PROMPT_TYPE, &bytes[..cut]).is_err(),
            "cut {cut}"
        );
    }
    // The test's own writer agrees byte for byte with ROS, padding aside.
    let plain = Prompt {
        request_id: "r2".into(),
        prompt: String::new(),
        max_new_tokens: -1,
        temperature: -1.0,
        top_p: -1.0,
        seed: -1,
        messages: vec![ChatMessage {
            role: "user".into(),
            content: p[2].clone(),
            ..Default::default()
        }],
        ..Prompt::default()
    };
    let mut ros = plain.to_serialized_bytes().unwrap();
    // (This one pads before `seed`: the int64 is aligned to 8.)
    let d = decode_prompt(PROMPT_TYPE, &ros).unwrap();
    assert_eq!(
        (d.request_id.as_str(), d.prompt.as_str(), d.messages.len()),
        ("r2", "", 1)
    );
    assert_eq!(d.messages[0].1, p[2]);
    let (ours, padding) = cdr_prompt_padded("r2", "", &[("user", &p[2])]);
    assert_eq!(ros.len(), ours.len());
    assert!(!padding.is_empty());
    for i in padding {
        ros[i] = 0;
    }
    assert_eq!(ros, ours);
    let s = r2r::std_msgs::msg::String { data: p[2].clone() };
    let bytes = s.to_serialized_bytes().unwrap();
    assert_eq!(bytes, cdr_string(&p[2]));
    assert_eq!(decode_prompt(STRING_TYPE, &bytes).unwrap().prompt, p[2]);
}
