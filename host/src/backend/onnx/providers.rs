//! Which ONNX Runtime execution providers a GPU instance's session gets, read the way Triton's
//! onnxruntime backend reads them:
//!
//! - `optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" ... } ] } }`
//!   puts TensorRT first, with `precision_mode` (`FP32`, `FP16`, `BF16`, `INT8`),
//!   `max_workspace_size_bytes`, the `int8_*` calibration keys and the `trt_*` keys passed to
//!   ONNX Runtime as they are; any other key is refused. `name: "cuda"` passes its keys to the
//!   CUDA provider unchecked, but for those the server owns (`device_id`, the stream) and CUDA
//!   graphs (which need fixed input addresses).
//! - The CUDA provider always follows (it runs what TensorRT does not take), on the instance's
//!   device and stream.
//! - The model's `parameters` `cudnn_conv_algo_search` (0 exhaustive, 1 heuristic, 2 default),
//!   `gpu_mem_limit`, `arena_extend_strategy` (0 next power of two, 1 same as requested) and
//!   `do_copy_in_default_stream` set the CUDA provider's options of those names, over the
//!   accelerator's.
//! - `cpu_execution_accelerator`: `openvino` is Triton's only one and is not available here.
//!
//! A provider that cannot be registered (a CPU-only ONNX Runtime, TensorRT not installed) fails
//! the load with the reason, never a silent run on the CPU.

use crate::backend::LoadError;
use crate::config::ModelConfig;
use crate::config::pb::model_optimization_policy::ExecutionAccelerators;

/// The execution providers of a GPU instance's session, as ONNX Runtime option keys and values.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GpuProviders {
    /// TensorRT's options, when the configuration asks for it; it is registered first.
    pub tensorrt: Option<Vec<(String, String)>>,
    /// The CUDA provider's options (registered after TensorRT, always).
    pub cuda: Vec<(String, String)>,
}

enum Value {
    Bool,
    Int,
    Text,
}

/// TensorRT keys Triton passes to ONNX Runtime unchanged, and what their values must be.
const TENSORRT_KEYS: &[(&str, Value)] = &[
    ("trt_max_partition_iterations", Value::Int),
    ("trt_min_subgraph_size", Value::Int),
    ("trt_dla_enable", Value::Bool),
    ("trt_dla_core", Value::Int),
    ("trt_engine_cache_enable", Value::Bool),
    ("trt_engine_cache_path", Value::Text),
    ("trt_engine_cache_prefix", Value::Text),
    ("trt_dump_subgraphs", Value::Bool),
    ("trt_force_sequential_engine_build", Value::Bool),
    ("trt_context_memory_sharing_enable", Value::Bool),
    ("trt_layer_norm_fp32_fallback", Value::Bool),
    ("trt_timing_cache_enable", Value::Bool),
    ("trt_timing_cache_path", Value::Text),
    ("trt_force_timing_cache", Value::Bool),
    ("trt_detailed_build_log", Value::Bool),
    ("trt_build_heuristics_enable", Value::Bool),
    ("trt_sparsity_enable", Value::Bool),
    ("trt_builder_optimization_level", Value::Int),
    ("trt_auxiliary_streams", Value::Int),
    ("trt_tactic_sources", Value::Text),
    ("trt_extra_plugin_lib_paths", Value::Text),
    ("trt_profile_min_shapes", Value::Text),
    ("trt_profile_max_shapes", Value::Text),
    ("trt_profile_opt_shapes", Value::Text),
    ("trt_cuda_graph_enable", Value::Bool),
    ("trt_dump_ep_context_model", Value::Bool),
    ("trt_ep_context_file_path", Value::Text),
    ("trt_ep_context_embed_mode", Value::Int),
    ("trt_int8_calibration_table_name", Value::Text),
    ("trt_int8_use_native_calibration_table", Value::Bool),
];

fn accelerators(config: &ModelConfig) -> Option<&ExecutionAccelerators> {
    config
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref())
}

fn check_value(accelerator: &str, key: &str, value: &str, kind: &Value) -> Result<(), LoadError> {
    let ok = match kind {
        Value::Bool => matches!(
            value.to_ascii_lowercase().as_str(),
            "true" | "false" | "1" | "0"
        ),
        Value::Int => value.trim().parse::<i64>().is_ok(),
        Value::Text => true,
    };
    if ok {
        Ok(())
    } else {
        Err(LoadError::invalid(format!(
            "{accelerator} execution accelerator: parameter '{key}' has value '{value}', expected {}",
            match kind {
                Value::Bool => "true or false",
                Value::Int => "an integer",
                Value::Text => "text",
            }
        )))
    }
}

