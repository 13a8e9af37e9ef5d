//! ONNX models through ONNX Runtime (the `ort` crate, loaded dynamically), on the CPU or on a GPU.
//!
//! Serves `platform: "onnxruntime_onnx"` / `backend: "onnxruntime"`. The shared library comes from
//! the `onnxruntime` PyPI wheel (`onnxruntime-gpu` for GPUs) and is found through
//! `--onnxruntime-library` or `ORT_DYLIB_PATH`; without it ONNX models are UNAVAILABLE with
//! instructions, and everything else serves.
//!
//! Each instance is one session on its own thread, placed on the CPU or a GPU by its instance
//! group ([`crate::device::placement`]); a GPU instance's session has the execution providers of
//! [`providers`] on a stream of its own ([`gpu`]). A batch is executed as one
//! ONNX Runtime run: the requests' inputs are concatenated along the batch dimension, and each
//! output is split back by the requests' row counts.
//!
//! Per-model `parameters` (Triton's onnxruntime backend names):
//! - `intra_op_thread_count` — threads one execution may use. Default 1: instances, HTTP workers
//!   and other models share the cores, and small models gain nothing from more threads.
//! - `inter_op_thread_count` — threads for parallel graph branches. Default 1.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use futures::FutureExt;
use ort::session::Session;
use ort::value::{DynValue, Tensor as OrtTensor, TensorElementType, ValueType};

use super::{Backend, CompletionContext, Executed, LoadContext, LoadError, ModelInstance};
use crate::config::{ModelConfig, ModelSignature, TensorSignature, model_file, string_parameter};
use crate::device::placement::InstanceSlot;
use crate::infer::{BoxFuture, Call, InferError, InferRequest, InferResponse, InferResult};
use crate::metrics::ExecutionTiming;
use crate::tensor::{DataType, Tensor, TensorData};

macro_rules! numeric_types {
    ($m:ident) => {
        $m! {
            Fp16 => half::f16, Fp32 => f32, Fp64 => f64,
            Int8 => i8, Int16 => i16, Int32 => i32, Int64 => i64,
            Uint8 => u8, Uint16 => u16, Uint32 => u32, Uint64 => u64
        }
    };
}

pub mod gpu;
pub mod providers;

/// The ONNX Runtime release the project pins (see `scripts/setup-python.sh`).
pub const PINNED_VERSION: &str = "1.31.1";

static RUNTIME: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// Loads the ONNX Runtime library once. `library` wins over `ORT_DYLIB_PATH`.
pub fn init_runtime(library: Option<&Path>) -> Result<(), String> {
    let result = RUNTIME.get_or_init(|| {
        let path: PathBuf = match library
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from))
        {
            Some(p) => p,
            None => return Err(missing_runtime_message("no library given")),
        };
        if !path.exists() {
            return Err(missing_runtime_message(&format!(
                "{} does not exist",
                path.display()
            )));
        }
        let builder = ort::init_from(&path)
            .map_err(|e| missing_runtime_message(&format!("{}: {e}", path.display())))?;
        let env = builder
            .with_name("tessera")
            .build()
            .map_err(|e| format!("ONNX Runtime failed to start: {e}"))?;
        tracing::info!(library = %path.display(), "ONNX Runtime loaded");
        Ok(env)
    });
    result.as_ref().map(|_| ()).map_err(Clone::clone)
}

fn missing_runtime_message(detail: &str) -> String {
    format!(
        "ONNX Runtime is not available ({detail}). Install it with `pip install onnxruntime=={PINNED_VERSION}` \
         (or run scripts/setup-python.sh) and point ORT_DYLIB_PATH or --onnxruntime-library at \
         .../site-packages/onnxruntime/capi/libonnxruntime.so.{PINNED_VERSION}"
    )
}

fn runtime() -> Result<&'static ort::environment::Environment, LoadError> {
    if RUNTIME.get().is_none() {
        init_runtime(None).map_err(LoadError::unsupported)?;
    }
    match RUNTIME.get() {
        Some(Ok(env)) => Ok(env),
        Some(Err(e)) => Err(LoadError::unsupported(e.clone())),
        None => Err(LoadError::unsupported(missing_runtime_message(
            "not initialised",
        ))),
    }
}

fn thread_parameter(config: &ModelConfig, key: &str) -> Result<usize, LoadError> {
    match string_parameter(config, key) {
        None => Ok(1),
        Some(v) => v.trim().parse::<usize>().map_err(|_| {
            LoadError::invalid(format!(
                "parameter {key} must be a non-negative integer, got '{v}'"
            ))
        }),
    }
}

/// A session builder with the thread settings every instance uses.
fn session_builder(
    path: &Path,
    intra: usize,
    inter: usize,
) -> Result<ort::session::builder::SessionBuilder, LoadError> {
    if !path.exists() {
        return Err(LoadError::invalid(format!(
            "model file {} not found",
            path.display()
        )));
    }
    let fail =
        |e: String| LoadError::runtime(format!("ONNX Runtime cannot load {}: {e}", path.display()));
    Session::builder(runtime()?)
        .map_err(|e| fail(e.to_string()))?
        .with_intra_threads(intra)
        .map_err(|e| fail(e.to_string()))?
        .with_inter_threads(inter)
        .map_err(|e| fail(e.to_string()))
}

