//! Ensembles: `platform: "ensemble"` with `ensemble_scheduling.step`.
//!
//! The steps form a DAG over named tensors: a step starts as soon as every tensor it reads exists,
//! independent steps run concurrently, and intermediate tensors stay in memory. Each step is an
//! ordinary request to its model through [`Inference::infer`] (the server's request path), so it
//! goes through that model's own queue and dynamic batcher, shared with everybody else's requests.
//!
//! The plan is checked at load time: every step's model must be loaded, every mapped name must
//! be an input or output of that model, every tensor read must be produced exactly once, the
//! datatypes must agree, and the steps must not form a cycle.
//!
//! **Streaming.** An ensemble with a decoupled step (an LLM engine, a decoupled handler) is
//! decoupled itself, as in Triton: called through a stream (gRPC `ModelStreamInfer`,
//! `generate_stream`, a handler's `infer-stream`) it runs the steps before the decoupled one
//! once, then, for each response the decoupled step sends, the steps that read what it produced
//! (TensorRT-LLM's `postprocessing`), and sends the ensemble's outputs as one response, in
//! order. The caller going away drops the decoupled step's stream, which cancels its request.
//! A unary call gets the one response such a run produces (more than one is an error).
//! One decoupled step per ensemble: two would multiply each other's responses.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Instant;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};

use super::{Backend, Executed, LoadContext, LoadError, ModelInstance};
use crate::config::{self, ModelConfig};
use crate::infer::{
    BoxFuture, Call, CallContext, InferError, InferRequest, InferResponse, InferResult, Inference,
    RequestedOutput,
};
use crate::metrics::ExecutionTiming;
use crate::stream::ResponseSender;
use crate::tensor::{DataType, Tensor};

/// One step, resolved.
#[derive(Debug)]
struct Step {
    model: String,
    version: Option<i64>,
    /// (step model input, ensemble tensor)
    inputs: Vec<(String, String)>,
    /// (step model output, ensemble tensor)
    outputs: Vec<(String, String)>,
}

/// The validated DAG of an ensemble.
#[derive(Debug)]
struct Plan {
    name: String,
    steps: Vec<Step>,
    outputs: Vec<String>,
    /// Ensemble inputs a request may leave out: a step reading an absent one runs without it.
    optional_inputs: HashSet<String>,
    /// The decoupled step, whose every response runs the steps after it.
    stream_step: Option<usize>,
    /// Per step: whether it reads, directly or through other steps, what `stream_step`
    /// produces, and so runs once per response of it.
    per_response: Vec<bool>,
}

