//! The request queue (no ROS) on the real SmolLM2 weights: every request is
//! answered, a full queue rejects explicitly, cancel works before and during
//! generation, runtime settings are validated, streamed text adds up.

mod common;

use selectinfer::engine::EngineSpec;
use selectinfer::engine::Sampling;
use selectinfer::method::Mode;
use selectinfer::serve::server::{
    CancelToken, Job, Reply, Request, RuntimeSettings, Server, ServerConfig,
};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn config(mode: Mode, queue_depth: usize) -> ServerConfig {
    let mut engine = EngineSpec {
        model: common::model_dir("smollm2-135m-instruct"),
        mode,
        ranking: Some(
            common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"),
        ),
        ..Default::default()
    };
    engine.params.dense_layers = vec![0, 29];
    ServerConfig {
        defaults: RuntimeSettings {
            max_new_tokens: 8,
            sampling: Sampling::default(),
            compute_ratio: engine.params.compute_ratio,
            token_ratio: engine.params.token_ratio,
            task: engine.params.task.clone(),
            system_prompt: String::new(),
            prefix_cache: true,
        },
        engine,
        queue_depth,
    }
}

/// Submits a request; returns the reply channel, the streamed pieces and
/// the cancel token.
fn submit(
    server: &Server,
    id: &str,
    prompt: &str,
    max_new_tokens: Option<i64>,
) -> (Receiver<Reply>, Arc<Mutex<String>>, CancelToken) {
    let (tx, rx) = channel();
    let streamed = Arc::new(Mutex::new(String::new()));
    let s2 = streamed.clone();
    let cancel = CancelToken::default();
    server.submit(Job {
        request: Request {
            id: id.into(),
            prompt: prompt.into(),
            max_new_tokens,
            ..Default::default()
        },
        cancel: cancel.clone(),
        on_token: Box::new(move |_, piece| s2.lock().unwrap().push_str(piece)),
        on_done: Box::new(move |r| tx.send(r).unwrap()),
    });
    (rx, streamed, cancel)
}

fn wait(rx: &Receiver<Reply>) -> Reply {
    rx.recv_timeout(Duration::from_secs(120))
        .expect("no reply within 120 s")
}

#[test]
fn full_queue_rejects_and_every_request_is_answered() {
    let server = Server::start(config(Mode::Selectinfer, 2)).unwrap();
    let jobs: Vec<_> = (0..8)
        .map(|i| submit(&server, &format!("r{i}"), "Name a fruit.", Some(12)))
        .collect();
    let replies: Vec<Reply> = jobs.iter().map(|(rx, _, _)| wait(rx)).collect();
    let served = replies.iter().filter(|r| r.success).count();
    let rejected: Vec<_> = replies.iter().filter(|r| !r.success).collect();
    // Two wait (a third runs once the worker has taken the first): at least
    // two served; the rest rejected, explicitly.
    assert!(served >= 2, "served {served}");
    assert!(
        !rejected.is_empty(),
        "8 requests into a queue of 2 must reject some"
    );
    for r in &rejected {
        assert!(r.error.contains("queue is full"), "{}", r.error);
    }
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.request_id, format!("r{i}"));
    }
    for ((_, streamed, _), r) in jobs.iter().zip(&replies) {
        if r.success {
            assert_eq!(*streamed.lock().unwrap(), r.text);
            assert!(
                r.compute_ratio > 0.3 && r.compute_ratio < 0.6,
                "{}",
                r.compute_ratio
            );
        }
    }
    let stats = server.stats();
    assert_eq!(stats.rejected as usize, rejected.len());
    assert_eq!(stats.queued, 0);
}

#[test]
fn cancel_stops_running_and_queued_requests() {
    let server = Server::start(config(Mode::Dense, 4)).unwrap();
    let (rx1, streamed, c1) = submit(
        &server,
        "long",
        "Write a long story about a robot.",
        Some(400),
    );
    let t = std::time::Instant::now();
    while streamed.lock().unwrap().is_empty() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (rx2, _, c2) = submit(&server, "queued", "Hello", Some(8));
    // A queued request cancelled: answered at once, its slot freed while the
    // first one still runs.
    c2.cancel();
    server.purge_cancelled();
    let r2 = rx2
        .recv_timeout(Duration::from_secs(5))
        .expect("cancelled job answered at once");
    assert!(!r2.success && r2.cancelled(), "{r2:?}");
    assert_eq!(server.stats().queued, 0);
    assert!(server.stats().busy);
    // Let the first produce some text, then cancel it.
    while streamed.lock().unwrap().len() < 20 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    c1.cancel();
    let r1 = wait(&rx1);
    assert!(r1.success && r1.cancelled(), "{r1:?}");
    assert!(r1.generated_tokens > 0 && r1.generated_tokens < 400);
    assert_eq!(*streamed.lock().unwrap(), r1.text);
    // The queue keeps serving.
    let (rx3, _, _) = submit(&server, "after", "Hello", Some(4));
    assert!(wait(&rx3).success);
}