/// A session on the CPU.
fn open_session(path: &Path, intra: usize, inter: usize) -> Result<Session, LoadError> {
    session_builder(path, intra, inter)?
        .commit_from_file(path)
        .map_err(|e| {
            LoadError::runtime(format!("ONNX Runtime cannot load {}: {e}", path.display()))
        })
}

fn datatype_of(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// What the model file declares, for auto-completion.
fn signature(path: &Path) -> Result<ModelSignature, LoadError> {
    runtime()?;
    signature_of(&open_session(path, 1, 1)?)
}

/// What an open session's model declares.
fn signature_of(session: &Session) -> Result<ModelSignature, LoadError> {
    let describe = |outlets: &[ort::value::Outlet]| -> Result<Vec<TensorSignature>, LoadError> {
        outlets
            .iter()
            .map(|o| match o.dtype() {
                ValueType::Tensor { ty, shape, .. } => Ok(TensorSignature {
                    name: o.name().to_owned(),
                    datatype: datatype_of(*ty).ok_or_else(|| {
                        LoadError::unsupported(format!(
                            "tensor '{}' has element type {ty:?}, which tessera does not serve",
                            o.name()
                        ))
                    })?,
                    dims: shape.iter().copied().collect(),
                }),
                other => Err(LoadError::unsupported(format!(
                    "'{}' is a {other:?}, not a tensor",
                    o.name()
                ))),
            })
            .collect()
    };
    Ok(ModelSignature {
        inputs: describe(session.inputs())?,
        outputs: describe(session.outputs())?,
    })
}

/// How a configured input reaches the session.
#[derive(Clone)]
struct InputPlan {
    name: String,
    /// `reshape`: the non-batch shape the model expects, if it differs from `dims`.
    reshape: Option<Vec<i64>>,
}

struct Plan {
    batched: bool,
    inputs: Vec<InputPlan>,
    outputs: Vec<(String, Option<Vec<i64>>)>,
}

/// One ONNX Runtime session.
/// One instance is one session on its own OS thread. A long-lived thread per instance (rather than
/// whichever blocking-pool thread is free) stays on its core between runs: with one thread per
/// core, pool threads woken in turn kept landing on a busy core and left the other idle.
pub struct OnnxInstance {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// A batch for the instance's thread, and where its result goes.
struct Job {
    batch: Vec<InferRequest>,
    done: tokio::sync::oneshot::Sender<Executed>,
}

impl OnnxInstance {
    fn start(
        session: Session,
        gpu: Option<gpu::GpuResources>,
        plan: Arc<Plan>,
        name: String,
    ) -> Result<Self, LoadError> {
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        // One value, so the session is dropped before the stream it runs on even when the
        // thread never starts (a closure's captures drop in no promised order).
        let owned = (session, gpu);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let (mut session, gpu) = owned;
                // Ends when the instance is dropped (the model is unloaded).
                while let Ok(job) = inbox.recv() {
                    let n = job.batch.len();
                    let executed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(&mut session, &plan, &job.batch)
                    }))
                    .unwrap_or_else(|_| {
                        failed(
                            n,
                            InferError::internal("ONNX Runtime execution panicked"),
                            ExecutionTiming::default(),
                        )
                    });
                    let _ = job.done.send(executed);
                }
                // The session runs on the GPU resources' stream: it goes first.
                drop(session);
                drop(gpu);
            })
            .map_err(|e| LoadError::runtime(format!("cannot start an instance thread: {e}")))?;
        Ok(OnnxInstance { jobs })
    }
}

/// The ONNX Runtime backend.
pub struct OnnxBackend;

impl Backend for OnnxBackend {
    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>> {
        let (name, config, version_dir, slots, devices) = (
            ctx.name.clone(),
            ctx.config.clone(),
            ctx.version_dir.clone(),
            ctx.instances.clone(),
            ctx.devices.clone(),
        );
        // Opening sessions reads and optimizes the model: seconds of blocking work, kept off the
        // async workers so loading never stalls requests to other models.
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                load(&name, &config, &version_dir, &slots, &devices)
            })
            .await
            .map_err(|e| LoadError::runtime(format!("loading the ONNX model failed: {e}")))?
        })
    }

    fn executes_on_gpu(&self) -> bool {
        runtime().is_ok() && gpu::cuda_available()
    }

    /// Inputs, outputs and batching from the model file, where the configuration leaves them out.
    fn complete_config<'a>(
        &'a self,
        ctx: &'a CompletionContext,
    ) -> BoxFuture<'a, Result<Option<ModelConfig>, LoadError>> {
        let mut config = ctx.config.clone();
        let file = model_file(&config, &ctx.version_dir, "model.onnx");
        let name = ctx.name.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let signature = signature(&file)?;
                let filled = crate::config::autocomplete(&mut config, &signature);
                if filled.is_empty() {
                    return Ok(None);
                }
                tracing::info!(model = name, fields = ?filled, "auto-completed configuration from the model file");
                Ok(Some(config))
            })
            .await
            .map_err(|e| LoadError::runtime(format!("reading the ONNX model failed: {e}")))?
        })
    }
}

