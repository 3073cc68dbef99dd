//! Inputs for the readers: random bytes, byte-level edits of a valid file,
//! and edits of the JSON a file carries (a header, a metadata string),
//! each a proptest strategy whose value is the edit list (what a failure
//! prints and shrinks), applied by the test to the valid bytes.

use proptest::prelude::*;
use proptest::sample::Index;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Numbers that find off-by-ones and unchecked arithmetic in length and
/// count fields.
pub fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => prop::sample::select(vec![
            0,
            1,
            2,
            7,
            8,
            0x7f,
            0xff,
            0x100,
            0x7fff,
            0xffff,
            4096,
            0x7fff_ffff,
            0xffff_ffff,
            1 << 32,
            1 << 40,
            i64::MAX as u64,
            1 << 63,
            u64::MAX - 7,
            u64::MAX,
        ]),
        1 => any::<u64>(),
    ]
}

/// One byte-level edit; positions are fractions of the current length.
#[derive(Debug, Clone)]
pub enum Edit {
    Flip(Index, u8),
    Set(Index, u8),
    /// Overwrites `width` bytes (1, 2, 4 or 8, little endian) with a number.
    Word(Index, u64, usize),
    Truncate(Index),
    Delete(Index, usize),
    Insert(Index, Vec<u8>),
    /// Copies `len` bytes from one place over another.
    Splice(Index, Index, usize),
}

pub fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        3 => (any::<Index>(), 0..8u8).prop_map(|(i, b)| Edit::Flip(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        4 => (any::<Index>(), edge_u64(), prop::sample::select(vec![1usize, 2, 4, 8]))
            .prop_map(|(i, v, w)| Edit::Word(i, v, w)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => (any::<Index>(), 1..64usize).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<Index>(), any::<Index>(), 1..256usize)
            .prop_map(|(a, b, n)| Edit::Splice(a, b, n)),
    ];
    prop::collection::vec(edit, 1..6)
}

/// `base` with `edits` applied in order.
pub fn apply(base: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = base.to_vec();
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len) };
    for e in edits {
        let len = b.len();
        match e {
            Edit::Flip(i, bit) if len > 0 => b[at(i, len)] ^= 1 << bit,
            Edit::Set(i, v) if len > 0 => b[at(i, len)] = *v,
            Edit::Word(i, v, w) if len > 0 => {
                let s = at(i, len);
                let n = (*w).min(len - s);
                b[s..s + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            Edit::Truncate(i) => b.truncate(at(i, len)),
            Edit::Delete(i, n) if len > 0 => {
                let s = at(i, len);
                b.drain(s..(s + n).min(len));
            }
            Edit::Insert(i, bytes) => {
                let s = at(i, len + 1);
                b.splice(s..s, bytes.iter().copied());
            }
            Edit::Splice(from, to, n) if len > 0 => {
                let (f, t) = (at(from, len), at(to, len));
                let n = (*n).min(len - f).min(len - t);
                b.copy_within(f..f + n, t);
            }
            _ => {}
        }
    }
    b
}

/// Random bytes, up to 64 KiB, optionally after `magic` (so the reader
/// gets past its first check): the length and a seed (fast to make, and
/// a failure prints two numbers, not the bytes).
#[derive(Debug, Clone)]
pub struct Noise {
    pub with_magic: bool,
    pub len: usize,
    pub seed: u64,
}

pub fn noise() -> impl Strategy<Value = Noise> {
    (any::<bool>(), 0..=65536usize, any::<u64>()).prop_map(|(with_magic, len, seed)| Noise {
        with_magic,
        len,
        seed,
    })
}

impl Noise {
    pub fn bytes(&self, magic: &[u8]) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let mut b = if self.with_magic {
            magic.to_vec()
        } else {
            Vec::new()
        };
        b.extend((0..self.len).map(|_| rng.random::<u8>()));
        b
    }
}

/// Replaces one leaf (number, string, bool, null) of a JSON document.
#[derive(Debug, Clone)]
pub struct JsonEdit {
    pub leaf: Index,
    pub value: Value,
}

pub fn json_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => edge_u64().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => prop::sample::select(vec![-1.0, 0.5, 1e308, -1e308, 1e-300]).prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => "[a-z0-9_.]{0,12}".prop_map(Value::from),
        1 => Just(serde_json::json!([])),
        1 => Just(serde_json::json!({})),
        1 => prop::collection::vec(edge_u64(), 0..4).prop_map(Value::from),
    ]
}

