//! The client commands of `tessera` (`deploy`, `models`, `rollback`, `unload`): thin wrappers
//! over the HTTP repository API, so that anything they do can be scripted with curl too.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::config;

/// An HTTP client that sends `TESSERA_API_KEY` (a tenant's key or the admin key) as a bearer
/// token when it is set.
fn client() -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(key) = std::env::var("TESSERA_API_KEY")
        && !key.trim().is_empty()
    {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.trim()))
            .context("TESSERA_API_KEY is not a valid header value")?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .context("cannot create an HTTP client")
}

/// `server` may be a URL or, as tritonclient takes it, `host:port` (then plain HTTP).
fn url(server: &str, path: &str) -> String {
    let server = server.trim_end_matches('/');
    if server.contains("://") {
        format!("{server}{path}")
    } else {
        format!("http://{server}{path}")
    }
}

/// Sends a POST with a JSON body; an error answer becomes an error with the server's message.
async fn post(server: &str, path: &str, body: Value) -> anyhow::Result<Value> {
    request(server, reqwest::Method::POST, path, Some(body)).await
}

/// Sends a request (with a JSON body if given); an error answer becomes an error with the
/// server's message.
async fn request(
    server: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let mut builder = client()?.request(method, url(server, path));
    if let Some(body) = body {
        builder = builder.json(&body);
    }
    let response = builder
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {server}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or(text);
        bail!("{message} (HTTP {status})");
    }
    Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Every file of a model directory but its `config.pbtxt`, by relative path.
fn model_files(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> anyhow::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let relative = path
                    .strip_prefix(root)
                    .context("a file outside the model directory")?
                    .to_str()
                    .with_context(|| format!("{} is not a UTF-8 path", path.display()))?
                    .to_owned();
                if relative != "config.pbtxt" {
                    out.push((relative, path));
                }
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    Ok(files)
}

/// `tessera deploy DIR`: a model directory (with `config.pbtxt`, or a Triton model.py without
/// one), or a function's folder (with
/// `function.wasm` and an optional `function.toml`).
pub async fn deploy(server: &str, dir: &Path, name: Option<&str>) -> anyhow::Result<()> {
    if !dir.join("config.pbtxt").exists() && dir.join("function.wasm").exists() {
        return deploy_function(server, dir, name).await;
    }
    let mut config = if !dir.join("config.pbtxt").exists() && has_model_py(dir) {
        // As in Triton, a model.py without a configuration is a Python backend model; its
        // auto_complete_config completes the rest when the server loads it.
        config::ModelConfig {
            backend: "python".into(),
            ..Default::default()
        }
    } else {
        config::read(&dir.join("config.pbtxt"))?
    };
    let name = match name {
        Some(n) => n.to_owned(),
        None if !config.name.is_empty() => config.name.clone(),
        None => dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name()?.to_str().map(str::to_owned))
            .context("cannot tell the model name: pass --name")?,
    };
    config.name.clone_from(&name);
    let mut parameters = serde_json::Map::new();
    parameters.insert(
        "config".into(),
        Value::String(config::to_json(&config).to_string()),
    );
    let mut total = 0usize;
    for (relative, path) in model_files(dir)? {
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        total += bytes.len();
        parameters.insert(
            format!("file:{relative}"),
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        );
    }
    let started = Instant::now();
    let answer = post(
        server,
        &format!("/v2/repository/models/{name}/load"),
        json!({ "parameters": parameters }),
    )
    .await
    .with_context(|| format!("deploying '{name}' failed"))?;
    let ready = client()?
        .get(url(server, &format!("/v2/models/{name}/ready")))
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {server}"))?;
    if !ready.status().is_success() {
        bail!(
            "'{name}' was deployed but is not ready (HTTP {})",
            ready.status()
        );
    }
    let (outcome, revision) = outcome_of(&answer);
    println!(
        "{name}{revision}: {outcome}, {total} bytes, READY in {} ms",
        started.elapsed().as_millis()
    );
    if let Some(folder) = answer.get("replaces").and_then(|f| f.as_str()) {
        println!("  serves instead of the repository's model in {folder} (same name)");
    }
    // A decoupled model answers with a stream, which `/infer` refuses.
    let decoupled = match client()?
        .get(url(server, &format!("/v2/models/{name}/config")))
        .send()
        .await
    {
        Ok(r) => r.json::<serde_json::Value>().await.is_ok_and(|config| {
            config["model_transaction_policy"]["decoupled"].as_bool() == Some(true)
        }),
        Err(_) => false,
    };
    let endpoint = if decoupled {
        "generate_stream"
    } else {
        "infer"
    };
    println!(
        "  POST {}",
        url(server, &format!("/v2/models/{name}/{endpoint}"))
    );
    Ok(())
}

