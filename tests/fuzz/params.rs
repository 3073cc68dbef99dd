//! The node's parameters: random `SetParameters` sequences (typed values
//! near and past each declared range, the names a parameter takes, the
//! current value of a read-only one, values of any type, unknown names)
//! through the handler r2r drives ([`RosParams`]), on an unconfigured node
//! and on an active one (a loaded synthetic model, whose server checks
//! runtime settings too). After every step each parameter keeps its type
//! and lies in the range `~/describe_parameters` declares; an accepted set
//! is what `get_parameter` then returns and changes nothing else; a
//! refusal leaves everything as it was and its message names the
//! parameter; on the active node the server accepts the settings as
//! stored, and a node reconfigured with them loads; on the unconfigured
//! one, configure loads them or names the parameter it refuses.

use crate::mutate::edge_u64;
use crate::{fixtures, fuzz};
use proptest::prelude::*;
use r2r::{ParameterValue as P, RosParams};
use selectinfer::serve::node::{ParamHandle, PARAMETERS};
use std::sync::atomic::{AtomicU64, Ordering};

// lifecycle_msgs/msg/Transition ids.
const CONFIGURE: u8 = 1;
const CLEANUP: u8 = 2;
const ACTIVATE: u8 = 3;
const DEACTIVATE: u8 = 4;

/// Parameter names, then names the node does not have.
fn names() -> Vec<&'static str> {
    let mut n: Vec<&str> = PARAMETERS.iter().map(|p| p.name).collect();
    n.extend(["use_sim_time", "nope", ""]);
    n
}

fn snapshot(h: &mut ParamHandle) -> Vec<P> {
    PARAMETERS
        .iter()
        .map(|p| h.get_parameter(p.name).expect("a declared parameter"))
        .collect()
}

/// Values of any type.
fn any_value() -> BoxedStrategy<P> {
    prop_oneof![
        Just(P::NotSet),
        any::<bool>().prop_map(P::Bool),
        edge_u64().prop_map(|v| P::Integer(v as i64)),
        any::<f64>().prop_map(P::Double),
        "\\PC{0,8}".prop_map(P::String),
        prop::collection::vec(-40i64..40, 0..3).prop_map(P::IntegerArray),
        prop::collection::vec(any::<f64>(), 0..3).prop_map(P::DoubleArray),
        prop::collection::vec(any::<bool>(), 0..3).prop_map(P::BoolArray),
    ]
    .boxed()
}

/// Values of parameter `name`'s kind, by its descriptor and `current` value.
fn typed(h: &ParamHandle, name: &str, current: &P) -> BoxedStrategy<P> {
    let d = h.describe_parameter(name).expect("described");
    let now = Just(current.clone());
    if let Some(r) = d.floating_point_range.first() {
        let (lo, hi) = (r.from_value, r.to_value);
        let edges = vec![lo, hi, lo - 1e-9, hi + 1e-9, -0.0, f64::NAN, f64::INFINITY];
        return prop_oneof![
            now,
            prop::sample::select(edges).prop_map(P::Double),
            (lo..=hi).prop_map(P::Double),
            prop::sample::select(vec![lo as i64, hi as i64, hi as i64 + 1]).prop_map(P::Integer),
        ]
        .boxed();
    }
    if let Some(r) = d.integer_range.first() {
        let (lo, hi) = (r.from_value, r.to_value);
        let edges = vec![lo, hi, lo.saturating_sub(1), hi.saturating_add(1), 0];
        return prop_oneof![
            now,
            prop::sample::select(edges).prop_map(P::Integer),
            (lo..=hi.min(lo.saturating_add(600))).prop_map(P::Integer),
            (-1.0..1.0f64).prop_map(P::Double),
        ]
        .boxed();
    }
    if let Some(list) = d.additional_constraints.strip_prefix("one of: ") {
        let mut choices: Vec<String> = list.split(", ").map(String::from).collect();
        choices.extend(["nope".into(), String::new()]);
        return prop_oneof![now, prop::sample::select(choices).prop_map(P::String)].boxed();
    }
    match current {
        P::Bool(_) => any::<bool>().prop_map(P::Bool).boxed(),
        P::IntegerArray(_) => prop_oneof![
            now,
            prop::collection::vec(-4i64..4, 0..3).prop_map(P::IntegerArray),
            prop::sample::select(vec!["0, -1", "", "1,x"]).prop_map(|s| P::String(s.into())),
        ]
        .boxed(),
        _ => {
            let texts = vec![
                "qa",
                "translation",
                "summarization",
                "",
                " ",
                "nope",
                "Be brief.",
            ];
            prop_oneof![
                now,
                prop::sample::select(texts).prop_map(|s| P::String(s.into()))
            ]
            .boxed()
        }
    }
}

/// What `get_parameter` returns after `v` was accepted for a parameter
/// whose value was `old`.
fn reflected(old: &P, v: &P) -> P {
    match (old, v) {
        (P::Double(_), P::Integer(x)) => P::Double(*x as f64),
        (P::IntegerArray(_), P::Integer(x)) => P::IntegerArray(vec![*x]),
        (P::IntegerArray(_), P::String(s)) => P::IntegerArray(
            s.split(',')
                .filter(|x| !x.trim().is_empty())
                .map(|x| x.trim().parse().unwrap_or(i64::MIN))
                .collect(),
        ),
        _ => v.clone(),
    }
}

/// Whether `v` lies in what the descriptor of `name` declares.
fn declared(h: &ParamHandle, name: &str, v: &P) -> bool {
    let d = h.describe_parameter(name).expect("described");
    match (d.floating_point_range.first(), d.integer_range.first(), v) {
        (Some(r), _, P::Double(x)) => (r.from_value..=r.to_value).contains(x),
        (Some(_), _, _) => false,
        (_, Some(r), P::Integer(x)) => (r.from_value..=r.to_value).contains(x),
        (_, Some(_), _) => false,
        _ => match (d.additional_constraints.strip_prefix("one of: "), v) {
            (Some(list), P::String(s)) => list.split(", ").any(|n| n == s),
            (Some(_), _) => false,
            _ => true,
        },
    }
}