pub fn json_edits() -> impl Strategy<Value = Vec<JsonEdit>> {
    prop::collection::vec(
        (any::<Index>(), json_value()).prop_map(|(leaf, value)| JsonEdit { leaf, value }),
        1..4,
    )
}

fn leaves(v: &Value, path: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                leaves(x, format!("{path}/{k}"), out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{path}/{i}"), out);
            }
        }
        _ => out.push(path),
    }
}

/// `doc` with each edit's leaf replaced.
pub fn apply_json(doc: &Value, edits: &[JsonEdit]) -> Value {
    let mut doc = doc.clone();
    for e in edits {
        let mut paths = Vec::new();
        leaves(&doc, String::new(), &mut paths);
        if paths.is_empty() {
            continue;
        }
        let p = &paths[e.leaf.index(paths.len())];
        if let Some(slot) = doc.pointer_mut(p) {
            *slot = e.value.clone();
        }
    }
    doc
}

/// A safetensors file's 8-byte header length and JSON header, and the
/// bytes after them.
pub fn split_safetensors(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        &bytes[8 + n..],
    )
}

/// A safetensors file from a header and the data after it (the header
/// padded with spaces to 8 bytes, as the writer does).
pub fn join_safetensors(header: &Value, data: &[u8]) -> Vec<u8> {
    let mut json = serde_json::to_vec(header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    out.extend_from_slice(data);
    out
}

/// Wrapping product of a JSON shape (`None` if it is not a list of numbers).
fn elems(shape: &Value) -> Option<u64> {
    shape
        .as_array()?
        .iter()
        .try_fold(1u64, |n, d| Some(n.wrapping_mul(d.as_u64()?)))
}

/// Sets each tensor's end offset to its start plus the size its (edited)
/// dtype and shape give, wrapping as unchecked arithmetic would: the
/// header an adversary makes to pass a reader's consistency check.
pub fn fit_safetensors(header: &mut Value) {
    let Some(m) = header.as_object_mut() else {
        return;
    };
    for (_, t) in m.iter_mut().filter(|(k, _)| *k != "__metadata__") {
        let size = match t["dtype"].as_str() {
            Some("F64" | "I64" | "U64") => 8,
            Some("F32" | "I32" | "U32") => 4,
            Some("F16" | "BF16" | "I16" | "U16") => 2,
            _ => 1,
        };
        let (Some(n), Some(start)) = (elems(&t["shape"]), t["data_offsets"][0].as_u64()) else {
            continue;
        };
        t["data_offsets"] = serde_json::json!([start, start.wrapping_add(n.wrapping_mul(size))]);
    }
}

/// Sets each entry's byte count of a quantized checkpoint header to what
/// its (edited) shape and formats give, wrapping (see [`fit_safetensors`]).
pub fn fit_qfile(header: &mut Value) {
    let block = |f: &Value| match f.as_str() {
        Some("q4_0") => 18u64,
        Some("q4_1") => 20,
        Some("q5_0") => 22,
        _ => 34,
    };
    let row = |f: &Value, cols: u64| (cols / 32).wrapping_mul(block(f));
    if let Some(m) = header["tensors"].as_object_mut() {
        for e in m.values_mut() {
            let Some(n) = elems(&e["shape"]) else {
                continue;
            };
            let cols = e["shape"].as_array().and_then(|s| s.last()?.as_u64());
            e["bytes"] = match (e["format"].as_str(), cols) {
                (Some("f32"), _) => n.wrapping_mul(4),
                (_, Some(c)) if c > 0 => row(&e["format"], c).wrapping_mul(n / c),
                _ => continue,
            }
            .into();
        }
    }
    if let Some(a) = header["ffn"].as_array_mut() {
        for e in a {
            let (Some(h), Some(n)) = (e["hidden"].as_u64(), e["neurons"].as_u64()) else {
                continue;
            };
            let bb = ["gate", "up", "down"]
                .iter()
                .fold(0u64, |s, p| s.wrapping_add(row(&e[*p], h)));
            e["bytes"] = bb.wrapping_mul(n).into();
        }
    }
}
