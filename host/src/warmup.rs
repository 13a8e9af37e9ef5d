//! Model warmup (`model_warmup`): requests a version runs through its own queue before it is
//! reported READY, so the first real request does not pay for lazy initialisation.

use std::path::Path;

use crate::config::{datatype_from_config, pb};
use crate::infer::{CallContext, InferError, InferRequest};
use crate::model::ModelVersion;
use crate::tensor::{Bytes, DataType, Tensor, TensorData, element_count};

/// Builds the request of one warmup entry. `model_dir` holds `warmup/<input_data_file>`.
fn request(
    warmup: &pb::ModelWarmup,
    batched: bool,
    model_dir: &Path,
) -> Result<InferRequest, String> {
    let mut inputs = Vec::new();
    let mut names: Vec<&String> = warmup.inputs.keys().collect();
    names.sort();
    for name in names {
        let input = &warmup.inputs[name];
        let datatype = datatype_from_config(input.data_type).ok_or_else(|| {
            format!(
                "warmup '{}' input '{name}' has no valid data_type",
                warmup.name
            )
        })?;
        let mut shape = Vec::with_capacity(input.dims.len() + 1);
        if batched {
            shape.push(i64::from(warmup.batch_size.max(1)));
        }
        shape.extend(&input.dims);
        let count = element_count(&shape)
            .ok()
            .filter(|&n| n.saturating_mul(datatype.size().unwrap_or(1)) <= MAX_WARMUP_INPUT_BYTES)
            .ok_or_else(|| {
                format!(
                    "warmup '{}' input '{name}' has invalid dims {:?} (at most {MAX_WARMUP_INPUT_BYTES} bytes per input)",
                    warmup.name, input.dims
                )
            })?;
        use pb::model_warmup::input::InputDataType;
        let data = match &input.input_data_type {
            Some(InputDataType::InputDataFile(file)) => {
                // `file` stays inside the model's folder (config::check_file_names).
                let path = model_dir.join("warmup").join(file);
                let bytes = std::fs::read(&path).map_err(|e| {
                    tracing::warn!(path = %path.display(), "cannot read a warmup file: {e}");
                    format!("cannot read warmup/{file} ({})", e.kind())
                })?;
                match datatype.size() {
                    Some(_) => TensorData::Raw(bytes.into()),
                    None if count.saturating_mul(bytes.len()) > MAX_WARMUP_INPUT_BYTES => {
                        return Err(format!(
                            "warmup '{}' input '{name}': {count} copies of warmup/{file} would exceed {MAX_WARMUP_INPUT_BYTES} bytes",
                            warmup.name,
                        ));
                    }
                    // Every element shares the file's one buffer.
                    None => TensorData::Elements(vec![Bytes::from(bytes); count]),
                }
            }
            Some(InputDataType::RandomData(true)) => filler(datatype, count, true),
            _ => filler(datatype, count, false),
        };
        inputs.push(Tensor::new(name.clone(), datatype, shape, data));
    }
    Ok(InferRequest {
        id: format!("warmup:{}", warmup.name),
        inputs,
        ..Default::default()
    })
}

/// The largest warmup input the server builds: warmup data is generated from declared dims, and
/// a typo in a config must not make the server allocate without bound.
const MAX_WARMUP_INPUT_BYTES: usize = 256 << 20;

/// Zeros, or deterministic pseudo-random bytes (a warmup needs variety, not entropy).
fn filler(datatype: DataType, count: usize, random: bool) -> TensorData {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state & 0x7f) as u8 // small positive values are valid for every numeric type
    };
    match datatype.size() {
        None => TensorData::Elements(
            (0..count)
                .map(|_| {
                    if random {
                        Bytes::from(vec![b'a' + next() % 26; 8])
                    } else {
                        Bytes::new()
                    }
                })
                .collect(),
        ),
        Some(size) => TensorData::Raw(
            (0..count * size)
                .map(|i| {
                    if random && (datatype != DataType::Bool || i % size == 0) {
                        next() % if datatype == DataType::Bool { 2 } else { 128 }
                    } else {
                        0
                    }
                })
                .collect::<Vec<u8>>()
                .into(),
        ),
    }
}

/// The most times one warmup entry runs: models load one after another, so a warmup that
/// would run for hours (`count: 4000000000`) would keep every model after it from serving.
pub const MAX_WARMUP_COUNT: u32 = 1000;

/// Runs every warmup entry `count` times (at least once). Errors name the entry.
pub async fn run(model: &ModelVersion, model_dir: &Path) -> Result<(), String> {
    let batched = model.config.max_batch_size > 0;
    if let Some(warmup) = model
        .config
        .model_warmup
        .iter()
        .find(|w| w.count > MAX_WARMUP_COUNT)
    {
        return Err(format!(
            "warmup '{}' has count {}; at most {MAX_WARMUP_COUNT} runs of one warmup entry are allowed",
            warmup.name, warmup.count
        ));
    }
    for warmup in &model.config.model_warmup {
        let request = request(warmup, batched, model_dir)?;
        for _ in 0..warmup.count.max(1) {
            let cx = CallContext {
                warmup: true,
                ..CallContext::root()
            };
            model
                .infer(cx, request.clone())
                .await
                .map_err(|e: InferError| {
                    format!("warmup '{}' failed: {}", warmup.name, e.message)
                })?;
        }
        tracing::info!(model = %model.name, version = model.version, warmup = %warmup.name, "warmup done");
    }
    Ok(())
}
