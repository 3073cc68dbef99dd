//! Replaying recorded prompt streams (rosbag2 bags) against a running node:
//! the per-request records and the report (latency percentiles, throughput,
//! tokens/s, rejected and lost requests). The part that talks to ROS is
//! [`ros`] (feature `ros`); this part works without it. Bags are read by
//! [`crate::bag`].

#[cfg(feature = "ros")]
pub mod ros;

use serde::Serialize;

/// What happened to one replayed prompt.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestRecord {
    pub request_id: String,
    pub task: String,
    /// Seconds after the replay started when it was published.
    pub sent_at_s: f64,
    /// Client-side time to the first streamed token (`None`: none arrived).
    pub ttft_s: Option<f64>,
    /// Client-side time to the response (`None`: lost).
    pub latency_s: Option<f64>,
    pub answered: bool,
    pub success: bool,
    pub rejected: bool,
    pub error: String,
    pub generated_tokens: u32,
    /// The node's own decode tokens/s for this request.
    pub tokens_per_s: f64,
}

/// Nearest-rank percentile of `values` (`None` when empty).
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

/// p50 / p90 / p99 of a sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Self {
        Self {
            p50: percentile(values, 50.0),
            p90: percentile(values, 90.0),
            p99: percentile(values, 99.0),
        }
    }
}

/// The replay's summary and its per-request records.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub bag: String,
    pub node: String,
    pub timing: String,
    pub requests: usize,
    pub answered: usize,
    pub succeeded: usize,
    pub rejected: usize,
    /// Answered with an error other than a rejection.
    pub failed: usize,
    /// Never answered within the timeout.
    pub lost: usize,
    pub wall_s: f64,
    /// Succeeded requests per second of wall time.
    pub throughput_rps: f64,
    pub generated_tokens: u64,
    /// Generated tokens per second of wall time (all requests together).
    pub tokens_per_s: f64,
    /// Mean of the node's per-request decode tokens/s.
    pub mean_decode_tokens_per_s: f64,
    pub ttft_s: Percentiles,
    pub latency_s: Percentiles,
    pub records: Vec<RequestRecord>,
}

impl ReplayReport {
    /// Summarises `records` of a replay that took `wall_s` seconds.
    pub fn new(
        bag: &str,
        node: &str,
        timing: &str,
        records: Vec<RequestRecord>,
        wall_s: f64,
    ) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.success).collect();
        let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
        let latency: Vec<f64> = ok.iter().filter_map(|r| r.latency_s).collect();
        let generated: u64 = records.iter().map(|r| r.generated_tokens as u64).sum();
        let wall = wall_s.max(1e-9);
        Self {
            bag: bag.into(),
            node: node.into(),
            timing: timing.into(),
            requests: records.len(),
            answered: records.iter().filter(|r| r.answered).count(),
            succeeded: ok.len(),
            rejected: records.iter().filter(|r| r.rejected).count(),
            failed: records
                .iter()
                .filter(|r| r.answered && !r.success && !r.rejected)
                .count(),
            lost: records.iter().filter(|r| !r.answered).count(),
            wall_s,
            throughput_rps: ok.len() as f64 / wall,
            generated_tokens: generated,
            tokens_per_s: generated as f64 / wall,
            mean_decode_tokens_per_s: if ok.is_empty() {
                0.0
            } else {
                ok.iter().map(|r| r.tokens_per_s).sum::<f64>() / ok.len() as f64
            },
            ttft_s: Percentiles::of(&ttft),
            latency_s: Percentiles::of(&latency),
            records,
        }
    }

    /// A markdown summary table.
    pub fn markdown(&self) -> String {
        let f = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.3}"));
        format!(
            "| bag | timing | requests | succeeded | rejected | failed | lost | wall s | req/s | tok/s (all) | decode tok/s (mean) | TTFT p50/p90/p99 s | latency p50/p90/p99 s |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n\
             | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.1} | {:.1} | {} / {} / {} | {} / {} / {} |\n",
            self.bag,
            self.timing,
            self.requests,
            self.succeeded,
            self.rejected,
            self.failed,
            self.lost,
            self.wall_s,
            self.throughput_rps,
            self.tokens_per_s,
            self.mean_decode_tokens_per_s,
            f(self.ttft_s.p50),
            f(self.ttft_s.p90),
            f(self.ttft_s.p99),
            f(self.latency_s.p50),
            f(self.latency_s.p90),
            f(self.latency_s.p99),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[2.0, 1.0], 50.0), Some(1.0));
    }

    #[test]
    fn report_counts_every_outcome() {
        let rec = |success, rejected, answered| RequestRecord {
            success,
            rejected,
            answered,
            latency_s: answered.then_some(1.0),
            ttft_s: success.then_some(0.5),
            generated_tokens: if success { 10 } else { 0 },
            tokens_per_s: 20.0,
            ..Default::default()
        };
        let r = ReplayReport::new(
            "b",
            "/n",
            "fast",
            vec![
                rec(true, false, true),
                rec(false, true, true),
                rec(false, false, true),
                rec(false, false, false),
            ],
            2.0,
        );
        assert_eq!(
            (
                r.requests,
                r.succeeded,
                r.rejected,
                r.failed,
                r.lost,
                r.answered
            ),
            (4, 1, 1, 1, 1, 3)
        );
        assert_eq!(r.generated_tokens, 10);
        assert_eq!(r.tokens_per_s, 5.0);
        assert_eq!(r.ttft_s.p50, Some(0.5));
        assert!(r.markdown().contains("| b | fast | 4 | 1 | 1 | 1 | 1 |"));
    }
}
