//! A handler that completes its own configuration: Triton's `auto_complete_config`, through the
//! optional `tessera:inference/config-completion` export (`wit/tessera.wit`).
//!
//! The component is instantiated once, in a store of its own under the model's sandbox limits,
//! and `complete-config` is called with the configuration as read; the instance is dropped
//! afterwards (Triton, too, runs `auto_complete_config` in an interpreter it then throws away).
//! What the guest returns is untrusted: [`crate::config::merge_completion`] keeps only the fields a
//! completion may set, and only where the configuration left them open.

use std::sync::Arc;

use wasmtime::Store;

use super::host::{Guest, HostState, MAX_INIT_ERROR_CHARS, trap_cause, truncate_chars};
use super::limits::{Limits, LogRate};
use super::{NoInference, WasmRuntime, check_component_binary};
use crate::backend::{CompletionContext, LoadError};
use crate::config::{ModelConfig, model_file};
use crate::infer::Inference;

/// The interface a completing handler exports (any 0.1 patch version).
const CONFIG_COMPLETION_EXPORT: &str = "tessera:inference/config-completion@0.1";

/// What the guest sees when it calls a model while completing its configuration.
const NO_CALLS: &str =
    "models cannot be called from auto_complete_config: the model is not loaded yet";

/// The configuration as the handler completes it, or `None` when its component does not export
/// `config-completion` (or is not built yet: loading then says how to build it).
pub async fn complete(
    runtime: &Arc<WasmRuntime>,
    ctx: &CompletionContext,
) -> Result<Option<ModelConfig>, LoadError> {
    let path = model_file(&ctx.config, &ctx.version_dir, "model.wasm");
    if !path.exists() {
        return Ok(None);
    }
    let (compiling, name) = (runtime.clone(), ctx.name.clone());
    let component = tokio::task::spawn_blocking(move || {
        let bytes = std::fs::read(&path).map_err(|e| {
            tracing::warn!(path = %path.display(), "cannot read a component: {e}");
            LoadError::invalid(format!("cannot read {} ({})", path.display(), e.kind()))
        })?;
        check_component_binary(&path.display().to_string(), &bytes).map_err(LoadError::invalid)?;
        compiling.component_kept_for_load(&bytes, &name)
    })
    .await
    .map_err(|e| LoadError::runtime(format!("compiling the component failed: {e}")))??;
    let Some(export) = component
        .component_type()
        .exports(&runtime.engine)
        .map(|(name, _)| name.to_owned())
        .find(|name| name.starts_with(CONFIG_COMPLETION_EXPORT))
    else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let completed = call(runtime, ctx, &component, &export).await?;
    let mut completed = crate::config::from_json(&completed).map_err(|e| {
        LoadError::invalid(format!(
            "auto_complete_config returned a configuration that does not parse: {e}"
        ))
    })?;
    // The guest saw the name its owner gave the model (a tenant's, without the namespace).
    if completed.name == crate::namespace::shown(&ctx.config.name) {
        completed.name.clone_from(&ctx.config.name);
    }
    let merged = crate::config::merge_completion(&ctx.config, completed)
        .map_err(|e| LoadError::invalid(format!("auto_complete_config: {e}")))?;
    if merged == ctx.config {
        return Ok(None);
    }
    tracing::info!(
        model = ctx.name,
        ms = started.elapsed().as_millis(),
        "configuration completed by the handler's auto_complete_config"
    );
    Ok(Some(merged))
}

/// Instantiates the component under the model's limits and calls `complete-config` once.
async fn call(
    runtime: &WasmRuntime,
    ctx: &CompletionContext,
    component: &wasmtime::component::Component,
    export: &str,
) -> Result<String, LoadError> {
    let limits = Limits::from_config(&ctx.config, runtime.max_memory_bytes, runtime.fuel_metered)
        .map_err(LoadError::invalid)?;
    // Alive for the call: the guest's `infer` finds it and is told why it cannot call.
    let no_calls: Arc<dyn Inference> = Arc::new(NoInference(NO_CALLS));
    let shown = crate::namespace::shown(&ctx.name);
    let state = HostState::for_guest(&Guest {
        name: &ctx.name,
        version: 0,
        limits: &limits,
        inference: Arc::downgrade(&no_calls),
        counters: runtime.counters.for_model(&ctx.name),
        custom_metrics: runtime.custom_metrics.clone(),
        series_keeper: None,
        log_rate: Arc::new(LogRate::new(limits.max_log_bytes_per_second)),
        ticker: runtime.ticker.clone(),
        env: &[],
        allowed_hosts: Arc::from(Vec::new()),
        files: Some(&ctx.version_dir),
    });
    let mut store = Store::new(&runtime.engine, state);
    store.limiter(|s| &mut s.limiter);
    // As for an `execute`: the epoch yields to the executor, the deadline bounds the wall
    // clock, fuel the instructions.
    super::epoch::yield_each_tick(&mut store);
    limits
        .refuel(&mut store)
        .map_err(|e| LoadError::runtime(format!("{e:#}")))?;
    store.data_mut().begin_execution(
        vec![ctx.name.clone()],
        limits.execute_deadline,
        0,
        None,
        tracing::Span::none(),
    );
    let config_json = {
        let mut json = crate::config::to_json(&ctx.config);
        json["name"] = shown.into();
        json.to_string()
    };
    let outcome = {
        let _running = store.data().guest_running();
        let run = async {
            let instance = runtime
                .linker
                .instantiate_async(&mut store, component)
                .await?;
            let interface = instance
                .get_export_index(&mut store, None, export)
                .ok_or_else(|| wasmtime::format_err!("{export} is not exported"))?;
            let func = instance
                .get_export_index(&mut store, Some(&interface), "complete-config")
                .ok_or_else(|| wasmtime::format_err!("{export} has no complete-config"))?;
            let func =
                instance.get_typed_func::<(&str,), (Result<String, String>,)>(&mut store, &func)?;
            let (returned,) = func.call_async(&mut store, (&config_json,)).await?;
            wasmtime::Result::Ok(returned)
        };
        tokio::time::timeout(limits.execute_deadline, run).await
    };
    store.data_mut().flush_output(&ctx.name, 0);
    store.data_mut().end_execution();
    match outcome {
        Ok(Ok(Ok(completed))) => Ok(completed),
        Ok(Ok(Err(message))) => Err(LoadError::invalid(format!(
            "auto_complete_config failed: {}",
            truncate_chars(&message, MAX_INIT_ERROR_CHARS)
        ))),
        Ok(Err(trap)) => Err(LoadError::invalid(super::with_likely_fix(format!(
            "handler '{shown}' trapped in auto_complete_config: {}",
            trap_cause(&trap)
        )))),
        Err(_) => Err(LoadError::invalid(format!(
            "handler '{shown}' auto_complete_config exceeded its deadline ({} ms)",
            limits.execute_deadline.as_millis()
        ))),
    }
}