/// Checks a configured tensor against what the model file declares, as Triton's ONNX Runtime
/// backend does: the name exists, the datatype is the same, and the shape (with the batch
/// dimension when batched; not checked under `reshape`) has the same rank and agrees wherever the
/// file fixes a dimension.
#[allow(clippy::too_many_arguments)]
fn check_declared(
    role: &str,
    name: &str,
    data_type: i32,
    dims: &[i64],
    reshaped: bool,
    batched: bool,
    declared: &[crate::config::TensorSignature],
    path: &Path,
) -> Result<(), LoadError> {
    let Some(found) = declared.iter().find(|s| s.name == name) else {
        return Err(LoadError::invalid(format!(
            "configuration {role} '{name}' is not an {role} of {} (it has: {})",
            path.display(),
            declared
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let configured = crate::config::datatype_from_config(data_type);
    if configured != Some(found.datatype) {
        return Err(LoadError::invalid(format!(
            "configuration {role} '{name}' has data_type {}, but the model's is {}",
            crate::config::pb::DataType::try_from(data_type).map_or("unknown", |t| t.as_str_name()),
            crate::config::datatype_to_config(found.datatype).as_str_name()
        )));
    }
    if reshaped {
        return Ok(());
    }
    let mut full = Vec::with_capacity(dims.len() + 1);
    if batched {
        full.push(-1);
    }
    full.extend_from_slice(dims);
    let agrees = full.len() == found.dims.len()
        && full
            .iter()
            .zip(&found.dims)
            .all(|(&c, &m)| m < 0 || c < 0 || c == m);
    if !agrees {
        return Err(LoadError::invalid(format!(
            "configuration {role} '{name}' has shape {full:?} (batch dimension included), but the model's is {:?}",
            found.dims
        )));
    }
    Ok(())
}

fn load(
    model: &str,
    config: &ModelConfig,
    version_dir: &Path,
    slots: &[InstanceSlot],
    devices: &crate::device::Devices,
) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
    runtime()?;
    // ONNX Runtime takes whole tensors: requests of different shapes joined into one batch
    // would be one malformed tensor (Triton's backend needs a `batch_input` to describe them,
    // which this one does not read), and every request of such a batch would fail.
    let batches_requests =
        config.max_batch_size > 0 && crate::config::dynamic_batching(config).is_some();
    if let Some(input) = config
        .input
        .iter()
        .find(|i| i.allow_ragged_batch && batches_requests)
    {
        return Err(LoadError::unsupported(format!(
            "input '{}' has allow_ragged_batch: the ONNX Runtime backend batches only requests of one shape (ragged batches need batch_input, which it does not support); remove it, or serve the model without dynamic_batching",
            input.name
        )));
    }
    // Checked for every model, so a mistyped accelerator fails on a CPU-only machine too.
    let gpu_providers = providers::gpu_providers(config)?;
    let path = model_file(config, version_dir, "model.onnx");
    let intra = thread_parameter(config, "intra_op_thread_count")?;
    let inter = thread_parameter(config, "inter_op_thread_count")?;
    let plan = Arc::new(Plan {
        batched: config.max_batch_size > 0,
        // A stateful model also takes the control and state inputs the host fills in, and
        // gives back its state outputs.
        inputs: config
            .input
            .iter()
            .map(|i| InputPlan {
                name: i.name.clone(),
                reshape: i.reshape.as_ref().map(|r| r.shape.clone()),
            })
            .chain(
                crate::sequence::Sequencer::host_inputs(config)
                    .into_iter()
                    .map(|name| InputPlan {
                        name,
                        reshape: None,
                    }),
            )
            .collect(),
        outputs: config
            .output
            .iter()
            .map(|o| (o.name.clone(), o.reshape.as_ref().map(|_| o.dims.clone())))
            .chain(
                crate::sequence::Sequencer::state_outputs(config)
                    .into_iter()
                    .map(|name| (name, None)),
            )
            .collect(),
    });
    let mut sessions = Vec::with_capacity(slots.len());
    for slot in slots {
        sessions.push(match slot.gpu {
            None => (open_session(&path, intra, inter)?, None),
            Some(id) => {
                let device = devices.get(id).ok_or_else(|| {
                    LoadError::unsupported(format!("instance {} names GPU {id}, which this server does not use", slot.name))
                })?;
                let builder = session_builder(&path, intra, inter)?;
                let (session, resources) =
                    gpu::open_session(builder, &path, &gpu_providers, device)?;
                tracing::info!(model, instance = %slot.name, gpu = id, "ONNX Runtime session on the GPU");
                (session, Some(resources))
            }
        });
    }
    // The first instance's session tells what the file declares; no session just for that.
    let Some((first, _)) = sessions.first() else {
        return Err(LoadError::invalid("the configuration places no instance"));
    };
    let declared = signature_of(first)?;
    let batched = config.max_batch_size > 0;
    for input in &config.input {
        check_declared(
            "input",
            &input.name,
            input.data_type,
            &input.dims,
            input.reshape.is_some(),
            batched,
            &declared.inputs,
            &path,
        )?;
    }
    // What the host fills in for a stateful model must be what the graph takes.
    for (name, datatype) in
        crate::sequence::Sequencer::host_input_types(config).map_err(LoadError::invalid)?
    {
        let Some(found) = declared.inputs.iter().find(|s| s.name == name) else {
            return Err(LoadError::invalid(format!(
                "sequence_batching input '{name}' is not an input of {}",
                path.display()
            )));
        };
        if found.datatype != datatype {
            return Err(LoadError::invalid(format!(
                "sequence_batching input '{name}' is {datatype}, but the model's is {}",
                found.datatype
            )));
        }
    }
    // Every input the graph needs must come from somewhere: left out of the configuration, no
    // request could give it and every one would fail (Triton refuses such a model too).
    let host_inputs = crate::sequence::Sequencer::host_inputs(config);
    if let Some(missing) = declared
        .inputs
        .iter()
        .find(|s| !config.input.iter().any(|i| i.name == s.name) && !host_inputs.contains(&s.name))
    {
        return Err(LoadError::invalid(format!(
            "{} takes the input '{}', which the configuration does not declare (nor sequence_batching fill in)",
            path.display(),
            missing.name
        )));
    }
    for output in &config.output {
        check_declared(
            "output",
            &output.name,
            output.data_type,
            &output.dims,
            output.reshape.is_some(),
            batched,
            &declared.outputs,
            &path,
        )?;
    }
    let mut instances: Vec<Box<dyn ModelInstance>> = Vec::new();
    for (i, (session, gpu)) in sessions.into_iter().enumerate() {
        let name = format!("onnx-{model}-{i}");
        instances.push(Box::new(OnnxInstance::start(
            session,
            gpu,
            plan.clone(),
            name,
        )?));
    }
    Ok(instances)
}

impl ModelInstance for OnnxInstance {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed> {
        let batch: Vec<InferRequest> = batch.into_iter().map(|c| c.request).collect();
        let n = batch.len();
        let (done, result) = tokio::sync::oneshot::channel();
        let sent = self.jobs.send(Job { batch, done });
        async move {
            let lost = || {
                failed(
                    n,
                    InferError::internal("the ONNX Runtime instance thread stopped"),
                    ExecutionTiming::default(),
                )
            };
            match sent {
                Ok(()) => result.await.unwrap_or_else(|_| lost()),
                Err(_) => lost(),
            }
        }
        .boxed()
    }
}

fn failed(n: usize, error: InferError, timing: ExecutionTiming) -> Executed {
    Executed {
        results: (0..n).map(|_| Err(error.clone())).collect(),
        timing,
    }
}

/// Runs one batch: concatenate, run, split.
fn run(session: &mut Session, plan: &Plan, batch: &[InferRequest]) -> Executed {
    let t0 = Instant::now();
    let rows: Vec<usize> = batch
        .iter()
        .map(|r| {
            if plan.batched {
                r.inputs
                    .first()
                    .and_then(|t| t.shape.first())
                    .map_or(1, |&d| d.max(0) as usize)
            } else {
                1
            }
        })
        .collect();
    let total_rows: usize = rows.iter().sum();
    let mut inputs: Vec<(String, ort::session::SessionInputValue<'_>)> =
        Vec::with_capacity(plan.inputs.len());
    for input in &plan.inputs {
        let parts: Vec<&Tensor> = batch
            .iter()
            .filter_map(|r| r.inputs.iter().find(|t| t.name == input.name))
            .collect();
        if parts.is_empty() {
            continue; // optional input left out by every request of the batch
        }
        match joined(parts, total_rows, plan.batched, input.reshape.as_deref()) {
            Ok(value) => inputs.push((input.name.clone(), value.into())),
            Err(e) => return failed(batch.len(), e, ExecutionTiming::default()),
        }
    }
    let t1 = Instant::now();
    let ran = session.run(inputs);
    if batch.len() > 1 && matches!(&ran, Err(e) if e.code() == ort::ErrorCode::InvalidArgument) {
        // Requests batch only with equal shapes, but ONNX Runtime also checks values (an index
        // out of range): each runs alone, so only the one at fault fails.
        drop(ran);
        let infer = t1.elapsed();
        let results = batch
            .iter()
            .flat_map(|request| run(session, plan, std::slice::from_ref(request)).results)
            .collect();
        return Executed {
            results,
            timing: ExecutionTiming {
                input: t1 - t0,
                infer,
                ..Default::default()
            },
        };
    }
    let outputs = match ran {
        Ok(o) => o,
        Err(e) => {
            let timing = ExecutionTiming {
                input: t1 - t0,
                infer: t1.elapsed(),
                ..Default::default()
            };
            let error = if e.code() == ort::ErrorCode::InvalidArgument {
                // ONNX Runtime checks the inputs against the graph's own shapes and values, which
                // a config with variable dims (-1) leaves to it: the request's fault, a 400 in
                // ONNX Runtime's words (Triton's backend answers these as internal errors).
                InferError::invalid(format!("ONNX Runtime refused the inputs: {}", e.message()))
            } else {
                InferError::internal("ONNX Runtime could not run the batch")
                    .with_detail(e.to_string())
            };
            return failed(batch.len(), error, timing);
        }
    };
    let t2 = Instant::now();
    let mut per_request: Vec<Vec<Tensor>> = vec![Vec::new(); batch.len()];
    for (name, dims) in &plan.outputs {
        let Some(value) = outputs.get(name.as_str()) else {
            return failed(
                batch.len(),
                InferError::internal(format!("ONNX Runtime produced no output '{name}'")),
                ExecutionTiming::default(),
            );
        };
        let tensor = match from_ort(name, value) {
            Ok(t) => t,
            Err(e) => return failed(batch.len(), e, ExecutionTiming::default()),
        };
        match split(tensor, &rows, plan.batched, dims.as_deref()) {
            Ok(parts) => {
                for (slot, part) in per_request.iter_mut().zip(parts) {
                    slot.push(part);
                }
            }
            Err(e) => return failed(batch.len(), e, ExecutionTiming::default()),
        }
    }
    drop(outputs);
    let results: Vec<InferResult> = per_request
        .into_iter()
        .map(|outputs| {
            Ok(InferResponse {
                outputs,
                ..Default::default()
            })
        })
        .collect();
    let timing = ExecutionTiming {
        input: t1 - t0,
        infer: t2 - t1,
        output: t2.elapsed(),
    };
    Executed { results, timing }
}

/// The shape of one input of a batch: `total_rows` rows of the first request's (or `reshape`'s)
/// row shape.
fn merged_shape(
    first: &Tensor,
    total_rows: usize,
    batched: bool,
    reshape: Option<&[i64]>,
) -> Vec<i64> {
    let inner: &[i64] = match reshape {
        Some(r) => r,
        None if batched => first.shape.get(1..).unwrap_or_default(),
        None => &first.shape,
    };
    let mut shape = Vec::with_capacity(inner.len() + 1);
    if batched {
        shape.push(total_rows as i64);
    }
    shape.extend_from_slice(inner);
    shape
}

/// One input of every request of a batch, concatenated along the batch dimension, as the value
/// ONNX Runtime takes. Numbers are copied once, each request's bytes straight into the typed
/// buffer ONNX Runtime reads (joining them first and then converting copied a batch twice).
fn joined(
    parts: Vec<&Tensor>,
    total_rows: usize,
    batched: bool,
    reshape: Option<&[i64]>,
) -> Result<DynValue, InferError> {
    #[cfg(target_endian = "little")]
    {
        let first = parts[0];
        let raw: Option<Vec<&[u8]>> = parts
            .iter()
            .map(|t| match &t.data {
                TensorData::Raw(b) if t.datatype == first.datatype => Some(b.as_ref()),
                _ => None,
            })
            .collect();
        if let Some(raw) = raw
            && first.datatype != DataType::Bool
            && first.datatype.size().is_some()
        {
            let shape = merged_shape(first, total_rows, batched, reshape);
            let invalid = |e: crate::tensor::SizeError| {
                InferError::invalid(format!(
                    "tensor '{}' has an invalid shape {shape:?}: {e}",
                    first.name
                ))
            };
            let needed = crate::tensor::shape_byte_size(first.datatype, &shape)
                .map_err(invalid)?
                .unwrap_or(0);
            let got: usize = raw.iter().map(|b| b.len()).sum();
            if got != needed {
                return Err(InferError::invalid(format!(
                    "tensor '{}' of shape {shape:?} and datatype {} needs {needed} bytes, got {got}",
                    first.name, first.datatype
                )));
            }
            let ort_err = |e: ort::Error| {
                InferError::internal(format!("ONNX Runtime refused input '{}'", first.name))
                    .with_detail(e.to_string())
            };
            macro_rules! convert {
                ($($dt:ident => $t:ty),*) => {
                    match first.datatype {
                        $(DataType::$dt => {
                            let values: Vec<$t> = values_of(&raw);
                            return OrtTensor::from_array((shape, values)).map(|t| t.into_dyn()).map_err(ort_err);
                        })*
                        _ => {}
                    }
                };
            }
            numeric_types!(convert);
        }
    }
    merge(parts, total_rows, batched, reshape).and_then(to_ort)
}

/// Concatenates one input of every request along the batch dimension.
fn merge(
    parts: Vec<&Tensor>,
    total_rows: usize,
    batched: bool,
    reshape: Option<&[i64]>,
) -> Result<Tensor, InferError> {
    let first = parts[0];
    let shape = merged_shape(first, total_rows, batched, reshape);
    let data = if parts.len() == 1 {
        first.data.clone()
    } else {
        match &first.data {
            TensorData::Raw(_) => {
                let mut joined = Vec::with_capacity(parts.iter().map(|t| t.byte_size()).sum());
                for part in &parts {
                    if let TensorData::Raw(b) = &part.data {
                        joined.extend_from_slice(b);
                    }
                }
                TensorData::Raw(joined.into())
            }
            TensorData::Elements(_) => TensorData::Elements(
                parts
                    .iter()
                    .flat_map(|t| match &t.data {
                        TensorData::Elements(e) => e.clone(),
                        TensorData::Raw(_) => Vec::new(),
                    })
                    .collect(),
            ),
        }
    };
    let merged = Tensor::new(first.name.clone(), first.datatype, shape, data);
    merged.check_consistent().map_err(InferError::invalid)?;
    Ok(merged)
}

/// Splits an output into per-request tensors of `rows` rows each.
fn split(
    tensor: Tensor,
    rows: &[usize],
    batched: bool,
    dims: Option<&[i64]>,
) -> Result<Vec<Tensor>, InferError> {
    if !batched {
        let mut t = tensor;
        if let Some(d) = dims {
            t.shape = d.to_vec();
        }
        return Ok(vec![t]);
    }
    let total: usize = rows.iter().sum();
    let produced_rows = tensor.shape.first().copied().unwrap_or(0);
    if produced_rows != total as i64 {
        return Err(InferError::internal(format!(
            "output '{}' has {produced_rows} rows for a batch of {total}",
            tensor.name
        )));
    }
    let inner: Vec<i64> = match dims {
        Some(d) => d.to_vec(),
        None => tensor.shape[1..].to_vec(),
    };
    let per_row = crate::tensor::element_count(&tensor.shape[1..]).unwrap_or(0);
    let shape_of = |r: usize| {
        let mut s = vec![r as i64];
        s.extend(&inner);
        s
    };
    if rows.len() == 1 {
        return Ok(vec![Tensor {
            shape: shape_of(rows[0]),
            ..tensor
        }]);
    }
    let mut out = Vec::with_capacity(rows.len());
    let mut start = 0;
    match &tensor.data {
        TensorData::Raw(bytes) => {
            // Each request's rows are a slice of the batch's output: shared, not copied.
            let row_bytes = per_row * tensor.datatype.size().unwrap_or(1);
            for &r in rows {
                let range = start * row_bytes..(start + r) * row_bytes;
                if range.end > bytes.len() {
                    return Err(InferError::internal(format!(
                        "output '{}' holds fewer bytes than its shape",
                        tensor.name
                    )));
                }
                out.push(Tensor::new(
                    tensor.name.clone(),
                    tensor.datatype,
                    shape_of(r),
                    TensorData::Raw(bytes.slice(range)),
                ));
                start += r;
            }
        }
        TensorData::Elements(items) => {
            for &r in rows {
                let chunk = items
                    .get(start * per_row..(start + r) * per_row)
                    .ok_or_else(|| {
                        InferError::internal(format!(
                            "output '{}' holds fewer elements than its shape",
                            tensor.name
                        ))
                    })?
                    .to_vec();
                out.push(Tensor::new(
                    tensor.name.clone(),
                    tensor.datatype,
                    shape_of(r),
                    TensorData::Elements(chunk),
                ));
                start += r;
            }
        }
    }
    Ok(out)
}

/// Fixed-size element types whose every bit pattern is a value, so tensor bytes convert to and
/// from them by copying memory.
///
/// # Safety
/// Implement only for plain numeric types: no padding, no invalid bit patterns.
unsafe trait Plain: Copy {}
// SAFETY: each is a plain number of its size with no invalid bit patterns.
unsafe impl Plain for i8 {}
unsafe impl Plain for i16 {}
unsafe impl Plain for i32 {}
unsafe impl Plain for i64 {}
unsafe impl Plain for u8 {}
unsafe impl Plain for u16 {}
unsafe impl Plain for u32 {}
unsafe impl Plain for u64 {}
unsafe impl Plain for f32 {}
unsafe impl Plain for f64 {}
unsafe impl Plain for half::f16 {}

/// Little-endian element bytes as values, with one copy (the bytes need not be aligned), where
/// converting element by element cost more than the inference on large tensors.
#[cfg(target_endian = "little")]
fn values_of<T: Plain>(parts: &[&[u8]]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let n = parts.iter().map(|b| b.len()).sum::<usize>() / size;
    let mut values = Vec::<T>::with_capacity(n);
    let mut at = 0;
    for part in parts {
        let take = part.len().min(n * size - at);
        // SAFETY: writes bytes [at, at + take) of the allocation of capacity n * size (take is
        // bounded by what is left of it); every bit pattern is a valid T (`Plain`), and memory
        // order is little-endian like the bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                part.as_ptr(),
                values.as_mut_ptr().cast::<u8>().add(at),
                take,
            );
        }
        at += take;
    }
    // SAFETY: the first n * size bytes were written above (a trailing partial element is not
    // counted in n).
    unsafe { values.set_len(at / size) };
    values
}

/// Values as little-endian element bytes, with one copy.
#[cfg(target_endian = "little")]
fn bytes_of<T: Plain>(values: &[T]) -> bytes::Bytes {
    // SAFETY: a `Plain` slice has no padding, so its memory is exactly its elements'
    // little-endian bytes; the view lives only for this copy.
    let view = unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    };
    bytes::Bytes::copy_from_slice(view)
}

/// String tensors element by element, byte for byte: ONNX Runtime's strings are byte strings
/// (`std::string`), so an element may hold NUL or bytes that are not UTF-8, as Triton passes
/// them. `ort`'s own conversions go through C strings and Rust `String`s, which cut at NUL and
/// refuse other bytes, so these call ONNX Runtime's C API directly.
mod strings {
    use ort::AsPointer;
    use ort::sys::{OrtStatusPtr, OrtValue};
    use ort::value::{DynValue, Tensor as OrtTensor};

    /// Turns a status into its message, releasing it.
    ///
    /// SAFETY: `status` comes from an ONNX Runtime call and is released nowhere else.
    unsafe fn check(status: OrtStatusPtr) -> Result<(), String> {
        if status.0.is_null() {
            return Ok(());
        }
        let api = ort::api();
        // SAFETY: a non-null status from ONNX Runtime holds a NUL-terminated message, which is
        // copied before the status is released.
        unsafe {
            let message = std::ffi::CStr::from_ptr((api.GetErrorMessage)(status.0))
                .to_string_lossy()
                .into_owned();
            (api.ReleaseStatus)(status.0);
            Err(message)
        }
    }

    pub fn to_ort(shape: Vec<i64>, items: &[bytes::Bytes]) -> Result<DynValue, String> {
        let empty = vec![""; items.len()];
        let mut tensor = OrtTensor::from_string_array((shape, empty.as_slice()))
            .map_err(|e| e.to_string())?
            .into_dyn();
        let value: *mut OrtValue = tensor.ptr_mut();
        let api = ort::api();
        for (index, item) in items.iter().enumerate() {
            let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
            // SAFETY: `value` is a string tensor of `items.len()` elements owned by `tensor`;
            // ONNX Runtime sizes element `index` to `item.len()` bytes and hands back its buffer,
            // which is filled with exactly that many bytes.
            unsafe {
                check((api.GetResizedStringTensorElementBuffer)(
                    value,
                    index,
                    item.len(),
                    &mut buffer,
                ))?;
                if !item.is_empty() {
                    std::ptr::copy_nonoverlapping(item.as_ptr(), buffer.cast::<u8>(), item.len());
                }
            }
        }
        Ok(tensor)
    }

    pub fn from_ort(value: &DynValue) -> Result<Vec<bytes::Bytes>, String> {
        let count = match value.dtype() {
            ort::value::ValueType::Tensor { shape, .. } => shape.num_elements(),
            _ => return Err("not a tensor".into()),
        };
        if count == 0 {
            return Ok(Vec::new());
        }
        let api = ort::api();
        let ptr: *const OrtValue = value.ptr();
        let mut total = 0usize;
        // SAFETY: `ptr` is a live string tensor of `count` elements; the content buffer holds
        // `total` bytes and the offsets `count` entries, as the call requires.
        let (content, mut offsets) = unsafe {
            check((api.GetStringTensorDataLength)(ptr, &mut total))?;
            let mut content = vec![0u8; total];
            let mut offsets = vec![0usize; count + 1];
            check((api.GetStringTensorContent)(
                ptr,
                content.as_mut_ptr().cast(),
                total,
                offsets.as_mut_ptr(),
                count,
            ))?;
            (content, offsets)
        };
        offsets[count] = total;
        let content = bytes::Bytes::from(content);
        offsets
            .windows(2)
            .map(|w| {
                if w[0] <= w[1] && w[1] <= total {
                    Ok(content.slice(w[0]..w[1]))
                } else {
                    Err(format!("inconsistent string offsets {}..{}", w[0], w[1]))
                }
            })
            .collect()
    }
}

fn to_ort(tensor: Tensor) -> Result<DynValue, InferError> {
    let ort_err = |e: ort::Error| {
        InferError::internal(format!("ONNX Runtime refused input '{}'", tensor.name))
            .with_detail(e.to_string())
    };
    let shape = tensor.shape.clone();
    macro_rules! convert {
        ($($dt:ident => $t:ty),*) => {
            match (&tensor.data, tensor.datatype) {
                $((TensorData::Raw(b), DataType::$dt) => {
                    #[cfg(target_endian = "little")]
                    let values: Vec<$t> = values_of(&[b]);
                    #[cfg(not(target_endian = "little"))]
                    let values: Vec<$t> = b
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect();
                    OrtTensor::from_array((shape, values)).map(|t| t.into_dyn()).map_err(ort_err)
                })*
                (TensorData::Raw(b), DataType::Bool) => {
                    let values: Vec<bool> = b.iter().map(|&v| v != 0).collect();
                    OrtTensor::from_array((shape, values)).map(|t| t.into_dyn()).map_err(ort_err)
                }
                (TensorData::Elements(items), DataType::Bytes) => {
                    strings::to_ort(shape, items).map_err(|detail| {
                        InferError::internal(format!("ONNX Runtime refused input '{}'", tensor.name))
                            .with_detail(detail)
                    })
                }
                (_, dt) => Err(InferError::invalid(format!("input '{}': datatype {dt} is not supported by the ONNX Runtime backend", tensor.name))),
            }
        };
    }
    numeric_types!(convert)
}

fn from_ort(name: &str, value: &DynValue) -> Result<Tensor, InferError> {
    let err = |e: ort::Error| {
        InferError::internal(format!("ONNX Runtime output '{name}' could not be read"))
            .with_detail(e.to_string())
    };
    let ValueType::Tensor { ty, .. } = value.dtype() else {
        return Err(InferError::internal(format!(
            "output '{name}' is not a tensor"
        )));
    };
    macro_rules! convert {
        ($($dt:ident => $t:ty),*) => {
            match *ty {
                $(t if datatype_of(t) == Some(DataType::$dt) => {
                    let (shape, data) = value.try_extract_tensor::<$t>().map_err(err)?;
                    #[cfg(target_endian = "little")]
                    let bytes = bytes_of(data);
                    #[cfg(not(target_endian = "little"))]
                    let bytes: bytes::Bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Ok(Tensor::new(name, DataType::$dt, shape.to_vec(), TensorData::Raw(bytes)))
                })*
                TensorElementType::Bool => {
                    let (shape, data) = value.try_extract_tensor::<bool>().map_err(err)?;
                    Ok(Tensor::new(name, DataType::Bool, shape.to_vec(), TensorData::Raw(data.iter().map(|&b| u8::from(b)).collect::<Vec<u8>>().into())))
                }
                TensorElementType::String => {
                    let ValueType::Tensor { shape, .. } = value.dtype() else {
                        return Err(InferError::internal(format!("output '{name}' is not a tensor")));
                    };
                    let items = strings::from_ort(value).map_err(|detail| {
                        InferError::internal(format!("ONNX Runtime output '{name}' could not be read"))
                            .with_detail(detail)
                    })?;
                    Ok(Tensor::new(name, DataType::Bytes, shape.to_vec(), TensorData::Elements(items)))
                }
                other => Err(InferError::internal(format!("output '{name}' has element type {other:?}, which tessera does not serve"))),
            }
        };
    }
    numeric_types!(convert)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_split_round_trip() {
        let a = Tensor::from_f32("x", vec![1, 2], &[1.0, 2.0]);
        let b = Tensor::from_f32("x", vec![2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let merged = merge(vec![&a, &b], 3, true, None).expect("merges");
        assert_eq!(merged.shape, vec![3, 2]);
        let parts = split(merged, &[1, 2], true, None).expect("splits");
        assert_eq!(parts[0], a);
        assert_eq!(parts[1], b);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn element_bytes_convert_by_copy_even_unaligned() {
        let raw: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut shifted = vec![0u8];
        shifted.extend(&raw);
        let values: Vec<f32> = values_of(&[&shifted[1..]]);
        assert_eq!(values, vec![1.5, -2.0, 3.25]);
        assert_eq!(bytes_of(&values).as_ref(), raw.as_slice());
        let ints: Vec<i16> = values_of(&[&[1, 0, 0xff, 0xff]]);
        assert_eq!(ints, vec![1, -1]);
        // A batch's requests, each copied once into the one buffer; an element may straddle two.
        let ints: Vec<i16> = values_of(&[&[1, 0, 0xff], &[0xff, 2, 0]]);
        assert_eq!(ints, vec![1, -1, 2]);
    }

    #[test]
    fn a_batch_input_is_joined_in_request_order_and_checked() {
        if runtime().is_err() {
            return; // no ONNX Runtime here (ORT_DYLIB_PATH unset)
        }
        let a = Tensor::from_f32("x", vec![1, 2], &[1.0, 2.0]);
        let b = Tensor::from_f32("x", vec![2, 2], &[3.0, 4.0, 5.0, 6.0]);
        let value = joined(vec![&a, &b], 3, true, None).expect("joined");
        let (shape, data) = value.try_extract_tensor::<f32>().expect("f32");
        assert_eq!(shape.to_vec(), vec![3, 2]);
        assert_eq!(data, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // Rows that do not add up to the batch are refused, not read past.
        let error = joined(vec![&a, &b], 4, true, None).expect_err("short");
        assert!(
            error.to_string().contains("needs 32 bytes, got 24"),
            "{error}"
        );
    }

    #[test]
    fn split_refuses_wrong_row_count() {
        let t = Tensor::from_f32("y", vec![2, 1], &[1.0, 2.0]);
        assert!(split(t, &[1, 2], true, None).is_err());
    }
}
