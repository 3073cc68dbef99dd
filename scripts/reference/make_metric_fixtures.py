#!/usr/bin/env python3
"""Generate ``tests/fixtures/metrics_reference.json``: reference metric values.

Usage:

    python3 -m venv /tmp/metricvenv
    /tmp/metricvenv/bin/pip install sacrebleu==2.6.0 rouge-score==0.1.2
    /tmp/metricvenv/bin/python scripts/reference/make_metric_fixtures.py \\
        --data /work/shared/data --out tests/fixtures/metrics_reference.json

(generated with Python 3.11.7, sacrebleu 2.6.0, rouge-score 0.1.2,
nltk 3.10.4, numpy 2.4.6; the versions actually used are recorded in the
output's ``versions``).

``--data`` is the folder with ``translation_wmt22_deen.dev.jsonl``,
``summarization_xsum.dev.jsonl`` and ``qa_squad11.dev.jsonl`` (one JSON
object per line, field ``references``: a list of strings). The first 60
examples of each are taken and hypotheses are made from their references by
deterministic perturbations (word drop/shuffle/replace, case, punctuation,
number changes, truncation, empty and identical hypotheses) driven by
``random.Random`` with fixed seeds, so re-running gives a byte-identical
file. Extra hand-written sets cover edge cases: perfect match, all-empty
hypotheses, no overlap, hypotheses shorter than 4 tokens, unicode and odd
whitespace, the 13a tokenizer's special cases (HTML entities, ``<skipped>``,
``-\\n``, decimals), case changes, empty references and a varying number of
references per example.

For every set the file holds the hypotheses, the per-example reference
lists and:
  bleu      sacrebleu.corpus_bleu(hyps, ref_streams).score  (defaults: 13a,
            exp smoothing, mixed case); reference streams are padded with
            None where an example has fewer references, which sacrebleu
            drops, so each example uses exactly its own references
  chrf      sacrebleu.corpus_chrf(hyps, ref_streams).score  (defaults: chrF2,
            char order 6, word order 0)
  rouge1/rouge2/rougeL
            mean over examples of the F1 of
            RougeScorer(['rouge1','rouge2','rougeL'], use_stemmer=False)
            .score_multi(refs, hyp) (max F1 over references), times 100
  squad_em/squad_f1
            the official SQuAD v1.1 ``evaluate-v1.1.py`` functions (copied
            below): max over ground truths, mean over examples, times 100
  per_example
            sentence-level ROUGE F1s and SQuAD EM/F1 (0..1), for debugging
Also ``tokenize_13a``: strings and their sacrebleu 13a tokenization (after
the ``rstrip`` sacrebleu applies before tokenizing).
"""

import argparse
import json
import os
import random
import re
import string
import sys
from collections import Counter
from importlib import metadata

import sacrebleu
from rouge_score import rouge_scorer
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

N_CORPUS = 60


# --------------------------------------------------------------------------
# Official SQuAD v1.1 evaluation (evaluate-v1.1.py), verbatim functions
# --------------------------------------------------------------------------

def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""
    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def f1_score(prediction, ground_truth):
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def exact_match_score(prediction, ground_truth):
    return (normalize_answer(prediction) == normalize_answer(ground_truth))


def metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


# --------------------------------------------------------------------------
# Data and perturbations
# --------------------------------------------------------------------------

def load_refs(path, n):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if len(out) == n:
                break
            refs = json.loads(line)["references"]
            assert isinstance(refs, list) and refs and all(isinstance(r, str) for r in refs)
            out.append(refs)
    assert len(out) == n, f"{path}: only {len(out)} examples"
    return out


FILLER = ["house", "quickly", "blue", "seven", "However", "river", "they", "of",
          "and", "model", "Berlin", "2019", "the", "a", "an", "über", "café"]


def drop_words(text, rng, p=0.25):
    words = text.split()
    kept = [w for w in words if rng.random() >= p]
    return " ".join(kept if kept else words[:1])


