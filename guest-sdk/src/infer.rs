//! Business logic scripting: calling other models of the same server.

use crate::{DataType, Error, Request, Response};

/// One input or output of a model, as its metadata describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMetadata {
    /// The tensor's name.
    pub name: String,
    /// Its datatype.
    pub datatype: DataType,
    /// Its dimensions; -1 marks a variable dimension.
    pub shape: Vec<i64>,
}

/// A model's metadata, as `GET /v2/models/{name}` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelMetadata {
    /// The model's name.
    pub name: String,
    /// Its available versions.
    pub versions: Vec<String>,
    /// Its platform or backend, e.g. `"onnxruntime_onnx"` or `"wasm"`.
    pub platform: String,
    /// Its inputs.
    pub inputs: Vec<TensorMetadata>,
    /// Its outputs.
    pub outputs: Vec<TensorMetadata>,
}

/// Runs `model` (`version` `None` = the latest ready version) on `request` and waits for the
/// answer.
///
/// The call enters the target model's queue exactly as an HTTP request does, so the target's
/// dynamic batcher merges it with other traffic. Calls that would form a cycle back into a
/// calling model, or nest deeper than the host's limit, fail with
/// [`ErrorKind::QuotaExceeded`](crate::ErrorKind::QuotaExceeded) instead of deadlocking. The
/// error is the target's own (its kind and message); add [`context`](crate::ResultExt::context)
/// before returning it as this model's error.
///
/// ```no_run
/// use tessera_guest::{infer, Request, ResultExt, Tensor};
///
/// let request = Request::builder()
///     .input(Tensor::from_f32("INPUT0", [1, 2], &[1.0, 2.0]))
///     .input(Tensor::from_f32("INPUT1", [1, 2], &[3.0, 4.0]))
///     .build();
/// let response = infer("add_sub", None, request).context("calling add_sub")?;
/// let sum = response.output("OUTPUT0")?.as_f32()?;
/// # Ok::<(), tessera_guest::Error>(())
/// ```
///
/// Outside a Wasm component (in host-side unit tests) the call goes to the function installed
/// with [`testing::set_infer`](crate::testing::set_infer), or fails with an `internal` error.
pub fn infer(model: &str, version: Option<i64>, request: Request) -> Result<Response, Error> {
    #[cfg(target_arch = "wasm32")]
    {
        let request = request.into();
        crate::bindings::tessera::inference::inference::infer(model, version, &request)
            .map(Into::into)
            .map_err(Into::into)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::testing::call_infer(model, version, request)
    }
}

/// Looks up a model's metadata (`version` `None` = the latest ready version).
///
/// Outside a Wasm component this fails with an `internal` error.
pub fn model_metadata(model: &str, version: Option<i64>) -> Result<ModelMetadata, Error> {
    #[cfg(target_arch = "wasm32")]
    {
        let tensors = |list: Vec<crate::bindings::tessera::inference::types::TensorMetadata>| {
            list.into_iter()
                .map(|t| TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.into(),
                    shape: t.shape,
                })
                .collect()
        };
        crate::bindings::tessera::inference::inference::model_metadata(model, version)
            .map(|m| ModelMetadata {
                name: m.name,
                versions: m.versions,
                platform: m.platform,
                inputs: tensors(m.inputs),
                outputs: tensors(m.outputs),
            })
            .map_err(Into::into)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        Err(Error::internal(format!(
            "model_metadata('{model}', {version:?}) needs a Tessera host: it only works inside a Wasm component"
        )))
    }
}
