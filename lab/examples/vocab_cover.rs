//! How much of the task texts a frequency-ranked output vocabulary would
//! miss (docs/EXPERIMENTS.md, "Smaller output vocabularies"): token
//! frequencies from the prompts and references of dev rows 100.. of each
//! file, then, on rows ..100, the share of reference tokens outside the top
//! K (single bytes and the prompt's own tokens always kept).
//! Run: cargo run --release -p selectinfer-lab --example vocab_cover -- TOKENIZER.json ../shared/data/*.dev.jsonl
use std::collections::{HashMap, HashSet};
fn fields(v: &serde_json::Value) -> (String, String) {
    let prompt = ["context", "question", "source", "document"]
        .iter()
        .filter_map(|k| v[k].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let r = if let Some(r) = v["references"].as_array() {
        r[0].as_str().unwrap().to_string()
    } else if let Some(r) = v["answers"].as_array() {
        r[0].as_str().unwrap_or_default().to_string()
    } else {
        v["summary"].as_str().unwrap_or_default().to_string()
    };
    (prompt, format!(" {r}"))
}
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let tok = tokenizers::Tokenizer::from_file(&a[1]).unwrap();
    let files: Vec<Vec<serde_json::Value>> = a[2..]
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .collect();
    let mut freq: HashMap<u32, usize> = HashMap::new();
    for rows in &files {
        for v in rows.iter().skip(100) {
            let (p, r) = fields(v);
            for t in [p, r] {
                for &id in tok.encode(t.as_str(), false).unwrap().get_ids() {
                    *freq.entry(id).or_default() += 1;
                }
            }
        }
    }
    let mut ranked: Vec<(u32, usize)> = freq.into_iter().collect();
    ranked.sort_by_key(|a| std::cmp::Reverse(a.1));
    println!("distinct tokens in calibration: {}", ranked.len());
    let ks = [8192usize, 16384, 24576, 32768];
    for (fi, rows) in files.iter().enumerate() {
        let mut total = 0;
        let mut miss = vec![0usize; ks.len()];
        for v in rows.iter().take(100) {
            let (p, r) = fields(v);
            let ps: HashSet<u32> = tok
                .encode(p.as_str(), false)
                .unwrap()
                .get_ids()
                .iter()
                .copied()
                .collect();
            let ids = tok.encode(r.as_str(), false).unwrap().get_ids().to_vec();
            total += ids.len();
            for (i, &k) in ks.iter().enumerate() {
                let set: HashSet<u32> = ranked.iter().take(k).map(|x| x.0).collect();
                miss[i] += ids
                    .iter()
                    .filter(|&&t| t >= 256 && !set.contains(&t) && !ps.contains(&t))
                    .count();
            }
        }
        println!("{}: {total}", a[2 + fi]);
        for (i, k) in ks.iter().enumerate() {
            println!(
                "  top {k}: outside & not in prompt {:.3}%",
                100.0 * miss[i] as f64 / total as f64
            );
        }
    }
}
