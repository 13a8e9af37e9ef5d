//! Auto-completion of a configuration from the model file, as Triton does with
//! `--strict-model-config=false` or when `config.pbtxt` is missing.

use super::{ModelConfig, datatype_to_config, pb};
use crate::tensor::DataType;

/// Triton's `--backend-config=default-max-batch-size` default.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// One input or output as the model file declares it (-1 for a symbolic dimension).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSignature {
    pub name: String,
    pub datatype: DataType,
    pub dims: Vec<i64>,
}

/// What a model file says about its inputs and outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSignature {
    pub inputs: Vec<TensorSignature>,
    pub outputs: Vec<TensorSignature>,
}

impl ModelSignature {
    /// True when every tensor's first dimension is symbolic, i.e. the model takes a batch.
    fn batchable(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .all(|t| t.dims.first() == Some(&-1))
    }
}

/// Fills in what the configuration leaves out: max_batch_size, inputs, outputs.
/// Explicit settings are kept. Returns the names of the fields it filled, for the log.
pub fn autocomplete(config: &mut ModelConfig, signature: &ModelSignature) -> Vec<&'static str> {
    let mut filled = Vec::new();
    // Triton's ONNX Runtime backend also fills in max_batch_size for a config that asks for
    // dynamic batching without it, when its inputs and outputs leave out the model's dynamic
    // first dimension (they are the per-request dims of a batching model).
    let batching_without_size = super::dynamic_batching(config).is_some()
        && !config.input.is_empty()
        && dims_leave_out_batch(config, signature);
    if config.max_batch_size == 0
        && (config.input.is_empty() || batching_without_size)
        && signature.batchable()
    {
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
        if config.scheduling_choice.is_none() {
            config.scheduling_choice = Some(pb::model_config::SchedulingChoice::DynamicBatching(
                pb::ModelDynamicBatching::default(),
            ));
        }
        filled.push("max_batch_size");
    }
    let skip = usize::from(config.max_batch_size > 0);
    if config.input.is_empty() {
        config.input = signature
            .inputs
            .iter()
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: datatype_to_config(t.datatype) as i32,
                dims: t.dims.iter().skip(skip).copied().collect(),
                ..Default::default()
            })
            .collect();
        filled.push("input");
    }
    if config.output.is_empty() {
        config.output = signature
            .outputs
            .iter()
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: datatype_to_config(t.datatype) as i32,
                dims: t.dims.iter().skip(skip).copied().collect(),
                ..Default::default()
            })
            .collect();
        filled.push("output");
    }
    filled
}

/// Whether every configured input and output is one dimension shorter than the model's tensor of
/// that name (whose first dimension is the batch).
fn dims_leave_out_batch(config: &ModelConfig, signature: &ModelSignature) -> bool {
    let declared = |name: &str, list: &[TensorSignature]| {
        list.iter().find(|t| t.name == name).map(|t| t.dims.len())
    };
    config
        .input
        .iter()
        .all(|i| declared(&i.name, &signature.inputs).is_some_and(|n| n == i.dims.len() + 1))
        && config
            .output
            .iter()
            .all(|o| declared(&o.name, &signature.outputs).is_some_and(|n| n == o.dims.len() + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(dims: Vec<i64>) -> ModelSignature {
        ModelSignature {
            inputs: vec![TensorSignature {
                name: "x".into(),
                datatype: DataType::Fp32,
                dims: dims.clone(),
            }],
            outputs: vec![TensorSignature {
                name: "y".into(),
                datatype: DataType::Fp32,
                dims,
            }],
        }
    }

    #[test]
    fn batchable_model_gets_default_batch_and_stripped_dims() {
        let mut config = ModelConfig::default();
        autocomplete(&mut config, &sig(vec![-1, 16]));
        assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
        assert_eq!(config.input[0].dims, vec![16]);
        assert!(super::super::dynamic_batching(&config).is_some());
    }

    #[test]
    fn fixed_model_is_not_batched() {
        let mut config = ModelConfig::default();
        autocomplete(&mut config, &sig(vec![2, 16]));
        assert_eq!(config.max_batch_size, 0);
        assert_eq!(config.output[0].dims, vec![2, 16]);
    }

    #[test]
    fn explicit_inputs_are_kept() {
        let mut config = ModelConfig {
            max_batch_size: 2,
            ..Default::default()
        };
        config.input.push(pb::ModelInput {
            name: "mine".into(),
            ..Default::default()
        });
        autocomplete(&mut config, &sig(vec![-1, 16]));
        assert_eq!(config.input[0].name, "mine");
        assert_eq!(config.output[0].dims, vec![16]);
    }

    #[test]
    fn dynamic_batching_without_max_batch_size_gets_the_default() {
        // As Triton's ONNX Runtime backend: dynamic_batching {} with max_batch_size left out,
        // per-request dims, and a model whose first dimension is dynamic.
        let mut config = super::super::parse(
            r#"platform: "onnxruntime_onnx"
               input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]
               dynamic_batching { }"#,
            "c",
        )
        .expect("parses");
        let filled = autocomplete(&mut config, &sig(vec![-1, 16]));
        assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE, "{filled:?}");
        assert_eq!(config.input[0].dims, vec![16]);
        assert!(super::super::validate(&config).is_ok());
        // Full-shape dims (the batch included) are not reinterpreted.
        let mut full = super::super::parse(
            r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
               dynamic_batching { }"#,
            "c",
        )
        .expect("parses");
        autocomplete(&mut full, &sig(vec![-1, 16]));
        assert_eq!(full.max_batch_size, 0);
    }
}
