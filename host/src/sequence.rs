//! Sequence batching: stateful models, as Triton's `sequence_batching` defines them.
//!
//! The requests of one sequence carry its correlation id (`sequence_id`, an unsigned integer or a
//! string) and mark its first and last request (`sequence_start`, `sequence_end`). For each
//! request the host fills in the control inputs the configuration names
//! (`CONTROL_SEQUENCE_START`, `_END`, `_READY`, `_CORRID`, with their datatypes and false/true
//! values) and the sequence's implicit state (`state { input_name output_name ... }`): the state
//! output of one request is the state input of the next, kept here per sequence, so the model
//! (an ONNX model or a Wasm handler alike) holds nothing between requests and any instance can
//! run any step.
//!
//! A sequence's requests run one at a time, in the order they arrive (each waits for its turn on
//! the sequence's lock, which is fair); requests of different sequences share the model's queue
//! and batch together. Live sequences are bounded (a slot each): a new sequence waits for a slot
//! when all are taken, as in Triton's backlog. A sequence idle longer than
//! `max_sequence_idle_microseconds` is released and logged; its next request is refused as one
//! without a start. The table belongs to the model version, so a reloaded model starts without
//! sequences and refuses the requests of the old ones the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{ModelConfig, pb};
use crate::infer::{ErrorKind, InferError, InferRequest, InferResponse, InferResult, ParamValue};
use crate::tensor::{Bytes, DataType, Tensor, TensorData};

/// Triton's default `max_sequence_idle_microseconds`.
const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// Triton's default `max_candidate_sequences` of the `oldest` strategy.
const DEFAULT_CANDIDATES: usize = 16;

/// A sequence's correlation id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorrelationId::Number(n) => write!(f, "{n}"),
            CorrelationId::Text(s) => write!(f, "'{s}'"),
        }
    }
}

/// What a control input says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ControlKind {
    Start,
    End,
    Ready,
    CorrelationId,
}

/// One control input: its name, what it says, and how (datatype and false/true values).
#[derive(Clone, Debug)]
struct Control {
    input: String,
    kind: ControlKind,
    datatype: DataType,
    /// The false and true values as little-endian bytes (flags only).
    values: [Bytes; 2],
}

/// One implicit state: fed to `input`, read back from `output`.
#[derive(Clone, Debug)]
struct StateSpec {
    input: String,
    output: String,
    /// The state's first value (zeros, or `initial_state`'s data).
    initial: Tensor,
}

/// The sequence batching settings of a model, and its live sequences.
pub struct Sequencer {
    model: String,
    batched: bool,
    controls: Vec<Control>,
    states: Vec<StateSpec>,
    slots: Arc<Semaphore>,
    live: Mutex<HashMap<CorrelationId, Arc<Sequence>>>,
    pub counts: SequenceCounts,
}

/// How many sequences a model started, ended and released for idleness.
#[derive(Default)]
pub struct SequenceCounts {
    pub started: AtomicU64,
    pub ended: AtomicU64,
    pub expired: AtomicU64,
}

struct Sequence {
    id: CorrelationId,
    /// Holding the lock is a request's turn.
    turn: tokio::sync::Mutex<Turn>,
    last_used: Mutex<Instant>,
    /// Ended, or released for idleness: later requests are refused.
    closed: AtomicBool,
}

/// What a sequence holds between its requests.
struct Turn {
    /// Its implicit state.
    state: Vec<Tensor>,
    /// Its slot, taken by its first request (which waits for one when all are taken, and the
    /// sequence's later requests wait behind it, as in Triton's backlog).
    slot: Option<OwnedSemaphorePermit>,
}

