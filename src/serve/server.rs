//! The request queue between front ends (the ROS node's service, topics and
//! action) and the engine: one bounded FIFO, one worker thread that owns the
//! engine, and an answer for every request — text, error or explicit
//! rejection. Settings that need no reload (φ, α, sampling, max tokens, the
//! task) can change at runtime and apply to the next request. A request is
//! answered under the task it was accepted with: before running one whose
//! task differs from the loaded plan's, the worker swaps the base set
//! ([`EngineSpec::swap_task`]: only the neurons the new plan adds are read).
//! No ROS in here.

pub use super::request::{Reply, Request};
use crate::engine::stops::StopStrings;
use crate::engine::tool_offer::Offer;
use crate::engine::EngineSpec;
use crate::engine::Grammar;
use crate::engine::{conversation, TextCodec};
use crate::engine::{CallGate, CallThresholds, Engine, GenerateOptions, Sampling};
use crate::method::Mode;
use crate::method::SelectionParams;
use crate::sys::memory;
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Cancels a request: before it starts (it never runs) or while it runs
/// (generation stops at the next token).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Streamed text: `(index, piece)`; pieces concatenate to the reply's text.
pub type TokenSink = Box<dyn FnMut(usize, &str) + Send>;
/// Receives the reply; called exactly once per submitted job.
pub type ReplySink = Box<dyn FnOnce(Reply) + Send>;

/// A request with where its tokens and reply go.
pub struct Job {
    pub request: Request,
    pub cancel: CancelToken,
    pub on_token: TokenSink,
    pub on_done: ReplySink,
}

/// Settings that apply to the next request without reloading the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuntimeSettings {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// φ and α; only used by modes that select per prompt.
    pub compute_ratio: f64,
    pub token_ratio: f64,
    /// The task of requests that name none.
    pub task: String,
    /// The system turn of every conversation that brings none (empty =
    /// the model's template default).
    pub system_prompt: String,
    /// Reuse the last prompt's cache for a prompt that starts the same.
    pub prefix_cache: bool,
}

/// Counters published as node statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Requests waiting in the queue (not counting the running one).
    pub queued: usize,
    pub queue_capacity: usize,
    pub busy: bool,
    pub completed: u64,
    /// Requests that were valid but failed (the model, a task swap).
    pub failed: u64,
    /// Invalid requests, answered at once with why (not counted as failed).
    pub refused: u64,
    /// Valid requests turned away: queue full, shutting down.
    pub rejected: u64,
    pub cancelled: u64,
    /// Decode tokens/s of the last completed generation.
    pub last_tokens_per_s: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

/// What runtime settings may be on a loaded server: the node's parameter
/// descriptors are drawn from it, so they say what a set accepts.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    /// `max_new_tokens` is below it.
    pub max_context: usize,
    /// Tasks with a plan (`task` is one of them).
    pub tasks: Vec<String>,
    /// φ's range, `[δ, γ]` as loaded; `None` where φ does not apply (the
    /// mode computes every loaded neuron).
    pub compute_ratio: Option<(f64, f64)>,
}

/// What runtime settings must respect, fixed at load.
#[derive(Debug, Clone)]
struct Limits {
    max_context: usize,
    num_layers: usize,
    /// Whether the mode selects neurons per prompt (φ and α apply).
    selects: bool,
    load_params: SelectionParams,
    tasks: Vec<String>,
}

impl Limits {
    fn check(&self, s: &RuntimeSettings) -> Result<()> {
        if s.max_new_tokens == 0 || s.max_new_tokens >= self.max_context {
            bail!(
                "max_new_tokens must be in [1, {}), got {}",
                self.max_context,
                s.max_new_tokens
            );
        }
        s.sampling.validate()?;
        known_task(&s.task, &self.tasks)?;
        let p = &self.load_params;
        if self.selects {
            p.with_selection(s.compute_ratio, s.token_ratio, self.num_layers)?;
        } else if (s.compute_ratio, s.token_ratio) != (p.compute_ratio, p.token_ratio) {
            bail!("this mode computes every loaded neuron: compute_ratio and token_ratio apply to selectinfer, coreinfer and random-load");
        }
        Ok(())
    }
}

