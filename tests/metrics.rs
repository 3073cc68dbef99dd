//! Our evaluation metrics must equal the Python reference implementations
//! (sacrebleu BLEU/chrF, rouge-score ROUGE-1/2/L, the official SQuAD v1.1
//! script) on every set of `tests/fixtures/metrics_reference.json`, written
//! by `scripts/reference/make_metric_fixtures.py`. Scores are on the 0..100
//! scale and must agree within 0.01.

mod common;

use selectinfer::tools::metrics::{bleu, chrf, rouge, squad_em_f1, squad_normalize, tokenize_13a};
use serde_json::Value;

const TOL: f64 = 0.01;

struct Set {
    name: String,
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
    want: Value,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn sets() -> Vec<Set> {
    let fixture = common::fixture("metrics_reference.json");
    let sets: Vec<Set> = fixture["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Set {
            name: s["name"].as_str().unwrap().to_owned(),
            hyps: strings(&s["hyps"]),
            refs: s["refs"].as_array().unwrap().iter().map(strings).collect(),
            want: s.clone(),
        })
        .collect();
    assert!(sets.len() >= 10, "fixture has only {} sets", sets.len());
    sets
}

/// Compares `got(set)` with the fixture's `key` for every set; returns the
/// largest absolute difference and fails listing every set outside `TOL`.
fn check(key: &str, got: impl Fn(&Set) -> f64) -> f64 {
    let mut max_diff = 0.0f64;
    let mut bad = Vec::new();
    for set in sets() {
        let want = set.want[key].as_f64().unwrap();
        let got = got(&set);
        let diff = (got - want).abs();
        max_diff = max_diff.max(diff);
        if diff.is_nan() || diff > TOL {
            bad.push(format!("{}: ours {got:.6}, reference {want:.6}", set.name));
        }
    }
    eprintln!("{key}: max abs difference {max_diff:.3e}");
    assert!(bad.is_empty(), "{key} differs:\n{}", bad.join("\n"));
    max_diff
}

#[test]
fn bleu_matches_sacrebleu() {
    check("bleu", |s| bleu(&s.hyps, &s.refs));
}

#[test]
fn chrf_matches_sacrebleu() {
    check("chrf", |s| chrf(&s.hyps, &s.refs));
}

#[test]
fn rouge_matches_rouge_score() {
    check("rouge1", |s| rouge(&s.hyps, &s.refs).r1);
    check("rouge2", |s| rouge(&s.hyps, &s.refs).r2);
    check("rougeL", |s| rouge(&s.hyps, &s.refs).rl);
}

#[test]
fn squad_matches_official_script() {
    check("squad_em", |s| squad_em_f1(&s.hyps, &s.refs).0);
    check("squad_f1", |s| squad_em_f1(&s.hyps, &s.refs).1);
}

/// Sentence-level ROUGE and SQuAD values, to localize any corpus mismatch.
#[test]
fn per_example_rouge_and_squad_match() {
    let mut bad = Vec::new();
    for set in sets() {
        let per = &set.want["per_example"];
        for (i, (h, r)) in set.hyps.iter().zip(&set.refs).enumerate() {
            let hyp = std::slice::from_ref(h);
            let refs = std::slice::from_ref(r);
            let rg = rouge(hyp, refs);
            let (em, f1) = squad_em_f1(hyp, refs);
            for (key, got) in [
                ("rouge1", rg.r1),
                ("rouge2", rg.r2),
                ("rougeL", rg.rl),
                ("squad_em", em),
                ("squad_f1", f1),
            ] {
                let want = 100.0 * per[key][i].as_f64().unwrap();
                if (got - want).abs() > 1e-9 {
                    bad.push(format!(
                        "{} #{i} {key}: ours {got}, reference {want}",
                        set.name
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn tokenizer_13a_matches_sacrebleu() {
    let fixture = common::fixture("metrics_reference.json");
    let cases = fixture["tokenize_13a"].as_array().unwrap();
    assert!(cases.len() >= 50);
    let mut bad = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = case["tokens"].as_str().unwrap();
        // sacrebleu rstrips (Python whitespace) before tokenizing.
        let got =
            tokenize_13a(text.trim_end_matches(|c: char| {
                c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
            }));
        if got != want {
            bad.push(format!("{text:?}: ours {got:?}, sacrebleu {want:?}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn v(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn perfect_match_scores_100() {
    let hyps = v(&[
        "The quick brown fox jumps over the lazy dog.",
        "A second, longer sentence with 3.5 numbers and (brackets).",
    ]);
    let refs: Vec<Vec<String>> = hyps.iter().map(|h| vec![h.clone()]).collect();
    let r = rouge(&hyps, &refs);
    for (name, got) in [
        ("bleu", bleu(&hyps, &refs)),
        ("chrf", chrf(&hyps, &refs)),
        ("rouge1", r.r1),
        ("rouge2", r.r2),
        ("rougeL", r.rl),
        ("em", squad_em_f1(&hyps, &refs).0),
        ("f1", squad_em_f1(&hyps, &refs).1),
    ] {
        assert!((got - 100.0).abs() < 1e-9, "{name}: {got}");
    }
}

#[test]
fn empty_inputs_do_not_panic() {
    // Empty hypotheses score 0 everywhere.
    let hyps = v(&["", "   "]);
    let refs = vec![v(&["a reference"]), v(&["another one", "and more"])];
    let r = rouge(&hyps, &refs);
    assert_eq!(bleu(&hyps, &refs), 0.0);
    assert_eq!(chrf(&hyps, &refs), 0.0);
    assert_eq!((r.r1, r.r2, r.rl), (0.0, 0.0, 0.0));
    assert_eq!(squad_em_f1(&hyps, &refs), (0.0, 0.0));

    // An empty corpus scores 0; an example without references is scored
    // against one empty reference.
    assert_eq!(bleu(&[], &[]), 0.0);
    assert_eq!(chrf(&[], &[]), 0.0);
    assert_eq!(rouge(&[], &[]).r1, 0.0);
    assert_eq!(squad_em_f1(&[], &[]), (0.0, 0.0));
    let no_refs = vec![Vec::new()];
    let empty = v(&[""]);
    assert_eq!(squad_em_f1(&empty, &no_refs), (100.0, 0.0));
    assert_eq!(bleu(&v(&["words here"]), &no_refs), 0.0);
    assert_eq!(chrf(&v(&["words here"]), &no_refs), 0.0);
}

#[test]
fn squad_normalization_examples() {
    assert_eq!(squad_normalize("The Eiffel Tower!"), "eiffel tower");
    assert_eq!(squad_normalize("  an   apple, a pear "), "apple pear");
    assert_eq!(squad_normalize("theory of the anthem"), "theory of anthem");
}

#[test]
#[should_panic(expected = "2 hypotheses but 1 reference lists")]
fn mismatched_lengths_panic() {
    bleu(&v(&["a", "b"]), &[v(&["a"])]);
}
