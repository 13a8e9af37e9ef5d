//! A loaded model version: its configuration, its scheduler, and the two ends of the request path
//! that are the same for every backend — checking a request against the configuration before it
//! is queued, and shaping the response (requested outputs, classification) after it ran.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::config::{BackendKind, ModelConfig};
use crate::infer::{CallContext, InferError, InferRequest, InferResult, RequestedOutput};
use crate::metrics::ModelStats;
use crate::scheduler::Scheduler;
use crate::signature::Signature;
use crate::stream::ResponseStream;
use crate::tensor::{DataType, Tensor, TensorData};

/// One READY version of a model.
pub struct ModelVersion {
    pub name: String,
    pub version: i64,
    pub kind: BackendKind,
    pub config: Arc<ModelConfig>,
    pub signature: Signature,
    pub stats: Arc<ModelStats>,
    /// Class labels per output, from `label_filename`.
    labels: HashMap<String, Vec<String>>,
    scheduler: Scheduler,
    /// The live sequences of a stateful model (`sequence_batching`).
    pub sequencer: Option<Arc<crate::sequence::Sequencer>>,
}

impl ModelVersion {
    pub fn new(
        name: String,
        version: i64,
        kind: BackendKind,
        config: Arc<ModelConfig>,
        labels: HashMap<String, Vec<String>>,
        scheduler: Scheduler,
        stats: Arc<ModelStats>,
    ) -> ModelVersion {
        let signature = Signature::of(&config);
        ModelVersion {
            name,
            version,
            kind,
            config,
            signature,
            stats,
            labels,
            scheduler,
            sequencer: None,
        }
    }

    /// A stateful model's version: its requests go through `sequencer`.
    pub fn with_sequencer(mut self, sequencer: Option<Arc<crate::sequence::Sequencer>>) -> Self {
        self.sequencer = sequencer;
        self
    }

    fn batched(&self) -> bool {
        self.config.max_batch_size > 0
    }

    /// Requests queued for this version.
    pub fn pending_count(&self) -> usize {
        self.scheduler.pending_count()
    }

