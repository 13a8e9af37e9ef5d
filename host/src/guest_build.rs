//! `tessera build <model-dir>`: handlers written in Python or JavaScript become the Wasm
//! components Tessera serves, `<version>/model.wasm` beside their source.
//!
//! - A Triton Python model (`config.pbtxt` with `backend: "python"`, `<version>/model.py` and
//!   its local modules): componentize-py (pinned) packs the model's folder, the
//!   `triton_python_backend_utils` shim and the handler adapter (`guest-sdk-python/src`).
//! - A Python handler written against the `tessera` module (`backend: "wasm"`,
//!   `<version>/model.py` with a `tessera.Handler` class): the same, with that module's adapter.
//! - A JavaScript handler (`backend: "wasm"`, `<version>/model.js`): componentize-qjs (pinned;
//!   QuickJS, without the component model's async ABI) packs it with `@tessera/guest`
//!   (`guest-sdk-js`).
//!
//! The SDKs and the WIT are carried in this binary. The config and the sources are left as
//! they are; the component is written beside, then renamed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

include!(concat!(env!("OUT_DIR"), "/python_build_files.rs"));

/// The componentize-py release the Python SDK is built and tested with.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
/// The componentize-qjs release the JavaScript SDK is built and tested with.
pub const COMPONENTIZE_QJS_VERSION: &str = "0.4.5";

/// Where the build tools are; `None`: `$COMPONENTIZE_PY` / `$COMPONENTIZE_QJS`, else `PATH`.
#[derive(Debug, Default)]
pub struct Tools {
    pub componentize_py: Option<PathBuf>,
    pub componentize_qjs: Option<PathBuf>,
    /// How long one tool may run ([`DEFAULT_TIME_LIMIT`] when `None`).
    pub time_limit: Option<Duration>,
}

/// How long a build tool may run: a cold Python build takes about 10 s on two cores.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Language {
    Python,
    JavaScript,
    /// JavaScript after typescript strips the types (`model.ts`).
    TypeScript,
}

/// Builds every version of the model in `dir` that has a `model.py` or a `model.js`; returns
/// the components written.
pub fn build(dir: &Path, tools: &Tools) -> anyhow::Result<Vec<PathBuf>> {
    let config_path = dir.join("config.pbtxt");
    let versions = source_versions(dir)?;
    let config = if config_path.exists() {
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?;
        tessera_core::config::parse(&text, &config_path.to_string_lossy())?
    } else if versions.iter().all(|(_, l)| *l == Language::Python) {
        // As in Triton, a model.py without a configuration is a Python backend model (its
        // auto_complete_config may fill in the rest when it loads).
        tessera_core::config::ModelConfig {
            backend: "python".into(),
            ..Default::default()
        }
    } else {
        bail!(
            "{} is missing: a JavaScript handler needs one with backend: \"wasm\"",
            config_path.display()
        );
    };
    let Some((_, language)) = versions.first() else {
        bail!(
            "{} has no version folder with a model.py, model.js or model.ts (Triton's layout: {}/1/model.py)",
            dir.display(),
            dir.display()
        );
    };
    let (language, backend) = (*language, config.backend.as_str());
    match (language, backend) {
        (Language::Python, "python" | "wasm")
        | (Language::JavaScript | Language::TypeScript, "wasm") => {}
        (Language::Python, _) => bail!(
            "{}: a model.py is built for backend \"python\" (Triton's TritonPythonModel) or \"wasm\" (a tessera.Handler), and the backend is '{backend}'",
            config_path.display()
        ),
        (Language::JavaScript | Language::TypeScript, _) => bail!(
            "{}: a model.js or model.ts is a Wasm handler: the backend must be \"wasm\", not '{backend}'",
            config_path.display()
        ),
    }
    if versions.iter().any(|(_, l)| *l != language) {
        bail!(
            "{}: versions in two languages; one model is one language",
            dir.display()
        );
    }
    let decoupled = config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    let work = tempfile::Builder::new()
        .prefix("tessera-build-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let wit = work.path().join("wit");
    write_files(&wit, WIT_FILES)?;
    let limit = tools.time_limit.unwrap_or(DEFAULT_TIME_LIMIT);
    let mut built = Vec::new();
    match language {
        Language::Python => {
            let tool = componentize_py(tools.componentize_py.as_deref())?;
            let sdk = work.path().join("sdk");
            write_files(&sdk, PYTHON_SDK_FILES)?;
            // backend "python": Triton's model.py on the pb_utils shim; "wasm": a handler
            // written against the `tessera` module.
            let app = if backend == "python" {
                "tessera_triton_app"
            } else {
                "tessera_app"
            };
            for (version, _) in &versions {
                let world = python_world(decoupled, backend == "python" && completes(version)?);
                built.push(build_python(&tool, &wit, &sdk, version, world, app, limit)?);
            }
        }
        Language::JavaScript | Language::TypeScript => {
            let tool = componentize_qjs(tools.componentize_qjs.as_deref())?;
            for (version, _) in &versions {
                built.push(build_js(
                    &tool,
                    &wit,
                    work.path(),
                    version,
                    language,
                    decoupled,
                    limit,
                )?);
            }
        }
    }
    Ok(built)
}

/// The world a Python model is built for: a decoupled one or not, or, when the model.py has an
/// `auto_complete_config`, the one that exports `config-completion` and both handlers (whether
/// the model is decoupled is known only once its configuration is completed).
fn python_world(decoupled: bool, completes: bool) -> &'static str {
    match (decoupled, completes) {
        (_, true) => "completing-model",
        (true, false) => "decoupled-model",
        (false, false) => "model",
    }
}