def shuffle_window(text, rng):
    words = text.split()
    if len(words) > 3:
        i = rng.randrange(len(words) - 2)
        window = words[i:i + 3]
        rng.shuffle(window)
        words[i:i + 3] = window
    return " ".join(words)


def replace_words(text, rng, p=0.3):
    return " ".join(rng.choice(FILLER) if rng.random() < p else w for w in text.split())


def change_case(text, rng):
    mode = rng.randrange(3)
    return text.upper() if mode == 0 else text.lower() if mode == 1 else text.title()


def change_punct(text, rng):
    text = text.translate(str.maketrans("", "", ".,!?;:"))
    return text + rng.choice([" .", "!", "...", " ,", "?!", ""])


def change_numbers(text, rng):
    out = re.sub(r"\d", lambda m: str((int(m.group()) + rng.randrange(1, 10)) % 10), text)
    if out == text:
        out = text + f" {rng.randrange(1000)}.{rng.randrange(100)}"
    return out


def truncate(text, rng):
    words = text.split()
    return " ".join(words[: max(1, len(words) // 2)])


def duplicate(text, rng):
    words = text.split()
    i = rng.randrange(len(words))
    return " ".join(words[: i + 1] + words[i:])


PERTURBATIONS = [drop_words, shuffle_window, replace_words, change_case,
                 change_punct, change_numbers, truncate, duplicate]


def perturb_corpus(refs, seed):
    """Deterministic hypotheses: mostly 1-2 stacked perturbations of the first
    reference; every 15th is identical, every 17th (from 7) empty."""
    rng = random.Random(seed)
    hyps = []
    for i, rs in enumerate(refs):
        base = rs[0]
        if i % 15 == 0:
            hyps.append(base)
        elif i % 17 == 7:
            hyps.append("")
        else:
            h = base
            for _ in range(1 + rng.randrange(2)):
                h = rng.choice(PERTURBATIONS)(h, rng) if h.split() else h
            hyps.append(h)
    return hyps


def squad_preds(refs, seed):
    """Answer-like predictions: exact, article/punctuation/case variants,
    extra or missing words, another example's answer, empty."""
    rng = random.Random(seed)
    preds = []
    for i, rs in enumerate(refs):
        a = rng.choice(rs)
        mode = i % 10
        if mode == 0:
            p = a
        elif mode == 1:
            p = "The " + a + "."
        elif mode == 2:
            p = a.upper()
        elif mode == 3:
            p = "it was " + a + " in fact"
        elif mode == 4:
            p = drop_words(a, rng, 0.5)
        elif mode == 5:
            p = refs[(i + 7) % len(refs)][0]
        elif mode == 6:
            p = ""
        elif mode == 7:
            p = "  " + a.lower() + " ,  "
        elif mode == 8:
            p = "an " + replace_words(a, rng, 0.5)
        else:
            p = "a " + a + " (" + a + ")"
        preds.append(p)
    return preds


def multi_refs(refs, seed):
    """1..3 references per example: the original plus perturbed variants."""
    rng = random.Random(seed)
    out = []
    for rs in refs:
        extra = rng.randrange(3)
        variants = [rs[0]] + [rng.choice(PERTURBATIONS)(rs[0], rng) for _ in range(extra)]
        out.append(variants)
    return out


# --------------------------------------------------------------------------
# Hand-written sets
# --------------------------------------------------------------------------

UNICODE_HYPS = [
    "Über die Brücke gehen wir morgen früh um 8 Uhr.",
    "東京は日本の首都です。",
    "Emoji 👍🏽 test 👨‍👩‍👧 done",
    "Cafe\u0301 na\u00efve r\u00e9sum\u00e9",
    "non\u00a0breaking\u2009thin\u3000ideographic space",
    "info\x1cseparator\x1fchars and\ttabs",
    "İstanbul KELVIN \u212a degrees",
    "ΟΔΟΣ Σοφοκλέους",
    "Привет, мир! Как дела?",
    "नमस्ते दुनिया",
]
UNICODE_REFS = [
    ["Morgen früh um 8 Uhr gehen wir über die Brücke."],
    ["日本の首都は東京です。", "東京は首都です"],
    ["Emoji 👍 test 👨‍👩‍👧 finished"],
    ["Café naïve résumé"],
    ["non breaking thin ideographic space"],
    ["info separator chars and tabs"],
    ["istanbul kelvin k degrees"],
    ["οδος Σοφοκλεους"],
    ["Привет мир! Как у тебя дела?"],
    ["नमस्ते दुनिया!"],
]

TOKENIZER_HYPS = [
    "He said &quot;hello&quot; &amp; left &lt;quickly&gt;.",
    "The <skipped> value was 3.14, not 3,14 or 1,000.5!",
    "Line one-\nline two\nline three",
    "U.S.A. vs. e.g. the end.. ok,, fine.,",
    "Prices: $5-$10 (approx.) / 20% off; 2019-2020 season",
    "{braces} [brackets] `ticks` ~tilde| pipe ^caret _under",
    "trailing space and dash-   ",
    "ends with hyphen-\n",
    "numbers 1.5.3 and .5 and 5. and ,5 and 5,",
    "tab\tseparated\r\nwindows line",
]
TOKENIZER_REFS = [
    ["He said \"hello\" & left <quickly>."],
    ["The value was 3.14, not 3,14 or 1,000.5!"],
    ["Line oneline two line three"],
    ["U.S.A. vs. e.g. the end. ok, fine."],
    ["Prices: $5 - $10 (approx.) / 20 % off; 2019 - 2020 season"],
    ["{braces} [brackets] `ticks` ~tilde | pipe ^caret _under"],
    ["trailing space and dash-"],
    ["ends with hyphen"],
    ["numbers 1.5.3 and .5 and 5. and ,5 and 5,"],
    ["tab separated windows line"],
]

TOKENIZE_ONLY = [
    "", " ", "a", "Hello, world!", "3.14", "a.b", "1,2,3", "a,b", "x-1", "1-x",
    "5--6", "end.", "end .", "&amp;amp;", "&lt;skipped&gt;", "<skipped>x",
    "it's", "rock'n'roll", "C++ and C#", "path/to/file.txt", "e-mail@host.com",
    "..", "...", ",.,", "9.", ".9", "9,", ",9", "a\u00a0b", "x\x1cy",
    "x\u2028y", "line-\nbreak", "line -\n break", "tail-\n", "\n\nlead",
    "quote\"inside\"", "[x](y){z}", "#hashtag @user", "100%", "3:45pm",
    "Ünïcödé, wörds.", "日本語。", "—dash–en dash—", "«guillemets»",
] + TOKENIZER_HYPS + [r[0] for r in TOKENIZER_REFS]


def hand_sets(wmt, xsum):
    sets = []
    sets.append(("perfect_match", [r[0] for r in wmt[:10]], [r[:1] for r in wmt[:10]]))
    sets.append(("all_empty_hyps", ["", "", "", "", ""], [r[:1] for r in wmt[:5]]))
    sets.append(("no_overlap", ["日本語 の 文", "ελληνικά λόγια", "中文 句子 这里"],
                 [["English words only here"], ["Another plain sentence"], ["Third one"]]))
    sets.append(("short_hyps", ["Yes.", "No", "maybe so"],
                 [["Yes."], ["No way"], ["maybe so"]]))
    sets.append(("single_example", [wmt[3][0].lower()], [wmt[3][:1]]))
    sets.append(("unicode", UNICODE_HYPS, UNICODE_REFS))
    sets.append(("tokenizer_13a", TOKENIZER_HYPS, TOKENIZER_REFS))
    sets.append(("case_changes",
                 [r[0].upper() if i % 2 else r[0].lower() for i, r in enumerate(xsum[:12])],
                 [r[:1] for r in xsum[:12]]))
    sets.append(("empty_refs", ["something here", "", "the cat sat", "a b c d e"],
                 [[""], [""], ["", "the cat sat on the mat"], ["a b c d e", ""]]))
    sets.append(("varying_ref_counts",
                 ["the cat sat on the mat", "a quick brown fox", "hello there world", "one"],
                 [["the cat is on the mat", "there is a cat on the mat", "a cat sat"],
                  ["the quick brown fox"],
                  ["hello world", "hello there, world!"],
                  ["one", "two", "three", "four"]]))
    sets.append(("closest_ref_len_tie",
                 ["a b c d e f", "x y z w"],
                 [["a b c d e f g h", "a b c d"], ["x y z w v", "x y z"]]))
    return sets


# --------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------

SCORER = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)


def ref_streams(refs):
    n = max(len(r) for r in refs)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(n)]


def score_set(name, hyps, refs):
    assert len(hyps) == len(refs) and all(refs)
    streams = ref_streams(refs)
    # Same as sacrebleu.corpus_bleu / corpus_chrf with default arguments.
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hyps, streams).score
    chrf = chrf_metric.corpus_score(hyps, streams).score
    assert bleu == sacrebleu.corpus_bleu(hyps, streams).score
    assert chrf == sacrebleu.corpus_chrf(hyps, streams).score
    per = {"rouge1": [], "rouge2": [], "rougeL": [], "squad_em": [], "squad_f1": []}
    for h, rs in zip(hyps, refs):
        sc = SCORER.score_multi(rs, h)
        for k in ("rouge1", "rouge2", "rougeL"):
            per[k].append(float(sc[k].fmeasure))
        per["squad_em"].append(float(metric_max_over_ground_truths(exact_match_score, h, rs)))
        per["squad_f1"].append(float(metric_max_over_ground_truths(f1_score, h, rs)))
    n = len(hyps)
    out = {"name": name, "hyps": hyps, "refs": refs, "bleu": bleu, "chrf": chrf,
           "signatures": {"bleu": str(bleu_metric.get_signature()),
                          "chrf": str(chrf_metric.get_signature())}}
    for k, v in per.items():
        out[k] = 100.0 * sum(v) / n
    out["per_example"] = per
    return out


