//! Build script (the product's, and crates/bagtools'): with the `ros`
//! feature, link libpython3.11 into every
//! binary (tests included). The ROS 2 wheels' librcl depends on
//! `*__rosidl_generator_py.so`, which needs libpython symbols
//! (`PyExc_RuntimeError`); see ../shared/notes/ros2-from-pypi.md, fix 4.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_ROS");
    println!("cargo:rerun-if-env-changed=SELECTINFER_ROS_PREFIX");
    if std::env::var_os("CARGO_FEATURE_ROS").is_none() {
        return;
    }
    let python = std::env::var("SELECTINFER_ROS_PREFIX")
        .map(|p| format!("{p}/bin/python"))
        .unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {python} to find libpython: {e}"));
    let libdir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if libdir.is_empty() {
        panic!(
            "{python} did not report its LIBDIR; source .ros/env.sh (scripts/setup_ros.sh) first"
        );
    }
    println!("cargo:rustc-link-search=native={libdir}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-lpython3.11");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
}