/// Normalises a boolean the way ONNX Runtime's option parser reads it.
fn bool_text(value: &str) -> &'static str {
    if matches!(value.to_ascii_lowercase().as_str(), "true" | "1") {
        "1"
    } else {
        "0"
    }
}

/// Checks the accelerators and the GPU `parameters` of a configuration, and says which providers
/// a GPU instance gets. Called for every ONNX model, so a typo fails the load on any machine.
pub fn gpu_providers(config: &ModelConfig) -> Result<GpuProviders, LoadError> {
    let mut providers = GpuProviders::default();
    if let Some(accelerators) = accelerators(config) {
        if let Some(accelerator) = accelerators.cpu_execution_accelerator.first() {
            return Err(match accelerator.name.as_str() {
                "openvino" => LoadError::unsupported(
                    "the openvino CPU execution accelerator is not available in tessera (remove it to run on ONNX Runtime's CPU provider)",
                ),
                other => LoadError::invalid(format!(
                    "unknown Execution Accelerator '{other}' is requested"
                )),
            });
        }
        for accelerator in &accelerators.gpu_execution_accelerator {
            let mut sorted: Vec<(&String, &String)> = accelerator.parameters.iter().collect();
            sorted.sort();
            match accelerator.name.as_str() {
                "tensorrt" => {
                    let mut options = Vec::new();
                    for (key, value) in sorted {
                        tensorrt_option(key, value, &mut options)?;
                    }
                    providers.tensorrt = Some(options);
                }
                "cuda" => {
                    for (key, value) in sorted {
                        if let Some(why) = server_owned(key) {
                            return Err(LoadError::invalid(format!(
                                "cuda execution accelerator: parameter '{key}' cannot be set: {why}"
                            )));
                        }
                        if matches!(
                            key.as_str(),
                            "do_copy_in_default_stream" | "use_ep_level_unified_stream"
                        ) {
                            check_value("cuda", key, value, &Value::Bool)?;
                            set(&mut providers.cuda, key, bool_text(value));
                        } else {
                            set(&mut providers.cuda, key, value);
                        }
                    }
                }
                other => {
                    return Err(LoadError::invalid(format!(
                        "unknown Execution Accelerator '{other}' is requested"
                    )));
                }
            }
        }
    }
    model_cuda_parameters(config, &mut providers.cuda)?;
    Ok(providers)
}

/// CUDA provider options the server sets itself, or that cannot work with how it runs sessions.
fn server_owned(key: &str) -> Option<&'static str> {
    match key {
        "device_id" => Some("the device is the instance's GPU (instance_group.gpus)"),
        "has_user_compute_stream" | "user_compute_stream" => {
            Some("each instance runs on a CUDA stream the server creates for it")
        }
        "enable_cuda_graph" => Some(
            "CUDA graphs need inputs at fixed device addresses, and batches are copied in per run",
        ),
        _ => None,
    }
}

fn tensorrt_option(
    key: &str,
    value: &str,
    options: &mut Vec<(String, String)>,
) -> Result<(), LoadError> {
    match key {
        "precision_mode" => match value {
            "FP32" => {}
            "FP16" => set(options, "trt_fp16_enable", "1"),
            "BF16" => set(options, "trt_bf16_enable", "1"),
            "INT8" => set(options, "trt_int8_enable", "1"),
            other => {
                return Err(LoadError::invalid(format!(
                    "unsupported precision mode '{other}' is requested (FP32, FP16, BF16 or INT8)"
                )));
            }
        },
        "max_workspace_size_bytes" => {
            check_value("tensorrt", key, value, &Value::Int)?;
            set(options, "trt_max_workspace_size", value.trim());
        }
        "int8_calibration_table_name" | "int8_use_native_calibration_table" => {
            let ort_key = format!("trt_{key}");
            tensorrt_option(&ort_key, value, options)?;
        }
        _ => {
            let Some((_, kind)) = TENSORRT_KEYS.iter().find(|(k, _)| *k == key) else {
                return Err(LoadError::invalid(format!(
                    "unknown parameter '{key}' is provided for TensorRT Execution Accelerator"
                )));
            };
            check_value("tensorrt", key, value, kind)?;
            let value = match kind {
                Value::Bool => bool_text(value),
                _ => value,
            };
            set(options, key, value);
        }
    }
    Ok(())
}

