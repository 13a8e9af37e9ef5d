//! What a model looks like from outside: its inputs and outputs as the configuration declares
//! them, and the metadata every front-end reports (`GET /v2/models/{m}`, the WIT `model-metadata`
//! import, and gRPC next). Built once per model version; front-ends only convert it.

use crate::config::{self, ModelConfig};
use crate::tensor::DataType;

/// An input or output as the configuration declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    /// Without the batch dimension; -1 for variable.
    pub dims: Vec<i64>,
    pub optional: bool,
}

impl TensorSpec {
    /// Whether `dims` (without the batch dimension) fit the declared dims: same rank, and equal
    /// wherever the declaration is not -1.
    pub fn accepts(&self, dims: &[i64]) -> bool {
        dims.len() == self.dims.len()
            && dims
                .iter()
                .zip(&self.dims)
                .all(|(&d, &want)| want == -1 || d == want)
    }

    /// The shape clients see: the batch dimension (-1) first when the model batches.
    pub fn client_shape(&self, batched: bool) -> Vec<i64> {
        let mut shape = Vec::with_capacity(self.dims.len() + 1);
        if batched {
            shape.push(-1);
        }
        shape.extend(&self.dims);
        shape
    }
}

/// The inputs and outputs of a configuration, resolved once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signature {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    pub fn of(config: &ModelConfig) -> Signature {
        let spec = |name: &String, data_type: i32, dims: &Vec<i64>, optional: bool| TensorSpec {
            name: name.clone(),
            datatype: config::datatype_from_config(data_type).unwrap_or(DataType::Bytes),
            dims: dims.clone(),
            optional,
        };
        Signature {
            inputs: config
                .input
                .iter()
                .map(|i| spec(&i.name, i.data_type, &i.dims, i.optional))
                .collect(),
            outputs: config
                .output
                .iter()
                .map(|o| spec(&o.name, o.data_type, &o.dims, false))
                .collect(),
        }
    }
}

/// The metadata of one model version, as KServe v2 defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelMetadata {
    pub name: String,
    /// Every version the repository knows for the model (ready or not), ascending.
    pub versions: Vec<i64>,
    /// `platform`, or the `backend` when the configuration names no platform (as Triton does).
    pub platform: String,
    /// Whether the model batches: shapes then start with a -1 batch dimension.
    pub batched: bool,
    /// Whether the model answers with a stream of responses (`decoupled: true`).
    pub decoupled: bool,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

impl ModelMetadata {
    /// The metadata of a version with `config` and `signature`; `versions` come from the
    /// repository.
    pub fn new(
        name: &str,
        config: &ModelConfig,
        signature: &Signature,
        versions: Vec<i64>,
    ) -> ModelMetadata {
        ModelMetadata {
            name: name.to_owned(),
            versions,
            platform: platform(config),
            batched: config.max_batch_size > 0,
            decoupled: config
                .model_transaction_policy
                .as_ref()
                .is_some_and(|p| p.decoupled),
            inputs: signature.inputs.clone(),
            outputs: signature.outputs.clone(),
        }
    }
}

/// What `/v2/models/{m}` reports as the platform: Triton falls back to the backend name.
pub fn platform(config: &ModelConfig) -> String {
    if config.platform.is_empty() {
        config.backend.clone()
    } else {
        config.platform.clone()
    }
}
