//! BFCL's AST check of tool calls, as `bfcl_eval`'s `ast_checker` does it
//! (Berkeley Function Calling Leaderboard v4): the right functions, every
//! required argument present and no unknown one, each value of the
//! declared type and among the accepted ones (strings compared after
//! BFCL's standardization: no spaces or `,./-_*^`, lower case), an omitted
//! optional argument only where `""` is accepted; `parallel*` rows match
//! calls to references in any order; `irrelevance` rows pass with no call.

use serde_json::{Map, Value};

/// `call`'s verdict against one row: `functions` as the row offers them,
/// `references` (per call: function name → argument → accepted values),
/// `calls` as `(name, arguments object)`.
pub(crate) fn check(
    category: &str,
    functions: &[Value],
    references: &[Value],
    calls: &[(String, Value)],
) -> bool {
    if category.contains("irrelevance") || references.is_empty() {
        return calls.is_empty();
    }
    if calls.len() != references.len() {
        return false;
    }
    if !category.contains("parallel") {
        return calls
            .iter()
            .zip(references)
            .all(|(c, r)| call_matches(functions, r, c));
    }
    // Any order: each reference takes one call not taken yet (BFCL's
    // greedy no-order matching).
    let mut taken = vec![false; calls.len()];
    for r in references {
        let found = (0..calls.len()).find(|&i| !taken[i] && call_matches(functions, r, &calls[i]));
        match found {
            Some(i) => taken[i] = true,
            None => return false,
        }
    }
    true
}

fn call_matches(functions: &[Value], reference: &Value, (name, args): &(String, Value)) -> bool {
    let Some(accepted) = reference.get(name).and_then(Value::as_object) else {
        return false;
    };
    let Some(f) = functions
        .iter()
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
    else {
        return false;
    };
    let Some(args) = args.as_object() else {
        return false;
    };
    let props = f["parameters"]["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let required: Vec<&str> = f["parameters"]["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if required.iter().any(|r| !args.contains_key(*r)) {
        return false;
    }
    for (param, value) in args {
        let Some(values) = accepted.get(param).and_then(Value::as_array) else {
            return false; // an argument the reference does not know
        };
        let ty = props
            .get(param)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("any");
        if !typed(ty, value, props.get(param)) || !values.iter().any(|a| same(value, a)) {
            return false;
        }
    }
    // An optional argument left out must be one BFCL lets go ("").
    accepted
        .iter()
        .filter(|(p, _)| !args.contains_key(*p))
        .all(|(_, v)| v.as_array().is_some_and(|a| a.iter().any(|x| x == "")))
}

/// Whether `v` is of BFCL's type `ty` (an integer passes for a float).
fn typed(ty: &str, v: &Value, schema: Option<&Value>) -> bool {
    match ty {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "float" | "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "dict" | "object" => v.is_object(),
        "array" | "tuple" => {
            let item = schema
                .and_then(|s| s.get("items"))
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str);
            v.as_array().is_some_and(|xs| {
                xs.iter()
                    .all(|x| item.is_none_or(|t| typed(t, x, schema.and_then(|s| s.get("items")))))
            })
        }
        _ => true,
    }
}

/// BFCL's `standardize_string`.
fn standardize(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | ',' | '.' | '/' | '-' | '_' | '*' | '^'))
        .collect::<String>()
        .to_lowercase()
        .replace('\'', "\"")
}

/// Whether a model's value equals an accepted one: numbers by value,
/// strings standardized, lists element by element, dicts key by key (an
/// accepted dict's key may be left out where `""` is accepted).
fn same(v: &Value, accepted: &Value) -> bool {
    match (v, accepted) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::String(a), Value::String(b)) => standardize(a) == standardize(b),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => dict_matches(a, b),
        (a, b) => a == b,
    }
}

fn dict_matches(v: &Map<String, Value>, accepted: &Map<String, Value>) -> bool {
    if v.keys().any(|k| !accepted.contains_key(k)) {
        return false;
    }
    accepted.iter().all(|(k, options)| {
        let options: Vec<&Value> = match options {
            Value::Array(xs) => xs.iter().collect(),
            x => vec![x],
        };
        match v.get(k) {
            Some(x) => options.iter().any(|o| same(x, o)),
            None => options.iter().any(|o| *o == ""),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hypot() -> Vec<Value> {
        vec![
            json!({"name": "math.hypot", "parameters": {"type": "dict", "properties": {
            "x": {"type": "integer"}, "y": {"type": "integer"}, "z": {"type": "integer"}},
            "required": ["x", "y"]}}),
        ]
    }

    #[test]
    fn simple_calls_are_checked_as_bfcl_does() {
        let refs = vec![json!({"math.hypot": {"x": [4], "y": [5], "z": ["", 0]}})];
        let call = |args: Value| vec![("math.hypot".to_string(), args)];
        assert!(check(
            "simple_python",
            &hypot(),
            &refs,
            &call(json!({"x": 4, "y": 5}))
        ));
        assert!(check(
            "simple_python",
            &hypot(),
            &refs,
            &call(json!({"x": 4, "y": 5, "z": 0}))
        ));
        assert!(
            !check("simple_python", &hypot(), &refs, &call(json!({"x": 4}))),
            "missing required"
        );
        assert!(
            !check(
                "simple_python",
                &hypot(),
                &refs,
                &call(json!({"x": 4, "y": 6}))
            ),
            "wrong value"
        );
        assert!(
            !check(
                "simple_python",
                &hypot(),
                &refs,
                &call(json!({"x": 4, "y": 5, "w": 1}))
            ),
            "unknown"
        );
        assert!(
            !check(
                "simple_python",
                &hypot(),
                &refs,
                &call(json!({"x": 4.5, "y": 5}))
            ),
            "type"
        );
        assert!(!check("simple_python", &hypot(), &refs, &[]), "no call");
        let two = [call(json!({"x": 4, "y": 5})), call(json!({"x": 4, "y": 5}))].concat();
        assert!(!check("simple_python", &hypot(), &refs, &two), "two calls");
    }

    #[test]
    fn strings_are_standardized_and_parallel_calls_match_in_any_order() {
        let f = vec![
            json!({"name": "play", "parameters": {"type": "dict", "properties": {
            "artist": {"type": "string"}, "minutes": {"type": "float"}}, "required": ["artist"]}}),
        ];
        let refs = vec![
            json!({"play": {"artist": ["Taylor Swift"], "minutes": [20.0]}}),
            json!({"play": {"artist": ["Maroon 5"], "minutes": [15.0]}}),
        ];
        let calls = vec![
            (
                "play".to_string(),
                json!({"artist": "maroon 5", "minutes": 15}),
            ),
            (
                "play".to_string(),
                json!({"artist": "Taylor-Swift", "minutes": 20}),
            ),
        ];
        assert!(check("parallel", &f, &refs, &calls));
        assert!(!check("parallel", &f, &refs, &calls[..1]));
    }

    #[test]
    fn irrelevance_passes_with_no_call_only() {
        assert!(check("irrelevance", &hypot(), &[], &[]));
        assert!(!check(
            "irrelevance",
            &hypot(),
            &[],
            &[("math.hypot".into(), json!({"x": 1, "y": 2}))]
        ));
    }
}
