//! Load plans built from the shipped SmolLM2 ranking.

mod common;

use selectinfer::method::ranking::Ranking;
use selectinfer::method::{
    params::{count, load_count},
    LoadPlan, SelectionParams,
};

fn ranking() -> Ranking {
    Ranking::load(&common::repo_root().join("rankings/smollm2-135m-instruct.ranking.safetensors"))
        .unwrap()
}

fn params() -> SelectionParams {
    SelectionParams {
        load_ratio: 0.7,
        static_ratio: 0.2,
        compute_ratio: 0.4,
        token_ratio: 0.1,
        dense_layers: vec![0, 29],
        task: "translation".into(),
        score: Default::default(),
        gate_keep: 1.0,
        layer_drop: Vec::new(),
        coarse_ratio: 0.0,
        coarse_bits: 4,
    }
}

#[test]
fn base_neurons_first_then_secondary_without_duplicates() {
    let r = ranking();
    let plan = LoadPlan::from_ranking(&r, &params()).unwrap();
    // γ·N to whole blocks of 32 (1075.2 -> 1088), δ·N as it is.
    let n_static = count(0.2, 1536);
    let n_load = load_count(0.7, 1536, n_static);
    assert_eq!((n_load, n_static), (1088, 307));
    for (l, lp) in plan.layers.iter().enumerate() {
        if l == 0 || l == 29 {
            assert!(lp.dense && lp.loaded.len() == 1536);
            continue;
        }
        assert_eq!(lp.loaded.len(), n_load, "layer {l}");
        assert_eq!(lp.num_static, n_static);
        assert_eq!(
            &lp.loaded[..n_static],
            r.task("translation").unwrap().top(l, n_static),
            "layer {l} base first"
        );
        let mut sorted = lp.loaded.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), n_load, "layer {l} has duplicates");
        // The rest follow the model-wide order, skipping chosen ones.
        let rest: Vec<u32> = r.model_wide.order[l]
            .iter()
            .copied()
            .filter(|n| !lp.loaded[..n_static].contains(n))
            .take(n_load - n_static)
            .collect();
        assert_eq!(
            &lp.loaded[n_static..],
            &rest[..],
            "layer {l} secondary order"
        );
    }
    assert_eq!(plan.loaded_neurons(), 28 * n_load + 2 * 1536);
}

#[test]
fn invalid_parameter_sets_are_rejected_naming_the_parameter() {
    let r = ranking();
    type Mutation = Box<dyn Fn(&mut SelectionParams)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|p| p.load_ratio = 1.5), "load_ratio"),
        (Box::new(|p| p.load_ratio = 0.0), "load_ratio"),
        (Box::new(|p| p.compute_ratio = 0.8), "compute_ratio"),
        (Box::new(|p| p.compute_ratio = 0.0), "compute_ratio"),
        (Box::new(|p| p.static_ratio = 0.5), "static_ratio"),
        (Box::new(|p| p.static_ratio = -0.1), "static_ratio"),
        (Box::new(|p| p.token_ratio = 0.0), "token_ratio"),
        (Box::new(|p| p.token_ratio = f64::NAN), "token_ratio"),
        (Box::new(|p| p.dense_layers = vec![30]), "dense_layers"),
        (
            Box::new(|p| p.task = "navigation".into()),
            "unknown task 'navigation'",
        ),
    ];
    for (mutate, needle) in cases {
        let mut p = params();
        mutate(&mut p);
        let e = format!("{:#}", LoadPlan::from_ranking(&r, &p).unwrap_err());
        assert!(e.contains(needle), "{p:?}: {e}");
    }
}

#[test]
fn random_plan_is_seeded_and_sized() {
    let p = params();
    let a = LoadPlan::random(30, 1536, &p, 7).unwrap();
    assert_eq!(a, LoadPlan::random(30, 1536, &p, 7).unwrap());
    assert_ne!(a, LoadPlan::random(30, 1536, &p, 8).unwrap());
    assert!(a.layers[5].loaded.len() == 1088 && a.layers[0].dense);
}
