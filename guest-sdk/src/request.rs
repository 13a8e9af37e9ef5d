//! Requests a handler receives (or sends with [`infer`](crate::infer)) and the responses it
//! returns.

use crate::{Error, Tensor};

/// A request or response parameter value (KServe v2 `parameters`).
#[derive(Clone, Debug, PartialEq)]
pub enum ParameterValue {
    /// A JSON boolean.
    Bool(bool),
    /// A JSON integer.
    Int(i64),
    /// A JSON number that is not an integer.
    Double(f64),
    /// A JSON string.
    String(String),
}

impl ParameterValue {
    /// The value as an integer: an `Int`, a `Double` without fraction, or a `String` that parses
    /// as one (clients differ in how they send numbers).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            ParameterValue::Int(i) => Some(*i),
            ParameterValue::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(*d as i64),
            ParameterValue::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// The value as a float: a `Double`, an `Int`, or a `String` that parses as a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            ParameterValue::Double(d) => Some(*d),
            ParameterValue::Int(i) => Some(*i as f64),
            ParameterValue::String(s) => s.trim().parse().ok(),
            ParameterValue::Bool(_) => None,
        }
    }

    /// The value as a boolean: a `Bool`, or the string `"true"`/`"false"`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            ParameterValue::Bool(b) => Some(*b),
            ParameterValue::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// The value of a `String` parameter.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ParameterValue::String(s) => Some(s),
            _ => None,
        }
    }
}

impl From<bool> for ParameterValue {
    fn from(v: bool) -> Self {
        ParameterValue::Bool(v)
    }
}

impl From<i64> for ParameterValue {
    fn from(v: i64) -> Self {
        ParameterValue::Int(v)
    }
}

impl From<i32> for ParameterValue {
    fn from(v: i32) -> Self {
        ParameterValue::Int(v.into())
    }
}

impl From<f64> for ParameterValue {
    fn from(v: f64) -> Self {
        ParameterValue::Double(v)
    }
}

impl From<String> for ParameterValue {
    fn from(v: String) -> Self {
        ParameterValue::String(v)
    }
}

impl From<&str> for ParameterValue {
    fn from(v: &str) -> Self {
        ParameterValue::String(v.to_owned())
    }
}

/// One `parameters` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameter {
    /// The parameter's name.
    pub key: String,
    /// Its value.
    pub value: ParameterValue,
}

fn find<'a>(parameters: &'a [Parameter], key: &str) -> Option<&'a ParameterValue> {
    parameters.iter().find(|p| p.key == key).map(|p| &p.value)
}

/// One inference request: inputs, the outputs the caller wants, and parameters.
///
/// Handlers receive requests in [`Model::execute`](crate::Model::execute); BLS handlers build them
/// with [`Request::builder`] and send them with [`infer`](crate::infer).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    pub(crate) id: String,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) requested_outputs: Vec<String>,
    pub(crate) parameters: Vec<Parameter>,
}

impl Request {
    /// A request with these inputs, no id, no parameters, asking for every output.
    pub fn new(inputs: Vec<Tensor>) -> Self {
        Request {
            inputs,
            ..Default::default()
        }
    }

    /// Starts building a request.
    ///
    /// ```
    /// use tessera_guest::{Request, Tensor};
    ///
    /// let request = Request::builder()
    ///     .id("r1")
    ///     .input(Tensor::from_f32("INPUT0", [1, 2], &[1.0, 2.0]))
    ///     .requested_output("OUTPUT0")
    ///     .parameter("k", 5)
    ///     .build();
    /// assert_eq!(request.parameter_i64("k")?, Some(5));
    /// assert!(request.wants_output("OUTPUT0") && !request.wants_output("OUTPUT1"));
    /// # Ok::<(), tessera_guest::Error>(())
    /// ```
    pub fn builder() -> RequestBuilder {
        RequestBuilder::default()
    }

    /// The client's request id; empty when the client sent none.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// All inputs, in the order the client sent them.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// The input called `name`, or an `invalid-input` error naming it.
    pub fn input(&self, name: &str) -> Result<&Tensor, Error> {
        self.get_input(name)
            .ok_or_else(|| Error::invalid_input(format!("missing input '{name}'")))
    }