/// Whether the model's sources define `auto_complete_config`: only the version folder's own
/// modules are in the component, so a definition is in one of them. A model without one is built
/// without the export, and its loads skip the extra instance that completing takes.
fn completes(version: &Path) -> anyhow::Result<bool> {
    for entry in files_under(version)? {
        if entry.extension().is_some_and(|e| e == "py") {
            let text = std::fs::read_to_string(&entry)
                .with_context(|| format!("cannot read {}", entry.display()))?;
            if text.contains("auto_complete_config") {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Every file under `dir`, in subfolders too (not following links).
fn files_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)
            .with_context(|| format!("cannot read {}", folder.display()))?
        {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    Ok(files)
}

fn build_python(
    tool: &Path,
    wit: &Path,
    sdk: &Path,
    version: &Path,
    world: &str,
    app: &str,
    limit: Duration,
) -> anyhow::Result<PathBuf> {
    let partial = version.join(".model.wasm.partial");
    // componentize-py compiles the model's modules in place, whatever PYTHONDONTWRITEBYTECODE
    // says; a __pycache__ that was not there before is removed afterwards.
    let pycache = version.join("__pycache__");
    let had_pycache = pycache.exists();
    let run = output_within(
        Command::new(tool)
            .arg("-d")
            .arg(wit)
            .args(["-w", world, "componentize", "-p"])
            .arg(sdk)
            // `import numpy` finds the sandbox's stand-in.
            .arg("-p")
            .arg(sdk.join("sandbox"))
            .arg("-p")
            .arg(version)
            .arg(app)
            .arg("-o")
            .arg(&partial),
        limit,
    )
    .with_context(|| format!("cannot run {}", tool.display()))?;
    if !had_pycache {
        let _ = std::fs::remove_dir_all(&pycache);
    }
    let Some(run) = run else {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "componentize-py did not finish building {} in {} s and was stopped. It runs the \
             model's module to snapshot it: code at module level that loops or waits never \
             ends (move it into initialize()); on a slow machine, build it with \
             `tessera build --timeout-secs N`",
            version.join("model.py").display(),
            limit.as_secs()
        );
    };
    finish(run, &partial, &version.join("model.py"), "componentize-py")
}

/// componentize-qjs resolves `@tessera/guest` under its module root: a scratch folder holding
/// the SDK as `node_modules/@tessera/guest` and a copy of the version folder's files.
fn build_js(
    tool: &Path,
    wit: &Path,
    work: &Path,
    version: &Path,
    language: Language,
    decoupled: bool,
    limit: Duration,
) -> anyhow::Result<PathBuf> {
    let root = work.join(format!(
        "js-{}",
        version.file_name().and_then(|n| n.to_str()).unwrap_or("v")
    ));
    let sdk = root.join("node_modules/@tessera/guest");
    write_files(&sdk, JS_SDK_FILES)?;
    let model = root.join("model");
    copy_sources(version, &model)?;
    if language == Language::TypeScript {
        transpile(tool, &sdk.join("src/transpile.cjs"), &model, version)?;
    }
    let partial = version.join(".model.wasm.partial");
    let run = output_within(
        Command::new(tool)
            .arg("--wit")
            .arg(wit)
            .arg("--world")
            .arg(if decoupled {
                "decoupled-model"
            } else {
                "model"
            })
            .args(["--sync", "--js"])
            .arg(model.join("model.js"))
            .arg("--module-root")
            .arg(&root)
            .arg("-o")
            .arg(&partial),
        limit,
    )
    .with_context(|| format!("cannot run {}", tool.display()))?;
    let source = match language {
        Language::TypeScript => "model.ts",
        _ => "model.js",
    };
    let Some(run) = run else {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "componentize-qjs did not finish building {} in {} s and was stopped (code at \
             module level that never ends?); on a slow machine, build it with \
             `tessera build --timeout-secs N`",
            version.join(source).display(),
            limit.as_secs()
        );
    };
    finish(run, &partial, &version.join(source), "componentize-qjs")
}

/// Strips the types of the folder's `.ts` files with the typescript package installed beside
/// componentize-qjs (`npm ci` in guest-sdk-js puts both in one node_modules).
fn transpile(qjs: &Path, script: &Path, folder: &Path, version: &Path) -> anyhow::Result<()> {
    let typescript = resolve(qjs)
        .and_then(|bin| Some(bin.parent()?.parent()?.parent()?.join("typescript")))
        .filter(|dir| dir.join("package.json").is_file())
        .with_context(|| {
            format!(
                "no typescript package beside {} to build a model.ts: `npm ci` in guest-sdk-js",
                qjs.display()
            )
        })?;
    let run = Command::new("node")
        .arg(script)
        .arg(&typescript)
        .arg(folder)
        .output()
        .context("cannot run node (Node.js 20 or later) to transpile TypeScript")?;
    if !run.status.success() {
        bail!(
            "TypeScript could not be transpiled ({}):\n{}",
            version.join("model.ts").display(),
            tail(&String::from_utf8_lossy(&run.stderr), 40)
        );
    }
    Ok(())
}

/// The version folder's files but the components, for the JS build's module root.
fn copy_sources(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
    {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            copy_sources(&path, &to.join(&name))?;
        } else if !name.to_string_lossy().ends_with(".wasm")
            && !name.to_string_lossy().ends_with(".partial")
        {
            std::fs::copy(&path, to.join(&name))
                .with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    Ok(())
}

/// The component in place, or the tool's complaint with the likely fix.
/// Runs a build tool to its end and collects what it printed, or stops it once it has run for
/// `limit` (`None`): componentize-py runs the model's module at build time, so a model.py that
/// loops at import would otherwise hold `tessera build`, and `tessera deploy`, forever.
fn output_within(command: &mut Command, limit: Duration) -> std::io::Result<Option<Output>> {
    use std::io::Read;
    use std::os::unix::process::CommandExt as _;
    // Its own process group: a stop reaches what the tool started too (a wrapper script's
    // child would otherwise keep the pipes, and this wait, open).
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    // Read both pipes while the tool runs: a full pipe would stop it.
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            text
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Past the limit, or the wait itself failed: stop the tool and everything it started.
            _ => {
                if let Ok(group) = i32::try_from(child.id()) {
                    // SAFETY: kill(2) on the process group the child leads; no memory involved.
                    unsafe { libc::kill(-group, libc::SIGKILL) };
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(status.map(|status| Output {
        status,
        stdout,
        stderr,
    }))
}

fn finish(
    run: std::process::Output,
    partial: &Path,
    source: &Path,
    tool: &str,
) -> anyhow::Result<PathBuf> {
    if !run.status.success() {
        let _ = std::fs::remove_file(partial);
        let stderr = String::from_utf8_lossy(&run.stderr);
        let stdout = String::from_utf8_lossy(&run.stdout);
        let said = format!("{stdout}{stderr}");
        // componentize-py ends a failed build with its own Rust backtrace, after the Python
        // traceback that says what went wrong.
        let said = said.split("\nStack backtrace:").next().unwrap_or_default();
        bail!(
            "{tool} could not build {}:\n{}{}",
            source.display(),
            tail(said, 40),
            hint(&stderr)
        );
    }
    let output = partial.with_file_name("model.wasm");
    std::fs::rename(partial, &output)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(output)
}

/// The numbered folders of `dir` that hold a `model.py`, `model.js` or `model.ts`, in order.
/// Why `dir` must be built before it is served: a version folder with a `model.py`,
/// `model.js` or `model.ts` and no `model.wasm`, or one older than a file in that folder.
/// `None`: nothing to build.
pub fn stale(dir: &Path) -> anyhow::Result<Option<String>> {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    for (version, _) in source_versions(dir)? {
        let component = version.join("model.wasm");
        let Some(built) = modified(&component) else {
            return Ok(Some(format!("{} has no model.wasm", version.display())));
        };
        let mut newer = None;
        let mut stack = vec![version.clone()];
        while let (None, Some(folder)) = (&newer, stack.pop()) {
            for entry in std::fs::read_dir(&folder)
                .with_context(|| format!("cannot read {}", folder.display()))?
            {
                let path = entry?.path();
                let name = path.file_name().unwrap_or_default();
                if name == "__pycache__" || name == "node_modules" {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if path != component && modified(&path).is_some_and(|m| m > built) {
                    newer = Some(path);
                    break;
                }
            }
        }
        if let Some(path) = newer {
            return Ok(Some(format!(
                "{} is newer than {}",
                path.display(),
                component.display()
            )));
        }
    }
    Ok(None)
}

fn source_versions(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Language)>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(crate::repository::version_number)
        else {
            continue;
        };
        let path = entry.path();
        let found: Vec<(&str, Language)> = [
            ("model.py", Language::Python),
            ("model.js", Language::JavaScript),
            ("model.ts", Language::TypeScript),
        ]
        .into_iter()
        .filter(|(file, _)| path.join(file).is_file())
        .collect();
        let language = match found.as_slice() {
            [] => continue,
            [(_, language)] => *language,
            [(a, _), (b, _), ..] => bail!("{} holds both a {a} and a {b}", path.display()),
        };
        versions.push((n, path, language));
    }
    versions.sort_by_key(|(n, _, _)| *n);
    Ok(versions.into_iter().map(|(_, p, l)| (p, l)).collect())
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

/// componentize-qjs at the pinned version (read from its npm package), or how to install it.
fn componentize_qjs(tool: Option<&Path>) -> anyhow::Result<PathBuf> {
    let tool = tool
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("COMPONENTIZE_QJS").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("componentize-qjs"));
    let install = format!(
        "`npm ci` in guest-sdk-js (or `npm install componentize-qjs@{COMPONENTIZE_QJS_VERSION}`) and pass --componentize-qjs guest-sdk-js/node_modules/.bin/componentize-qjs"
    );
    let resolved = resolve(&tool);
    let Some(resolved) = resolved else {
        bail!(
            "componentize-qjs is needed to build JavaScript handlers and {} was not found: {install}",
            tool.display()
        );
    };
    // npm's layout: node_modules/componentize-qjs/bin/componentize-qjs beside its package.json.
    let manifest = resolved
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("package.json"));
    let version = manifest
        .and_then(|m| std::fs::read_to_string(m).ok())
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| v.get("version")?.as_str().map(str::to_owned));
    match version.as_deref() {
        Some(COMPONENTIZE_QJS_VERSION) => Ok(tool),
        Some(other) => bail!(
            "{} is componentize-qjs {other}, and tessera build is pinned to {COMPONENTIZE_QJS_VERSION}: {install}",
            tool.display()
        ),
        None => bail!(
            "cannot tell which componentize-qjs {} is (no npm package.json beside it): {install}",
            tool.display()
        ),
    }
}

/// A tool's real path: as given when it names a folder, else found on PATH; links followed.
fn resolve(tool: &Path) -> Option<PathBuf> {
    if tool.components().count() > 1 {
        std::fs::canonicalize(tool).ok()
    } else {
        which(tool).and_then(|p| std::fs::canonicalize(p).ok())
    }
}

/// The first `name` on PATH.
fn which(name: &Path) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
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
            "numpy has no WebAssembly build, and the sandbox's numpy is a subset without submodules (docs/writing-handlers-python.md lists it call by call)".to_owned()
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
            "tessera_app.py",
            "tessera.py",
            "tessera_wire.py",
            "tessera_loop.py",
            "tessera_ndarray.py",
            "sandbox/numpy/__init__.py",
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
        let config = |backend: &str| {
            std::fs::write(
                model.join("config.pbtxt"),
                format!("name: \"m\"\nbackend: \"{backend}\"\n"),
            )
            .unwrap()
        };
        config("wasm");
        let none = Tools::default();
        let e = build(model, &none).expect_err("no sources").to_string();
        assert!(
            e.contains("no version folder with a model.py, model.js or model.ts"),
            "{e}"
        );
        std::fs::create_dir(model.join("1")).unwrap();
        std::fs::write(model.join("1/model.py"), "").unwrap();
        config("onnxruntime");
        let e = build(model, &none)
            .expect_err("python, backend onnxruntime")
            .to_string();
        assert!(e.contains("for backend \"python\""), "{e}");
        config("python");
        let tools = Tools {
            componentize_py: Some(model.join("no-such-componentize-py")),
            componentize_qjs: Some(model.join("no-such-componentize-qjs")),
            time_limit: None,
        };
        let e = build(model, &tools).expect_err("no tool").to_string();
        assert!(e.contains("pip install componentize-py==0.25.1"), "{e}");
        std::fs::write(model.join("1/model.js"), "").unwrap();
        let e = build(model, &tools).expect_err("two languages").to_string();
        assert!(e.contains("both a model.py and a model.js"), "{e}");
        std::fs::remove_file(model.join("1/model.py")).unwrap();
        let e = build(model, &tools)
            .expect_err("js, backend python")
            .to_string();
        assert!(e.contains("must be \"wasm\""), "{e}");
        config("wasm");
        let e = build(model, &tools).expect_err("no qjs").to_string();
        assert!(e.contains("npm ci"), "{e}");
    }

    #[test]
    fn a_missing_module_is_named_with_the_fix() {
        let h = hint("ModuleNotFoundError: No module named 'numpy.linalg'\n");
        assert!(h.contains("'numpy.linalg'") && h.contains("subset"), "{h}");
        let h = hint("ModuleNotFoundError: No module named 'helpers'\n");
        assert!(h.contains("helpers.py"), "{h}");
        assert!(hint("some other failure").is_empty());
    }

    #[test]
    fn a_model_that_completes_its_config_gets_the_completing_world() {
        let scratch = tempfile::tempdir().expect("a scratch folder");
        let version = scratch.path().join("1");
        std::fs::create_dir_all(version.join("lib")).expect("folders");
        std::fs::write(
            version.join("model.py"),
            "class TritonPythonModel:\n    pass\n",
        )
        .expect("written");
        assert!(!completes(&version).expect("read"));
        assert_eq!(python_world(false, false), "model");
        assert_eq!(python_world(true, false), "decoupled-model");
        // Inherited from a local module, in a subfolder: still found.
        std::fs::write(
            version.join("lib").join("base.py"),
            "class Base:\n    @staticmethod\n    def auto_complete_config(c):\n        return c\n",
        )
        .expect("written");
        assert!(completes(&version).expect("read"));
        // Whether it is decoupled is known only once completed: one world exports both.
        assert_eq!(python_world(false, true), "completing-model");
        assert_eq!(python_world(true, true), "completing-model");
    }
}
