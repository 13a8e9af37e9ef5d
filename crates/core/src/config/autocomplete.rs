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

/// Takes what a model's own completion (a handler's `auto_complete_config`) may set, and only
/// where `read` (the configuration as written) left it open; any other change is refused,
/// named. The rules of Triton's `pb_utils.ModelConfig`:
/// - `max_batch_size`: may be set, but not below a size `read` gives;
/// - `input`, `output`: tensors may be added; a tensor `read` declares stays, with its
///   `data_type` (settable where `read` has none), its `dims` (settable where `read` has none),
///   an input's `optional` (settable where `read` leaves it false) and every other setting;
/// - `dynamic_batching`: may be added where `read` sets no scheduler;
/// - `model_transaction_policy.decoupled`: may be set where `read` leaves it false.
pub fn merge_completion(read: &ModelConfig, completed: ModelConfig) -> Result<ModelConfig, String> {
    use pb::model_config::SchedulingChoice;
    let mut rest = completed.clone();
    rest.max_batch_size = read.max_batch_size;
    rest.input.clone_from(&read.input);
    rest.output.clone_from(&read.output);
    rest.model_transaction_policy
        .clone_from(&read.model_transaction_policy);
    if read.scheduling_choice.is_none()
        && matches!(
            rest.scheduling_choice,
            Some(SchedulingChoice::DynamicBatching(_))
        )
    {
        rest.scheduling_choice = None;
    }
    if rest != *read {
        return Err(format!(
            "it may set only max_batch_size, input, output, dynamic_batching (where no scheduler is set) and model_transaction_policy, and it changed {}",
            changed_fields(read, &rest).join(", ")
        ));
    }
    if read.max_batch_size > completed.max_batch_size {
        return Err(format!(
            "the configuration sets max_batch_size {}, the model {}: a configuration may ask for less than the model allows, not more",
            read.max_batch_size, completed.max_batch_size
        ));
    }
    for declared in &read.input {
        let Some(given) = completed.input.iter().find(|i| i.name == declared.name) else {
            return Err(format!("it removed input '{}'", declared.name));
        };
        let mut compared = given.clone();
        if declared.data_type == pb::DataType::TypeInvalid as i32 {
            compared.data_type = declared.data_type;
        }
        if declared.dims.is_empty() {
            compared.dims.clone_from(&declared.dims);
        }
        if !declared.optional {
            compared.optional = false;
        }
        tensor_unchanged(
            "input",
            &declared.name,
            (declared.data_type, &declared.dims),
            (given.data_type, &given.dims),
            compared == *declared,
        )?;
    }
    for declared in &read.output {
        let Some(given) = completed.output.iter().find(|o| o.name == declared.name) else {
            return Err(format!("it removed output '{}'", declared.name));
        };
        let mut compared = given.clone();
        if declared.data_type == pb::DataType::TypeInvalid as i32 {
            compared.data_type = declared.data_type;
        }
        if declared.dims.is_empty() {
            compared.dims.clone_from(&declared.dims);
        }
        tensor_unchanged(
            "output",
            &declared.name,
            (declared.data_type, &declared.dims),
            (given.data_type, &given.dims),
            compared == *declared,
        )?;
    }
    let decoupled = |c: &ModelConfig| {
        c.model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled)
    };
    if decoupled(read) && !decoupled(&completed) {
        return Err(
            "the configuration sets model_transaction_policy { decoupled: true } and the model says it is not decoupled".into(),
        );
    }
    Ok(completed)
}

/// Names the first difference between a tensor as the configuration declares it and as the
/// completion gives it, in Triton's words.
fn tensor_unchanged(
    kind: &str,
    name: &str,
    (declared_type, declared_dims): (i32, &[i64]),
    (given_type, given_dims): (i32, &[i64]),
    same: bool,
) -> Result<(), String> {
    if same {
        return Ok(());
    }
    let type_name = |t: i32| {
        pb::DataType::try_from(t).map_or_else(|_| t.to_string(), |t| t.as_str_name().to_owned())
    };
    if declared_type != pb::DataType::TypeInvalid as i32 && declared_type != given_type {
        return Err(format!(
            "{kind} '{name}': the configuration expects data_type {}, the model gives {}",
            type_name(declared_type),
            type_name(given_type)
        ));
    }
    if !declared_dims.is_empty() && declared_dims != given_dims {
        return Err(format!(
            "{kind} '{name}': the configuration expects dims {declared_dims:?}, the model gives {given_dims:?}"
        ));
    }
    Err(format!(
        "{kind} '{name}': it changed settings the configuration gives (only data_type, dims and optional may be filled in)"
    ))
}

