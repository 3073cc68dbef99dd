//! The node parameters' tests: defaults and ranges, the YAML files, the
//! preset's place between the defaults and the user's parameters.
use super::*;
use crate::serve::node::param_handle::ParamHandle;
use r2r::RosParams;

/// Every default lies in its parameter's declared range, and a value
/// outside it is refused naming the parameter, leaving the rest as is.
#[test]
fn defaults_lie_in_the_declared_ranges_and_outside_is_refused() {
    let defaults = NodeParams::default();
    for spec in PARAMETERS {
        let v = defaults.get(spec.name).unwrap();
        spec.check(&v)
            .unwrap_or_else(|e| panic!("default of {}: {e:#}", spec.name));
        let d = spec.descriptor();
        assert_eq!(d.read_only, !spec.runtime, "{}", spec.name);
    }
    let mut p = NodeParams::default();
    let e = p
        .set("temperature", &ParameterValue::Double(50.0))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "parameter temperature must be in [0, 10], got 50"
    );
    let e = p
        .set("max_new_tokens", &ParameterValue::Integer(0))
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("parameter max_new_tokens must be in [1,"),
        "{e}"
    );
    let e = p.set("seed", &ParameterValue::Integer(-1)).unwrap_err();
    assert_eq!(e.to_string(), "parameter seed must be >= 0, got -1");
    let e = p
        .set("load_ratio", &ParameterValue::Integer(2))
        .unwrap_err();
    assert!(
        e.to_string().contains("load_ratio must be in [0.001, 1]"),
        "{e}"
    );
    let e = p
        .set("layer_drop", &ParameterValue::String("1, x".into()))
        .unwrap_err();
    assert!(format!("{e:#}").contains("parameter layer_drop"), "{e:#}");
    p.set("layer_drop", &ParameterValue::DoubleArray(vec![0.0, 1.5]))
        .unwrap();
    assert_eq!(
        p.get("layer_drop"),
        Some(ParameterValue::DoubleArray(vec![0.0, 1.5]))
    );
    // The configure log line names every selection knob.
    let line = p.summary();
    for part in [
        "layer_drop [0.0, 1.5]",
        "score counts",
        "vocab all",
        "head_screen 0 (4-bit)",
        "gate_keep",
    ] {
        assert!(line.contains(part), "{part} missing: {line}");
    }
    assert_eq!(p.get("temperature"), defaults.get("temperature"));
    p.set("temperature", &ParameterValue::Double(0.7)).unwrap();
    assert_eq!(p.get("temperature"), Some(ParameterValue::Double(0.7)));
}

/// `config/node.yaml` states every parameter the node declares but the
/// model's knobs (a preset's keys), each with the node's own default,
/// and nothing else.
#[test]
fn node_yaml_states_the_declared_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/node.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let given = yaml["/**"]["ros__parameters"].as_mapping().unwrap();
    let defaults = NodeParams::default();
    let mut names: Vec<&str> = given.keys().map(|k| k.as_str().unwrap()).collect();
    names.sort_unstable();
    let own = || {
        PARAMETERS
            .iter()
            .map(|p| p.name)
            .filter(|n| !crate::store::preset::KEYS.contains(n))
    };
    let mut declared: Vec<&str> = own().collect();
    declared.sort_unstable();
    assert_eq!(names, declared, "parameters in {path} vs declared");
    for name in own() {
        let want = defaults.get(name).unwrap();
        let v = &given[name];
        let got = match &want {
            ParameterValue::Double(_) => ParameterValue::Double(v.as_f64().unwrap()),
            ParameterValue::Integer(_) => ParameterValue::Integer(v.as_i64().unwrap()),
            ParameterValue::Bool(_) => ParameterValue::Bool(v.as_bool().unwrap()),
            ParameterValue::String(_) => ParameterValue::String(match v {
                serde_yaml::Value::String(s) => s.clone(),
                other => serde_yaml::to_string(other).unwrap().trim().to_string(),
            }),
            ParameterValue::IntegerArray(_) => ParameterValue::IntegerArray(
                v.as_sequence()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect(),
            ),
            // ROS 2's YAML parser refuses an empty list: "" stands for one.
            ParameterValue::DoubleArray(_) => ParameterValue::DoubleArray(match v {
                serde_yaml::Value::String(s) if s.is_empty() => Vec::new(),
                v => v
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect(),
            }),
            other => panic!("parameter {name}: no YAML form for {other:?}"),
        };
        assert_eq!(got, want, "parameter {name} in {path}");
    }
}