/// Checks the ensemble against the loaded models and builds its plan.
fn plan(name: &str, config: &ModelConfig, inference: &dyn Inference) -> Result<Plan, LoadError> {
    // As the ensemble will call them: step names resolve in the ensemble's namespace.
    let cx = CallContext::root().call_from(name);
    let scheduling = config::ensemble_scheduling(config)
        .filter(|s| !s.step.is_empty())
        .ok_or_else(|| {
            LoadError::invalid("an ensemble needs ensemble_scheduling with at least one step")
        })?;
    // Where each tensor comes from, with its datatype and its whole shape (batch included).
    let ensemble_batches = config.max_batch_size > 0;
    let mut produced: HashMap<String, (DataType, String)> = HashMap::new();
    let mut shapes: HashMap<String, Vec<i64>> = HashMap::new();
    for input in &config.input {
        let dt = config::datatype_from_config(input.data_type).ok_or_else(|| {
            LoadError::invalid(format!(
                "ensemble input '{}' has no valid data_type",
                input.name
            ))
        })?;
        produced.insert(input.name.clone(), (dt, "the ensemble's inputs".into()));
        shapes.insert(
            input.name.clone(),
            whole_shape(ensemble_batches, &input.dims),
        );
    }
    let mut steps = Vec::new();
    let mut stream_step = None;
    for (i, step) in scheduling.step.iter().enumerate() {
        let label = format!("step {} ('{}')", i + 1, step.model_name);
        if step.model_name == name {
            return Err(LoadError::invalid(format!(
                "{label} refers to the ensemble itself"
            )));
        }
        let version = (step.model_version > 0).then_some(step.model_version);
        let target = inference
            .metadata(&cx, &step.model_name, version)
            .map_err(|e| LoadError::invalid(format!("{label}: {}", e.message)))?;
        if target.decoupled {
            if let Some(first) = stream_step {
                let first: &Step = &steps[first];
                return Err(LoadError::unsupported(format!(
                    "{label} and step '{}' are both decoupled: an ensemble streams through one decoupled step",
                    first.model
                )));
            }
            stream_step = Some(steps.len());
        }
        let mut inputs = Vec::new();
        for (model_input, tensor) in &step.input_map {
            if !target.inputs.iter().any(|s| &s.name == model_input) {
                return Err(LoadError::invalid(format!(
                    "{label}: '{model_input}' is not an input of '{}'",
                    step.model_name
                )));
            }
            inputs.push((model_input.clone(), tensor.clone()));
        }
        let mut outputs = Vec::new();
        for (model_output, tensor) in &step.output_map {
            let Some(spec) = target.outputs.iter().find(|s| &s.name == model_output) else {
                return Err(LoadError::invalid(format!(
                    "{label}: '{model_output}' is not an output of '{}'",
                    step.model_name
                )));
            };
            if let Some((_, by)) = produced.get(tensor) {
                return Err(LoadError::invalid(format!(
                    "{label}: tensor '{tensor}' is already produced by {by}"
                )));
            }
            produced.insert(tensor.clone(), (spec.datatype, label.clone()));
            shapes.insert(tensor.clone(), whole_shape(target.batched, &spec.dims));
            outputs.push((model_output.clone(), tensor.clone()));
        }
        for spec in target.inputs.iter().filter(|s| !s.optional) {
            if !step.input_map.contains_key(&spec.name) {
                return Err(LoadError::invalid(format!(
                    "{label}: required input '{}' is not mapped",
                    spec.name
                )));
            }
        }
        steps.push(Step {
            model: step.model_name.clone(),
            version,
            inputs,
            outputs,
        });
    }
    // Every read tensor exists, with the datatype the reader expects.
    for step in &steps {
        let target = inference
            .metadata(&cx, &step.model, step.version)
            .map_err(|e| LoadError::invalid(e.message))?;
        for (model_input, tensor) in &step.inputs {
            let Some((dt, by)) = produced.get(tensor) else {
                return Err(LoadError::invalid(format!(
                    "step '{}' reads tensor '{tensor}', which no ensemble input or step output provides",
                    step.model
                )));
            };
            let spec = target.inputs.iter().find(|s| &s.name == model_input);
            let want = spec.map(|s| s.datatype);
            if want != Some(*dt) {
                return Err(LoadError::invalid(format!(
                    "step '{}' input '{model_input}' expects {}, but tensor '{tensor}' from {by} is {dt}",
                    step.model,
                    want.map_or("?".into(), |d| d.to_string())
                )));
            }
            let expects = spec.map(|s| whole_shape(target.batched, &s.dims));
            if let (Some(expects), Some(has)) = (expects, shapes.get(tensor))
                && !shapes_agree(&expects, has)
            {
                return Err(LoadError::invalid(format!(
                    "step '{}' input '{model_input}' takes shape {expects:?}, but tensor '{tensor}' from {by} has shape {has:?} (-1: any size; a batching model's first dimension is its batch)",
                    step.model
                )));
            }
        }
    }
    for output in &config.output {
        let Some((dt, by)) = produced.get(&output.name) else {
            return Err(LoadError::invalid(format!(
                "ensemble output '{}' is not produced by any step",
                output.name
            )));
        };
        let declared = config::datatype_from_config(output.data_type);
        if declared != Some(*dt) {
            return Err(LoadError::invalid(format!(
                "ensemble output '{}' is declared {}, but {by} produces {dt}",
                output.name,
                declared.map_or("with no valid data_type".into(), |d| d.to_string())
            )));
        }
        let declared = whole_shape(ensemble_batches, &output.dims);
        if let Some(has) = shapes.get(&output.name)
            && !shapes_agree(&declared, has)
        {
            return Err(LoadError::invalid(format!(
                "ensemble output '{}' is declared with shape {declared:?}, but {by} produces shape {has:?} (-1: any size; a batching model's first dimension is its batch)",
                output.name
            )));
        }
    }
    check_acyclic(&steps, config)?;
    let per_response = downstream_of(&steps, stream_step);
    Ok(Plan {
        name: name.to_owned(),
        per_response,
        steps,
        outputs: config.output.iter().map(|o| o.name.clone()).collect(),
        optional_inputs: config
            .input
            .iter()
            .filter(|i| i.optional)
            .map(|i| i.name.clone())
            .collect(),
        stream_step,
    })
}

