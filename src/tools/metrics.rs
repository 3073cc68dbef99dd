//! Text-generation evaluation metrics for the eval harness: corpus BLEU and
//! chrF (as `sacrebleu` computes them with its defaults), ROUGE-1/2/L F1 (as
//! Google's `rouge-score` package computes them) and the official SQuAD v1.1
//! exact match / token F1.
//!
//! Every function takes the hypotheses (model outputs) and, per example, a
//! list of references, and returns a score on the 0..100 scale. They are
//! re-implementations checked against the Python packages themselves by
//! `tests/metrics.rs` on the fixture written by
//! `scripts/reference/make_metric_fixtures.py` (sacrebleu 2.6.0,
//! rouge-score 0.1.2), so numbers are comparable with published ones that
//! used those tools' defaults.
//!
//! Conventions shared by all functions:
//! - `hyps.len()` must equal `refs.len()` (they panic otherwise); an empty
//!   corpus scores 0.
//! - `refs[i]` holds all references of example `i`; examples may have
//!   different numbers of references. For BLEU and chrF this is what
//!   sacrebleu does when its reference streams are padded with `None`.
//! - An example with no references is scored as if it had one empty
//!   reference (the Python tools reject such input).
//! - "Whitespace" is Python's `str.split()` notion (Unicode White_Space plus
//!   U+001C..U+001F), since the reference tools split that way.

use std::collections::HashMap;
use std::hash::Hash;

/// Python's `str.isspace()`: Unicode White_Space plus the information
/// separators U+001C..U+001F.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.split()` with no arguments.
fn py_split(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_py_space).filter(|t| !t.is_empty())
}

/// Empty-reference stand-in for examples that have no references.
const NO_REFS: &[String] = &[String::new()];

fn refs_or_empty(refs: &[String]) -> &[String] {
    if refs.is_empty() {
        NO_REFS
    } else {
        refs
    }
}

fn check_lengths(what: &str, hyps: usize, refs: usize) {
    assert_eq!(
        hyps, refs,
        "{what}: {hyps} hypotheses but {refs} reference lists"
    );
}

/// Counts of all windows of length `n` of `items`.
fn ngram_counts<T: Eq + Hash>(items: &[T], n: usize) -> HashMap<&[T], u32> {
    let mut counts = HashMap::new();
    if n > 0 {
        for w in items.windows(n) {
            *counts.entry(w).or_insert(0) += 1;
        }
    }
    counts
}

// ---------------------------------------------------------------------------
// BLEU
// ---------------------------------------------------------------------------

const BLEU_MAX_ORDER: usize = 4;