/// Every key a preset may set is a node parameter.
#[test]
fn every_preset_key_is_a_node_parameter() {
    for key in crate::store::preset::KEYS {
        assert!(
            spec_of(key).is_some(),
            "preset key {key} is not a node parameter"
        );
    }
}

/// The order of the layers: defaults, then the catalog model's preset,
/// then the user's parameters; a folder path gets no preset.
#[test]
fn the_preset_lies_over_the_defaults_and_under_the_users_parameters() {
    if std::env::var_os(crate::store::home::MODELS_ENV).is_none() {
        std::env::set_var(
            crate::store::home::MODELS_ENV,
            concat!(env!("CARGO_MANIFEST_DIR"), "/models"),
        );
    }
    let name = "smollm2-135m-instruct";
    let preset = Preset::for_model(name)
        .unwrap()
        .expect("a committed preset");
    let given = |pairs: &[(&str, ParameterValue)]| {
        let v: Vec<(String, ParameterValue)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        ParamHandle::from_overrides(&v)
            .unwrap_or_else(|e| panic!("{e:#}"))
            .params
    };
    let model = ("model", ParameterValue::String(name.into()));
    let p = given(std::slice::from_ref(&model));
    assert_eq!(p.preset.as_deref(), Some(preset.path.as_path()));
    for (key, v) in &preset.values {
        let want = yaml_value(v).unwrap();
        let got = p.get(key).unwrap();
        let same = match (&want, &got) {
            (ParameterValue::IntegerArray(w), ParameterValue::IntegerArray(g)) => w == g,
            (ParameterValue::Integer(w), ParameterValue::Double(g)) => *w as f64 == *g,
            (w, g) => w == g,
        };
        assert!(same, "{key}: preset {want:?}, node {got:?}");
    }
    assert!(p.engine.model.is_absolute() && p.engine.model.ends_with(name));
    // A parameter given wins over the preset's.
    let p = given(&[
        model,
        ("dtype", ParameterValue::String("q8".into())),
        ("mode", ParameterValue::String("load-only".into())),
    ]);
    assert_eq!(p.get("dtype"), Some(ParameterValue::String("q8".into())));
    assert_eq!(
        p.get("mode"),
        Some(ParameterValue::String("load-only".into()))
    );
    // A folder is a folder: the defaults, no preset.
    let folder = format!("{}/models/{name}", env!("CARGO_MANIFEST_DIR"));
    let p = given(&[("model", ParameterValue::String(folder))]);
    assert_eq!(p.preset, None);
    assert_eq!(p.engine.mode, defaults::NODE.mode);
    assert_eq!(p.engine.dtype, defaults::NODE.dtype);
}

/// The `ros__parameters` of `config/{file}`, as parameter values.
fn config_values(file: &str) -> Vec<(String, ParameterValue)> {
    fn value(v: &serde_yaml::Value) -> ParameterValue {
        use serde_yaml::Value as Y;
        match v {
            Y::Bool(b) => ParameterValue::Bool(*b),
            Y::Number(n) if n.is_f64() => ParameterValue::Double(n.as_f64().unwrap()),
            Y::Number(n) => ParameterValue::Integer(n.as_i64().unwrap()),
            Y::String(s) => ParameterValue::String(s.clone()),
            Y::Sequence(xs) if xs.iter().all(|x| x.is_i64()) => {
                ParameterValue::IntegerArray(xs.iter().map(|x| x.as_i64().unwrap()).collect())
            }
            Y::Sequence(xs) => {
                ParameterValue::DoubleArray(xs.iter().map(|x| x.as_f64().unwrap()).collect())
            }
            other => panic!("no parameter form for {other:?}"),
        }
    }
    let path = format!("{}/config/{file}", env!("CARGO_MANIFEST_DIR"));
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (yaml["/**"]["ros__parameters"].as_mapping().unwrap().iter())
        .map(|(k, v)| (k.as_str().unwrap().to_string(), value(v)))
        .collect()
}