impl Sequence {
    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

/// The sequence flags of a request.
struct Flags {
    id: CorrelationId,
    start: bool,
    end: bool,
}

impl Sequencer {
    /// The sequencer of a model with `sequence_batching` (None for any other), with a task that
    /// releases idle sequences for as long as the sequencer lives.
    pub fn of(
        model: &str,
        config: &ModelConfig,
        instances: usize,
        model_dir: &std::path::Path,
    ) -> Result<Option<Arc<Sequencer>>, String> {
        let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) =
            &config.scheduling_choice
        else {
            return Ok(None);
        };
        let batched = config.max_batch_size > 0;
        let rows = usize::try_from(config.max_batch_size).unwrap_or(0).max(1);
        let slots = match &sb.strategy_choice {
            Some(pb::model_sequence_batching::StrategyChoice::Oldest(oldest)) => {
                usize::try_from(oldest.max_candidate_sequences)
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or(DEFAULT_CANDIDATES)
            }
            // Direct (the default): one slot per batch row of each instance.
            _ => rows.saturating_mul(instances.max(1)),
        };
        let idle = match sb.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        let controls = sb
            .control_input
            .iter()
            .map(control)
            .collect::<Result<Vec<_>, _>>()?;
        let states = sb
            .state
            .iter()
            .map(|s| state(s, model_dir))
            .collect::<Result<Vec<_>, _>>()?;
        let sequencer = Arc::new(Sequencer {
            model: model.to_owned(),
            batched,
            controls,
            states,
            slots: Arc::new(Semaphore::new(slots)),
            live: Mutex::new(HashMap::new()),
            counts: SequenceCounts::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release_idle(Arc::downgrade(&sequencer), idle));
        }
        Ok(Some(sequencer))
    }