/// One set, as r2r does it (check, then set), and every invariant after
/// it; whether the set was accepted.
fn step(h: &mut ParamHandle, active: bool, name: &str, v: &P) -> Result<bool, String> {
    let before = snapshot(h);
    let checked = h.check_parameter(name, v);
    let set = h.set_parameter(name, v);
    let after = snapshot(h);
    let declared_names: Vec<&str> = PARAMETERS.iter().map(|p| p.name).collect();
    match &set {
        Err(r2r::Error::ParameterRefused { name: n, msg }) => {
            check!(n == name, "refusal of {name} filed under {n}");
            check!(
                !msg.trim().is_empty() && msg.contains(name),
                "refusing {name} = {v:?}, the message does not name it: {msg}"
            );
            check!(after == before, "refusing {name} = {v:?} changed the state");
        }
        Err(e) => return Err(format!("refusing {name} = {v:?}: not a refusal: {e}")),
        Ok(()) => {
            check!(
                checked.is_ok(),
                "check_parameter refused {name} = {v:?}, set took it"
            );
            let i = declared_names.iter().position(|n| *n == name);
            let Some(i) = i else {
                return Err(format!("accepted an unknown parameter {name}"));
            };
            let want = reflected(&before[i], v);
            check!(
                after[i] == want,
                "set {name} = {v:?}, get gives {:?}",
                after[i]
            );
            for (j, n) in declared_names.iter().enumerate().filter(|(j, _)| *j != i) {
                check!(after[j] == before[j], "setting {name} changed {n}");
            }
        }
    }
    for (i, n) in declared_names.iter().enumerate() {
        let (a, b) = (&after[i], &before[i]);
        check!(
            std::mem::discriminant(a) == std::mem::discriminant(b),
            "{n} changed type: {b:?} -> {a:?}"
        );
        check!(
            declared(h, n, a),
            "{n} = {a:?} lies outside its declared values"
        );
    }
    if active {
        let (runtime, params) = (h.params.runtime.clone(), h.params.clone());
        h.server
            .update_settings(runtime, &params)
            .map_err(|e| format!("the server refuses the stored settings: {e:#}"))?;
    }
    Ok(set.is_ok())
}

#[test]
fn node_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixtures::model(tmp.path(), false);
    let overrides = [
        ("model", P::String(model.display().to_string())),
        ("mode", P::String("selectinfer".into())),
        ("dtype", P::String("f32".into())),
    ]
    .map(|(n, v)| (n.to_string(), v));
    let fresh = || ParamHandle::from_overrides(&overrides).expect("the fixture's parameters");
    let active = fresh();
    active.server.transition(CONFIGURE).expect("configure");
    active.server.transition(ACTIVATE).expect("activate");
    let base = active.params.clone();
    let mut probe = fresh();
    let current = snapshot(&mut probe);
    let all = names();
    let per_name: Vec<BoxedStrategy<P>> = all
        .iter()
        .enumerate()
        .map(|(i, n)| match current.get(i) {
            Some(c) => prop_oneof![3 => typed(&probe, n, c), 1 => any_value()].boxed(),
            None => any_value(),
        })
        .collect();
    let one = (0..all.len()).prop_flat_map(move |i| (Just(i), per_name[i].clone()));
    let strategy = (any::<bool>(), prop::collection::vec(one, 1..12));
    let (sets, taken) = (AtomicU64::new(0), AtomicU64::new(0));
    let refused_configs = AtomicU64::new(0);
    fuzz("node parameters", strategy, |(on_active, steps)| {
        let mut h = if on_active {
            let (runtime, params) = (base.runtime.clone(), base.clone());
            active.server.update_settings(runtime, &params).unwrap();
            ParamHandle {
                params,
                server: active.server.clone(),
            }
        } else {
            fresh()
        };
        let mut any = false;
        for (i, v) in &steps {
            let ok = step(&mut h, on_active, all[*i], v)?;
            sets.fetch_add(1, Ordering::Relaxed);
            taken.fetch_add(ok as u64, Ordering::Relaxed);
            any |= ok;
        }
        if on_active {
            // The stored parameters still make a node that loads.
            let s = &h.server;
            s.transition(DEACTIVATE)
                .map_err(|e| format!("deactivate: {e:#}"))?;
            s.transition(CLEANUP)
                .map_err(|e| format!("cleanup: {e:#}"))?;
            s.transition(CONFIGURE)
                .map_err(|e| format!("a node with the parameters set does not load: {e:#}"))?;
            s.transition(ACTIVATE)
                .map_err(|e| format!("activate: {e:#}"))?;
        } else if let Err(e) = h.server.transition(CONFIGURE) {
            // Unconfigured, runtime settings are kept for configure, which
            // checks them together: it loads, or names what it refuses.
            refused_configs.fetch_add(1, Ordering::Relaxed);
            let msg = format!("{e:#}");
            let runtime = PARAMETERS.iter().filter(|p| p.runtime);
            check!(
                runtime.map(|p| p.name).any(|n| msg.contains(n)),
                "configure refused the parameters set without naming one: {msg}"
            );
        }
        Ok(any)
    });
    let (sets, taken) = (sets.into_inner(), taken.into_inner());
    println!(
        "fuzz node parameters: {sets} sets, {taken} accepted, {} refused naming the parameter; \
         {} configures refused naming one",
        sets - taken,
        refused_configs.into_inner()
    );
}
