//! Checks a configuration makes sense before a model is loaded, so problems surface at load time
//! with a message naming the field, not as odd behaviour under traffic.

use std::collections::HashSet;
use std::path::Component;

use super::{ConfigError, ModelConfig, datatype_from_config};
use crate::tensor::element_count;

/// Validates the parts of the configuration every backend relies on.
pub fn validate(config: &ModelConfig) -> Result<(), ConfigError> {
    check_file_names(config)?;
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if config.max_batch_size < 0 {
        return invalid(format!(
            "max_batch_size must be >= 0, got {}",
            config.max_batch_size
        ));
    }
    let mut seen = HashSet::new();
    for (kind, name, data_type, dims, reshape) in config
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims, i.reshape.as_ref()))
        .chain(
            config
                .output
                .iter()
                .map(|o| ("output", &o.name, o.data_type, &o.dims, o.reshape.as_ref())),
        )
    {
        if name.is_empty() {
            return invalid(format!("an {kind} has no name"));
        }
        if !seen.insert((kind, name)) {
            return invalid(format!("{kind} '{name}' is declared twice"));
        }
        if datatype_from_config(data_type).is_none() {
            return invalid(format!(
                "{kind} '{name}' has an unsupported or missing data_type"
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d == 0 || d < -1) {
            return invalid(format!(
                "{kind} '{name}' has invalid dimension {d} (use -1 for variable)"
            ));
        }
        if let Some(reshape) = reshape
            && !dims.contains(&-1)
            && !reshape.shape.contains(&-1)
            && element_count(dims).ok() != element_count(&reshape.shape).ok()
        {
            return invalid(format!(
                "{kind} '{name}': reshape {:?} does not hold the {:?} elements of dims",
                reshape.shape, dims
            ));
        }
    }
    if let Some(batching) = super::dynamic_batching(config) {
        if config.max_batch_size == 0 {
            return invalid("dynamic_batching needs max_batch_size > 0".into());
        }
        if let Some(p) = batching
            .preferred_batch_size
            .iter()
            .find(|&&p| p <= 0 || p > config.max_batch_size)
        {
            return invalid(format!(
                "preferred_batch_size {p} must be in 1..={}",
                config.max_batch_size
            ));
        }
        if batching.priority_levels > 0
            && (batching.default_priority_level == 0
                || batching.default_priority_level > batching.priority_levels)
        {
            return invalid(format!(
                "default_priority_level must be in 1..={} when priority_levels is set",
                batching.priority_levels
            ));
        }
    }
    Ok(())
}

/// Refuses a file name the configuration gives (`default_model_filename`, `cc_model_filenames`,
/// an output's `label_filename`, a warmup's `input_data_file`) unless it stays inside the model's
/// folder: relative, without `..`. Whoever may write a configuration (a deployment, a load with
/// a config override, a handler completing its own) could otherwise make the server read any
/// file it can read, and hand it back as labels, a model or warmup data. Checked before any of
/// those files is opened.
pub fn check_file_names(config: &ModelConfig) -> Result<(), ConfigError> {
    let mut named: Vec<(String, &str)> = Vec::new();
    if !config.default_model_filename.is_empty() {
        named.push((
            "default_model_filename".into(),
            &config.default_model_filename,
        ));
    }
    for (key, file) in &config.cc_model_filenames {
        named.push((format!("cc_model_filenames['{key}']"), file));
    }
    for output in config
        .output
        .iter()
        .filter(|o| !o.label_filename.is_empty())
    {
        named.push((
            format!("output '{}' label_filename", output.name),
            &output.label_filename,
        ));
    }
    for warmup in &config.model_warmup {
        for (input, data) in &warmup.inputs {
            if let Some(super::pb::model_warmup::input::InputDataType::InputDataFile(file)) =
                &data.input_data_type
            {
                named.push((
                    format!(
                        "model_warmup '{}' input '{input}' input_data_file",
                        warmup.name
                    ),
                    file,
                ));
            }
        }
    }
    for (field, file) in named {
        let inside = !file.contains('\0')
            && std::path::Path::new(file)
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            && std::path::Path::new(file)
                .components()
                .any(|c| matches!(c, Component::Normal(_)));
        if !inside {
            return Err(ConfigError::Invalid(format!(
                "{field} {file:?} must name a file inside the model's folder (a relative path \
                 without '..')"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn check(text: &str) -> Result<(), ConfigError> {
        validate(&parse(text, "c").expect("parses"))
    }

    #[test]
    fn accepts_a_plain_model() {
        check("max_batch_size: 8 input { name: \"a\" data_type: TYPE_FP32 dims: [16] } output { name: \"b\" data_type: TYPE_FP32 dims: [-1] }").expect("valid");
    }

    #[test]
    fn rejects_zero_dims_and_duplicates() {
        let e =
            check("input { name: \"a\" data_type: TYPE_FP32 dims: [0] }").expect_err("zero dim");
        assert!(e.to_string().contains("invalid dimension 0"));
        let e = check("input { name: \"a\" data_type: TYPE_FP32 dims: [1] } input { name: \"a\" data_type: TYPE_FP32 dims: [1] }").expect_err("dup");
        assert!(e.to_string().contains("declared twice"));
    }

    #[test]
    fn rejects_batching_without_batch_size() {
        let e = check("dynamic_batching { }").expect_err("needs batch");
        assert!(e.to_string().contains("max_batch_size > 0"));
    }

    #[test]
    fn file_names_must_stay_inside_the_model_folder() {
        let base = "input { name: \"a\" data_type: TYPE_FP32 dims: [1] } ";
        for bad in [
            "default_model_filename: \"/etc/passwd\"",
            "default_model_filename: \"../other/1/model.wasm\"",
            "default_model_filename: \"1/../../x\"",
            "output { name: \"b\" data_type: TYPE_FP32 dims: [1] label_filename: \"/root/.key\" }",
            "output { name: \"b\" data_type: TYPE_FP32 dims: [1] label_filename: \"../../tenants.json\" }",
            "cc_model_filenames { key: \"7.5\" value: \"../x.plan\" }",
            "model_warmup { name: \"w\" batch_size: 1 inputs { key: \"a\" value { data_type: TYPE_FP32 dims: [1] input_data_file: \"../../../etc/shadow\" } } }",
            "default_model_filename: \".\"",
        ] {
            let e = check(&format!("{base}{bad}")).expect_err(bad);
            assert!(
                e.to_string().contains("inside the model's folder"),
                "{bad}: {e}"
            );
        }
        for good in [
            "default_model_filename: \"model.wasm\"",
            "default_model_filename: \"./sub/model.onnx\"",
            "output { name: \"b\" data_type: TYPE_FP32 dims: [1] label_filename: \"labels.txt\" }",
            "model_warmup { name: \"w\" batch_size: 1 inputs { key: \"a\" value { data_type: TYPE_FP32 dims: [1] input_data_file: \"a.bin\" } } }",
        ] {
            check(&format!("{base}{good}")).expect(good);
        }
    }
}