def version(pkg):
    return metadata.version(pkg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/work/shared/data")
    ap.add_argument("--out", default="tests/fixtures/metrics_reference.json")
    args = ap.parse_args()

    wmt = load_refs(os.path.join(args.data, "translation_wmt22_deen.dev.jsonl"), N_CORPUS)
    xsum = load_refs(os.path.join(args.data, "summarization_xsum.dev.jsonl"), N_CORPUS)
    squad = load_refs(os.path.join(args.data, "qa_squad11.dev.jsonl"), N_CORPUS)

    sets = [
        ("wmt22_deen_corpus", perturb_corpus(wmt, 1), wmt),
        ("wmt22_deen_multiref", perturb_corpus(wmt, 2), multi_refs(wmt, 3)),
        ("xsum_corpus", perturb_corpus(xsum, 4), xsum),
        ("squad11_corpus", squad_preds(squad, 5), squad),
        ("squad11_as_translation", perturb_corpus([r[:1] for r in squad], 6), squad),
    ] + hand_sets(wmt, xsum)

    tok = Tokenizer13a()
    fixture = {
        "generator": "scripts/reference/make_metric_fixtures.py",
        "versions": {
            "python": sys.version.split()[0],
            "sacrebleu": version("sacrebleu"),
            "rouge-score": version("rouge-score"),
            "nltk": version("nltk"),
            "numpy": version("numpy"),
        },
        "tokenize_13a": [{"text": t, "tokens": tok(t.rstrip())} for t in TOKENIZE_ONLY],
        "sets": [score_set(*s) for s in sets],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for s in fixture["sets"]:
        print(f"{s['name']:24s} n={len(s['hyps']):3d} bleu={s['bleu']:7.3f} chrf={s['chrf']:7.3f} "
              f"r1={s['rouge1']:7.3f} r2={s['rouge2']:7.3f} rL={s['rougeL']:7.3f} "
              f"em={s['squad_em']:7.3f} f1={s['squad_f1']:7.3f}")


if __name__ == "__main__":
    main()
