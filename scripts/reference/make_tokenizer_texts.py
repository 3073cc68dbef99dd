#!/usr/bin/env python3
"""Generate ``tests/fixtures/tokenizer_texts.json``: the tokenizer test corpus.

Usage (stdlib only, any Python >= 3.8):

    python scripts/reference/make_tokenizer_texts.py --out tests/fixtures/tokenizer_texts.json

The output is a JSON list of strings (UTF-8, ``ensure_ascii=False``, indent 1)
covering: English prose, German (umlauts, ß), numbers and long digit runs,
dates, code in several languages (indentation, tabs, newlines), emoji
(including ZWJ sequences, skin tones and flags), CJK (zh/ja/ko),
Arabic/Hebrew/Cyrillic/Hindi and other scripts, whitespace edge cases
(leading/trailing/multiple spaces, CRLF, lone CR/LF, tabs), punctuation runs,
URLs, JSON, math, and texts with the ChatML special tokens ``<|im_start|>``,
``<|im_end|>`` and ``<|endoftext|>`` inline.

Everything is written out literally or derived by deterministic loops (no
randomness), so re-running produces a byte-identical file. Duplicates are
removed while keeping the first occurrence's order. The empty string is not
included (llama.cpp's /tokenize treats it trivially; test it separately).

``make_llamacpp_fixtures.py`` reads this file and tokenizes every entry with
llama.cpp.
"""

import argparse
import json
import os

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "I can't believe it's not butter! We'll see, they're here, you've done it, he'd go, she'll stay.",
    "Don't DON'T don't Don’t — curly quotes ‘single’ and “double”.",
    "Mr. Smith went to Washington D.C. on Jan. 5th, e.g. for a meeting, i.e. work.",
    "Once upon a time, in a land far, far away, there lived a small robot named Pip.\nPip liked to count stars.",
    "Machine learning models are trained on large datasets; their outputs can be surprisingly fluent.",
    "Selective inference lets us compute only the layers we need.",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
    "a",
    "A",
    "I",
    "ab cd ef gh ij kl mn op qr st uv wx yz",
    "CamelCaseIdentifierWithManyWords and snake_case_identifier_here and SCREAMING_SNAKE_CASE",
    "The year was 1984. The price: $3.50. The ratio: 3:2. The score: 10-7.",
    "Q: What is the capital of France?\nA: Paris.",
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\nThe slings and arrows of outrageous fortune,",
    "hello\nworld",
    "hello\n\nworld",
    "hello\n\n\nworld",
    "Tokenization is the first step; detokenization is the last.",
    "What's up? Nothing much... just testing!!! Really?!?",
    "user assistant system tool function",
    "im_start im_end endoftext",
]

GERMAN_EU = [
    "Grüße aus München! Die Straße ist schön.",
    "Größe, Maß, Fuß, süß, heiß, weiß, Spaß.",
    "ÄÖÜ äöü ß ẞ",
    "Der Bäcker bäckt frische Brötchen für die Kinder.",
    "Donaudampfschifffahrtsgesellschaftskapitänsmütze",
    "Übermäßiger Ölverbrauch führt zu Ärger über Österreichs Änderungen.",
    "Guten Morgen, wie geht es dir?",
    "Français: où est la bibliothèque? Ça va, très bien, merci. Œuvre, cœur, naïve, façade.",
    "Español: ¿Dónde está el baño? ¡Qué bueno! Mañana, niño, corazón.",
    "Português: Não sei, coração, ação, pão, avó, avô.",
    "Polski: Zażółć gęślą jaźń. Łódź, Kraków, Gdańsk.",
    "Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Türkçe: Işık, ağaç, çiçek, şeker, öğrenci, İstanbul.",
    "Ελληνικά: Καλημέρα κόσμε, τι κάνεις; αβγδεζηθ ΑΒΓΔ",
    "Tiếng Việt: Xin chào thế giới, cảm ơn bạn rất nhiều.",
    "Íslenska: Þetta er ðað, æ, ö, á.",
    "café cafe\u0301",  # precomposed vs combining acute
    "e\u0301\u0301\u0301 combining marks stacked",
    "ﬁ ﬂ ligatures and Ⅻ roman numeral and ½ fraction",
]

