//! `tessera build <model-dir>`: a Triton Python model (`config.pbtxt` with `backend: "python"`,
//! `<version>/model.py` and its local modules) becomes the Wasm component Tessera serves for it,
//! `<version>/model.wasm`, built by componentize-py (pinned) from the model's folder, the
//! `triton_python_backend_utils` shim and the handler adapter (`guest-sdk-python/src`, carried
//! in this binary with the WIT). The config and the model.py are left as they are.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

include!(concat!(env!("OUT_DIR"), "/python_build_files.rs"));

/// The componentize-py release the SDK is built and tested with.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// Builds every version of the model in `dir` that has a `model.py`; returns the components
/// written. `tool` is componentize-py's path (default: `$COMPONENTIZE_PY`, else on `PATH`).
pub fn build(dir: &Path, tool: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
    let config_path = dir.join("config.pbtxt");
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("cannot read {}", config_path.display()))?;
    let config = tessera_core::config::parse(&text, &config_path.to_string_lossy())?;
    if config.backend != "python" {
        bail!(
            "{}: the backend is '{}', not 'python': `tessera build` builds Triton Python models (model.py)",
            config_path.display(),
            config.backend
        );
    }
    if config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
    {
        bail!(
            "{}: decoupled Python models (get_response_sender) are not built yet; write the handler in Rust (docs/writing-handlers.md)",
            config_path.display()
        );
    }
    let versions = python_versions(dir)?;
    if versions.is_empty() {
        bail!(
            "{} has no version folder with a model.py (Triton's layout: {}/1/model.py)",
            dir.display(),
            dir.display()
        );
    }
    let tool = componentize_py(tool)?;
    let work = tempfile::Builder::new()
        .prefix("tessera-build-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let wit = work.path().join("wit");
    let sdk = work.path().join("sdk");
    write_files(&wit, WIT_FILES)?;
    write_files(&sdk, PYTHON_SDK_FILES)?;
    let mut built = Vec::new();
    for version in versions {
        let output = version.join("model.wasm");
        let partial = version.join(".model.wasm.partial");
        // componentize-py compiles the model's modules in place, whatever PYTHONDONTWRITEBYTECODE
        // says; a __pycache__ that was not there before is removed afterwards.
        let pycache = version.join("__pycache__");
        let had_pycache = pycache.exists();
        let run = Command::new(&tool)
            .arg("-d")
            .arg(&wit)
            .args(["-w", "model", "componentize", "-p"])
            .arg(&sdk)
            .arg("-p")
            .arg(&version)
            .arg("tessera_triton_app")
            .arg("-o")
            .arg(&partial)
            .output()
            .with_context(|| format!("cannot run {}", tool.display()))?;
        if !had_pycache {
            let _ = std::fs::remove_dir_all(&pycache);
        }
        if !run.status.success() {
            let _ = std::fs::remove_file(&partial);
            let stderr = String::from_utf8_lossy(&run.stderr);
            bail!(
                "componentize-py could not build {}:\n{}{}",
                version.join("model.py").display(),
                tail(&stderr, 40),
                hint(&stderr)
            );
        }
        std::fs::rename(&partial, &output)
            .with_context(|| format!("cannot write {}", output.display()))?;
        built.push(output);
    }
    Ok(built)
}

/// The numbered folders of `dir` that hold a `model.py`, in version order.
fn python_versions(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.parse::<u64>().ok())
            && entry.path().join("model.py").is_file()
        {
            versions.push((n, entry.path()));
        }
    }
    versions.sort();
    Ok(versions.into_iter().map(|(_, p)| p).collect())
}

/// componentize-py at the pinned version, or an error that says how to install it.
fn componentize_py(tool: Option<&Path>) -> anyhow::Result<PathBuf> {
    let tool = tool
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("COMPONENTIZE_PY").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("componentize-py"));
    let install = format!("pip install componentize-py=={COMPONENTIZE_PY_VERSION}");
    let out = match Command::new(&tool).arg("--version").output() {
        Ok(out) => out,
        Err(e) => bail!(
            "componentize-py is needed to build Python models and {} cannot be run ({e}): `{install}` (or name it with --componentize-py or $COMPONENTIZE_PY)",
            tool.display()
        ),
    };
    let version = String::from_utf8_lossy(&out.stdout);
    if !version
        .split_whitespace()
        .any(|w| w == COMPONENTIZE_PY_VERSION)
    {
        bail!(
            "{} is '{}', and tessera build is pinned to componentize-py {COMPONENTIZE_PY_VERSION}: `{install}`",
            tool.display(),
            version.trim()
        );
    }
    Ok(tool)
}

fn write_files(dir: &Path, files: &[(&str, &str)]) -> anyhow::Result<()> {
    for (relative, text) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The likely fix for what componentize-py reported.
fn hint(stderr: &str) -> String {
    if let Some(module) = stderr
        .split("No module named '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
    {
        let why = if module == "numpy" || module.starts_with("numpy.") {
            "numpy has no WebAssembly build: the sandbox's tensors are tessera_ndarray arrays (docs/writing-handlers-python.md lists what they do); remove the import".to_owned()
        } else {
            format!(
                "put {module}.py (pure Python) next to model.py; packages with native code have no WebAssembly build"
            )
        };
        return format!("\n\nthe model imports '{module}', which the sandbox does not have: {why}");
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_carries_the_wit_and_the_sdk() {
        assert!(
            WIT_FILES
                .iter()
                .any(|(p, t)| *p == "tessera.wit" && t.contains("world model"))
        );
        for module in [
            "triton_python_backend_utils.py",
            "tessera_triton_app.py",
            "tessera_wire.py",
            "tessera_ndarray.py",
        ] {
            assert!(
                PYTHON_SDK_FILES.iter().any(|(p, _)| *p == module),
                "{module}"
            );
        }
    }

    #[test]
    fn refuses_what_it_cannot_build_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path();
        std::fs::write(
            model.join("config.pbtxt"),
            "name: \"m\"\nbackend: \"wasm\"\n",
        )
        .unwrap();
        let e = build(model, None).expect_err("not python").to_string();
        assert!(e.contains("not 'python'"), "{e}");
        std::fs::write(
            model.join("config.pbtxt"),
            "name: \"m\"\nbackend: \"python\"\n",
        )
        .unwrap();
        let e = build(model, None).expect_err("no model.py").to_string();
        assert!(e.contains("no version folder with a model.py"), "{e}");
        std::fs::create_dir(model.join("1")).unwrap();
        std::fs::write(model.join("1/model.py"), "").unwrap();
        let missing = model.join("no-such-componentize-py");
        let e = build(model, Some(&missing))
            .expect_err("no tool")
            .to_string();
        assert!(e.contains("pip install componentize-py==0.25.1"), "{e}");
    }

    #[test]
    fn a_missing_module_is_named_with_the_fix() {
        let h = hint("ModuleNotFoundError: No module named 'numpy'\n");
        assert!(
            h.contains("'numpy'") && h.contains("tessera_ndarray"),
            "{h}"
        );
        let h = hint("ModuleNotFoundError: No module named 'helpers'\n");
        assert!(h.contains("helpers.py"), "{h}");
        assert!(hint("some other failure").is_empty());
    }
}