/// Refuses a task the node has no plan for, naming those it has.
fn known_task(task: &str, tasks: &[String]) -> Result<()> {
    if !tasks.iter().any(|t| t == task) {
        bail!(
            "unknown task `{task}`; this node knows: {}",
            tasks.join(", ")
        );
    }
    Ok(())
}

/// How the server is configured at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub engine: EngineSpec,
    pub queue_depth: usize,
    pub defaults: RuntimeSettings,
}

/// The FIFO and whether it still takes jobs.
struct Queue {
    jobs: VecDeque<Job>,
    open: bool,
}

struct Shared {
    settings: Mutex<(RuntimeSettings, u64)>,
    queue: Mutex<Queue>,
    wake: Condvar,
    busy: AtomicBool,
    completed: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    rejected: AtomicU64,
    cancelled: AtomicU64,
    last_tokens_per_s: Mutex<f64>,
}

/// The queue and its worker. Dropping it answers every still-queued request
/// with an error and joins the worker.
pub struct Server {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    capacity: usize,
    limits: Limits,
    mode: Mode,
    codec: TextCodec,
    shutting_down: Arc<AtomicBool>,
}

impl Server {
    /// Loads the engine (errors here are start-up errors) and starts the worker.
    pub fn start(config: ServerConfig) -> Result<Self> {
        if config.queue_depth == 0 {
            bail!("queue_depth must be at least 1");
        }
        let spec = &config.engine;
        let mut engine = spec.load()?;
        let tasks: Vec<String> = match engine.method.as_ref().map(|m| &m.ranking_tasks) {
            Some(t) if !t.is_empty() => t.clone(),
            _ => crate::engine::defaults::TASKS
                .iter()
                .map(|t| t.to_string())
                .collect(),
        };
        // The parameters as loaded: a memory plan chose γ (and, where every
        // loaded neuron is computed, φ and δ with it).
        let load_params = engine
            .params()
            .cloned()
            .unwrap_or_else(|| spec.effective_params());
        let limits = Limits {
            max_context: engine.model.max_context(),
            num_layers: engine.model.config().num_hidden_layers,
            selects: engine.selection().is_some(),
            load_params,
            tasks,
        };
        let mut defaults = config.defaults.clone();
        if !limits.selects {
            defaults.compute_ratio = limits.load_params.compute_ratio;
            defaults.token_ratio = limits.load_params.token_ratio;
        }
        limits.check(&defaults)?;
        if limits.selects {
            engine.set_selection(defaults.compute_ratio, defaults.token_ratio)?;
        }
        let shared = Arc::new(Shared {
            settings: Mutex::new((defaults, 0)),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                open: true,
            }),
            wake: Condvar::new(),
            busy: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            last_tokens_per_s: Mutex::new(0.0),
        });
        let codec = engine.codec.clone();
        let shutting_down = Arc::new(AtomicBool::new(false));
        let worker = {
            let shared = shared.clone();
            let stop = shutting_down.clone();
            let spec = spec.clone();
            std::thread::Builder::new()
                .name("selectinfer-worker".into())
                .spawn(move || worker_loop(engine, spec, shared, stop))?
        };
        Ok(Self {
            shared,
            worker: Mutex::new(Some(worker)),
            capacity: config.queue_depth,
            limits,
            mode: spec.mode,
            codec,
            shutting_down,
        })
    }

    /// Tasks a request may name.
    pub fn tasks(&self) -> &[String] {
        &self.limits.tasks
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn settings(&self) -> RuntimeSettings {
        self.shared.settings.lock().unwrap().0.clone()
    }

    /// Validates and applies new runtime settings (for the next request).
    pub fn update_settings(&self, new: RuntimeSettings) -> Result<()> {
        self.limits.check(&new)?;
        let mut s = self.shared.settings.lock().unwrap();
        if s.0 != new {
            s.0 = new;
            s.1 += 1;
        }
        Ok(())
    }

    /// Checks what can be checked without the model; the worker checks the
    /// prompt's length against the context. [`Server::submit`] answers a
    /// request this refuses with the error; public for the fuzz tests.
    pub fn check_request(&self, r: &Request) -> Result<()> {
        conversation("", &r.messages, &r.prompt)?;
        StopStrings::check(&r.stop)?;
        let offer = Offer::from_fields(&r.tools, &r.tool_choice, r.parallel_tool_calls)?;
        let own = Grammar::of_fields(&r.json_schema, &r.grammar)?;
        if let Some(g) = offer.grammar_with(own, &self.codec)? {
            self.codec.grammars()?.compile(&g)?;
        }
        if !r.task.is_empty() {
            known_task(&r.task, &self.limits.tasks)?;
        }
        if let Some(n) = r.max_new_tokens {
            if n < 1 || n as u64 >= self.limits.max_context as u64 {
                bail!(
                    "max_new_tokens must be in [1, {}) (the context), got {n}",
                    self.limits.max_context
                );
            }
        }
        if let Some(s) = r.seed {
            if s < 0 {
                bail!("seed must be >= 0, got {s}");
            }
        }
        let probe = Sampling {
            temperature: r.temperature.unwrap_or(0.0),
            top_p: r.top_p.unwrap_or(1.0),
            seed: 0,
        };
        probe.validate()
    }

    /// Queues `job`, or answers it at once with an error (invalid request)
    /// or a rejection (queue full, shutting down). Returns `true` if queued.
    pub fn submit(&self, mut job: Job) -> bool {
        if job.request.id.is_empty() {
            job.request.id = new_request_id();
        }
        if job.request.task.is_empty() {
            job.request.task = self.settings().task;
        }
        if let Err(e) = self.check_request(&job.request) {
            self.shared.refused.fetch_add(1, Ordering::Relaxed);
            log::info!("request {} refused: {e:#}", job.request.id);
            (job.on_done)(Reply::error(&job.request.id, format!("{e:#}")));
            return false;
        }
        let mut q = self.shared.queue.lock().unwrap();
        if !q.open {
            drop(q);
            return self.reject(job, "rejected: the node is shutting down");
        }
        if q.jobs.len() >= self.capacity {
            drop(q);
            return self.reject(job, &self.queue_full_reason());
        }
        q.jobs.push_back(job);
        drop(q);
        self.shared.wake.notify_one();
        true
    }

    /// Answers and removes the queued jobs whose cancel token is set, so a
    /// cancelled request frees its queue slot at once (call after cancelling).
    pub fn purge_cancelled(&self) {
        let removed: Vec<Job> = {
            let mut q = self.shared.queue.lock().unwrap();
            let (gone, kept): (Vec<Job>, Vec<Job>) =
                q.jobs.drain(..).partition(|j| j.cancel.is_cancelled());
            q.jobs = kept.into();
            gone
        };
        for job in removed {
            self.shared.cancelled.fetch_add(1, Ordering::Relaxed);
            log::info!("request {} cancelled while queued", job.request.id);
            (job.on_done)(cancelled_before_start(&job.request.id));
        }
    }

    fn reject(&self, job: Job, why: &str) -> bool {
        self.shared.rejected.fetch_add(1, Ordering::Relaxed);
        log::info!("request {} {why}", job.request.id);
        (job.on_done)(Reply::error(&job.request.id, why));
        false
    }

    /// Why a request is refused when the queue is full.
    pub(crate) fn queue_full_reason(&self) -> String {
        format!(
            "rejected: the queue is full (queue_depth {})",
            self.capacity
        )
    }

    /// Whether one more job would be queued now (for action goal acceptance).
    /// What runtime settings may be (see [`Bounds`]).
    pub(crate) fn bounds(&self) -> Bounds {
        let l = &self.limits;
        Bounds {
            max_context: l.max_context,
            tasks: l.tasks.clone(),
            compute_ratio: l
                .selects
                .then_some((l.load_params.static_ratio, l.load_params.load_ratio)),
        }
    }

    pub(crate) fn has_room(&self) -> bool {
        let q = self.shared.queue.lock().unwrap();
        q.open && q.jobs.len() < self.capacity
    }

    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            queued: s.queue.lock().unwrap().jobs.len(),
            queue_capacity: self.capacity,
            busy: s.busy.load(Ordering::SeqCst),
            completed: s.completed.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            rejected: s.rejected.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            last_tokens_per_s: *s.last_tokens_per_s.lock().unwrap(),
            rss_bytes: memory::rss_bytes(),
            peak_rss_bytes: memory::peak_rss_bytes(),
        }
    }

    /// The task requests default to now.
    pub fn task(&self) -> String {
        self.settings().task
    }
}