NUMBERS = [
    "0",
    "1",
    "42",
    "123",
    "1234",
    "12345",
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "2.718281828459045",
    "-17",
    "+49 30 1234567",
    "1,000,000",
    "1.000.000,50 €",
    "1e-5 2.5E+10 6.022e23",
    "0x1F 0xDEADBEEF 0b1010 0o755",
    "100% 50% 3.5%",
    "$1,234.56 €99,99 £5 ¥1000 ₹250",
    "Call 555-0100 or (555) 010-0199 ext. 42",
    "IPv4 192.168.0.1 and IPv6 2001:db8::ff00:42:8329",
    "v1.2.3 v10.20.30-rc.1+build.5",
    "ISBN 978-3-16-148410-0",
    "Order #A12-34B56 shipped 3x items at 12:30:45.678",
    "1st 2nd 3rd 4th 21st 101st",
    "١٢٣٤٥ ०१२३४ 一二三 ①②③",
]

DATES = [
    "2024-01-15",
    "2024-01-15T13:45:30Z",
    "2024-01-15T13:45:30.123+02:00",
    "15.01.2024",
    "01/15/2024",
    "January 15, 2024",
    "Mon, 15 Jan 2024 13:45:30 GMT",
    "Q3 FY2023 ended 30 Sep 2023; Q4 starts 1 Oct.",
    "Der 3. Oktober 1990 ist der Tag der Deutschen Einheit.",
    "2024年1月15日 午後3時",
    "Timestamp 1705326330 epoch ms 1705326330123",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo:\n    def __init__(self, x: int) -> None:\n        self.x = x\n\n    def __repr__(self):\n        return f\"Foo({self.x!r})\"\n",
    "import numpy as np\nx = np.arange(10)\nprint(x[::2], x.sum())",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "impl<'a, T: Clone + Send> Iterator for Foo<'a, T> {\n\ttype Item = &'a T;\n}",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"Hello, %s!\\n\", \"world\");\n\treturn 0;\n}\n",
    "template <typename T>\nstd::vector<T> v{1, 2, 3};\nauto it = v.begin(); // iterator\n",
    "function add(a, b) {\n  return a + b;\n}\nconst arrow = (x) => x ** 2;\nconsole.log(`sum=${add(1, 2)}`);",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "public static void main(String[] args) {\n    System.out.println(\"Hello\");\n}",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC LIMIT 10;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | wc -c\ndone\n",
    "<html>\n  <body>\n    <div class=\"x\" id='y'>&amp; &lt;tag&gt;</div>\n  </body>\n</html>",
    "body { margin: 0; padding: 0 !important; }\n.a > .b:hover::after { content: \"→\"; }",
    "\tindented with one tab\n\t\ttwo tabs\n\t\t\tthree tabs",
    "    four spaces\n        eight spaces\n            twelve spaces",
    "if (x) {\r\n    y();\r\n}\r\n",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b**=6;c//=7;d<<=1;e>>=2;f&=g|h^~i",
    "a == b != c <= d >= e && f || !g -> h => i :: j ... k ?? l ?. m",
    "// comment\n/* block\n   comment */\n# python comment\n-- sql comment\n<!-- html comment -->",
    "lambda x: [i for i in range(x) if i % 2 == 0]",
    "\"\"\"Docstring with 'quotes' and \\\"escapes\\\".\"\"\"",
    "```python\nprint('fenced')\n```",
    "$ cargo build --release && ./target/release/app --flag=value -v",
    "matrix = [[1, 2, 3],\n          [4, 5, 6],\n          [7, 8, 9]]",
    "CREATE TABLE t (\n\tid INTEGER PRIMARY KEY,\n\tname TEXT NOT NULL\n);",
    "let s = \"unicode → λ → 🦀\";",
    "x = {'a': 1, \"b\": [2, 3], 'c': {'d': None}}",
    "@decorator\nasync def handler(req):\n    await asyncio.sleep(0.1)\n    yield req",
]

EMOJI = [
    "😀",
    "Hello 👋 world 🌍!",
    "😀😃😄😁😆😅😂🤣",
    "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
    "👨‍👩‍👧‍👦 family ZWJ sequence",
    "🏳️‍🌈 🏴‍☠️ 👩‍💻 🧑‍🚀 ❤️‍🔥",
    "🇩🇪 🇺🇸 🇯🇵 🇫🇷 🇬🇧",
    "🇩🇪🇺🇸🇯🇵",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
    "♥️ ♥ ☺️ ✔️ ✅ ❌ ⚠️",
    "I ❤️ 🍕 and 🍣!!!",
    "🦀🐍☕🐹",
    "1️⃣ 2️⃣ #️⃣ *️⃣",
    "emoji at end 🎉",
    "🎉 emoji at start",
]