/// Whether a version folder (`<n>/`) of the model directory holds a `model.py`.
fn has_model_py(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|n| crate::repository::version_number(n).is_some())
                && entry.path().join("model.py").is_file()
        })
    })
}

/// Deploys a function's folder.
async fn deploy_function(server: &str, dir: &Path, name: Option<&str>) -> anyhow::Result<()> {
    let name = match name {
        Some(n) => n.to_owned(),
        None => dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name()?.to_str().map(str::to_owned))
            .context("cannot tell the function's name: pass --name")?,
    };
    let component = std::fs::read(dir.join("function.wasm"))
        .with_context(|| format!("cannot read {}", dir.join("function.wasm").display()))?;
    let mut parameters = serde_json::Map::new();
    parameters.insert(
        "file:function.wasm".into(),
        Value::String(base64::engine::general_purpose::STANDARD.encode(&component)),
    );
    match std::fs::read_to_string(dir.join("function.toml")) {
        Ok(text) => {
            parameters.insert("manifest".into(), Value::String(text));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("cannot read function.toml"),
    }
    let started = Instant::now();
    let answer = post(
        server,
        &format!("/v2/repository/functions/{name}/load"),
        json!({ "parameters": parameters }),
    )
    .await
    .with_context(|| format!("deploying function '{name}' failed"))?;
    let (outcome, revision) = outcome_of(&answer);
    println!(
        "function {name}{revision}: {outcome}, {} bytes, serving in {} ms",
        component.len(),
        started.elapsed().as_millis()
    );
    println!("  {}", url(server, &format!("/v1/functions/{name}/")));
    Ok(())
}

/// What a load answered: `loaded` or `unchanged`, and ` revision N` for a store deployment.
fn outcome_of(answer: &Value) -> (&str, String) {
    let outcome = answer
        .get("outcome")
        .and_then(Value::as_str)
        .unwrap_or("loaded");
    let revision = answer
        .get("revision")
        .and_then(Value::as_u64)
        .map_or(String::new(), |r| format!(" revision {r}"));
    (outcome, revision)
}

/// `tessera models`.
pub async fn models(server: &str) -> anyhow::Result<()> {
    let rows = post(server, "/v2/repository/index", json!({})).await?;
    let functions: Value = client()?
        .get(url(server, "/v1/functions"))
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {server}"))?
        .json()
        .await
        .unwrap_or(Value::Null);
    println!("{:<32} {:>8}  {:<12} REASON", "MODEL", "VERSION", "STATE");
    for row in rows.as_array().into_iter().flatten() {
        let field = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("");
        println!(
            "{:<32} {:>8}  {:<12} {}",
            field("name"),
            field("version"),
            if field("state").is_empty() {
                "-"
            } else {
                field("state")
            },
            field("reason")
        );
    }
    let functions = functions.as_array().cloned().unwrap_or_default();
    if !functions.is_empty() {
        println!("\n{:<32} {:<12} URL / REASON", "FUNCTION", "STATE");
        for f in functions {
            let field = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            let detail = if field("state") == "READY" {
                url(server, &field("url"))
            } else {
                field("reason")
            };
            println!("{:<32} {:<12} {detail}", field("name"), field("state"));
        }
    }
    Ok(())
}

/// `tessera rollback MODEL` (or a function).
pub async fn rollback(server: &str, model: &str, function: bool) -> anyhow::Result<()> {
    let area = if function { "functions" } else { "models" };
    let answer = post(
        server,
        &format!("/v2/repository/{area}/{model}/rollback"),
        json!({}),
    )
    .await
    .with_context(|| format!("rolling back '{model}' failed"))?;
    let revision = answer.get("revision").and_then(Value::as_u64);
    match revision {
        Some(r) => println!("{model}: revision {r} serves"),
        None => println!("{model}: unchanged"),
    }
    Ok(())
}