/// The top-level fields of two configurations that differ, by their JSON names.
fn changed_fields(a: &ModelConfig, b: &ModelConfig) -> Vec<String> {
    let (serde_json::Value::Object(a), serde_json::Value::Object(b)) =
        (super::to_json(a), super::to_json(b))
    else {
        return vec!["the configuration".into()];
    };
    let mut changed: Vec<String> = a
        .iter()
        .filter(|(key, value)| b.get(*key) != Some(*value))
        .map(|(key, _)| key.clone())
        .collect();
    changed.extend(b.keys().filter(|k| !a.contains_key(*k)).cloned());
    changed
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

    fn config(text: &str) -> ModelConfig {
        super::super::parse(text, "config.pbtxt").expect("parses")
    }

    /// What Triton's auto_complete example does: inputs, outputs, a batch size, dynamic batching.
    fn completed_by_the_model(read: &ModelConfig) -> ModelConfig {
        let mut completed = read.clone();
        for name in ["INPUT0", "INPUT1"] {
            match completed.input.iter_mut().find(|i| i.name == name) {
                // pb_utils' add_input fills in a declared tensor's type and dims.
                Some(declared) => {
                    declared.data_type = pb::DataType::TypeFp32 as i32;
                    declared.dims = vec![4];
                }
                None => completed.input.push(pb::ModelInput {
                    name: name.into(),
                    data_type: pb::DataType::TypeFp32 as i32,
                    dims: vec![4],
                    ..Default::default()
                }),
            }
        }
        completed.output.push(pb::ModelOutput {
            name: "OUTPUT0".into(),
            data_type: pb::DataType::TypeFp32 as i32,
            dims: vec![4],
            ..Default::default()
        });
        completed.max_batch_size = 4;
        completed.scheduling_choice.get_or_insert_with(|| {
            pb::model_config::SchedulingChoice::DynamicBatching(Default::default())
        });
        completed
    }

    #[test]
    fn a_completion_fills_what_the_configuration_leaves_open() {
        let read = config(r#"name: "m" backend: "python""#);
        let merged = merge_completion(&read, completed_by_the_model(&read)).expect("accepted");
        assert_eq!(merged.input.len(), 2);
        assert_eq!(merged.output.len(), 1);
        assert_eq!(merged.max_batch_size, 4);
        assert!(super::super::dynamic_batching(&merged).is_some());
        // A tensor the configuration names without a type or dims gets them.
        let read = config(r#"name: "m" backend: "python" input [ { name: "INPUT0" } ]"#);
        let merged = merge_completion(&read, completed_by_the_model(&read)).expect("accepted");
        assert_eq!(merged.input[0].dims, vec![4]);
        // A smaller batch size in the configuration than the model allows is kept... by the
        // model, as pb_utils' set_max_batch_size does; a larger one is refused.
        let read = config(r#"name: "m" backend: "python" max_batch_size: 8"#);
        let err = merge_completion(&read, completed_by_the_model(&read)).unwrap_err();
        assert!(err.contains("max_batch_size 8, the model 4"), "{err}");
    }

    #[test]
    fn a_completion_cannot_contradict_the_configuration() {
        let read = config(
            r#"name: "m" backend: "python"
               input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]"#,
        );
        let err = merge_completion(&read, {
            let mut c = completed_by_the_model(&read);
            c.input[0].data_type = pb::DataType::TypeFp32 as i32;
            c.input[0].dims = vec![4];
            c
        })
        .unwrap_err();
        assert!(
            err.contains("input 'INPUT0'")
                && err.contains("TYPE_INT32")
                && err.contains("TYPE_FP32"),
            "{err}"
        );
        let err = merge_completion(&read, {
            let mut c = completed_by_the_model(&read);
            c.input[0].data_type = pb::DataType::TypeInt32 as i32;
            c.input[0].dims = vec![8];
            c
        })
        .unwrap_err();
        assert!(err.contains("dims [4]") && err.contains("[8]"), "{err}");
        let err = merge_completion(&read, {
            let mut c = completed_by_the_model(&read);
            c.input.retain(|i| i.name != "INPUT0");
            c
        })
        .unwrap_err();
        assert!(err.contains("removed input 'INPUT0'"), "{err}");
        // Another scheduler than the one configured, and decoupled turned off.
        let read = config(r#"name: "m" backend: "python" sequence_batching { }"#);
        let mut completed = completed_by_the_model(&read);
        completed.scheduling_choice = Some(pb::model_config::SchedulingChoice::DynamicBatching(
            Default::default(),
        ));
        let err = merge_completion(&read, completed).unwrap_err();
        assert!(err.contains("changed"), "{err}");
        let read =
            config(r#"name: "m" backend: "python" model_transaction_policy { decoupled: true }"#);
        let mut completed = read.clone();
        completed.model_transaction_policy = None;
        let err = merge_completion(&read, completed).unwrap_err();
        assert!(err.contains("decoupled"), "{err}");
    }

    #[test]
    fn a_completion_cannot_touch_anything_else() {
        let read = config(r#"name: "m" backend: "python""#);
        for (field, change) in [
            (
                "name",
                (|c: &mut ModelConfig| c.name = "other".into()) as fn(&mut ModelConfig),
            ),
            ("backend", |c| c.backend = "onnxruntime".into()),
            ("instance_group", |c| {
                c.instance_group.push(pb::ModelInstanceGroup {
                    count: 64,
                    ..Default::default()
                })
            }),
            ("parameters", |c| {
                c.parameters.insert(
                    "max_memory_bytes".into(),
                    pb::ModelParameter {
                        string_value: "1000000000000".into(),
                    },
                );
            }),
        ] {
            let mut completed = completed_by_the_model(&read);
            change(&mut completed);
            let err = merge_completion(&read, completed).unwrap_err();
            assert!(
                err.contains("may set only") && err.contains(field),
                "{field}: {err}"
            );
        }
        // Decoupled may be turned on where the configuration leaves it off.
        let mut completed = read.clone();
        completed.model_transaction_policy = Some(pb::ModelTransactionPolicy { decoupled: true });
        assert!(merge_completion(&read, completed).is_ok());
    }
}