/// A tensor's shape as it travels between the steps: a batching model's dims after its batch
/// dimension (-1).
fn whole_shape(batched: bool, dims: &[i64]) -> Vec<i64> {
    batched
        .then_some(-1)
        .into_iter()
        .chain(dims.iter().copied())
        .collect()
}

/// Whether a tensor of shape `has` can be what `expects` takes: the same rank, and equal sizes
/// wherever both are fixed.
fn shapes_agree(expects: &[i64], has: &[i64]) -> bool {
    expects.len() == has.len()
        && expects
            .iter()
            .zip(has)
            .all(|(a, b)| *a < 0 || *b < 0 || a == b)
}

/// Per step, whether it reads what `source` produces, directly or through other steps.
fn downstream_of(steps: &[Step], source: Option<usize>) -> Vec<bool> {
    let Some(source) = source else {
        return vec![false; steps.len()];
    };
    let produced = steps[source].outputs.iter().map(|(_, t)| t.as_str());
    let mut downstream = reach(steps, produced.collect(), |step, known| {
        step.inputs.iter().any(|(_, t)| known.contains(t.as_str()))
    });
    downstream[source] = false;
    downstream
}

/// Marks steps until nothing changes: a step is marked when `marks(step, known)` holds for the
/// tensors known so far, and then what it produces is known too.
fn reach<'a>(
    steps: &'a [Step],
    mut known: HashSet<&'a str>,
    marks: impl Fn(&Step, &HashSet<&'a str>) -> bool,
) -> Vec<bool> {
    let mut marked = vec![false; steps.len()];
    loop {
        let mut grew = false;
        for (i, step) in steps.iter().enumerate() {
            if !marked[i] && marks(step, &known) {
                marked[i] = true;
                grew = true;
                known.extend(step.outputs.iter().map(|(_, t)| t.as_str()));
            }
        }
        if !grew {
            return marked;
        }
    }
}

/// Whether an ensemble answers with a stream: one of its steps does (Triton makes such an
/// ensemble decoupled whatever its configuration says). Steps that are not loaded count as not
/// decoupled; loading the ensemble then says what is missing.
pub fn has_decoupled_step(name: &str, config: &ModelConfig, inference: &dyn Inference) -> bool {
    let cx = CallContext::root().call_from(name);
    config::ensemble_scheduling(config).is_some_and(|s| {
        s.step.iter().any(|step| {
            let version = (step.model_version > 0).then_some(step.model_version);
            inference
                .metadata(&cx, &step.model_name, version)
                .is_ok_and(|m| m.decoupled)
        })
    })
}

/// Runs the steps symbolically: if some step can never start, its inputs depend on itself.
fn check_acyclic(steps: &[Step], config: &ModelConfig) -> Result<(), LoadError> {
    let inputs = config.input.iter().map(|i| i.name.as_str()).collect();
    let done = reach(steps, inputs, |step, known| {
        step.inputs.iter().all(|(_, t)| known.contains(t.as_str()))
    });
    match steps.iter().zip(&done).find(|(_, d)| !**d) {
        Some((step, _)) => Err(LoadError::invalid(format!(
            "the ensemble's steps form a cycle through step '{}'",
            step.model
        ))),
        None => Ok(()),
    }
}

/// The ensemble backend: each instance runs requests through the validated plan.
pub struct EnsembleBackend {
    /// Requests one ensemble runs at once (`--ensemble-concurrency`); its steps queue at their
    /// own models.
    pub concurrency: usize,
}

impl Backend for EnsembleBackend {
    fn load<'a>(
        &'a self,
        ctx: &'a LoadContext,
    ) -> BoxFuture<'a, Result<Vec<Box<dyn ModelInstance>>, LoadError>> {
        Box::pin(async move { load(ctx, self.concurrency) })
    }
}