CJK = [
    "你好，世界！",
    "我爱自然语言处理。今天天气很好，我们去公园散步吧。",
    "中华人民共和国成立于1949年10月1日。",
    "繁體中文：電腦、軟體、網路。",
    "こんにちは世界",
    "日本語のテキストです。カタカナ、ひらがな、漢字が混ざっています。",
    "東京は日本の首都です。ｶﾀｶﾅ半角",
    "안녕하세요, 세계!",
    "한국어 텍스트 처리는 재미있습니다. 서울특별시.",
    "Mixed 中文 and English and 日本語 and 한국어 in one line.",
    "全角スペース　と　全角数字１２３",
    "《红楼梦》是中国古典小说。“引号”和‘单引号’。",
    "「こんにちは」と彼は言った。",
    "龘靐齉 rare han characters 𠀀𠀁 (plane 2)",
]

SCRIPTS = [
    "مرحبا بالعالم",
    "اللغة العربية جميلة جدا. ١٢٣",
    "שלום עולם",
    "עברית נכתבת מימין לשמאל.",
    "Mixed RTL: hello שלום world مرحبا end",
    "Привет, мир!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська: Ґанок, їжак, єнот.",
    "नमस्ते दुनिया",
    "हिन्दी भाषा भारत में बोली जाती है।",
    "বাংলা ভাষা",
    "தமிழ் மொழி",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "ქართული ენა",
    "Հայերեն լեզու",
    "አማርኛ ቋንቋ",
    "ᚠᚢᚦᚨᚱᚲ runes and 𝔉𝔯𝔞𝔨𝔱𝔲𝔯 math fraktur",
]

WHITESPACE = [
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\n\n\n",
    "\t",
    "\t\t",
    "\r\n",
    "\r\n\r\n",
    "\r",
    " \n ",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple   spaces   between   words",
    "tab\tseparated\tvalues\there",
    "line1\r\nline2\r\nline3",
    "line1\rline2",
    "a\n b\n  c\n   d",
    "\n leading newline",
    "trailing newline\n",
    "trailing newlines\n\n",
    " \t \n \r\n mixed whitespace \t\n",
    "word\u00a0nbsp\u2003emspace\u200bzwsp\u3000ideographic",
    "\u200d\u200c zero width joiners",
    "\ufeffBOM at start",
    "                                                                end after 64 spaces",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
]

PUNCT = [
    "!!!",
    "???",
    "...",
    "…",
    "?!?!?!",
    "---",
    "—–-",
    "===",
    "***",
    "###",
    "~~~",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "((((nested))))",
    "[[[[]]]]",
    "{{{{}}}}",
    "<<<<>>>>",
    "........................................",
    "----------------------------------------",
    "a.b.c.d.e.f",
    "\"quoted\" 'single' `backtick`",
    "«guillemets» „Anführungszeichen“ ‚einfach‘",
    "¿¡ ¡Hola! ¿Qué?",
    "©®™ §¶ †‡ •·",
    "→ ← ↑ ↓ ⇒ ⇔",
]

URLS = [
    "https://www.example.com",
    "https://example.com/path/to/page?query=1&other=two#fragment",
    "http://localhost:8080/api/v1/users/42",
    "Visit https://github.com/ggml-org/llama.cpp for more.",
    "mailto:someone@example.org",
    "user.name+tag@sub.domain.co.uk",
    "ftp://ftp.example.org/pub/file.tar.gz",
    "https://de.wikipedia.org/wiki/Stra%C3%9Fe",
    "https://例子.测试/路径",
    "file:///home/user/documents/report.pdf",
    "C:\\Users\\Name\\Documents\\file.txt",
    "/usr/local/bin/python3.11",
    "@user #hashtag $TICKER",
]

