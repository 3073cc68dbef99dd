//! Task datasets: JSON Lines files (`../shared/data/*.jsonl`: one example per
//! line with `id`, `task`, `references` and task fields) and prompt templates
//! with `{field}` placeholders filled from an example.

use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// One dataset row.
#[derive(Debug, Clone)]
pub struct Example {
    pub id: String,
    pub fields: Map<String, Value>,
    pub references: Vec<String>,
}

/// Reads up to `limit` examples (all when `None`) from a JSONL file.
/// A missing or empty file, or a malformed line, is an error naming the
/// file and line.
pub fn load_jsonl(path: &Path, limit: Option<usize>) -> Result<Vec<Example>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading dataset {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let row: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not valid JSON", path.display(), i + 1))?;
        let Value::Object(fields) = row else {
            bail!("{} line {}: expected a JSON object", path.display(), i + 1);
        };
        let id = fields
            .get("id")
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .unwrap_or_else(|| format!("line-{}", i + 1));
        let references = match fields.get("references") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        out.push(Example {
            id,
            fields,
            references,
        });
    }
    if out.is_empty() {
        bail!("dataset {} has no examples", path.display());
    }
    Ok(out)
}

/// Fills `{name}` placeholders of `template` with the example's fields
/// (`{{` and `}}` stand for literal braces). An unknown field is an error.
pub fn render_template(template: &str, ex: &Example) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('}') {
            bail!("prompt template has an unmatched '}}': {template:?}");
        }
        let end = tail
            .find('}')
            .with_context(|| format!("prompt template has an unclosed '{{': {template:?}"))?;
        let name = &tail[1..end];
        let value = ex.fields.get(name).with_context(|| {
            let known: Vec<_> = ex.fields.keys().map(String::as_str).collect();
            format!(
                "prompt template field '{name}' is not in example {} (fields: {})",
                ex.id,
                known.join(", ")
            )
        })?;
        match value {
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Example {
        let fields: Map<String, Value> =
            serde_json::from_str(r#"{"id": "x", "source": "Guten Tag", "n": 3}"#).unwrap();
        Example {
            id: "x".into(),
            fields,
            references: vec![],
        }
    }

    #[test]
    fn fills_fields_and_escapes() {
        let s = render_template("Translate: {source} ({n}) {{literal}}", &example()).unwrap();
        assert_eq!(s, "Translate: Guten Tag (3) {literal}");
    }

    #[test]
    fn unknown_field_is_an_error() {
        let e = render_template("{document}", &example())
            .unwrap_err()
            .to_string();
        assert!(e.contains("'document'") && e.contains("source"), "{e}");
        assert!(render_template("{source", &example()).is_err());
    }
}