fn load(ctx: &LoadContext, concurrency: usize) -> Result<Vec<Box<dyn ModelInstance>>, LoadError> {
    let inference = ctx.inference.upgrade().ok_or(LoadError::ShuttingDown)?;
    let plan = Arc::new(plan(&ctx.name, &ctx.config, inference.as_ref())?);
    Ok((0..concurrency.max(1))
        .map(|_| {
            Box::new(EnsembleInstance {
                plan: plan.clone(),
                inference: ctx.inference.clone(),
            }) as Box<dyn ModelInstance>
        })
        .collect())
}

struct EnsembleInstance {
    plan: Arc<Plan>,
    inference: Weak<dyn Inference>,
}

impl ModelInstance for EnsembleInstance {
    fn execute(&mut self, batch: Vec<Call>) -> BoxFuture<'_, Executed> {
        async move {
            let started = Instant::now();
            let (plan, weak) = (&*self.plan, &self.inference);
            let runs = batch.into_iter().map(|c| async move {
                let Some(inference) = weak.upgrade() else {
                    return Err(InferError::unavailable("the server is shutting down"));
                };
                match c.stream {
                    // Its responses went through the stream; an error ends it.
                    Some(sender) => run_streaming(plan, inference, c.cx, c.request, &sender)
                        .await
                        .map(|()| InferResponse::default()),
                    None if plan.stream_step.is_some() => {
                        run_once_streamed(plan, inference, c.cx, c.request).await
                    }
                    None => run(plan, inference, c.cx, c.request).await,
                }
            });
            let results = futures::future::join_all(runs).await;
            Executed {
                results,
                timing: ExecutionTiming {
                    infer: started.elapsed(),
                    ..Default::default()
                },
            }
        }
        .boxed()
    }
}

/// What the steps of one request share: where they come from and how they are asked.
struct Run<'a> {
    plan: &'a Plan,
    inference: Arc<dyn Inference>,
    /// The steps' calls: from the ensemble, in the caller's chain.
    cx: CallContext,
    /// The request's id, parameters, priority and timeout, which every step request carries.
    request: InferRequest,
    /// Optional ensemble inputs the request left out.
    absent: HashSet<String>,
}

impl<'a> Run<'a> {
    /// The request's inputs by name, and the run that reads them.
    fn start(
        plan: &'a Plan,
        inference: Arc<dyn Inference>,
        cx: CallContext,
        mut request: InferRequest,
    ) -> (Run<'a>, HashMap<String, Tensor>) {
        let tensors: HashMap<String, Tensor> = std::mem::take(&mut request.inputs)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        let absent = plan
            .optional_inputs
            .iter()
            .filter(|name| !tensors.contains_key(*name))
            .cloned()
            .collect();
        let run = Run {
            cx: cx.call_from(&plan.name),
            plan,
            inference,
            request,
            absent,
        };
        (run, tensors)
    }

    /// A step's request from the tensors there are (an absent optional input is left out).
    fn step_request(&self, step: &Step, tensors: &HashMap<String, Tensor>) -> InferRequest {
        InferRequest {
            id: self.request.id.clone(),
            inputs: step
                .inputs
                .iter()
                .filter_map(|(model_input, t)| {
                    tensors.get(t).map(|tensor| Tensor {
                        name: model_input.clone(),
                        ..tensor.clone()
                    })
                })
                .collect(),
            outputs: step
                .outputs
                .iter()
                .map(|(o, _)| RequestedOutput {
                    name: o.clone(),
                    ..Default::default()
                })
                .collect(),
            parameters: self.request.parameters.clone(),
            priority: self.request.priority,
            timeout: self.request.timeout,
        }
    }

    fn step_failed(&self, step: &Step, e: InferError) -> InferError {
        e.context(format!(
            "ensemble '{}' step '{}' failed",
            crate::namespace::shown(&self.plan.name),
            step.model
        ))
    }