/// `tessera unload MODEL` (or a function).
pub async fn unload(
    server: &str,
    model: &str,
    unload_dependents: bool,
    function: bool,
) -> anyhow::Result<()> {
    if function {
        post(
            server,
            &format!("/v2/repository/functions/{model}/unload"),
            json!({}),
        )
        .await
        .with_context(|| format!("unloading function '{model}' failed"))?;
        println!("unloaded: function {model}");
        return Ok(());
    }
    let answer = post(
        server,
        &format!("/v2/repository/models/{model}/unload"),
        json!({ "parameters": { "unload_dependents": unload_dependents } }),
    )
    .await
    .with_context(|| format!("unloading '{model}' failed"))?;
    let unloaded: Vec<&str> = answer
        .get("unloaded")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    println!("unloaded: {}", unloaded.join(", "));
    Ok(())
}

/// `tessera tenants ...`: the admin API (`/v1/tenants`), with the admin key in
/// `TESSERA_API_KEY`.
pub mod tenants {
    use anyhow::Context;
    use reqwest::Method;
    use serde_json::{Value, json};

    use super::request;

    pub async fn list(server: &str) -> anyhow::Result<()> {
        let rows = request(server, Method::GET, "/v1/tenants", None).await?;
        for t in rows.as_array().into_iter().flatten() {
            let names = |k: &str| -> String {
                t.get(k)
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            };
            println!(
                "{}\tkeys: {}\tgrants: {}\tquotas: {}",
                t.get("name").and_then(Value::as_str).unwrap_or(""),
                names("keys"),
                names("grants"),
                t.get("quotas").cloned().unwrap_or(Value::Null)
            );
        }
        Ok(())
    }

    pub async fn create(server: &str, tenant: &str) -> anyhow::Result<()> {
        request(
            server,
            Method::POST,
            "/v1/tenants",
            Some(json!({ "name": tenant })),
        )
        .await?;
        println!("created tenant '{tenant}'; issue it a key with: tessera tenants key {tenant}");
        Ok(())
    }

    pub async fn delete(server: &str, tenant: &str) -> anyhow::Result<()> {
        request(
            server,
            Method::DELETE,
            &format!("/v1/tenants/{tenant}"),
            None,
        )
        .await?;
        println!("deleted tenant '{tenant}' with its keys, models and functions");
        Ok(())
    }

    pub async fn issue_key(server: &str, tenant: &str) -> anyhow::Result<()> {
        let answer = request(
            server,
            Method::POST,
            &format!("/v1/tenants/{tenant}/keys"),
            None,
        )
        .await?;
        let field = |k: &str| {
            answer
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        eprintln!(
            "key '{}' for tenant '{tenant}' (shown only now; revoke with: tessera tenants revoke {tenant} {}):",
            field("id"),
            field("id")
        );
        println!("{}", field("key"));
        Ok(())
    }

    pub async fn revoke_key(server: &str, tenant: &str, id: &str) -> anyhow::Result<()> {
        request(
            server,
            Method::DELETE,
            &format!("/v1/tenants/{tenant}/keys/{id}"),
            None,
        )
        .await?;
        println!("revoked key '{id}' of tenant '{tenant}'");
        Ok(())
    }

    pub async fn set_quotas(server: &str, tenant: &str, settings: &[String]) -> anyhow::Result<()> {
        let mut patch = serde_json::Map::new();
        for setting in settings {
            let (name, value) = setting
                .split_once('=')
                .with_context(|| format!("'{setting}': expected NAME=VALUE"))?;
            let value: u64 = value
                .trim()
                .parse()
                .with_context(|| format!("'{setting}': the value must be a whole number"))?;
            patch.insert(name.trim().to_owned(), json!(value));
        }
        let quotas = request(
            server,
            Method::PUT,
            &format!("/v1/tenants/{tenant}/quotas"),
            Some(Value::Object(patch)),
        )
        .await?;
        println!("{}", serde_json::to_string_pretty(&quotas)?);
        Ok(())
    }

    pub async fn grant(server: &str, tenant: &str, model: &str, allow: bool) -> anyhow::Result<()> {
        let method = if allow { Method::POST } else { Method::DELETE };
        request(
            server,
            method,
            &format!("/v1/tenants/{tenant}/grants/{model}"),
            None,
        )
        .await?;
        if allow {
            println!("tenant '{tenant}' may now call '{model}'");
        } else {
            println!("tenant '{tenant}' may no longer call '{model}'");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_is_a_url_or_host_and_port() {
        assert_eq!(
            super::url("localhost:8000", "/v2"),
            "http://localhost:8000/v2"
        );
        assert_eq!(super::url("http://h:1/", "/v2"), "http://h:1/v2");
        assert_eq!(super::url("https://h", "/v2"), "https://h/v2");
    }
}