    /// The input called `name`, if the request has it (for optional inputs).
    pub fn get_input(&self, name: &str) -> Option<&Tensor> {
        self.inputs.iter().find(|t| t.name() == name)
    }

    /// Removes and returns the input called `name` (to pass its data on without copying), or an
    /// `invalid-input` error naming it.
    pub fn take_input(&mut self, name: &str) -> Result<Tensor, Error> {
        let index = self
            .inputs
            .iter()
            .position(|t| t.name() == name)
            .ok_or_else(|| Error::invalid_input(format!("missing input '{name}'")))?;
        Ok(self.inputs.remove(index))
    }

    /// Consumes the request, returning its inputs.
    pub fn into_inputs(self) -> Vec<Tensor> {
        self.inputs
    }

    /// The outputs the caller asked for; empty means all of them.
    pub fn requested_outputs(&self) -> &[String] {
        &self.requested_outputs
    }

    /// Whether the caller wants output `name` (it asked for no output in particular, or for this
    /// one). Handlers may skip computing unwanted outputs; the SDK drops any that are returned.
    pub fn wants_output(&self, name: &str) -> bool {
        self.requested_outputs.is_empty() || self.requested_outputs.iter().any(|o| o == name)
    }

    /// All parameters.
    pub fn parameters(&self) -> &[Parameter] {
        &self.parameters
    }

    /// The parameter called `key`, if present.
    pub fn parameter(&self, key: &str) -> Option<&ParameterValue> {
        find(&self.parameters, key)
    }

    /// Integer parameter `key`: `Ok(None)` when absent, an `invalid-input` error when present but
    /// not an integer (see [`ParameterValue::as_i64`]).
    pub fn parameter_i64(&self, key: &str) -> Result<Option<i64>, Error> {
        self.typed_parameter(key, "an integer", ParameterValue::as_i64)
    }

    /// Float parameter `key`: `Ok(None)` when absent, an `invalid-input` error when not a number.
    pub fn parameter_f64(&self, key: &str) -> Result<Option<f64>, Error> {
        self.typed_parameter(key, "a number", ParameterValue::as_f64)
    }

    /// Boolean parameter `key`: `Ok(None)` when absent, an `invalid-input` error when not a
    /// boolean.
    pub fn parameter_bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.typed_parameter(key, "a boolean", ParameterValue::as_bool)
    }

    /// String parameter `key`: `Ok(None)` when absent, an `invalid-input` error when not a string.
    pub fn parameter_str(&self, key: &str) -> Result<Option<&str>, Error> {
        match self.parameter(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                Error::invalid_input(format!("parameter '{key}' must be a string, got {v:?}"))
            }),
        }
    }

    fn typed_parameter<T>(
        &self,
        key: &str,
        what: &str,
        convert: impl FnOnce(&ParameterValue) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        match self.parameter(key) {
            None => Ok(None),
            Some(v) => convert(v).map(Some).ok_or_else(|| {
                Error::invalid_input(format!("parameter '{key}' must be {what}, got {v:?}"))
            }),
        }
    }
}

/// Builds a [`Request`]; see [`Request::builder`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct RequestBuilder {
    request: Request,
}