    /// Runs the steps `include` selects, each as soon as what it reads exists, adding what
    /// they produce to `tensors`.
    async fn steps(
        &self,
        tensors: &mut HashMap<String, Tensor>,
        include: impl Fn(usize) -> bool,
    ) -> Result<(), InferError> {
        let mut started = vec![false; self.plan.steps.len()];
        let mut running = FuturesUnordered::new();
        loop {
            for (i, step) in self.plan.steps.iter().enumerate() {
                let ready = step
                    .inputs
                    .iter()
                    .all(|(_, t)| tensors.contains_key(t) || self.absent.contains(t));
                if started[i] || !include(i) || !ready {
                    continue;
                }
                started[i] = true;
                let request = self.step_request(step, tensors);
                let (inference, cx) = (self.inference.clone(), self.cx.clone());
                running.push(async move {
                    (
                        i,
                        inference
                            .infer(cx, &step.model, step.version, request)
                            .await,
                    )
                });
            }
            let Some((i, result)) = running.next().await else {
                return Ok(());
            };
            let step = &self.plan.steps[i];
            let response = result.map_err(|e| self.step_failed(step, e))?;
            self.keep_outputs(step, response, tensors);
        }
    }

    /// Adds a step's outputs to `tensors` under their ensemble names.
    fn keep_outputs(
        &self,
        step: &Step,
        response: InferResponse,
        tensors: &mut HashMap<String, Tensor>,
    ) {
        for mut tensor in response.outputs {
            if let Some((_, name)) = step.outputs.iter().find(|(o, _)| *o == tensor.name) {
                tensor.name.clone_from(name);
                tensors.insert(name.clone(), tensor);
            }
        }
    }

