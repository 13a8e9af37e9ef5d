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
    if config.max_batch_size == 0 && config.input.is_empty() && signature.batchable() {
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
}