/// `node.yaml` with the overlay `config/{overlay}` laid over it as ROS
/// merges parameter files (the later wins): the node's parameters, its
/// model resolved.
fn overlaid(overlay: &str) -> NodeParams {
    let mut given: Vec<(String, ParameterValue)> = Vec::new();
    for (name, v) in config_values("node.yaml")
        .into_iter()
        .chain(config_values(overlay))
    {
        given.retain(|(n, _)| *n != name);
        given.push((name, v));
    }
    ParamHandle::from_overrides(&given)
        .unwrap_or_else(|e| panic!("{overlay}: {e:#}"))
        .params
}

/// `config/selective-qwen0.5b.yaml` over `node.yaml` gives parameters the
/// node accepts for Qwen2.5-Coder-0.5B: one `layer_drop` weight per
/// layer, averaging 1 over the sparse layers (φ's total kept).
#[test]
fn the_selective_overlay_is_valid_for_its_model() {
    use crate::method::Mode;
    use crate::sys::device::WeightDtype;
    let p = overlaid("selective-qwen0.5b.yaml");
    let e = &p.engine;
    assert_eq!((e.mode, e.dtype), (Mode::Coreinfer, WeightDtype::F16));
    let layers = Config::from_file(&e.model.join("config.json"))
        .unwrap()
        .num_hidden_layers;
    e.effective_params().validate(layers).unwrap();
    assert_eq!(e.params.layer_drop.len(), layers);
    let sparse: Vec<f64> = (0..layers)
        .filter(|l| !e.params.dense_layers.contains(l))
        .map(|l| e.params.layer_drop[l])
        .collect();
    let mean = sparse.iter().sum::<f64>() / sparse.len() as f64;
    assert!((mean - 1.0).abs() < 1e-2, "mean weight {mean}");
}