    /// The ensemble's outputs, taken from `tensors`.
    fn response(&self, mut tensors: HashMap<String, Tensor>) -> InferResult {
        let outputs = self
            .plan
            .outputs
            .iter()
            .map(|name| {
                tensors.remove(name).ok_or_else(|| {
                    InferError::internal(format!(
                        "ensemble '{}' did not produce '{name}'",
                        crate::namespace::shown(&self.plan.name)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InferResponse {
            outputs,
            ..Default::default()
        })
    }
}

/// Runs one request through the DAG.
async fn run(
    plan: &Plan,
    inference: Arc<dyn Inference>,
    cx: CallContext,
    request: InferRequest,
) -> InferResult {
    let (run, mut tensors) = Run::start(plan, inference, cx, request);
    run.steps(&mut tensors, |_| true).await?;
    run.response(tensors)
}

/// Runs one request of a streaming ensemble, sending each of its responses through `sender`:
/// the steps before the decoupled one once, the steps after it once per response of it.
async fn run_streaming(
    plan: &Plan,
    inference: Arc<dyn Inference>,
    cx: CallContext,
    request: InferRequest,
    sender: &ResponseSender,
) -> Result<(), InferError> {
    let Some(source) = plan.stream_step else {
        // Decoupled by configuration only: one response.
        let response = run(plan, inference, cx, request).await?;
        let _ = sender.send(Some(Ok(response)), true).await;
        return Ok(());
    };
    let (run, mut tensors) = Run::start(plan, inference, cx, request);
    run.steps(&mut tensors, |i| i != source && !plan.per_response[i])
        .await?;
    let step = &plan.steps[source];
    let mut upstream = run
        .inference
        .infer_stream(
            run.cx.clone(),
            &step.model,
            step.version,
            run.step_request(step, &tensors),
        )
        .await
        .map_err(|e| run.step_failed(step, e))?;
    loop {
        // A caller that has gone drops `upstream`, which cancels the decoupled step's request.
        let message = tokio::select! {
            message = upstream.next() => message,
            () = sender.cancelled() => return Ok(()),
        };
        let Some(message) = message else {
            return Ok(());
        };
        let response = match message.result {
            None => None,
            Some(Err(e)) => return Err(run.step_failed(step, e)),
            Some(Ok(response)) => {
                let mut these = tensors.clone();
                run.keep_outputs(step, response, &mut these);
                run.steps(&mut these, |i| plan.per_response[i]).await?;
                Some(run.response(these))
            }
        };
        if sender.send(response, message.last).await.is_err() || message.last {
            return Ok(());
        }
    }
}

/// A unary call to a streaming ensemble: the one response its run sends (an LLM engine asked
/// not to stream answers once). A run that sends more is refused, as Triton refuses a unary
/// call to a decoupled model.
async fn run_once_streamed(
    plan: &Plan,
    inference: Arc<dyn Inference>,
    cx: CallContext,
    request: InferRequest,
) -> InferResult {
    let (sender, mut stream) = crate::stream::channel();
    let running = async move { run_streaming(plan, inference, cx, request, &sender).await };
    let reading = async move {
        let mut answer = None;
        while let Some(message) = stream.next().await {
            match message.result {
                Some(Ok(_)) if answer.is_some() => {
                    // Dropping the stream (returning) stops the run.
                    return Err(InferError::new(
                        crate::infer::ErrorKind::Unsupported,
                        format!(
                            "ensemble '{}' answers this request with a stream of responses: send it with gRPC ModelStreamInfer or POST .../generate_stream",
                            crate::namespace::shown(&plan.name)
                        ),
                    ));
                }
                Some(Ok(response)) => answer = Some(response),
                Some(Err(e)) => return Err(e),
                None => {}
            }
            if message.last {
                break;
            }
        }
        answer.ok_or_else(|| {
            InferError::internal(format!(
                "ensemble '{}' sent no response",
                crate::namespace::shown(&plan.name)
            ))
        })
    };
    let (ran, answer) = futures::join!(running, reading);
    ran?;
    answer
}

#[cfg(test)]
mod tests {
    //! The planner and the DAG runner against a fake request path: no server, no models.

    use std::sync::Mutex;

    use super::*;
    use crate::signature::{ModelMetadata, TensorSpec};

    /// Models that add 1 to every element of their FP32 input "X" (output "Y"), and record the
    /// calls they get with the call chain.
    #[derive(Default)]
    struct Models {
        calls: Mutex<Vec<(String, Vec<String>)>>,
    }

    fn spec(name: &str, datatype: DataType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype,
            dims: vec![-1],
            optional: false,
        }
    }

    impl Models {
        fn record(&self, model: &str, cx: &CallContext) {
            self.calls
                .lock()
                .expect("calls")
                .push((model.to_owned(), cx.call_chain.clone()));
        }
    }

    fn input_x(request: &InferRequest) -> Result<Vec<f32>, InferError> {
        request
            .inputs
            .iter()
            .find(|t| t.name == "X")
            .and_then(Tensor::as_f32_vec)
            .ok_or_else(|| InferError::invalid("no X"))
    }

    /// Output "Y": `x` plus `add`, element by element.
    fn y_response(x: &[f32], add: f32) -> InferResponse {
        let y: Vec<f32> = x.iter().map(|v| v + add).collect();
        InferResponse {
            outputs: vec![Tensor::from_f32("Y", vec![y.len() as i64], &y)],
            ..Default::default()
        }
    }

    impl Inference for Models {
        fn infer<'a>(
            &'a self,
            cx: CallContext,
            model: &'a str,
            _version: Option<i64>,
            request: InferRequest,
        ) -> BoxFuture<'a, InferResult> {
            self.record(model, &cx);
            Box::pin(async move { Ok(y_response(&input_x(&request)?, 1.0)) })
        }

        fn infer_stream<'a>(
            &'a self,
            cx: CallContext,
            model: &'a str,
            version: Option<i64>,
            request: InferRequest,
        ) -> BoxFuture<'a, Result<crate::stream::ResponseStream, InferError>> {
            if model != "count" {
                return Box::pin(async move {
                    let result = self.infer(cx, model, version, request).await;
                    Ok(crate::stream::ResponseStream::single(result))
                });
            }
            // The decoupled one: X + 10, X + 20, X + 30, then a final message without outputs.
            self.record(model, &cx);
            Box::pin(async move {
                let x = input_x(&request)?;
                let (sender, stream) = crate::stream::channel();
                tokio::spawn(async move {
                    for k in 1..=3 {
                        let response = y_response(&x, 10.0 * k as f32);
                        if sender.send(Some(Ok(response)), false).await.is_err() {
                            return;
                        }
                    }
                    let _ = sender.send(None, true).await;
                });
                Ok(stream)
            })
        }

        fn metadata(
            &self,
            _cx: &CallContext,
            model: &str,
            _version: Option<i64>,
        ) -> Result<ModelMetadata, InferError> {
            let datatype = if model == "ints" {
                DataType::Int32
            } else {
                DataType::Fp32
            };
            match model {
                "inc" | "ints" | "count" => Ok(ModelMetadata {
                    name: model.into(),
                    versions: vec![1],
                    platform: "fake".into(),
                    batched: false,
                    decoupled: model == "count",
                    inputs: vec![spec("X", datatype)],
                    outputs: vec![spec("Y", datatype)],
                }),
                _ => Err(InferError::not_found(format!("no model '{model}'"))),
            }
        }
    }

