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

/// The responses of a streamed call ([`infer_stream`]), read as they come: an iterator of
/// results that ends after the last response (an error ends it too). Dropping it cancels the
/// call: the called model's next send fails.
pub struct ResponseStream {
    #[cfg(target_arch = "wasm32")]
    stream: crate::bindings::tessera::inference::inference::ResponseStream,
    #[cfg(not(target_arch = "wasm32"))]
    responses: std::vec::IntoIter<Result<Response, Error>>,
    ended: bool,
}

/// What [`ResponseStream::try_next`] found.
#[derive(Debug)]
pub enum Polled {
    /// No response yet. A decoupled handler returns from `resume` (with [`crate::Resume::After`]
    /// as a bound) and is resumed as soon as one of the streams it reads has a response.
    Pending,
    /// The next response, or the error that ends the stream.
    Ready(Result<Response, Error>),
    /// The stream has ended.
    Ended,
}

impl ResponseStream {
    /// The next response if one has arrived, without waiting: how a decoupled handler reads
    /// many streams at once (see [`Polled::Pending`]).
    pub fn try_next(&mut self) -> Polled {
        if self.ended {
            return Polled::Ended;
        }
        #[cfg(target_arch = "wasm32")]
        let polled = {
            use crate::bindings::tessera::inference::inference::Polled as Wit;
            match self.stream.try_next() {
                Wit::Pending => Polled::Pending,
                Wit::Ready(result) => Polled::Ready(result.map(Into::into).map_err(Into::into)),
                Wit::Ended => Polled::Ended,
            }
        };
        #[cfg(not(target_arch = "wasm32"))]
        let polled = match self.responses.next() {
            Some(result) => Polled::Ready(result),
            None => Polled::Ended,
        };
        self.ended = !matches!(polled, Polled::Ready(Ok(_)) | Polled::Pending);
        polled
    }
}

impl Iterator for ResponseStream {
    type Item = Result<Response, Error>;

    /// Waits for the next response.
    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        #[cfg(target_arch = "wasm32")]
        let next = self
            .stream
            .next()
            .map(|r| r.map(Into::into).map_err(Into::into));
        #[cfg(not(target_arch = "wasm32"))]
        let next = self.responses.next();
        self.ended = !matches!(next, Some(Ok(_)));
        next
    }
}

/// Runs `model` on `request` through its queue, as [`infer`] does, and reads its responses as
/// they come: every response of a decoupled model (Triton's `exec(decoupled=True)`), the one
/// response of any other. [`infer`] on a decoupled model fails: a stream is the way to call it.
///
/// ```no_run
/// use tessera_guest::{infer_stream, Request, Tensor};
///
/// let request = Request::builder()
///     .input(Tensor::from_i32("IN", [3], &[1, 2, 3]))
///     .input(Tensor::from_slice("DELAY", [3], &[0u32, 0, 0]))
///     .input(Tensor::from_slice("WAIT", [1], &[0u32]))
///     .build();
/// for response in infer_stream("repeat_int32", None, request)? {
///     let out = response?.output("OUT")?.as_i32()?.into_owned();
/// }
/// # Ok::<(), tessera_guest::Error>(())
/// ```
///
/// Outside a Wasm component the one response of the function installed with
/// [`testing::set_infer`](crate::testing::set_infer) makes the stream.
pub fn infer_stream(
    model: &str,
    version: Option<i64>,
    request: Request,
) -> Result<ResponseStream, Error> {
    #[cfg(target_arch = "wasm32")]
    {
        let request = request.into();
        crate::bindings::tessera::inference::inference::infer_stream(model, version, &request)
            .map(|stream| ResponseStream {
                stream,
                ended: false,
            })
            .map_err(Into::into)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let response = crate::testing::call_infer(model, version, request);
        Ok(ResponseStream {
            responses: vec![response].into_iter(),
            ended: false,
        })
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