    /// The names of the inputs the host fills in: the control inputs and the state inputs.
    pub fn host_inputs(config: &ModelConfig) -> Vec<String> {
        let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) =
            &config.scheduling_choice
        else {
            return Vec::new();
        };
        sb.control_input
            .iter()
            .map(|c| c.name.clone())
            .chain(sb.state.iter().map(|s| s.input_name.clone()))
            .collect()
    }

    /// The inputs the host fills in, each with the datatype it fills it with: what a backend
    /// checks against its model file at load, so that a mismatch is a load error, not a failure
    /// of every request.
    pub fn host_input_types(config: &ModelConfig) -> Result<Vec<(String, DataType)>, String> {
        let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) =
            &config.scheduling_choice
        else {
            return Ok(Vec::new());
        };
        let mut types = Vec::new();
        for c in &sb.control_input {
            let control = control(c)?;
            types.push((control.input, control.datatype));
        }
        for s in &sb.state {
            let datatype = crate::config::datatype_from_config(s.data_type)
                .ok_or_else(|| format!("state '{}' has no valid data_type", s.input_name))?;
            types.push((s.input_name.clone(), datatype));
        }
        Ok(types)
    }

    /// The names of the state outputs, which the host reads back instead of answering them.
    pub fn state_outputs(config: &ModelConfig) -> Vec<String> {
        match &config.scheduling_choice {
            Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) => {
                sb.state.iter().map(|s| s.output_name.clone()).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The counts `/metrics` shows.
    pub fn snapshot(&self) -> crate::metrics::SequenceCounts {
        crate::metrics::SequenceCounts {
            live: self.lock().len() as u64,
            started: self.counts.started.load(Ordering::Relaxed),
            ended: self.counts.ended.load(Ordering::Relaxed),
            expired: self.counts.expired.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CorrelationId, Arc<Sequence>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shown(&self) -> &str {
        crate::namespace::shown(&self.model)
    }

    /// Runs `request` as the next step of its sequence: `run` sends the request, with its
    /// control inputs and state filled in, through the model's queue.
    pub async fn step<F, Fut>(&self, mut request: InferRequest, run: F) -> InferResult
    where
        F: FnOnce(InferRequest) -> Fut,
        Fut: std::future::Future<Output = InferResult>,
    {
        let flags = self.flags(&request)?;
        // The controls and the state are one row each: a request of more rows would meet them
        // with a shape mismatch that names a tensor the client never sent. Checked before the
        // request starts or joins a sequence, which it then leaves as it was.
        if self.batched
            && let Some(rows) = request.inputs.iter().find_map(|t| t.shape.first())
            && *rows != 1
        {
            return Err(InferError::invalid(format!(
                "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher, got {rows}",
                self.shown()
            )));
        }
        let sequence = if flags.start {
            self.start(&flags.id)
        } else {
            self.lock()
                .get(&flags.id)
                .cloned()
                .ok_or_else(|| self.not_started(&flags.id))?
        };
        let mut turn = sequence.turn.lock().await;
        if sequence.closed.load(Ordering::Acquire) {
            return Err(self.not_started(&flags.id));
        }
        if turn.slot.is_none() {
            let slot = self
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| InferError::unavailable("the model is being unloaded"))?;
            turn.slot = Some(slot);
            // Started over (a new START for the id) while it waited for the slot.
            if sequence.closed.load(Ordering::Acquire) {
                return Err(self.not_started(&flags.id));
            }
        }
        self.fill(&mut request, &flags, &turn.state)?;
        let result = run(request).await;
        sequence.touch();
        let response = match result {
            Ok(response) => self.take_state(response, &mut turn.state),
            Err(e) => Err(e),
        };
        if flags.end {
            sequence.closed.store(true, Ordering::Release);
            self.remove(&sequence);
            self.counts.ended.fetch_add(1, Ordering::Relaxed);
        }
        response
    }

    /// A new sequence for `id`; its first request takes a slot. A start for an id that is live
    /// ends the old sequence: its state is dropped and its slot freed once its requests are done.
    fn start(&self, id: &CorrelationId) -> Arc<Sequence> {
        let sequence = Arc::new(Sequence {
            id: id.clone(),
            turn: tokio::sync::Mutex::new(Turn {
                state: self.states.iter().map(|s| s.initial.clone()).collect(),
                slot: None,
            }),
            last_used: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
        });
        if let Some(old) = self.lock().insert(id.clone(), sequence.clone()) {
            old.closed.store(true, Ordering::Release);
        }
        self.counts.started.fetch_add(1, Ordering::Relaxed);
        sequence
    }

    fn remove(&self, sequence: &Arc<Sequence>) {
        let mut live = self.lock();
        if live
            .get(&sequence.id)
            .is_some_and(|s| Arc::ptr_eq(s, sequence))
        {
            live.remove(&sequence.id);
        }
    }

    fn not_started(&self, id: &CorrelationId) -> InferError {
        InferError::invalid(format!(
            "inference request for sequence {id} to model '{}' must specify the START flag on the first request of the sequence",
            self.shown()
        ))
    }

    /// The sequence flags of `request` (its `sequence_id`, `sequence_start` and `sequence_end`
    /// parameters).
    fn flags(&self, request: &InferRequest) -> Result<Flags, InferError> {
        let flag = |name: &str| -> Result<bool, InferError> {
            match request.parameters.get(name) {
                None => Ok(false),
                Some(ParamValue::Bool(b)) => Ok(*b),
                Some(ParamValue::Int(i)) => Ok(*i != 0),
                Some(_) => Err(InferError::invalid(format!(
                    "the '{name}' parameter must be a boolean"
                ))),
            }
        };
        let id = match request.parameters.get("sequence_id") {
            Some(ParamValue::Int(n)) if *n != 0 => {
                CorrelationId::Number(u64::from_ne_bytes(n.to_ne_bytes()))
            }
            Some(ParamValue::String(s)) if !s.is_empty() => CorrelationId::Text(s.clone()),
            Some(ParamValue::Int(_) | ParamValue::String(_)) | None => {
                return Err(InferError::invalid(format!(
                    "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
                    self.shown()
                )));
            }
            Some(_) => {
                return Err(InferError::invalid(
                    "the 'sequence_id' parameter must be an unsigned integer or a string",
                ));
            }
        };
        Ok(Flags {
            id,
            start: flag("sequence_start")?,
            end: flag("sequence_end")?,
        })
    }

    /// Adds the control inputs and the state to `request`.
    fn fill(
        &self,
        request: &mut InferRequest,
        flags: &Flags,
        state: &[Tensor],
    ) -> Result<(), InferError> {
        let shape = |dims: &[i64]| -> Vec<i64> {
            if self.batched {
                std::iter::once(1).chain(dims.iter().copied()).collect()
            } else {
                dims.to_vec()
            }
        };
        for control in &self.controls {
            let on = match control.kind {
                ControlKind::Start => flags.start,
                ControlKind::End => flags.end,
                ControlKind::Ready => true,
                ControlKind::CorrelationId => {
                    request
                        .inputs
                        .push(correlation_tensor(control, &flags.id, shape(&[1]))?);
                    continue;
                }
            };
            request.inputs.push(Tensor::new(
                control.input.clone(),
                control.datatype,
                shape(&[1]),
                TensorData::Raw(control.values[usize::from(on)].clone()),
            ));
        }
        // A request that names its outputs gets the state outputs asked for too (a handler
        // answers only what is asked); they are taken back before the caller sees the response.
        if !request.outputs.is_empty() {
            for spec in &self.states {
                if !request.outputs.iter().any(|o| o.name == spec.output) {
                    request.outputs.push(crate::infer::RequestedOutput {
                        name: spec.output.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        for (spec, value) in self.states.iter().zip(state) {
            let mut tensor = value.clone();
            tensor.name.clone_from(&spec.input);
            tensor.shape = shape(&spec.initial.shape);
            request.inputs.push(tensor);
        }
        Ok(())
    }

    /// Moves the state outputs of `response` into the sequence's state.
    fn take_state(
        &self,
        mut response: InferResponse,
        state: &mut [Tensor],
    ) -> Result<InferResponse, InferError> {
        for (spec, slot) in self.states.iter().zip(state.iter_mut()) {
            let at = response
                .outputs
                .iter()
                .position(|t| t.name == spec.output)
                .ok_or_else(|| {
                    InferError::internal(format!(
                        "model '{}' did not produce its state output '{}'",
                        self.shown(),
                        spec.output
                    ))
                })?;
            let mut value = response.outputs.remove(at);
            // Kept without the batch dimension; it must hold what the state's dims say.
            let fits = value.datatype == spec.initial.datatype
                && value.element_count().ok() == spec.initial.element_count().ok();
            if !fits {
                return Err(InferError::internal(format!(
                    "model '{}' produced state output '{}' as {} {:?}, but the state is {} {:?}",
                    self.shown(),
                    spec.output,
                    value.datatype,
                    value.shape,
                    spec.initial.datatype,
                    spec.initial.shape
                )));
            }
            value.shape.clone_from(&spec.initial.shape);
            *slot = value;
        }
        Ok(response)
    }
}

/// The CORRID control input: the id in the control's datatype.
fn correlation_tensor(
    control: &Control,
    id: &CorrelationId,
    shape: Vec<i64>,
) -> Result<Tensor, InferError> {
    let data = match (control.datatype, id) {
        (DataType::Bytes, id) => {
            let text = match id {
                CorrelationId::Number(n) => n.to_string(),
                CorrelationId::Text(s) => s.clone(),
            };
            TensorData::Elements(vec![Bytes::from(text)])
        }
        (DataType::Uint64, CorrelationId::Number(n)) => raw(&n.to_le_bytes()),
        (DataType::Int64, CorrelationId::Number(n)) => raw(&n.to_le_bytes()),
        (DataType::Uint32, CorrelationId::Number(n)) => raw(&(*n as u32).to_le_bytes()),
        (DataType::Int32, CorrelationId::Number(n)) => raw(&(*n as u32).to_le_bytes()),
        (datatype, CorrelationId::Text(_)) => {
            return Err(InferError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the model's CORRID control input '{}' is {datatype}: it takes numeric correlation ids only",
                    control.input
                ),
            ));
        }
        (datatype, _) => {
            return Err(InferError::internal(format!(
                "CORRID control input '{}' has datatype {datatype}",
                control.input
            )));
        }
    };
    Ok(Tensor::new(
        control.input.clone(),
        control.datatype,
        shape,
        data,
    ))
}

fn raw(bytes: &[u8]) -> TensorData {
    TensorData::Raw(Bytes::copy_from_slice(bytes))
}

/// A control input of the configuration.
fn control(input: &pb::model_sequence_batching::ControlInput) -> Result<Control, String> {
    use pb::model_sequence_batching::control::Kind;
    let [c] = input.control.as_slice() else {
        return Err(format!(
            "control input '{}' must have exactly one control",
            input.name
        ));
    };
    let kind = match Kind::try_from(c.kind) {
        Ok(Kind::ControlSequenceStart) => ControlKind::Start,
        Ok(Kind::ControlSequenceEnd) => ControlKind::End,
        Ok(Kind::ControlSequenceReady) => ControlKind::Ready,
        Ok(Kind::ControlSequenceCorrid) => ControlKind::CorrelationId,
        Err(_) => {
            return Err(format!(
                "control input '{}' has an unknown kind",
                input.name
            ));
        }
    };
    if kind == ControlKind::CorrelationId {
        let datatype = crate::config::datatype_from_config(c.data_type)
            .filter(|d| {
                matches!(
                    d,
                    DataType::Uint64
                        | DataType::Int64
                        | DataType::Uint32
                        | DataType::Int32
                        | DataType::Bytes
                )
            })
            .ok_or_else(|| {
                format!(
                    "CORRID control input '{}' needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING",
                    input.name
                )
            })?;
        return Ok(Control {
            input: input.name.clone(),
            kind,
            datatype,
            values: [Bytes::new(), Bytes::new()],
        });
    }
    let pair = |values: &[u8], size: usize| -> [Bytes; 2] {
        [
            Bytes::copy_from_slice(&values[..size]),
            Bytes::copy_from_slice(&values[size..]),
        ]
    };
    let (datatype, values) = match (
        c.int32_false_true.as_slice(),
        c.fp32_false_true.as_slice(),
        c.bool_false_true.as_slice(),
    ) {
        ([f, t], [], []) => (
            DataType::Int32,
            pair(&[f.to_le_bytes(), t.to_le_bytes()].concat(), 4),
        ),
        ([], [f, t], []) => (
            DataType::Fp32,
            pair(&[f.to_le_bytes(), t.to_le_bytes()].concat(), 4),
        ),
        ([], [], [f, t]) => (DataType::Bool, pair(&[u8::from(*f), u8::from(*t)], 1)),
        _ => {
            return Err(format!(
                "control input '{}' needs one of int32_false_true, fp32_false_true or bool_false_true with two values",
                input.name
            ));
        }
    };
    Ok(Control {
        input: input.name.clone(),
        kind,
        datatype,
        values,
    })
}

/// An implicit state of the configuration, with its first value.
fn state(
    spec: &pb::model_sequence_batching::State,
    model_dir: &std::path::Path,
) -> Result<StateSpec, String> {
    let datatype = crate::config::datatype_from_config(spec.data_type)
        .ok_or_else(|| format!("state '{}' has no valid data_type", spec.input_name))?;
    if spec.dims.iter().any(|&d| d < 0) {
        return Err(format!(
            "state '{}' has a variable dimension: tessera keeps states of fixed dims only",
            spec.input_name
        ));
    }
    let count = crate::tensor::element_count(&spec.dims)
        .map_err(|e| format!("state '{}': {e}", spec.input_name))?;
    let zeros = || -> Result<TensorData, String> {
        Ok(match crate::tensor::byte_size(datatype, count) {
            Some(bytes) => {
                let bytes = bytes.map_err(|e| format!("state '{}': {e}", spec.input_name))?;
                TensorData::Raw(Bytes::from(vec![0u8; bytes]))
            }
            None => TensorData::Elements(vec![Bytes::new(); count]),
        })
    };
    let data = match spec.initial_state.as_slice() {
        [] => zeros()?,
        [initial] => match &initial.state_data {
            Some(pb::model_sequence_batching::initial_state::StateData::DataFile(file)) => {
                let path = model_dir.join("initial_state").join(file);
                let bytes = std::fs::read(&path).map_err(|e| {
                    format!(
                        "state '{}': cannot read initial_state/{file}: {e}",
                        spec.input_name
                    )
                })?;
                let tensor = Tensor::new(
                    spec.input_name.clone(),
                    datatype,
                    spec.dims.clone(),
                    TensorData::Raw(Bytes::from(bytes)),
                );
                tensor.check_consistent()?;
                tensor.data
            }
            _ => zeros()?,
        },
        _ => {
            return Err(format!(
                "state '{}' has more than one initial_state",
                spec.input_name
            ));
        }
    };
    Ok(StateSpec {
        input: spec.input_name.clone(),
        output: spec.output_name.clone(),
        initial: Tensor::new(spec.input_name.clone(), datatype, spec.dims.clone(), data),
    })
}

/// Releases the sequences idle for longer than `idle`, for as long as the sequencer lives.
async fn release_idle(sequencer: Weak<Sequencer>, idle: Duration) {
    let period = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(sequencer) = sequencer.upgrade() else {
            return;
        };
        let expired: Vec<Arc<Sequence>> = sequencer
            .lock()
            .values()
            // A sequence whose request is running is not idle.
            .filter(|s| s.idle_for() > idle && s.turn.try_lock().is_ok())
            .cloned()
            .collect();
        for sequence in expired {
            sequence.closed.store(true, Ordering::Release);
            sequencer.remove(&sequence);
            sequencer.counts.expired.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                model = %sequencer.model,
                sequence = %sequence.id,
                "sequence idle for more than {} µs (max_sequence_idle_microseconds): released",
                idle.as_micros()
            );
        }
    }
}