impl Server {
    /// Stops taking requests, stops the running generation at its next token
    /// (its partial text is the reply), answers every queued request with a
    /// rejection and joins the worker. Idempotent.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.shared.queue.lock().unwrap().open = false;
        self.shared.wake.notify_all();
        let worker = self.worker.lock().unwrap().take();
        if let Some(w) = worker {
            let _ = w.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A request id for requests that came without one.
pub(crate) fn new_request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("req-{t}-{n}")
}

fn cancelled_before_start(id: &str) -> Reply {
    Reply {
        stop_reason: "cancelled".into(),
        ..Reply::error(id, "cancelled before it started")
    }
}

/// Next job, waiting for one; `None` once the queue is closed and empty.
fn next_job(shared: &Shared) -> Option<Job> {
    let mut q = shared.queue.lock().unwrap();
    loop {
        if let Some(job) = q.jobs.pop_front() {
            return Some(job);
        }
        if !q.open {
            return None;
        }
        q = shared.wake.wait(q).unwrap();
    }
}

fn worker_loop(
    mut engine: Engine,
    spec: EngineSpec,
    shared: Arc<Shared>,
    shutting_down: Arc<AtomicBool>,
) {
    let mut applied = 0u64;
    // The task whose base set the engine holds.
    let mut loaded_task = spec.params.task.clone();
    while let Some(job) = next_job(&shared) {
        let id = job.request.id.clone();
        if shutting_down.load(Ordering::SeqCst) {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            (job.on_done)(Reply::error(&id, "rejected: the node is shutting down"));
            continue;
        }
        if job.cancel.is_cancelled() {
            shared.cancelled.fetch_add(1, Ordering::Relaxed);
            (job.on_done)(cancelled_before_start(&id));
            continue;
        }
        let settings = {
            let s = shared.settings.lock().unwrap();
            if s.1 != applied && engine.selection().is_some() {
                if let Err(e) = engine.set_selection(s.0.compute_ratio, s.0.token_ratio) {
                    log::error!("could not apply compute_ratio/token_ratio: {e:#}");
                }
            }
            applied = s.1;
            s.0.clone()
        };
        shared.busy.store(true, Ordering::SeqCst);
        let Job {
            request,
            cancel,
            mut on_token,
            on_done,
        } = job;
        let started = Instant::now();
        if spec.mode.needs_ranking() && request.task != loaded_task {
            let swapped = catch_unwind(AssertUnwindSafe(|| {
                spec.swap_task(&mut engine, &request.task)
            }))
            .unwrap_or_else(|_| Err(anyhow::anyhow!("internal error: the swap panicked")));
            match swapped {
                Ok(r) => {
                    log::info!(
                        "task {} -> {}: {} neurons read ({:.1} MiB) in {:.2} s",
                        loaded_task,
                        r.task,
                        r.neurons_read,
                        r.bytes_read as f64 / (1u64 << 20) as f64,
                        r.seconds
                    );
                    loaded_task = r.task;
                }
                Err(e) => {
                    // Back to the plan the engine held, layer by layer where
                    // the swap stopped part way.
                    if let Err(back) = spec.swap_task(&mut engine, &loaded_task) {
                        log::error!("could not restore task {loaded_task}'s plan: {back:#}");
                    }
                    shared.busy.store(false, Ordering::SeqCst);
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                    log::error!("request {id}: switching to task {}: {e:#}", request.task);
                    on_done(Reply::error(
                        &id,
                        format!("switching to task {}: {e:#}", request.task),
                    ));
                    continue;
                }
            }
        }
        let stop = || cancel.is_cancelled() || shutting_down.load(Ordering::SeqCst);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_request(&mut engine, &request, &settings, &stop, &mut on_token)
        }));
        shared.busy.store(false, Ordering::SeqCst);
        let reply = match result {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => Reply::error(&id, format!("{e:#}")),
            Err(_) => Reply::error(
                &id,
                "internal error: generation panicked (see the node log)",
            ),
        };
        if reply.success {
            *shared.last_tokens_per_s.lock().unwrap() = reply.tokens_per_s;
            if reply.cancelled() {
                shared.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.completed.fetch_add(1, Ordering::Relaxed);
            }
            log::info!(
                "request {id}: {} ({} cached) + {} tokens in {:.2} s ({})",
                reply.prompt_tokens,
                reply.cached_prompt_tokens,
                reply.generated_tokens,
                started.elapsed().as_secs_f64(),
                reply.stop_reason
            );
        } else {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            log::warn!("request {id} failed: {}", reply.error);
        }
        on_done(reply);
    }
}

