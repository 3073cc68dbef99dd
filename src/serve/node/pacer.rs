//! Paced replies: every `~/generate` service response and `~/response`
//! message leaves through one thread that keeps at least `pace` between two
//! of them, so a burst (a full queue rejecting a wave of calls at once)
//! cannot overflow the clients' reply history.
//!
//! Why (measured with `lab/scripts/dds_reply_burst.py`, a plain rclpy server,
//! no selectinfer code): Fast DDS delivers every reply of a service to
//! every client's reader, and rmw filters by client only when rclpy takes
//! it; a client with ROS's default QoS (KEEP_LAST 10) whose executor is a
//! little behind drops its own replies under a burst of others'. 8 clients
//! x 10 calls answered back to back: 25-71 of 80 arrived; with 1-10 ms
//! between replies: 80 of 80 (16 clients: 160 of 160 at 5 ms).

use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Outgoing = Box<dyn FnOnce() + Send>;

/// Runs sends in order, at least `pace` apart; dropping it runs what is
/// still waiting, then ends the thread.
pub(super) struct Pacer {
    tx: Mutex<Option<Sender<Outgoing>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Pacer {
    pub(crate) fn new(pace: Duration) -> std::io::Result<Self> {
        let (tx, rx) = channel::<Outgoing>();
        let thread = std::thread::Builder::new()
            .name("reply-pacer".into())
            .spawn(move || {
                let mut last: Option<Instant> = None;
                for send in rx {
                    if let Some(t) = last {
                        let next = t + pace;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                    }
                    last = Some(Instant::now());
                    send();
                }
            })?;
        Ok(Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `send` behind the replies already waiting. After
    /// [`Pacer::finish`] it runs at once, on the caller's thread: a reply
    /// is never dropped.
    pub(crate) fn send(&self, send: impl FnOnce() + Send + 'static) {
        let send: Outgoing = Box::new(send);
        let left = match self.tx.lock().unwrap().as_ref() {
            Some(tx) => tx.send(send).err().map(|e| e.0),
            None => Some(send),
        };
        if let Some(send) = left {
            send();
        }
    }

    /// Sends everything queued (still paced) and stops the thread.
    pub(crate) fn finish(&self) {
        drop(self.tx.lock().unwrap().take());
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Pacer {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn sends_everything_in_order_at_least_pace_apart() {
        let pacer = Pacer::new(Duration::from_millis(4)).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..10 {
            let seen = seen.clone();
            pacer.send(move || seen.lock().unwrap().push((i, Instant::now())));
        }
        pacer.finish();
        // After finish a send still happens (on the caller's thread).
        let s2 = seen.clone();
        pacer.send(move || s2.lock().unwrap().push((10, Instant::now())));
        let seen = seen.lock().unwrap();
        let order: Vec<i32> = seen.iter().map(|s| s.0).collect();
        assert_eq!(order, (0..=10).collect::<Vec<_>>());
        for w in seen[..10].windows(2) {
            assert!(
                w[1].1 - w[0].1 >= Duration::from_millis(4),
                "{:?}",
                w[1].1 - w[0].1
            );
        }
    }
}