/// `config/small-memory-qwen1.5b.yaml`: the frontier's configuration
/// (docs/BENCHMARKS.md, "The memory frontier"), every key a node parameter
/// in its range, the method's parameters valid. (Set on the defaults, not
/// resolved: the 1.5B model is not prepared for the tests.)
#[test]
fn the_small_memory_overlay_is_the_frontiers_configuration() {
    use crate::method::Mode;
    use crate::sys::device::WeightDtype;
    let mut p = NodeParams::default();
    for (name, v) in config_values("small-memory-qwen1.5b.yaml") {
        p.set(&name, &v).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
    let e = &p.engine;
    assert_eq!((e.mode, e.dtype), (Mode::LoadOnly, WeightDtype::Q4));
    let q = &e.params;
    assert_eq!((q.load_ratio, q.coarse_ratio, q.coarse_bits), (0.7, 1.0, 3));
    assert_eq!(e.kv_dtype, crate::model::KvDtype::Q8);
    assert!(e.head_in_file && e.head_screen == 256 && e.head_screen_bits.bits() == 2);
    assert_eq!((e.prefill_chunk, e.max_context), (128, Some(512)));
    e.effective_params().validate(usize::MAX).unwrap();
}

/// A value of `v`'s type other than `v`, for read-only checks.
fn other_value(v: &ParameterValue) -> ParameterValue {
    match v {
        ParameterValue::Bool(b) => ParameterValue::Bool(!b),
        ParameterValue::Integer(x) => ParameterValue::Integer(x + 1),
        ParameterValue::Double(x) => ParameterValue::Double(x / 2.0 + 0.01),
        ParameterValue::String(s) => ParameterValue::String(format!("{s}-other")),
        ParameterValue::IntegerArray(a) => {
            ParameterValue::IntegerArray([a.clone(), vec![1]].concat())
        }
        ParameterValue::DoubleArray(a) => {
            ParameterValue::DoubleArray([a.clone(), vec![1.0]].concat())
        }
        other => panic!("no other value for {other:?}"),
    }
}

/// What `ros2 param describe` says is what `ros2 param set` accepts, for
/// every parameter, on a loaded node in a mode that selects neurons and in
/// one that computes every loaded neuron: a read-only parameter refuses any
/// other value (and takes its own); a range's ends are taken, and values
/// just beyond them refused naming the parameter; `task` takes each task
/// it lists and nothing else.
#[test]
fn every_descriptor_says_what_a_runtime_set_accepts() {
    let folder = format!(
        "{}/models/smollm2-135m-instruct",
        env!("CARGO_MANIFEST_DIR")
    );
    for mode in ["selectinfer", "load-only"] {
        let given: Vec<(String, ParameterValue)> = [
            ("model", ParameterValue::String(folder.clone())),
            ("dtype", ParameterValue::String("q4".into())),
            ("mode", ParameterValue::String(mode.into())),
            ("load_ratio", ParameterValue::Double(0.7)),
            ("static_ratio", ParameterValue::Double(0.2)),
            ("compute_ratio", ParameterValue::Double(0.4)),
            ("token_ratio", ParameterValue::Double(0.5)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut h = ParamHandle::from_overrides(&given).unwrap_or_else(|e| panic!("{e:#}"));
        h.server.transition(1).unwrap_or_else(|e| panic!("{e:#}")); // configure
        for spec in PARAMETERS {
            let name = spec.name;
            let d = h.describe_parameter(name).unwrap();
            let current = h.get_parameter(name).unwrap();
            let ctx = format!("{mode}: {name}");
            if d.read_only {
                let e = h.set_parameter(name, &other_value(&current)).unwrap_err();
                assert!(e.to_string().contains("read-only"), "{ctx}: {e}");
                h.set_parameter(name, &current)
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                continue;
            }
            for r in &d.floating_point_range {
                for ok in [r.from_value, r.to_value] {
                    h.set_parameter(name, &ParameterValue::Double(ok))
                        .unwrap_or_else(|e| {
                            panic!(
                                "{ctx} = {ok} (described [{}, {}]): {e}",
                                r.from_value, r.to_value
                            )
                        });
                }
                for bad in [r.from_value - 1e-6, r.to_value + 1e-6] {
                    let e = h
                        .set_parameter(name, &ParameterValue::Double(bad))
                        .unwrap_err();
                    assert!(e.to_string().contains(name), "{ctx} = {bad}: {e}");
                }
            }
            for r in &d.integer_range {
                for ok in [r.from_value, r.to_value] {
                    h.set_parameter(name, &ParameterValue::Integer(ok))
                        .unwrap_or_else(|e| {
                            panic!(
                                "{ctx} = {ok} (described [{}, {}]): {e}",
                                r.from_value, r.to_value
                            )
                        });
                }
                let beyond = [r.from_value.checked_sub(1), r.to_value.checked_add(1)];
                for bad in beyond.into_iter().flatten() {
                    let e = h
                        .set_parameter(name, &ParameterValue::Integer(bad))
                        .unwrap_err();
                    assert!(e.to_string().contains(name), "{ctx} = {bad}: {e}");
                }
            }
            if let Some(list) = d.additional_constraints.strip_prefix("one of: ") {
                for ok in list.split(", ") {
                    h.set_parameter(name, &ParameterValue::String(ok.into()))
                        .unwrap_or_else(|e| panic!("{ctx} = {ok}: {e}"));
                }
                assert!(
                    h.set_parameter(name, &ParameterValue::String("cooking".into()))
                        .is_err(),
                    "{ctx}"
                );
            }
            h.set_parameter(name, &current)
                .unwrap_or_else(|e| panic!("{ctx} back: {e}"));
        }
        // The ones the mode decides.
        let phi = h.describe_parameter("compute_ratio").unwrap();
        match mode {
            "load-only" => assert!(phi.read_only && phi.description.contains("mode load-only")),
            _ => assert!(!phi.read_only && phi.floating_point_range[0].to_value == 0.7),
        }
        let task = h.describe_parameter("task").unwrap();
        assert!(task.additional_constraints.contains("qa"), "{task:?}");
    }
}

/// docs/PARAMETERS.md as the declarations give it: one row a parameter.
fn parameters_markdown() -> String {
    use crate::serve::node::param_specs::Values;
    let defaults = NodeParams::default();
    let mut out = String::from(
        "# Node parameters\n\n\
         Every parameter of `selectinfer_node`, from its one declaration: the\n\
         name, help, range and whether it changes at runtime in\n\
         `src/serve/node/param_specs.rs`, the default in `src/engine/defaults.rs`.\n\
         This file is generated: the test\n\
         `serve::node::params::tests::parameters_md_is_generated_from_the_declarations`\n\
         fails when it disagrees with them, as others fail for `config/node.yaml`,\n\
         the descriptors `ros2 param describe` shows and the CLI's flags\n\
         (`tests/cli_flags.rs`). Regenerate it with\n\
         `SELECTINFER_WRITE_DOCS=1 cargo test --release --features ros --lib parameters_md`.\n\n\
         Set them the ROS way (`--ros-args --params-file FILE`, `-p name:=value`);\n\
         *runtime* ones also with `ros2 param set` (or the SetParameters service),\n\
         applying to the next request; *load-time* ones are read at start-up and\n\
         refused at runtime with the reason. A *preset* parameter is also set by the\n\
         model's preset, `config/models/NAME.yaml`; a value given in a parameters\n\
         file or with `-p` wins over it, and the default shown is the node's\n\
         without a preset. *CLI* parameters are the flag of the same name on the\n\
         `selectinfer` commands (`load_ratio` ↔ `--load-ratio`). Ranges are\n\
         inclusive, as ROS's are; a value outside is refused naming the range.\n\n\
         | parameter | type | default | values | changes | also set by | description |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let code = |s: String| format!("`{s}`");
    for spec in PARAMETERS {
        let v = defaults.get(spec.name).unwrap();
        let (ty, default) = match &v {
            ParameterValue::String(s) => ("string", code(format!("{s:?}"))),
            ParameterValue::Double(x) => ("double", code(format!("{x:?}"))),
            ParameterValue::Integer(x) => ("integer", code(x.to_string())),
            ParameterValue::Bool(b) => ("bool", code(b.to_string())),
            ParameterValue::IntegerArray(xs) => ("integer[]", code(format!("{xs:?}"))),
            ParameterValue::DoubleArray(xs) => ("double[]", code(format!("{xs:?}"))),
            other => panic!("parameter {}: no documented type for {other:?}", spec.name),
        };
        let values = match spec.values {
            Values::Any if ty == "bool" => "true, false".to_string(),
            Values::Any => "any".to_string(),
            Values::Float(lo, hi) => format!("[{lo:?}, {hi:?}]"),
            Values::Int(lo, i64::MAX) => format!("≥ {lo}"),
            Values::Int(lo, hi) => format!("[{lo}, {hi}]"),
            Values::OneOf(names) => names().replace(',', ", ").replace("  ", " "),
        };
        let help = spec
            .help
            .trim_end_matches(" (load-time)")
            .trim_end_matches(" (runtime)")
            .replace('|', "\\|");
        let mut by = Vec::new();
        if crate::store::preset::KEYS.contains(&spec.name) {
            by.push("preset");
        }
        if spec.cli {
            by.push("CLI");
        }
        out += &format!(
            "| `{}` | {ty} | {default} | {values} | {} | {} | {help} |\n",
            spec.name,
            if spec.runtime { "runtime" } else { "load-time" },
            if by.is_empty() {
                "–".to_string()
            } else {
                by.join(", ")
            },
        );
    }
    out
}

/// docs/PARAMETERS.md is what the declarations say; a help text that
/// names when a parameter changes says what its declaration does.
#[test]
fn parameters_md_is_generated_from_the_declarations() {
    for spec in PARAMETERS {
        if spec.help.ends_with("(load-time)") || spec.help.ends_with("; load-time)") {
            assert!(!spec.runtime, "{}: help says load-time", spec.name);
        }
        if spec.help.ends_with("(runtime)") {
            assert!(spec.runtime, "{}: help says runtime", spec.name);
        }
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/PARAMETERS.md");
    let want = parameters_markdown();
    if std::env::var_os("SELECTINFER_WRITE_DOCS").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let got = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        got == want,
        "{path} disagrees with the parameters' declarations; regenerate it with \
         SELECTINFER_WRITE_DOCS=1 cargo test --release --features ros --lib parameters_md"
    );
}
