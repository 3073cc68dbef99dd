//! `--model` as a catalog name or a folder, from any working directory
//! (`store::home`), and a catalog model's preset laid under the flags
//! given (`store::preset`): the `selectinfer` binary run from a temporary
//! folder on the real SmolLM2, with the models home set by
//! `SELECTINFER_MODELS`.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const NAME: &str = "smollm2-135m-instruct";

/// `selectinfer ARGS` run in `cwd` with the models home `home`.
fn selectinfer(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_selectinfer"))
        .args(args)
        .current_dir(cwd)
        .env("SELECTINFER_MODELS", home)
        .output()
        .expect("running selectinfer")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// The models home the tests' models are in (the folder above SmolLM2's).
fn home() -> std::path::PathBuf {
    common::model_dir(NAME).parent().unwrap().to_path_buf()
}

/// `bench --json` with 2 new tokens and `extra` flags: its report names
/// the dtype and mode it ran.
fn bench(cwd: &Path, home: &Path, model: &str, extra: &[&str]) -> Output {
    let mut args = vec!["bench", "--model", model, "--new-tokens", "2", "--json"];
    args.extend_from_slice(extra);
    selectinfer(cwd, home, &args)
}

fn report(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_catalog_name_resolves_in_the_models_home_from_any_folder() {
    let cwd = tempfile::tempdir().unwrap();
    let out = bench(cwd.path(), &home(), NAME, &["--mode", "dense"]);
    let r = report(&out);
    assert_eq!(r["mode"], "dense");
}

#[test]
fn relative_and_absolute_folders_resolve_against_the_working_directory() {
    let dir = common::model_dir(NAME);
    let root = dir.parent().unwrap().parent().unwrap();
    let rel = format!(
        "{}/{NAME}",
        dir.parent().unwrap().file_name().unwrap().to_string_lossy()
    );
    // Relative to the working directory it was given in.
    report(&bench(root, &home(), &rel, &[]));
    // The same relative path from elsewhere: the error names the path and
    // the folder it was resolved against.
    let cwd = tempfile::tempdir().unwrap();
    let out = bench(cwd.path(), &home(), &rel, &[]);
    assert!(!out.status.success());
    let log = stderr(&out);
    let wd = cwd.path().canonicalize().unwrap();
    assert!(
        log.contains(&rel) && log.contains("does not exist"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "resolved against the working directory {}",
            wd.display()
        )) || log.contains(&format!(
            "resolved against the working directory {}",
            cwd.path().display()
        )),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    // An absolute folder works from anywhere.
    report(&bench(cwd.path(), &home(), dir.to_str().unwrap(), &[]));
}

#[test]
fn a_folder_that_is_not_a_model_and_an_unknown_name_are_refused_clearly() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("empty")).unwrap();
    let out = bench(cwd.path(), &home(), "empty", &[]);
    let log = stderr(&out);
    assert!(!out.status.success());
    assert!(
        log.contains("has no config.json") && log.contains(&cwd.path().display().to_string()),
        "{log}"
    );
    let out = bench(cwd.path(), &home(), "llama-9000", &[]);
    let log = stderr(&out);
    assert!(!out.status.success());
    assert!(
        log.contains("is not a catalog name") && log.contains(NAME),
        "lists the catalog: {log}"
    );
}

#[test]
fn an_unprepared_or_half_prepared_model_is_never_taken_for_a_finished_one() {
    let cwd = tempfile::tempdir().unwrap();
    let empty_home = tempfile::tempdir().unwrap();
    // What an interrupted preparation leaves: the partial folder, and (from
    // before preparations were atomic) a folder with only some files.
    let partial = empty_home.path().join(format!(".{NAME}.partial"));
    std::fs::create_dir(&partial).unwrap();
    std::fs::copy(
        common::model_dir(NAME).join("config.json"),
        partial.join("config.json"),
    )
    .unwrap();
    // `quantize` refuses rather than prepares: no download in this test.
    let out = selectinfer(
        cwd.path(),
        empty_home.path(),
        &["quantize", "--model", NAME],
    );
    let log = stderr(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "model {NAME} is not prepared in the models home {}",
            empty_home.path().display()
        )) && log.contains(&format!("selectinfer prepare-model {NAME}")),
        "{log}"
    );
    let half = empty_home.path().join(NAME);
    std::fs::create_dir(&half).unwrap();
    std::fs::copy(
        common::model_dir(NAME).join("config.json"),
        half.join("config.json"),
    )
    .unwrap();
    let out = selectinfer(
        cwd.path(),
        empty_home.path(),
        &["quantize", "--model", NAME],
    );
    assert!(stderr(&out).contains("is not prepared"), "{}", stderr(&out));
}