#[test]
fn invalid_requests_and_settings_are_refused_with_reasons() {
    let server = Server::start(config(Mode::Selectinfer, 4)).unwrap();
    for (prompt, max, expected) in [
        ("", None, "prompt is empty"),
        ("hi", Some(0), "max_new_tokens"),
        ("hi", Some(1_000_000_000), "max_new_tokens"),
        (&"word ".repeat(6000)[..], None, "exceeds the context"),
    ] {
        let (rx, _, _) = submit(&server, "bad", prompt, max);
        let r = wait(&rx);
        assert!(!r.success && r.error.contains(expected), "{}", r.error);
    }
    let mut s = server.settings();
    s.compute_ratio = 0.9; // > γ = 0.7
    let e = server.update_settings(s.clone()).unwrap_err().to_string();
    assert!(e.contains("compute_ratio"), "{e}");
    s.compute_ratio = 0.6;
    server.update_settings(s).unwrap();
    let (rx, _, _) = submit(&server, "phi", "Hello", Some(4));
    let r = wait(&rx);
    assert!(r.success);
    // 28 sparse layers at 0.6 + 2 dense layers, over 30.
    assert!(
        (r.compute_ratio - (28.0 * 0.6 + 2.0) / 30.0).abs() < 0.01,
        "{}",
        r.compute_ratio
    );

    let dense = Server::start(config(Mode::Dense, 1)).unwrap();
    let mut s = dense.settings();
    s.compute_ratio = 0.3;
    assert!(dense.update_settings(s).is_err());
}

#[test]
fn shutdown_answers_queued_requests() {
    let server = Server::start(config(Mode::Dense, 4)).unwrap();
    let jobs: Vec<_> = (0..4)
        .map(|i| {
            submit(
                &server,
                &format!("s{i}"),
                "Tell me about the sea.",
                Some(200),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    server.shutdown();
    for (rx, _, _) in &jobs {
        let r = wait(rx);
        assert!(r.success || r.error.contains("shutting down"), "{r:?}");
    }
    let (rx, _, _) = submit(&server, "late", "Hello", None);
    assert!(wait(&rx).error.contains("shutting down"));
}

/// Requests are answered under the task they were accepted with: the
/// node's task changed at runtime applies to requests accepted after it,
/// a request naming another task swaps that task's base set in first.
#[test]
fn each_request_is_answered_under_the_task_it_was_accepted_with() {
    let mut cfg = config(Mode::LoadOnly, 8);
    cfg.engine.dtype = selectinfer::sys::device::WeightDtype::Q8;
    let server = Server::start(cfg).unwrap();
    let ask = |id: &str, task: &str| {
        let (tx, rx) = channel();
        server.submit(Job {
            request: Request {
                id: id.into(),
                prompt: "Name a colour.".into(),
                task: task.into(),
                max_new_tokens: Some(8),
                ..Default::default()
            },
            cancel: CancelToken::default(),
            on_token: Box::new(|_, _| {}),
            on_done: Box::new(move |r| tx.send(r).unwrap()),
        });
        rx
    };
    let first = ask("a", "");
    let mut s = server.settings();
    s.task = "translation".into();
    server.update_settings(s.clone()).unwrap();
    let (second, third, fourth) = (ask("b", ""), ask("c", "qa"), ask("d", "summarization"));
    let replies: Vec<Reply> = [first, second, third, fourth].iter().map(wait).collect();
    for r in &replies {
        assert!(r.success, "{}: {}", r.request_id, r.error);
    }
    let tasks: Vec<&str> = replies.iter().map(|r| r.task.as_str()).collect();
    assert_eq!(tasks, ["qa", "translation", "qa", "summarization"]);
    assert_eq!(
        replies[0].text, replies[2].text,
        "qa's plan again, qa's answer again"
    );
    s.task = "navigation".into();
    let e = server.update_settings(s).unwrap_err().to_string();
    assert!(
        e.contains("unknown task `navigation`") && e.contains("qa"),
        "{e}"
    );
    let r = wait(&ask("e", "navigation"));
    assert!(
        !r.success && r.error.contains("unknown task"),
        "{}",
        r.error
    );
}