/// Applies a two-character pattern left to right without overlaps, the way
/// Python's `re.sub` does for the fixed-width regexes of the 13a tokenizer.
fn sub_pairs(
    chars: &[char],
    first: impl Fn(char) -> bool,
    second: impl Fn(char) -> bool,
    mut emit: impl FnMut(&mut Vec<char>, char, char),
) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + 8);
    let mut i = 0;
    while i < chars.len() {
        if i + 1 < chars.len() && first(chars[i]) && second(chars[i + 1]) {
            emit(&mut out, chars[i], chars[i + 1]);
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The `13a` tokenizer of sacrebleu (equivalent to mteval-v13a.pl, the
/// WMT standard), which BLEU uses by default.
///
/// Removes `<skipped>` and `-\n`, turns `\n` into a space, unescapes
/// `&quot; &amp; &lt; &gt;`, then splits off ASCII punctuation except
/// `' - . ,`; periods and commas are split off unless they sit between
/// digits on the relevant side, a dash is split off after a digit. Returns
/// the tokens joined by single spaces, without leading/trailing space.
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    let padded: Vec<char> = format!(" {line} ").chars().collect();

    // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> ' \1 '
    let is_split_punct =
        |c: char| matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/');
    let mut s = Vec::with_capacity(padded.len() * 2);
    for &c in &padded {
        if is_split_punct(c) {
            s.extend([' ', c, ' ']);
        } else {
            s.push(c);
        }
    }
    let digit = |c: char| c.is_ascii_digit();
    let not_digit = |c: char| !c.is_ascii_digit();
    let period_comma = |c: char| c == '.' || c == ',';
    // ([^0-9])([\.,]) -> '\1 \2 '
    let s = sub_pairs(&s, not_digit, period_comma, |o, a, b| {
        o.extend([a, ' ', b, ' '])
    });
    // ([\.,])([^0-9]) -> ' \1 \2'
    let s = sub_pairs(&s, period_comma, not_digit, |o, a, b| {
        o.extend([' ', a, ' ', b])
    });
    // ([0-9])(-) -> '\1 \2 '
    let s = sub_pairs(
        &s,
        digit,
        |c| c == '-',
        |o, a, b| o.extend([a, ' ', b, ' ']),
    );

    let s: String = s.into_iter().collect();
    py_split(&s).collect::<Vec<_>>().join(" ")
}

/// sacrebleu's `_get_closest_ref_len`: the reference length closest to the
/// hypothesis length, the shorter one on ties.
fn closest_ref_len(hyp_len: usize, ref_lens: &[usize]) -> usize {
    let mut best: Option<(usize, usize)> = None; // (diff, len)
    for &r in ref_lens {
        let diff = hyp_len.abs_diff(r);
        best = match best {
            None => Some((diff, r)),
            Some((d, l)) if diff < d || (diff == d && r < l) => Some((diff, r)),
            keep => keep,
        };
    }
    best.map_or(0, |(_, l)| l)
}

/// Corpus BLEU exactly as `sacrebleu.corpus_bleu(hyps, ref_streams)` with
/// its defaults: `13a` tokenization, case-sensitive, n-grams up to 4,
/// `exp` smoothing (each n-gram order without matches gets precision
/// `100 / (2^k * total)`, k counting such orders), no effective order, and
/// the brevity penalty from the summed closest reference lengths (the
/// shorter one on ties). N-gram matches are clipped by the maximum count of
/// that n-gram over the example's references. Score in 0..100.
///
/// If the corpus has no hypothesis n-gram of some order up to 4 (every
/// hypothesis shorter than 4 tokens), the score is 0, as in sacrebleu.
///
/// # Panics
/// If `hyps.len() != refs.len()`.
pub fn bleu(hyps: &[String], refs: &[Vec<String>]) -> f64 {
    check_lengths("bleu", hyps.len(), refs.len());
    if hyps.is_empty() {
        return 0.0;
    }
    let mut sys_len = 0usize;
    let mut ref_len = 0usize;
    let mut correct = [0u64; BLEU_MAX_ORDER];
    let mut total = [0u64; BLEU_MAX_ORDER];

    for (hyp, example_refs) in hyps.iter().zip(refs) {
        let ref_tokens: Vec<String> = refs_or_empty(example_refs)
            .iter()
            .map(|r| tokenize_13a(r.trim_end_matches(is_py_space)))
            .collect();
        let ref_tokens: Vec<Vec<&str>> = ref_tokens.iter().map(|t| py_split(t).collect()).collect();
        let ref_lens: Vec<usize> = ref_tokens.iter().map(Vec::len).collect();
        // Maximum count of each n-gram over the references.
        let mut ref_max: HashMap<&[&str], u32> = HashMap::new();
        for toks in &ref_tokens {
            for n in 1..=BLEU_MAX_ORDER {
                for (g, c) in ngram_counts(toks, n) {
                    let e = ref_max.entry(g).or_insert(0);
                    *e = (*e).max(c);
                }
            }
        }

        let hyp_tok = tokenize_13a(hyp.trim_end_matches(is_py_space));
        let hyp_tokens: Vec<&str> = py_split(&hyp_tok).collect();
        sys_len += hyp_tokens.len();
        ref_len += closest_ref_len(hyp_tokens.len(), &ref_lens);
        for n in 1..=BLEU_MAX_ORDER {
            for (g, c) in ngram_counts(&hyp_tokens, n) {
                total[n - 1] += u64::from(c);
                if let Some(&r) = ref_max.get(g) {
                    correct[n - 1] += u64::from(c.min(r));
                }
            }
        }
    }
    bleu_from_stats(&correct, &total, sys_len, ref_len)
}

/// sacrebleu's `BLEU.compute_bleu` with `smooth_method='exp'`.
fn bleu_from_stats(correct: &[u64], total: &[u64], sys_len: usize, ref_len: usize) -> f64 {
    let bp = if sys_len < ref_len {
        if sys_len > 0 {
            (1.0 - ref_len as f64 / sys_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    if correct.iter().all(|&c| c == 0) {
        return 0.0;
    }
    let mut precisions = [0.0f64; BLEU_MAX_ORDER];
    let mut smooth = 1.0f64;
    for n in 0..BLEU_MAX_ORDER {
        if total[n] == 0 {
            break;
        }
        precisions[n] = if correct[n] == 0 {
            smooth *= 2.0;
            100.0 / (smooth * total[n] as f64)
        } else {
            100.0 * correct[n] as f64 / total[n] as f64
        };
    }
    // sacrebleu's `my_log` floors log(0) at -9999999999.
    let log_sum: f64 = precisions
        .iter()
        .map(|&p| if p == 0.0 { -9_999_999_999.0 } else { p.ln() })
        .sum();
    bp * (log_sum / BLEU_MAX_ORDER as f64).exp()
}

// ---------------------------------------------------------------------------
// chrF
// ---------------------------------------------------------------------------

const CHRF_ORDER: usize = 6;
const CHRF_BETA: f64 = 2.0;

/// Per character n-gram order 1..=6: `[hyp count, ref count, matches]`.
type ChrfStats = [[u64; 3]; CHRF_ORDER];

/// Character n-gram counts of orders 1..=6 with all whitespace removed.
fn char_ngrams(chars: &[char]) -> Vec<HashMap<&[char], u32>> {
    (1..=CHRF_ORDER).map(|n| ngram_counts(chars, n)).collect()
}

fn no_space_chars(s: &str) -> Vec<char> {
    s.chars().filter(|&c| !is_py_space(c)).collect()
}

/// sacrebleu's `CHRF._compute_f_score` without eps smoothing: precision and
/// recall averaged over the orders where both hypothesis and reference have
/// n-grams, then F-beta.
fn chrf_f_score(stats: &ChrfStats) -> f64 {
    let factor = CHRF_BETA * CHRF_BETA;
    let (mut avg_prec, mut avg_rec, mut effective_order) = (0.0f64, 0.0f64, 0u32);
    for &[n_hyp, n_ref, n_match] in stats {
        if n_hyp > 0 && n_ref > 0 {
            avg_prec += n_match as f64 / n_hyp as f64;
            avg_rec += n_match as f64 / n_ref as f64;
            effective_order += 1;
        }
    }
    if effective_order == 0 {
        return 0.0;
    }
    avg_prec /= f64::from(effective_order);
    avg_rec /= f64::from(effective_order);
    if avg_prec + avg_rec == 0.0 {
        return 0.0;
    }
    let score = (1.0 + factor) * avg_prec * avg_rec;
    100.0 * (score / (factor * avg_prec + avg_rec))
}

/// Corpus chrF exactly as `sacrebleu.corpus_chrf(hyps, ref_streams)` with
/// its defaults: character n-grams of orders 1..=6, no word n-grams,
/// beta = 2, case-sensitive, whitespace removed before extracting n-grams.
/// For each example the reference with the best sentence-level chrF is
/// chosen (the first one on ties); the chosen statistics are summed over the
/// corpus and the final score is computed once from the sums. Score in
/// 0..100.
///
/// # Panics
/// If `hyps.len() != refs.len()`.
pub fn chrf(hyps: &[String], refs: &[Vec<String>]) -> f64 {
    check_lengths("chrf", hyps.len(), refs.len());
    if hyps.is_empty() {
        return 0.0;
    }
    let mut corpus: ChrfStats = [[0; 3]; CHRF_ORDER];
    for (hyp, example_refs) in hyps.iter().zip(refs) {
        let hyp_chars = no_space_chars(hyp);
        let hyp_ngrams = char_ngrams(&hyp_chars);
        let mut best: Option<(f64, ChrfStats)> = None;
        for r in refs_or_empty(example_refs) {
            let ref_chars = no_space_chars(r);
            let ref_ngrams = char_ngrams(&ref_chars);
            let mut stats: ChrfStats = [[0; 3]; CHRF_ORDER];
            for (i, (h, rf)) in hyp_ngrams.iter().zip(&ref_ngrams).enumerate() {
                let mut hyp_count = 0u64;
                let mut matches = 0u64;
                for (g, &c) in h {
                    hyp_count += u64::from(c);
                    if let Some(&rc) = rf.get(g) {
                        matches += u64::from(c.min(rc));
                    }
                }
                let ref_count: u64 = rf.values().map(|&c| u64::from(c)).sum();
                // sacrebleu counts no hypothesis n-grams of an order for
                // which the reference has none.
                stats[i] = [
                    if rf.is_empty() { 0 } else { hyp_count },
                    ref_count,
                    matches,
                ];
            }
            let f = chrf_f_score(&stats);
            if best.as_ref().is_none_or(|(bf, _)| f > *bf) {
                best = Some((f, stats));
            }
        }
        if let Some((_, stats)) = best {
            for (acc, s) in corpus.iter_mut().zip(stats) {
                for k in 0..3 {
                    acc[k] += s[k];
                }
            }
        }
    }
    chrf_f_score(&corpus)
}

// ---------------------------------------------------------------------------
// ROUGE
// ---------------------------------------------------------------------------

/// Mean ROUGE F1 scores over a corpus, each on the 0..100 scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rouge {
    /// ROUGE-1 (unigram overlap) F1.
    pub r1: f64,
    /// ROUGE-2 (bigram overlap) F1.
    pub r2: f64,
    /// ROUGE-L (longest common subsequence) F1, sentence-level (not
    /// `rougeLsum`).
    pub rl: f64,
}

/// `rouge_score`'s default tokenizer without stemming: lowercase, then the
/// maximal runs of `[a-z0-9]` are the tokens (everything else, including
/// non-ASCII letters, separates tokens).
fn rouge_tokens(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `rouge_score.scoring.fmeasure`.
fn f_measure(precision: f64, recall: f64) -> f64 {
    if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    }
}

/// `rouge_scorer._score_ngrams` F1.
fn rouge_n_f1(target: &[String], prediction: &[String], n: usize) -> f64 {
    let t = ngram_counts(target, n);
    let p = ngram_counts(prediction, n);
    let overlap: u32 = t
        .iter()
        .map(|(g, &c)| c.min(p.get(g).copied().unwrap_or(0)))
        .sum();
    let t_count: u32 = t.values().sum();
    let p_count: u32 = p.values().sum();
    let precision = f64::from(overlap) / f64::from(p_count.max(1));
    let recall = f64::from(overlap) / f64::from(t_count.max(1));
    f_measure(precision, recall)
}

/// Length of the longest common subsequence of two token lists.
fn lcs_len(a: &[String], b: &[String]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// `rouge_scorer._score_lcs` F1.
fn rouge_l_f1(target: &[String], prediction: &[String]) -> f64 {
    if target.is_empty() || prediction.is_empty() {
        return 0.0;
    }
    let lcs = lcs_len(target, prediction) as f64;
    f_measure(lcs / prediction.len() as f64, lcs / target.len() as f64)
}

/// ROUGE-1, ROUGE-2 and ROUGE-L F1 as
/// `rouge_score.rouge_scorer.RougeScorer(['rouge1', 'rouge2', 'rougeL'],
/// use_stemmer=False)` with its default tokenizer (lowercase; tokens are the
/// runs of `[a-z0-9]`, so non-ASCII letters act as separators). With several
/// references an example gets, per ROUGE type independently, the maximum F1
/// over its references (`RougeScorer.score_multi`). The corpus score is the
/// plain mean over examples, times 100.
///
/// # Panics
/// If `hyps.len() != refs.len()`.
pub fn rouge(hyps: &[String], refs: &[Vec<String>]) -> Rouge {
    check_lengths("rouge", hyps.len(), refs.len());
    if hyps.is_empty() {
        return Rouge {
            r1: 0.0,
            r2: 0.0,
            rl: 0.0,
        };
    }
    let (mut s1, mut s2, mut sl) = (0.0f64, 0.0f64, 0.0f64);
    for (hyp, example_refs) in hyps.iter().zip(refs) {
        let pred = rouge_tokens(hyp);
        let (mut b1, mut b2, mut bl) = (f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY);
        for r in refs_or_empty(example_refs) {
            let target = rouge_tokens(r);
            b1 = b1.max(rouge_n_f1(&target, &pred, 1));
            b2 = b2.max(rouge_n_f1(&target, &pred, 2));
            bl = bl.max(rouge_l_f1(&target, &pred));
        }
        s1 += b1;
        s2 += b2;
        sl += bl;
    }
    let n = hyps.len() as f64;
    Rouge {
        r1: 100.0 * s1 / n,
        r2: 100.0 * s2 / n,
        rl: 100.0 * sl / n,
    }
}

// ---------------------------------------------------------------------------
// SQuAD v1.1
// ---------------------------------------------------------------------------

/// Python's `\w` for `str` patterns, approximated with Rust's Unicode
/// alphanumeric test. Rust also counts the Other_Alphabetic combining marks
/// (e.g. Indic vowel signs, U+0345) and circled/squared letters as
/// alphanumeric, which Python does not (1,442 code points assigned in
/// Python 3.11's Unicode 14); that only matters when such a character
/// directly touches an `a`/`an`/`the` in an answer.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `normalize_answer` of the official SQuAD v1.1 evaluation script:
/// lowercase, drop ASCII punctuation (`string.punctuation`), replace the
/// words `a`, `an`, `the` (regex `\b(a|an|the)\b`) by a space, collapse
/// whitespace.
pub fn squad_normalize(s: &str) -> String {
    let no_punct: String = s
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    // `\b(a|an|the)\b` matches exactly the maximal word-character runs that
    // equal one of the articles.
    let mut no_articles = String::with_capacity(no_punct.len());
    let mut rest = no_punct.as_str();
    while let Some(c) = rest.chars().next() {
        let word = is_word_char(c);
        let end = rest
            .char_indices()
            .find(|&(_, d)| is_word_char(d) != word)
            .map_or(rest.len(), |(i, _)| i);
        let run = &rest[..end];
        if word && matches!(run, "a" | "an" | "the") {
            no_articles.push(' ');
        } else {
            no_articles.push_str(run);
        }
        rest = &rest[end..];
    }
    py_split(&no_articles).collect::<Vec<_>>().join(" ")
}

/// SQuAD token F1 of one prediction against one ground truth (0..1).
fn squad_f1(prediction: &str, ground_truth: &str) -> f64 {
    let p = squad_normalize(prediction);
    let g = squad_normalize(ground_truth);
    let p_tokens: Vec<&str> = py_split(&p).collect();
    let g_tokens: Vec<&str> = py_split(&g).collect();
    let g_counts = ngram_counts(&g_tokens, 1);
    let num_same: u32 = ngram_counts(&p_tokens, 1)
        .iter()
        .map(|(t, &c)| c.min(g_counts.get(t).copied().unwrap_or(0)))
        .sum();
    if num_same == 0 {
        return 0.0;
    }
    let precision = f64::from(num_same) / p_tokens.len() as f64;
    let recall = f64::from(num_same) / g_tokens.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Exact match and token F1 of the official SQuAD v1.1 evaluation script
/// (`evaluate-v1.1.py`): answers are compared after [`squad_normalize`];
/// each example takes the maximum over its ground truths; both are averaged
/// over examples and returned as `(em, f1)` on the 0..100 scale.
///
/// # Panics
/// If `preds.len() != refs.len()`.
pub fn squad_em_f1(preds: &[String], refs: &[Vec<String>]) -> (f64, f64) {
    check_lengths("squad_em_f1", preds.len(), refs.len());
    if preds.is_empty() {
        return (0.0, 0.0);
    }
    let (mut em, mut f1) = (0.0f64, 0.0f64);
    for (pred, truths) in preds.iter().zip(refs) {
        let truths = refs_or_empty(truths);
        let p = squad_normalize(pred);
        if truths.iter().any(|t| squad_normalize(t) == p) {
            em += 1.0;
        }
        f1 += truths
            .iter()
            .map(|t| squad_f1(pred, t))
            .fold(f64::NEG_INFINITY, f64::max);
    }
    let n = preds.len() as f64;
    (100.0 * em / n, 100.0 * f1 / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_13a_basics() {
        assert_eq!(tokenize_13a("Hello, world!"), "Hello , world !");
        assert_eq!(
            tokenize_13a("It costs $3.50, ok."),
            "It costs $ 3.50 , ok ."
        );
        assert_eq!(tokenize_13a("1,000 and 5-6"), "1,000 and 5 - 6");
        assert_eq!(tokenize_13a("a &amp; b &quot;c&quot;"), "a & b \" c \"");
        assert_eq!(tokenize_13a("hy-\nphen\nnext<skipped>"), "hyphen next");
    }

    #[test]
    fn squad_normalization() {
        assert_eq!(squad_normalize("The  Cat, a dog!"), "cat dog");
        assert_eq!(squad_normalize("theater an-a"), "theater ana");
    }

    #[test]
    fn closest_ref_len_prefers_shorter_on_ties() {
        assert_eq!(closest_ref_len(5, &[7, 3]), 3);
        assert_eq!(closest_ref_len(5, &[6, 9]), 6);
    }
}