#[test]
fn a_model_prepared_for_its_preset_keeps_only_the_q4_checkpoint_it_serves() {
    let cwd = tempfile::tempdir().unwrap();
    let lean_home = tempfile::tempdir().unwrap();
    let lean = lean_home.path().join(NAME);
    std::fs::create_dir(&lean).unwrap();
    // The verified GGUF in place: preparation skips the download.
    let full = common::model_dir(NAME);
    std::fs::copy(full.join("model.gguf"), lean.join("model.gguf")).unwrap();
    let out = selectinfer(cwd.path(), lean_home.path(), &["prepare-model", NAME]);
    assert!(out.status.success(), "{}", stderr(&out));
    let q4 = lean.join("model.q4.siq");
    assert!(q4.is_file(), "{}", stderr(&out));
    assert!(!lean.join("model.safetensors").exists(), "f32 removed");
    assert!(!lean.join("model.q8.siq").exists(), "no q8");
    assert!(
        stderr(&out).contains("prepare-model --all"),
        "says how to get it back"
    );
    // The same bytes as the q4 made beside a kept f32 checkpoint.
    assert!(
        std::fs::read(&q4).unwrap() == std::fs::read(full.join("model.q4.siq")).unwrap(),
        "the lean q4 checkpoint differs from the full folder's"
    );
    let r = report(&bench(cwd.path(), lean_home.path(), NAME, &[]));
    assert_eq!(r["dtype"], "q4");
    // A second preparation finds it finished: nothing converted again.
    let written = std::fs::metadata(&q4).unwrap().modified().unwrap();
    let out = selectinfer(cwd.path(), lean_home.path(), &["prepare-model", NAME]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!lean.join("model.safetensors").exists(), "{}", stderr(&out));
    // --all writes the f32 checkpoint and q8 back; q4 stays valid.
    let out = selectinfer(
        cwd.path(),
        lean_home.path(),
        &["prepare-model", "--all", NAME],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(lean.join("model.safetensors").is_file() && lean.join("model.q8.siq").is_file());
    assert_eq!(std::fs::metadata(&q4).unwrap().modified().unwrap(), written);
}

#[test]
fn the_preset_sets_what_the_flags_do_not_and_the_flags_win() {
    let preset = common::repo_root().join(format!("config/models/{NAME}.yaml"));
    let text = std::fs::read_to_string(&preset).unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let given = &yaml["/**"]["ros__parameters"];
    let cwd = tempfile::tempdir().unwrap();
    // By name: the preset's dtype and mode.
    let r = report(&bench(cwd.path(), &home(), NAME, &[]));
    assert_eq!(r["dtype"], given["dtype"].as_str().unwrap());
    assert_eq!(r["mode"], given["mode"].as_str().unwrap());
    // A flag given wins over the preset's key.
    let other = if given["mode"] == "dense" {
        "load-only"
    } else {
        "dense"
    };
    let r = report(&bench(
        cwd.path(),
        &home(),
        NAME,
        &["--mode", other, "--dtype", "q8"],
    ));
    assert_eq!(
        (r["mode"].as_str(), r["dtype"].as_str()),
        (Some(other), Some("q8"))
    );
    // A folder path gets no preset: the built-in defaults (dense q4).
    let dir = common::model_dir(NAME);
    let r = report(&bench(cwd.path(), &home(), dir.to_str().unwrap(), &[]));
    assert_eq!(
        (r["mode"].as_str(), r["dtype"].as_str()),
        (Some("dense"), Some("q4"))
    );
    // The header says how the preset was made.
    assert!(
        text.contains("command: selectinfer") && text.contains(" tune "),
        "{text}"
    );
}

#[test]
fn every_preset_key_is_a_flag_and_the_help_says_q4() {
    let cwd = tempfile::tempdir().unwrap();
    for cmd in ["bench", "eval", "generate"] {
        let out = selectinfer(cwd.path(), &home(), &[cmd, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        for key in selectinfer::store::preset::KEYS {
            let flag = format!("--{}", key.replace('_', "-"));
            assert!(help.contains(&flag), "{cmd} --help lacks {flag}");
        }
        assert!(help.contains("[default: q4]"), "{cmd} --help: {help}");
    }
}