fn run_request(
    engine: &mut Engine,
    r: &Request,
    settings: &RuntimeSettings,
    stop: &dyn Fn() -> bool,
    on_token: &mut TokenSink,
) -> Result<Reply> {
    let offer = Offer::from_fields(&r.tools, &r.tool_choice, r.parallel_tool_calls)?;
    let own = Grammar::of_fields(&r.json_schema, &r.grammar)?;
    let grammar = offer.grammar_with(own, &engine.codec)?;
    let opts = GenerateOptions {
        max_new_tokens: r
            .max_new_tokens
            .map_or(settings.max_new_tokens, |n| n as usize),
        sampling: Sampling {
            temperature: r.temperature.unwrap_or(settings.sampling.temperature),
            top_p: r.top_p.unwrap_or(settings.sampling.top_p),
            seed: r.seed.map_or(settings.sampling.seed, |s| s as u64),
        },
        ignore_eos: false,
        stop: r.stop.clone(),
        grammar,
        call_gate: CallGate::for_offer(&engine.codec, &offer, CallThresholds::TUNED),
    };
    let turns = conversation(&settings.system_prompt, &r.messages, &r.prompt)?;
    engine.prefix_cache = settings.prefix_cache;
    let mut index = 0usize;
    let mut streamed = String::new();
    let g = engine.generate_turns(&turns, &offer.tools, &opts, |piece| {
        on_token(index, piece);
        streamed.push_str(piece);
        index += 1;
        !stop()
    })?;
    // Text still held back by the stream (an unfinished UTF-8 sequence at
    // the end) goes out too, so the pieces always add up to the reply.
    if let Some(rest) = g.text.strip_prefix(streamed.as_str()) {
        if !rest.is_empty() {
            on_token(index, rest);
        }
    } else {
        log::warn!(
            "request {}: streamed text differs from the final text",
            r.id
        );
    }
    let answer = offer.answer(g.text, g.stop_reason.name());
    if answer.cut > 0 {
        log::warn!(
            "request {}: {} call(s) cut short ({}); the reply keeps the raw text",
            r.id,
            answer.cut,
            answer.stop_reason
        );
    }
    Ok(Reply {
        success: true,
        error: String::new(),
        request_id: r.id.clone(),
        text: answer.text,
        tool_calls: answer.calls,
        prompt_tokens: g.prompt_tokens,
        cached_prompt_tokens: g.cached_prompt_tokens,
        generated_tokens: g.generated_tokens,
        ttft_s: g.ttft_s,
        tokens_per_s: g.decode_tokens_per_s,
        compute_ratio: g.compute_ratio,
        task: r.task.clone(),
        stop_reason: answer.stop_reason,
    })
}