impl RequestBuilder {
    /// Sets the request id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.request.id = id.into();
        self
    }

    /// Adds an input.
    pub fn input(mut self, tensor: Tensor) -> Self {
        self.request.inputs.push(tensor);
        self
    }

    /// Adds several inputs.
    pub fn inputs(mut self, tensors: impl IntoIterator<Item = Tensor>) -> Self {
        self.request.inputs.extend(tensors);
        self
    }

    /// Asks for an output (by default every output is returned).
    pub fn requested_output(mut self, name: impl Into<String>) -> Self {
        self.request.requested_outputs.push(name.into());
        self
    }

    /// Adds a parameter.
    pub fn parameter(mut self, key: impl Into<String>, value: impl Into<ParameterValue>) -> Self {
        self.request.parameters.push(Parameter {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// The finished request.
    pub fn build(self) -> Request {
        self.request
    }
}

/// The answer to one request: output tensors and parameters.
///
/// ```
/// use tessera_guest::{Response, Tensor};
///
/// let response = Response::new()
///     .with_output(Tensor::from_f32("OUTPUT0", [1, 2], &[3.0, 4.0]))
///     .with_parameter("note", "computed");
/// assert_eq!(*response.output("OUTPUT0")?.as_f32()?, [3.0, 4.0]);
/// # Ok::<(), tessera_guest::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Response {
    pub(crate) outputs: Vec<Tensor>,
    pub(crate) parameters: Vec<Parameter>,
}

impl Response {
    /// An empty response.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an output.
    #[must_use]
    pub fn with_output(mut self, tensor: Tensor) -> Self {
        self.outputs.push(tensor);
        self
    }

    /// Adds an output in place.
    pub fn push_output(&mut self, tensor: Tensor) {
        self.outputs.push(tensor);
    }

    /// Adds a parameter.
    #[must_use]
    pub fn with_parameter(
        mut self,
        key: impl Into<String>,
        value: impl Into<ParameterValue>,
    ) -> Self {
        self.parameters.push(Parameter {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// All outputs.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// The output called `name`, or an `internal` error naming it (a model answered without an
    /// output it should have produced).
    pub fn output(&self, name: &str) -> Result<&Tensor, Error> {
        self.outputs
            .iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| Error::internal(format!("response has no output '{name}'")))
    }

    /// Removes and returns the output called `name`, to pass its data on without copying.
    pub fn take_output(&mut self, name: &str) -> Result<Tensor, Error> {
        let index = self
            .outputs
            .iter()
            .position(|t| t.name() == name)
            .ok_or_else(|| Error::internal(format!("response has no output '{name}'")))?;
        Ok(self.outputs.remove(index))
    }

    /// Consumes the response, returning its outputs.
    pub fn into_outputs(self) -> Vec<Tensor> {
        self.outputs
    }

    /// All parameters.
    pub fn parameters(&self) -> &[Parameter] {
        &self.parameters
    }

    /// The parameter called `key`, if present.
    pub fn parameter(&self, key: &str) -> Option<&ParameterValue> {
        find(&self.parameters, key)
    }
}

impl From<Vec<Tensor>> for Response {
    fn from(outputs: Vec<Tensor>) -> Self {
        Response {
            outputs,
            parameters: Vec::new(),
        }
    }
}

impl FromIterator<Tensor> for Response {
    fn from_iter<I: IntoIterator<Item = Tensor>>(iter: I) -> Self {
        Response {
            outputs: iter.into_iter().collect(),
            parameters: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_lenient_about_encoding_but_strict_about_kind() {
        let r = Request::builder()
            .parameter("a", 3)
            .parameter("b", "4")
            .parameter("c", 5.0)
            .parameter("d", "x")
            .parameter("e", true)
            .build();
        assert_eq!(r.parameter_i64("a").unwrap(), Some(3));
        assert_eq!(r.parameter_i64("b").unwrap(), Some(4));
        assert_eq!(r.parameter_i64("c").unwrap(), Some(5));
        assert!(r.parameter_i64("d").unwrap_err().is_invalid_input());
        assert_eq!(r.parameter_i64("zz").unwrap(), None);
        assert_eq!(r.parameter_bool("e").unwrap(), Some(true));
        assert_eq!(r.parameter_str("d").unwrap(), Some("x"));
        assert!(r.parameter_str("a").is_err());
        assert_eq!(r.parameter_f64("a").unwrap(), Some(3.0));
    }

    #[test]
    fn inputs_by_name() {
        let mut r = Request::new(vec![
            Tensor::from_f32("A", [1], &[1.0]),
            Tensor::from_f32("B", [1], &[2.0]),
        ]);
        assert_eq!(r.input("B").unwrap().name(), "B");
        assert_eq!(r.input("C").unwrap_err().message(), "missing input 'C'");
        let a = r.take_input("A").unwrap();
        assert_eq!(a.name(), "A");
        assert_eq!(r.inputs().len(), 1);
        assert!(r.wants_output("anything"));
    }

    #[test]
    fn response_outputs_by_name() {
        let mut resp: Response = vec![Tensor::from_i64("X", [1], &[1])].into();
        assert!(resp.output("Y").unwrap_err().is_internal());
        assert_eq!(resp.take_output("X").unwrap().name(), "X");
        assert!(resp.outputs().is_empty());
    }
}
