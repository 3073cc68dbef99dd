//! The CLI's flags against the node parameters' one declaration
//! (`selectinfer::serve::node::PARAMETERS`): a parameter declared as the
//! CLI's too is the flag of the same name on the commands that load a
//! model, and no such flag names a node parameter its declaration does
//! not give to the CLI. Also: a list flag takes what the node's parameter
//! takes (negative dense layers).
#![cfg(feature = "ros")]

use selectinfer::serve::node::PARAMETERS;
use std::collections::BTreeSet;
use std::process::Command;

fn flags(command: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args([command, "--help"])
        .output()
        .expect("running selectinfer");
    assert!(out.status.success(), "selectinfer {command} --help failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| l.split([' ', '=']).next().unwrap().to_string())
        .collect()
}

#[test]
fn every_shared_parameter_is_a_flag_and_no_flag_names_a_node_only_one() {
    for command in ["generate", "bench", "eval", "fidelity"] {
        let flags = flags(command);
        for spec in PARAMETERS {
            let flag = spec.name.replace('_', "-");
            // max_new_tokens, temperature, top_p and seed belong to the
            // commands that generate a reply; bench times a fixed count.
            let generating = matches!(
                spec.name,
                "max_new_tokens" | "temperature" | "top_p" | "seed"
            );
            if spec.cli && !(generating && command != "generate") {
                assert!(
                    flags.contains(&flag),
                    "selectinfer {command} has no --{flag}, which the declaration of `{}` promises",
                    spec.name
                );
            }
            if !spec.cli {
                assert!(
                    !flags.contains(&flag),
                    "selectinfer {command} takes --{flag}, but `{}` is declared node-only",
                    spec.name
                );
            }
        }
    }
}

#[test]
fn negative_dense_layers_parse_as_the_node_takes_them() {
    // A folder that does not exist: the flags parse, then the model is
    // refused naming the folder (not the flag).
    let out = Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args([
            "generate",
            "--model",
            "/nonexistent/model-folder",
            "--prompt",
            "x",
        ])
        .args(["--dense-layers", "0,-1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("/nonexistent/model-folder"), "{err}");
    assert!(!err.contains("--dense-layers"), "{err}");
}