    /// An ensemble IN → step → ... → OUT; each step is `(model, input tensor, output tensor)`.
    fn ensemble(steps: &[(&str, &str, &str)]) -> ModelConfig {
        let steps: String = steps
            .iter()
            .map(|(model, input, output)| {
                format!(
                    r#"step {{ model_name: "{model}" model_version: -1
                        input_map {{ key: "X" value: "{input}" }}
                        output_map {{ key: "Y" value: "{output}" }} }}"#
                )
            })
            .collect();
        config::parse(
            &format!(
                r#"name: "e" platform: "ensemble"
                   input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
                   output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
                   ensemble_scheduling {{ {steps} }}"#
            ),
            "e",
        )
        .expect("config")
    }

    fn plan_error(steps: &[(&str, &str, &str)]) -> String {
        plan("e", &ensemble(steps), &Models::default())
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_planner_checks_the_graph_against_the_models() {
        assert!(
            plan(
                "e",
                &ensemble(&[("inc", "IN", "A"), ("inc", "A", "OUT")]),
                &Models::default()
            )
            .is_ok()
        );
        assert!(plan_error(&[("missing", "IN", "OUT")]).contains("no model 'missing'"));
        assert!(plan_error(&[("inc", "IN", "A")]).contains("'OUT' is not produced"));
        assert!(
            plan_error(&[("inc", "IN", "OUT"), ("inc", "IN", "OUT")]).contains("already produced")
        );
        assert!(plan_error(&[("inc", "NOWHERE", "OUT")]).contains("which no ensemble input"));
        assert!(plan_error(&[("ints", "IN", "OUT")]).contains("expects INT32"));
        assert!(
            plan_error(&[("inc", "B", "A"), ("inc", "A", "B"), ("inc", "IN", "OUT")])
                .contains("cycle")
        );
        assert!(plan_error(&[("e", "IN", "OUT")]).contains("the ensemble itself"));
        // What the ensemble declares of its outputs and inputs must be what the steps make and
        // take (these were READY and failed every request).
        let declared = |input: &str, output: &str| {
            let config = config::parse(
                &format!(
                    r#"name: "e" platform: "ensemble"
                       input [ {{ name: "IN" data_type: TYPE_FP32 {input} }} ]
                       output [ {{ name: "OUT" {output} }} ]
                       ensemble_scheduling {{ step {{ model_name: "inc" model_version: -1
                         input_map {{ key: "X" value: "IN" }}
                         output_map {{ key: "Y" value: "OUT" }} }} }}"#
                ),
                "e",
            )
            .expect("config");
            plan("e", &config, &Models::default())
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(declared("dims: [ -1 ]", "data_type: TYPE_FP32 dims: [ 8 ]").is_ok());
        let e = declared("dims: [ -1 ]", "data_type: TYPE_INT32 dims: [ -1 ]").expect_err("type");
        assert!(e.contains("declared INT32"), "{e}");
        let e = declared("dims: [ 4, 4 ]", "data_type: TYPE_FP32 dims: [ -1 ]").expect_err("in");
        assert!(
            e.contains("takes shape [-1]") && e.contains("[4, 4]"),
            "{e}"
        );
        let e = declared("dims: [ -1 ]", "data_type: TYPE_FP32 dims: [ 2, 8 ]").expect_err("out");
        assert!(e.contains("declared with shape [2, 8]"), "{e}");
    }

    #[tokio::test]
    async fn a_request_flows_through_the_steps_with_the_ensemble_in_the_chain() {
        let models = Arc::new(Models::default());
        let plan = plan(
            "e",
            &ensemble(&[("inc", "A", "OUT"), ("inc", "IN", "A")]),
            models.as_ref(),
        )
        .expect("plan");
        let inference: Arc<dyn Inference> = models.clone();
        let request = InferRequest {
            inputs: vec![Tensor::from_f32("IN", vec![2], &[1.0, 2.0])],
            ..Default::default()
        };
        let cx = CallContext::root().call_from("caller");
        let response = run(&plan, inference, cx, request).await.expect("runs");
        assert_eq!(response.outputs[0].name, "OUT");
        assert_eq!(response.outputs[0].as_f32_vec(), Some(vec![3.0, 4.0]));
        let calls = models.calls.lock().expect("calls").clone();
        assert_eq!(calls.len(), 2);
        for (model, chain) in calls {
            assert_eq!(model, "inc");
            assert_eq!(chain, vec!["caller".to_owned(), "e".to_owned()]);
        }
    }

    /// The calls each model got, in order.
    fn called(models: &Models) -> Vec<String> {
        let calls = models.calls.lock().expect("calls");
        calls.iter().map(|(m, _)| m.clone()).collect()
    }

    #[tokio::test]
    async fn a_decoupled_step_streams_each_response_through_the_steps_after_it() {
        let models = Arc::new(Models::default());
        let config = ensemble(&[("inc", "IN", "A"), ("count", "A", "B"), ("inc", "B", "OUT")]);
        let inference: Arc<dyn Inference> = models.clone();
        assert!(has_decoupled_step("e", &config, inference.as_ref()));
        let plan = plan("e", &config, models.as_ref()).expect("plan");
        assert_eq!(plan.stream_step, Some(1));
        assert_eq!(plan.per_response, vec![false, false, true]);
        let request = || InferRequest {
            inputs: vec![Tensor::from_f32("IN", vec![1], &[1.0])],
            ..Default::default()
        };

        let (sender, mut stream) = crate::stream::channel();
        let cx = CallContext::root().call_from("caller");
        run_streaming(&plan, inference.clone(), cx.clone(), request(), &sender)
            .await
            .expect("runs");
        let mut outs = Vec::new();
        while let Some(message) = stream.next().await {
            if let Some(result) = message.result {
                outs.push(result.expect("a response").outputs[0].as_f32_vec());
            }
            if message.last {
                break;
            }
        }
        // 1 + 1, then + 10k, then + 1: in order, the final message without outputs passed on.
        assert_eq!(
            outs,
            vec![Some(vec![13.0]), Some(vec![23.0]), Some(vec![33.0])]
        );
        assert_eq!(called(&models), ["inc", "count", "inc", "inc", "inc"]);

        // A unary call gets one response or a clear refusal, never the first of many.
        let refused = run_once_streamed(&plan, inference, cx, request())
            .await
            .expect_err("three responses");
        assert!(refused.message.contains("generate_stream"), "{refused:?}");
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_stops_the_stream() {
        let models = Arc::new(Models::default());
        let config = ensemble(&[("count", "IN", "B"), ("inc", "B", "OUT")]);
        let plan = plan("e", &config, models.as_ref()).expect("plan");
        let (sender, stream) = crate::stream::channel();
        drop(stream);
        let inference: Arc<dyn Inference> = models.clone();
        let request = InferRequest {
            inputs: vec![Tensor::from_f32("IN", vec![1], &[1.0])],
            ..Default::default()
        };
        run_streaming(&plan, inference, CallContext::root(), request, &sender)
            .await
            .expect("ends quietly");
        // At most the response in flight when the caller's absence was seen went further.
        assert!(called(&models).iter().filter(|m| *m == "inc").count() <= 1);
    }

    #[test]
    fn two_decoupled_steps_are_refused() {
        let err = plan_error(&[("count", "IN", "A"), ("count", "A", "OUT")]);
        assert!(err.contains("both decoupled"), "{err}");
    }

    #[tokio::test]
    async fn an_absent_optional_input_is_left_out_of_the_steps() {
        let models = Arc::new(Models::default());
        let mut config = ensemble(&[("inc", "IN", "OUT")]);
        config.input[0].optional = true;
        let plan = plan("e", &config, models.as_ref()).expect("plan");
        let inference: Arc<dyn Inference> = models.clone();
        // The step runs without its input (and says what is missing) rather than never.
        let err = run(
            &plan,
            inference,
            CallContext::root(),
            InferRequest::default(),
        )
        .await
        .expect_err("the fake needs X");
        assert!(err.message.contains("no X"), "{err:?}");
    }
}