    /// Whether the model answers a request with a stream of 0..N responses (Triton's
    /// `model_transaction_policy { decoupled: true }`).
    pub fn decoupled(&self) -> bool {
        self.config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled)
    }

    /// Runs one request through this version's queue and reads its responses as a stream:
    /// those a decoupled model sends, or the one result of any other model.
    pub async fn infer_stream(
        self: &Arc<Self>,
        cx: CallContext,
        mut request: InferRequest,
    ) -> Result<ResponseStream, InferError> {
        if !self.decoupled() {
            return Ok(ResponseStream::single(self.infer(cx, request).await));
        }
        let arrived = Instant::now();
        let mut seen = std::collections::HashSet::new();
        request.outputs.retain(|o| seen.insert(o.name.clone()));
        self.validate(&request)?;
        let requested = request.outputs.clone();
        let id = request.id.clone();
        let counted = !cx.warmup;
        let stream = self.scheduler.submit_stream(cx, request)?;
        let me = self.clone();
        let finish =
            move |response: crate::infer::InferResponse| me.finish(response, &requested, &id);
        let stream = stream.map(Arc::new(finish));
        if !counted {
            return Ok(stream);
        }
        let record = Arc::new(StreamRecord {
            stats: self.stats.clone(),
            arrived,
            answered: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            recorded: AtomicBool::new(false),
        });
        let inspect = record.clone();
        Ok(stream.inspect(Arc::new(move |message| inspect.read(message))))
    }

    /// Runs one request through this version's queue. Warmup requests are not counted.
    pub async fn infer(&self, cx: CallContext, request: InferRequest) -> InferResult {
        // An LLM engine answers a request that does not stream with one response, decoupled
        // or not, so TensorRT-LLM's unary clients work against its streaming configuration;
        // so does an ensemble around one (it refuses a run that sends more).
        if self.decoupled() && !matches!(self.kind, BackendKind::Llm | BackendKind::Ensemble) {
            // A handler's call (BLS) is told the handler's way to stream, a client the protocol's.
            let how = if cx.call_chain.is_empty() {
                "use gRPC ModelStreamInfer or POST /v2/models/{name}/generate_stream"
            } else {
                "a handler calls it with infer_stream (Rust) or InferenceRequest(...).exec(decoupled=True) (Python)"
            };
            return Err(InferError::new(
                crate::infer::ErrorKind::Unsupported,
                format!(
                    "model '{}' is decoupled (it answers with a stream of responses): this call doesn't support models with decoupled transaction policy; {how}",
                    crate::namespace::shown(&self.name)
                ),
            ));
        }
        let arrived = Instant::now();
        let (warmup, request_id) = (cx.warmup, cx.request_id);
        let result = self.run(cx, request).await;
        if !warmup {
            self.stats.record_request(result.is_ok(), arrived.elapsed());
        }
        if let Err(InferError {
            message,
            detail: Some(detail),
            ..
        }) = &result
        {
            // Where the request ends for this model: what clients are not shown is logged here.
            tracing::warn!(model = %self.name, version = self.version, request = request_id, "{message}: {detail}");
        }
        result
    }

    async fn run(&self, cx: CallContext, mut request: InferRequest) -> InferResult {
        // An output asked for twice is answered once, as Triton does.
        let mut seen = std::collections::HashSet::new();
        request.outputs.retain(|o| seen.insert(o.name.clone()));
        self.validate(&request)?;
        let requested = request.outputs.clone();
        let id = request.id.clone();
        // A stateful model's request is a step of its sequence: control inputs and state are
        // filled in, and the steps of one sequence run in order.
        let response = match &self.sequencer {
            Some(sequencer) => {
                sequencer
                    .step(request, |request| self.scheduler.submit(cx, request))
                    .await?
            }
            None => self.scheduler.submit(cx, request).await?,
        };
        self.finish(response, &requested, &id)
    }

    /// A response as the caller gets it: outputs checked and selected, named and versioned.
    fn finish(
        &self,
        mut response: crate::infer::InferResponse,
        requested: &[RequestedOutput],
        id: &str,
    ) -> InferResult {
        self.check_outputs(&response.outputs)?;
        response.outputs = self.select_outputs(std::mem::take(&mut response.outputs), requested)?;
        response.model_name = crate::namespace::shown(&self.name).to_owned();
        response.model_version = self.version.to_string();
        response.id = id.to_owned();
        Ok(response)
    }

    /// Checks names, datatypes, shapes and batch size against the configuration.
    pub fn validate(&self, request: &InferRequest) -> Result<(), InferError> {
        let model = crate::namespace::shown(&self.name);
        let batched = self.batched();
        let mut batch_size: Option<i64> = None;
        for (i, tensor) in request.inputs.iter().enumerate() {
            if request.inputs[..i].iter().any(|t| t.name == tensor.name) {
                return Err(InferError::invalid(format!(
                    "input '{}' is given more than once for model '{model}'",
                    tensor.name
                )));
            }
            let Some(spec) = self.signature.inputs.iter().find(|s| s.name == tensor.name) else {
                return Err(InferError::invalid(format!(
                    "unexpected inference input '{}' for model '{model}'",
                    tensor.name
                )));
            };
            if tensor.datatype != spec.datatype {
                return Err(InferError::invalid(format!(
                    "inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                    tensor.name, tensor.datatype, spec.datatype
                )));
            }
            let dims = if batched {
                let Some((&b, rest)) = tensor.shape.split_first() else {
                    return Err(InferError::invalid(format!(
                        "input '{}' for model '{model}' needs a batch dimension, got shape []",
                        tensor.name
                    )));
                };
                if b < 1 {
                    return Err(InferError::invalid(format!(
                        "inference request batch-size must be at least 1 for '{model}', got {b}"
                    )));
                }
                if b > i64::from(self.config.max_batch_size) {
                    return Err(InferError::invalid(format!(
                        "inference request batch-size must be <= {} for '{model}', got {b}",
                        self.config.max_batch_size
                    )));
                }
                if batch_size.is_some_and(|prev| prev != b) {
                    return Err(InferError::invalid(format!(
                        "inputs of a request to '{model}' must share one batch size"
                    )));
                }
                batch_size = Some(b);
                rest
            } else {
                &tensor.shape[..]
            };
            if !spec.accepts(dims) {
                return Err(InferError::invalid(format!(
                    "unexpected shape for input '{}' for model '{model}'. Expected {:?}, got {:?}",
                    tensor.name,
                    spec.client_shape(batched),
                    tensor.shape
                )));
            }
            tensor.check_consistent().map_err(InferError::invalid)?;
        }
        for spec in &self.signature.inputs {
            if !spec.optional && !request.inputs.iter().any(|t| t.name == spec.name) {
                return Err(InferError::invalid(format!(
                    "expected {} inputs but got {} inputs for model '{model}': input '{}' is missing",
                    self.signature.inputs.iter().filter(|s| !s.optional).count(),
                    // The required ones it has: optional inputs do not make up for a missing one.
                    self.signature
                        .inputs
                        .iter()
                        .filter(|s| !s.optional && request.inputs.iter().any(|t| t.name == s.name))
                        .count(),
                    spec.name
                )));
            }
        }
        for output in &request.outputs {
            let Some(spec) = self
                .signature
                .outputs
                .iter()
                .find(|s| s.name == output.name)
            else {
                return Err(InferError::invalid(format!(
                    "unexpected inference output '{}' for model '{model}'",
                    output.name
                )));
            };
            if output.class_count > 0 && spec.datatype == DataType::Bytes {
                return Err(InferError::invalid(format!(
                    "classification is not supported for BYTES output '{}'",
                    output.name
                )));
            }
        }
        Ok(())
    }

    /// Checks what the backend produced against the configuration: a handler that returns INT32
    /// where its config declares FP32, or an output its config does not name, fails clearly
    /// instead of reaching the client as if it were right.
    fn check_outputs(&self, outputs: &[Tensor]) -> Result<(), InferError> {
        let model = crate::namespace::shown(&self.name);
        let batched = self.batched();
        for tensor in outputs {
            let Some(spec) = self
                .signature
                .outputs
                .iter()
                .find(|s| s.name == tensor.name)
            else {
                return Err(InferError::internal(format!(
                    "model '{model}' returned output '{}', which its configuration does not declare",
                    tensor.name
                )));
            };
            if tensor.datatype != spec.datatype {
                return Err(InferError::internal(format!(
                    "model '{model}' returned output '{}' as {}, but its configuration declares {}",
                    tensor.name, tensor.datatype, spec.datatype
                )));
            }
            let dims = if batched {
                tensor.shape.get(1..).unwrap_or_default()
            } else {
                &tensor.shape[..]
            };
            if !spec.accepts(dims) || (batched && tensor.shape.is_empty()) {
                return Err(InferError::internal(format!(
                    "model '{model}' returned output '{}' of shape {:?}, but its configuration declares {:?}",
                    tensor.name,
                    tensor.shape,
                    spec.client_shape(batched)
                )));
            }
        }
        Ok(())
    }

    /// Keeps the requested outputs (all when none were named), applying classification.
    fn select_outputs(
        &self,
        produced: Vec<Tensor>,
        requested: &[RequestedOutput],
    ) -> Result<Vec<Tensor>, InferError> {
        if requested.is_empty() {
            return Ok(produced);
        }
        let mut produced: HashMap<String, Tensor> =
            produced.into_iter().map(|t| (t.name.clone(), t)).collect();
        requested
            .iter()
            .map(|want| {
                let tensor = produced.remove(&want.name).ok_or_else(|| {
                    InferError::internal(format!(
                        "model '{}' did not produce output '{}'",
                        crate::namespace::shown(&self.name),
                        want.name
                    ))
                })?;
                if want.class_count == 0 {
                    return Ok(tensor);
                }
                let labels = self
                    .labels
                    .get(&want.name)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                classify(&tensor, want.class_count as usize, self.batched(), labels)
            })
            .collect()
    }
}

