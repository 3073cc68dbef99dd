//! Stop strings: generation ends where the text first contains one of a
//! request's strings. The string is not part of the answer, and streamed
//! pieces never show part of one: text that could be the start of a stop
//! string is held back until it cannot.

use anyhow::{bail, Result};

/// Where the text stands against the stop strings.
#[derive(Clone)]
pub(crate) struct StopStrings {
    stops: Vec<String>,
    text: String,
    emitted: usize,
}

impl StopStrings {
    /// Longest stop string accepted, in bytes.
    pub(crate) const MAX_LEN: usize = 256;
    /// Stop strings per request at most.
    pub(crate) const MAX_COUNT: usize = 16;

    /// Checks a request's stop strings: none empty, at most
    /// [`Self::MAX_COUNT`] of at most [`Self::MAX_LEN`] bytes.
    pub(crate) fn check(stops: &[String]) -> Result<()> {
        if stops.len() > Self::MAX_COUNT {
            bail!(
                "{} stop strings given, at most {} are taken",
                stops.len(),
                Self::MAX_COUNT
            );
        }
        for (i, s) in stops.iter().enumerate() {
            if s.is_empty() {
                bail!("stop string {i} is empty");
            }
            if s.len() > Self::MAX_LEN {
                bail!(
                    "stop string {i} is {} bytes, at most {} are taken",
                    s.len(),
                    Self::MAX_LEN
                );
            }
        }
        Ok(())
    }

    pub(crate) fn new(stops: &[String]) -> Result<Self> {
        Self::check(stops)?;
        Ok(Self {
            stops: stops.to_vec(),
            text: String::new(),
            emitted: 0,
        })
    }

    /// Adds a piece of generated text; returns the text that can be shown
    /// now and whether a stop string was reached (the text ends before it).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.text.push_str(piece);
        // A stop string can only start in text not shown yet (whatever
        // could start one is held back): no need to search the whole answer.
        let fresh = &self.text[self.emitted..];
        let hit = self
            .stops
            .iter()
            .filter_map(|s| fresh.find(s.as_str()))
            .min()
            .map(|at| self.emitted + at);
        if let Some(at) = hit {
            self.text.truncate(at);
            return (self.take(at), true);
        }
        let held = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.text.len() + 1))
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let upto = (self.text.len() - held).max(self.emitted);
        (self.take(upto), false)
    }

    /// What is still held back (generation ended without a stop string).
    pub(crate) fn finish(&mut self) -> String {
        self.take(self.text.len())
    }

    /// The answer so far (before any stop string reached).
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    fn take(&mut self, upto: usize) -> String {
        let out = self.text[self.emitted..upto].to_string();
        self.emitted = upto;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops).unwrap();
        let mut shown = Vec::new();
        for p in pieces {
            let (out, hit) = s.push(p);
            shown.push(out);
            if hit {
                return (shown, true, s.text().to_string());
            }
        }
        shown.push(s.finish());
        (shown, false, s.text().to_string())
    }

    #[test]
    fn a_stop_split_over_pieces_is_never_shown_and_ends_the_text() {
        let (shown, hit, text) = run(&["</plan>"], &["go to", " dock</", "pl", "an> more"]);
        assert!(hit);
        assert_eq!(text, "go to dock");
        assert_eq!(shown, ["go to", " dock", "", ""]);
        assert_eq!(shown.concat(), text);
    }

    #[test]
    fn a_false_start_is_released_and_the_earliest_stop_wins() {
        let (shown, hit, text) = run(&["STOP", "\n\n"], &["a S", "TOr", "y\n", "\nSTOP"]);
        assert!(hit);
        assert_eq!(text, "a STOry");
        assert_eq!(shown, ["a ", "STOr", "y", ""]);
        let (shown, hit, text) = run(&["END"], &["it E", "N"]);
        assert!(!hit);
        assert_eq!(text, "it EN");
        assert_eq!(
            shown.concat(),
            "it EN",
            "held-back text comes out at the end"
        );
    }

    #[test]
    fn multibyte_stops_and_bad_lists() {
        let (_, hit, text) = run(&["ü!"], &["gr", "\u{fc}", "n ", "\u{fc}!"]);
        assert!(hit);
        assert_eq!(text, "grün ");
        assert!(StopStrings::new(&[String::new()]).is_err());
        assert!(StopStrings::check(&vec!["x".to_string(); 17]).is_err());
        assert!(StopStrings::check(&["y".repeat(257)]).is_err());
    }
}
