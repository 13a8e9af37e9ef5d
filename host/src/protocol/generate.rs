//! Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
//! `.../generate_stream`, a text-oriented schema over the same request path.
//!
//! The body is one JSON object. Each top-level key that names an input of the model becomes that
//! tensor (a scalar, or a 1-D array; the datatype is the input's); `id` is the request id; the
//! `parameters` object is mapped by the same rule; every other key becomes a request parameter.
//! A response is `{"id", "model_name", "model_version", <output>: <value>}` with each output by
//! name (a single element as a scalar, more as an array; BYTES as text).
//!
//! `/generate` answers with exactly one response. `/generate_stream` answers with Server-Sent
//! Events, one `data:` event per response (a decoupled model's final response without outputs
//! sends none); an error after the stream started arrives as `data: {"error": "..."}`. A client
//! that disconnects drops the stream, which cancels the request.

use axum::response::sse::{Event, Sse};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::api::Server;
use crate::infer::{InferError, InferResponse};
use crate::signature::{ModelMetadata, TensorSpec};
use tessera_core::kserve;

/// Maps a generate body onto a KServe v2 JSON request for `metadata`'s model.
pub fn to_kserve(body: &[u8], metadata: &ModelMetadata) -> Result<Bytes, InferError> {
    let object: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => object,
        Ok(_) => {
            return Err(InferError::invalid(
                "the generate request must be a JSON object",
            ));
        }
        Err(e) => {
            return Err(InferError::invalid(format!(
                "failed to parse the request JSON: {e}"
            )));
        }
    };
    let mut inputs = Vec::new();
    let mut parameters = Map::new();
    let mut id = None;
    map_keys(
        object,
        metadata,
        &mut inputs,
        &mut parameters,
        &mut id,
        true,
    )?;
    let mut request = json!({ "inputs": inputs, "parameters": parameters });
    if let Some(id) = id {
        request["id"] = id;
    }
    Ok(Bytes::from(request.to_string()))
}

fn map_keys(
    object: Map<String, Value>,
    metadata: &ModelMetadata,
    inputs: &mut Vec<Value>,
    parameters: &mut Map<String, Value>,
    id: &mut Option<Value>,
    top: bool,
) -> Result<(), InferError> {
    for (key, value) in object {
        if let Some(spec) = metadata.inputs.iter().find(|s| s.name == key) {
            inputs.push(input(spec, value, metadata.batched)?);
            continue;
        }
        match (key.as_str(), value) {
            ("id", Value::String(text)) if top => *id = Some(Value::String(text)),
            ("parameters", Value::Object(nested)) if top => {
                map_keys(nested, metadata, inputs, parameters, id, false)?;
            }
            (_, value @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => {
                parameters.insert(key, value);
            }
            (_, other) => {
                return Err(InferError::invalid(format!(
                    "generate request key '{key}' is neither an input of the model nor a parameter (a string, number or boolean): {}",
                    kind_of(&other)
                )));
            }
        }
    }
    Ok(())
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
        _ => "a value",
    }
}

/// One input tensor in KServe v2 JSON: a scalar is one element, an array one dimension.
fn input(spec: &TensorSpec, value: Value, batched: bool) -> Result<Value, InferError> {
    let data = match value {
        Value::Array(items) => items,
        scalar @ (Value::String(_) | Value::Number(_) | Value::Bool(_)) => vec![scalar],
        other => {
            return Err(InferError::invalid(format!(
                "generate input '{}' must be a string, number, boolean or an array of them, not {}",
                spec.name,
                kind_of(&other)
            )));
        }
    };
    let mut shape = vec![json!(data.len())];
    if batched {
        shape.insert(0, json!(1));
    }
    Ok(json!({
        "name": spec.name,
        "datatype": spec.datatype.name(),
        "shape": shape,
        "data": data,
    }))
}

/// A response in the generate schema.
pub fn from_response(response: &InferResponse) -> Result<Value, InferError> {
    let mut answer = Map::new();
    if !response.id.is_empty() {
        answer.insert("id".into(), json!(response.id));
    }
    answer.insert("model_name".into(), json!(response.model_name));
    answer.insert("model_version".into(), json!(response.model_version));
    for tensor in &response.outputs {
        let data = match kserve::output_data_value(tensor)? {
            Value::Array(items) => items,
            other => vec![other],
        };
        let value = match data.len() {
            1 => data.into_iter().next().unwrap_or(Value::Null),
            _ => Value::Array(data),
        };
        answer.insert(tensor.name.clone(), value);
    }
    Ok(Value::Object(answer))
}

/// Reads `metadata` for the generate mapping and runs the request as a stream.
pub async fn start(
    server: &Server,
    principal: &crate::api::Principal,
    model: &str,
    version: Option<i64>,
    body: &[u8],
    trace: super::TraceContext,
    verbose_errors: bool,
) -> Result<super::ClientStream, InferError> {
    let metadata = server.model_metadata(principal, model, version)?;
    let kserve_body = to_kserve(body, &metadata)?;
    let request = super::ClientRequest {
        model,
        version,
        trace,
        received_bytes: body.len(),
    };
    let decode = |regions: &dyn kserve::RegionReader| {
        kserve::decode_request_with(&kserve_body, None, regions)
    };
    super::client_infer_stream(server, principal, request, verbose_errors, decode).await
}

/// The one response `/generate` answers with: a stream of exactly one.
pub async fn single(mut stream: super::ClientStream) -> Result<Value, InferError> {
    let mut answer = None;
    while let Some(message) = stream.stream.next().await {
        match message.result {
            Some(Ok(response)) if answer.is_none() => answer = Some(from_response(&response)?),
            Some(Ok(_)) => {
                return Err(InferError::new(
                    crate::infer::ErrorKind::Unsupported,
                    "the model sent more than one response: use generate_stream",
                ));
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    answer.ok_or_else(|| InferError::internal("the model sent no response"))
}

/// The Server-Sent Events of `/generate_stream`.
pub fn events(
    stream: super::ClientStream,
) -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>> + Send> {
    let events = futures::stream::unfold(stream.stream, |mut stream| async move {
        let message = stream.next().await?;
        Some((message, stream))
    })
    .filter_map(|message| async move {
        let data = match message.result? {
            Ok(response) => match from_response(&response) {
                Ok(value) => value,
                Err(e) => error_json(&e),
            },
            Err(e) => error_json(&e),
        };
        Some(Ok(Event::default().data(data.to_string())))
    });
    Sse::new(events)
}

/// An error as an event's data, bounded as every error message is.
fn error_json(e: &InferError) -> Value {
    json!({ "error": crate::infer::bounded(&e.message, crate::infer::MAX_ERROR_MESSAGE_BYTES) })
}

use futures::StreamExt;