JSON_MATH = [
    "{\"name\": \"Alice\", \"age\": 30, \"tags\": [\"a\", \"b\"]}",
    "{\n  \"key\": \"value\",\n  \"nested\": {\n    \"arr\": [1, 2.5, -3e2, true, false, null]\n  }\n}",
    "[{\"id\":1},{\"id\":2},{\"id\":3}]",
    "{\"escaped\": \"line\\nbreak \\\"quote\\\" \\u00e9 \\\\ backslash\"}",
    "{\"emoji\": \"🎉\", \"cjk\": \"中文\"}",
    "x^2 + y^2 = z^2",
    "E = mc²",
    "∑_{i=1}^{n} i = n(n+1)/2",
    "∫₀^∞ e^{-x²} dx = √π / 2",
    "∀x ∈ ℝ, ∃y : y > x ∧ y ≠ x ∨ ¬p",
    "α β γ δ ε ζ η θ λ μ π σ φ ψ ω Δ Σ Ω",
    "\\frac{a}{b} + \\sqrt{x} \\cdot \\alpha_{i,j}",
    "2 + 2 = 4; 10 / 3 ≈ 3.333; 7 × 8 = 56; 9 ÷ 3 = 3",
    "f(x) = 3x³ − 2x² + x − 7",
    "a_1, a_2, ..., a_n",
    "≤ ≥ ≠ ≈ ∞ ∂ ∇ ⊂ ⊆ ∪ ∩ ∅",
]

SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHello<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\nThe answer is 42.<|im_end|><|endoftext|>",
    "text before <|endoftext|> text after",
    "<|endoftext|><|endoftext|>",
    "<|im_start|><|im_end|>",
    "no space<|im_end|>directly after",
    " <|im_start|> spaced ",
    "<|im_start|>\n\n<|im_end|>\n",
    "<|im_start|>user\nGrüße 👋 中文<|im_end|>",
    "partial <|im_start and <im_end|> and <|endoftext are not special",
    "<|IM_START|> uppercase is not special",
    "<| im_start |> spaced inside is not special",
    "<|im_start|>user\n<|im_start|>nested<|im_end|><|im_end|>",
    "<|fake_token|> and <s> and </s> and [INST]",
]


def generated():
    """Deterministic, loop-derived texts."""
    out = []
    # digit runs of every length 1..32, plus some long ones
    for n in range(1, 33):
        out.append("".join(str((i + 1) % 10) for i in range(n)))
    for n in (40, 64, 100):
        out.append("9" * n)
    out.append("31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679")
    # digits mixed with letters / spaces
    out.append("abc123def4567ghi89")
    out.append(" 1 22 333 4444 55555 666666")
    # space runs before a word, 1..8
    for n in range(1, 9):
        out.append(" " * n + "x")
    # newline runs before/after a word
    for n in range(1, 6):
        out.append("a" + "\n" * n + "b")
    # CRLF runs
    for n in range(1, 4):
        out.append("a" + "\r\n" * n + "b")
    # tab + space combinations used in code
    for prefix in ("\t", " \t", "\t ", "  \t\t", "\n\t", "\n    "):
        out.append(prefix + "return x;")
    # repeated characters (BPE merge stress)
    for ch in ("a", "e", "z", "ä", "中", "😀", "-", "=", "_", "0"):
        out.append(ch * 17)
    # single code points across planes / byte lengths
    for cp in (0x41, 0x7F, 0x80, 0xE9, 0x3B1, 0x5D0, 0x627, 0x915, 0x4E2D, 0xAC00, 0xFFFD, 0x1F600, 0x1F9D1, 0x10348, 0x2603):
        out.append(chr(cp))
    # a couple of control characters
    out.append("bell\x07 backspace\x08 formfeed\x0c vtab\x0b esc\x1b[0m")
    out.append("null\x00byte")
    # capitalization variants of one word
    for w in ("hello", "Hello", "HELLO", "hELLO", " hello", " Hello", " HELLO"):
        out.append(w)
    # long paragraph built deterministically from prose pieces
    out.append(" ".join(PROSE[2:12]))
    out.append("\n".join(CODE[0:4]))
    # mixed bag lines
    out.append("Mix: Grüße 👋 你好 مرحبا 123 <|im_end|> https://x.y/z?a=1\n\tend")
    return out


def build():
    groups = [PROSE, GERMAN_EU, NUMBERS, DATES, CODE, EMOJI, CJK, SCRIPTS,
              WHITESPACE, PUNCT, URLS, JSON_MATH, SPECIAL, generated()]
    seen = set()
    texts = []
    for g in groups:
        for t in g:
            assert isinstance(t, str) and t != ""
            if t not in seen:
                seen.add(t)
                texts.append(t)
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/tokenizer_texts.json")
    args = ap.parse_args()
    texts = build()
    assert len(texts) >= 220, len(texts)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        json.dump(texts, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(texts)} texts to {args.out}")


if __name__ == "__main__":
    main()
