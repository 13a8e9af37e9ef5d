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
    // Where each tensor comes from, with its datatype.
    let mut produced: HashMap<String, (DataType, String)> = HashMap::new();
    for input in &config.input {
        let dt = config::datatype_from_config(input.data_type).ok_or_else(|| {
            LoadError::invalid(format!(
                "ensemble input '{}' has no valid data_type",
                input.name
            ))
        })?;
        produced.insert(input.name.clone(), (dt, "the ensemble's inputs".into()));
    }
    let mut steps = Vec::new();
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
        // An LLM engine is decoupled but answers a request that does not stream once.
        if target.decoupled && target.platform != "llamacpp" {
            return Err(LoadError::unsupported(format!(
                "{label} is a decoupled model: an ensemble's steps answer once (call it from a handler with infer-stream instead)"
            )));
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
            let want = target
                .inputs
                .iter()
                .find(|s| &s.name == model_input)
                .map(|s| s.datatype);
            if want != Some(*dt) {
                return Err(LoadError::invalid(format!(
                    "step '{}' input '{model_input}' expects {}, but tensor '{tensor}' from {by} is {dt}",
                    step.model,
                    want.map_or("?".into(), |d| d.to_string())
                )));
            }
        }
    }
    for output in &config.output {
        if !produced.contains_key(&output.name) {
            return Err(LoadError::invalid(format!(
                "ensemble output '{}' is not produced by any step",
                output.name
            )));
        }
    }
    check_acyclic(&steps, config)?;
    Ok(Plan {
        name: name.to_owned(),
        steps,
        outputs: config.output.iter().map(|o| o.name.clone()).collect(),
    })
}

/// Runs the steps symbolically: if some step can never start, its inputs depend on itself.
fn check_acyclic(steps: &[Step], config: &ModelConfig) -> Result<(), LoadError> {
    let mut available: HashSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let mut done = vec![false; steps.len()];
    loop {
        let mut progressed = false;
        for (i, step) in steps.iter().enumerate() {
            if !done[i]
                && step
                    .inputs
                    .iter()
                    .all(|(_, t)| available.contains(t.as_str()))
            {
                done[i] = true;
                progressed = true;
                available.extend(step.outputs.iter().map(|(_, t)| t.as_str()));
            }
        }
        if !progressed {
            break;
        }
    }
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
            let runs = batch
                .into_iter()
                .map(|c| run(&self.plan, &self.inference, c.cx, c.request));
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

/// Runs one request through the DAG.
async fn run(
    plan: &Plan,
    inference: &Weak<dyn Inference>,
    cx: CallContext,
    request: InferRequest,
) -> InferResult {
    let inference = inference
        .upgrade()
        .ok_or_else(|| InferError::unavailable("the server is shutting down"))?;
    let step_cx = cx.call_from(&plan.name);
    let mut tensors: HashMap<String, Tensor> = request
        .inputs
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let mut started = vec![false; plan.steps.len()];
    let mut running = FuturesUnordered::new();
    loop {
        for (i, step) in plan.steps.iter().enumerate() {
            if started[i] || !step.inputs.iter().all(|(_, t)| tensors.contains_key(t)) {
                continue;
            }
            started[i] = true;
            let inputs = step
                .inputs
                .iter()
                .filter_map(|(model_input, t)| {
                    tensors.get(t).map(|tensor| Tensor {
                        name: model_input.clone(),
                        ..tensor.clone()
                    })
                })
                .collect();
            let step_request = InferRequest {
                id: request.id.clone(),
                inputs,
                outputs: step
                    .outputs
                    .iter()
                    .map(|(o, _)| RequestedOutput {
                        name: o.clone(),
                        ..Default::default()
                    })
                    .collect(),
                parameters: request.parameters.clone(),
                priority: request.priority,
                timeout: request.timeout,
            };
            let inference = inference.clone();
            let step_cx = step_cx.clone();
            running.push(async move {
                (
                    i,
                    inference
                        .infer(step_cx, &step.model, step.version, step_request)
                        .await,
                )
            });
        }
        let Some((i, result)) = running.next().await else {
            break;
        };
        let step = &plan.steps[i];
        let response = result.map_err(|e| {
            e.context(format!(
                "ensemble '{}' step '{}' failed",
                crate::namespace::shown(&plan.name),
                step.model
            ))
        })?;
        for mut tensor in response.outputs {
            if let Some((_, name)) = step.outputs.iter().find(|(o, _)| *o == tensor.name) {
                tensor.name.clone_from(name);
                tensors.insert(name.clone(), tensor);
            }
        }
    }
    let outputs = plan
        .outputs
        .iter()
        .map(|name| {
            tensors.remove(name).ok_or_else(|| {
                InferError::internal(format!(
                    "ensemble '{}' did not produce '{name}'",
                    crate::namespace::shown(&plan.name)
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(InferResponse {
        outputs,
        ..Default::default()
    })
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

    impl Inference for Models {
        fn infer<'a>(
            &'a self,
            cx: CallContext,
            model: &'a str,
            _version: Option<i64>,
            request: InferRequest,
        ) -> BoxFuture<'a, InferResult> {
            self.calls
                .lock()
                .expect("calls")
                .push((model.to_owned(), cx.call_chain.clone()));
            Box::pin(async move {
                let x = request
                    .inputs
                    .iter()
                    .find(|t| t.name == "X")
                    .and_then(Tensor::as_f32_vec)
                    .ok_or_else(|| InferError::invalid("no X"))?;
                let y: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
                Ok(InferResponse {
                    outputs: vec![Tensor::from_f32("Y", vec![y.len() as i64], &y)],
                    ..Default::default()
                })
            })
        }

        fn infer_stream<'a>(
            &'a self,
            cx: CallContext,
            model: &'a str,
            version: Option<i64>,
            request: InferRequest,
        ) -> BoxFuture<'a, Result<crate::stream::ResponseStream, InferError>> {
            Box::pin(async move {
                let result = self.infer(cx, model, version, request).await;
                Ok(crate::stream::ResponseStream::single(result))
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
                "inc" | "ints" => Ok(ModelMetadata {
                    name: model.into(),
                    versions: vec![1],
                    platform: "fake".into(),
                    batched: false,
                    decoupled: false,
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
        let response = run(&plan, &Arc::downgrade(&inference), cx, request)
            .await
            .expect("runs");
        assert_eq!(response.outputs[0].name, "OUT");
        assert_eq!(response.outputs[0].as_f32_vec(), Some(vec![3.0, 4.0]));
        let calls = models.calls.lock().expect("calls").clone();
        assert_eq!(calls.len(), 2);
        for (model, chain) in calls {
            assert_eq!(model, "inc");
            assert_eq!(chain, vec!["caller".to_owned(), "e".to_owned()]);
        }
    }
}