/// The model-level `parameters` Triton's backend turns into CUDA provider options.
fn model_cuda_parameters(
    config: &ModelConfig,
    cuda: &mut Vec<(String, String)>,
) -> Result<(), LoadError> {
    let parameter = |key: &str| crate::config::string_parameter(config, key).map(str::trim);
    // Triton numbers these choices; ONNX Runtime names them.
    const CHOICES: [(&str, &[&str], &str); 2] = [
        (
            "cudnn_conv_algo_search",
            &["EXHAUSTIVE", "HEURISTIC", "DEFAULT"],
            "0, 1 or 2",
        ),
        (
            "arena_extend_strategy",
            &["kNextPowerOfTwo", "kSameAsRequested"],
            "0 or 1",
        ),
    ];
    for (key, names, allowed) in CHOICES {
        if let Some(v) = parameter(key) {
            let name = v
                .parse::<usize>()
                .ok()
                .and_then(|i| names.get(i))
                .ok_or_else(|| {
                    LoadError::invalid(format!(
                        "unsupported {key} value '{v}' is requested ({allowed})"
                    ))
                })?;
            set(cuda, key, name);
        }
    }
    if let Some(v) = parameter("gpu_mem_limit") {
        v.parse::<u64>().map_err(|_| {
            LoadError::invalid(format!(
                "gpu_mem_limit must be a number of bytes, got '{v}'"
            ))
        })?;
        set(cuda, "gpu_mem_limit", v);
    }
    if let Some(v) = parameter("do_copy_in_default_stream") {
        check_value("cuda", "do_copy_in_default_stream", v, &Value::Bool)?;
        set(cuda, "do_copy_in_default_stream", bool_text(v));
    }
    Ok(())
}

fn set(options: &mut Vec<(String, String)>, key: &str, value: &str) {
    options.retain(|(k, _)| k != key);
    options.push((key.to_owned(), value.to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn providers(text: &str) -> Result<GpuProviders, LoadError> {
        gpu_providers(&crate::config::parse(text, "c").expect("parses"))
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn tensorrt_parameters_become_onnx_runtime_options() {
        let p = providers(
            r#"optimization { execution_accelerators { gpu_execution_accelerator: [ {
                name: "tensorrt"
                parameters { key: "precision_mode" value: "FP16" }
                parameters { key: "max_workspace_size_bytes" value: "1073741824" }
                parameters { key: "trt_engine_cache_enable" value: "true" }
                parameters { key: "trt_engine_cache_path" value: "/tmp/trt" } } ] } }"#,
        )
        .expect("valid");
        assert_eq!(
            p.tensorrt,
            Some(pairs(&[
                ("trt_max_workspace_size", "1073741824"),
                ("trt_fp16_enable", "1"),
                ("trt_engine_cache_enable", "1"),
                ("trt_engine_cache_path", "/tmp/trt"),
            ]))
        );
        assert!(p.cuda.is_empty());
    }

    #[test]
    fn bad_accelerators_and_parameters_are_refused_by_name() {
        let e = providers(r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } } ] } }"#)
            .expect_err("FP8");
        assert!(
            e.to_string().contains("unsupported precision mode 'FP8'"),
            "{e}"
        );
        let e = providers(r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "workspace" value: "1" } } ] } }"#)
            .expect_err("unknown key");
        assert!(
            e.to_string().contains("unknown parameter 'workspace'"),
            "{e}"
        );
        let e = providers(r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "max_workspace_size_bytes" value: "1G" } } ] } }"#)
            .expect_err("not a number");
        assert!(e.to_string().contains("expected an integer"), "{e}");
        let e = providers(r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tpu" } ] } }"#)
            .expect_err("tpu");
        assert!(
            e.to_string()
                .contains("unknown Execution Accelerator 'tpu'"),
            "{e}"
        );
        let e = providers(r#"optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }"#)
            .expect_err("openvino");
        assert!(matches!(e, LoadError::Unsupported(_)));
        let e = providers(r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "cuda" parameters { key: "device_id" value: "1" } } ] } }"#)
            .expect_err("the server places instances");
        assert!(e.to_string().contains("'device_id' cannot be set"), "{e}");
        let e = providers(
            r#"parameters { key: "cudnn_conv_algo_search" value: { string_value: "7" } }"#,
        )
        .expect_err("7");
        assert!(
            e.to_string().contains("cudnn_conv_algo_search value '7'"),
            "{e}"
        );
    }

    #[test]
    fn model_parameters_override_the_cuda_accelerator() {
        let p = providers(
            r#"optimization { execution_accelerators { gpu_execution_accelerator: [ {
                name: "cuda"
                parameters { key: "cudnn_conv_algo_search" value: "EXHAUSTIVE" }
                parameters { key: "cudnn_conv_use_max_workspace" value: "1" } } ] } }
               parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
               parameters { key: "arena_extend_strategy" value: { string_value: "1" } }"#,
        )
        .expect("valid");
        assert_eq!(p.tensorrt, None);
        assert_eq!(
            p.cuda,
            pairs(&[
                ("cudnn_conv_use_max_workspace", "1"),
                ("cudnn_conv_algo_search", "HEURISTIC"),
                ("arena_extend_strategy", "kSameAsRequested"),
            ])
        );
    }
}