/// The classification extension: the top `k` classes of each batch row as "score:index[:label]".
pub fn classify(
    tensor: &Tensor,
    k: usize,
    batched: bool,
    labels: &[String],
) -> Result<Tensor, InferError> {
    let values = tensor.to_f64_vec().ok_or_else(|| {
        InferError::invalid(format!("output '{}' cannot be classified", tensor.name))
    })?;
    let rows = if batched {
        tensor.shape.first().copied().unwrap_or(1).max(1) as usize
    } else {
        1
    };
    let per_row = values.len() / rows.max(1);
    let k = k.min(per_row);
    let mut elements = Vec::with_capacity(rows * k);
    for row in values.chunks(per_row.max(1)) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        for &index in order.iter().take(k) {
            let score = if tensor.datatype == DataType::Fp32 || tensor.datatype == DataType::Fp16 {
                format!("{}", row[index] as f32)
            } else {
                format!("{}", row[index])
            };
            let entry = match labels.get(index) {
                Some(label) => format!("{score}:{index}:{label}"),
                None => format!("{score}:{index}"),
            };
            elements.push(entry.into_bytes().into());
        }
    }
    let shape = if batched {
        vec![rows as i64, k as i64]
    } else {
        vec![k as i64]
    };
    Ok(Tensor::new(
        tensor.name.clone(),
        DataType::Bytes,
        shape,
        TensorData::Elements(elements),
    ))
}

/// Counts a streamed request in the model's statistics as its caller reads it: each response,
/// the time to the first, and the request itself at its last message (a success unless an error
/// ended it), or as cancelled when the caller drops the stream before that.
struct StreamRecord {
    stats: Arc<ModelStats>,
    arrived: Instant,
    answered: AtomicBool,
    failed: AtomicBool,
    recorded: AtomicBool,
}

impl StreamRecord {
    fn read(&self, message: &crate::stream::StreamMessage) {
        if !self.answered.swap(true, Ordering::Relaxed) {
            self.stats.record_first_response(self.arrived.elapsed());
        }
        if matches!(message.result, Some(Err(_))) {
            self.failed.store(true, Ordering::Relaxed);
        }
        self.stats.record_streamed(message.result.is_none());
        if message.last && !self.recorded.swap(true, Ordering::Relaxed) {
            let ok = !self.failed.load(Ordering::Relaxed);
            self.stats.record_request(ok, self.arrived.elapsed());
        }
    }
}

impl Drop for StreamRecord {
    fn drop(&mut self) {
        if !self.recorded.load(Ordering::Relaxed) {
            self.stats.record_cancelled();
            self.stats.record_request(false, self.arrived.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_orders_rows_and_names_labels() {
        let t = Tensor::from_f32("p", vec![2, 3], &[0.1, 0.7, 0.2, 0.5, 0.25, 0.25]);
        let labels = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let out = classify(&t, 2, true, &labels).expect("classifies");
        assert_eq!(out.shape, vec![2, 2]);
        let TensorData::Elements(e) = out.data else {
            panic!("bytes")
        };
        assert_eq!(&e[0][..], b"0.7:1:b");
        assert_eq!(&e[1][..], b"0.2:2:c");
        assert_eq!(&e[2][..], b"0.5:0:a");
    }
}
