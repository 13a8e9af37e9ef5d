//! Conversions between the SDK's types and the WIT bindings'. Every conversion moves buffers;
//! tensor data is never copied.

use crate::bindings::tessera::inference::types as wit;
use crate::{
    DataType, Error, ErrorKind, Parameter, ParameterValue, Request, Response, Tensor, TensorData,
};

impl From<wit::Datatype> for DataType {
    fn from(d: wit::Datatype) -> Self {
        use wit::Datatype as W;
        match d {
            W::Bool => DataType::Bool,
            W::Uint8 => DataType::Uint8,
            W::Uint16 => DataType::Uint16,
            W::Uint32 => DataType::Uint32,
            W::Uint64 => DataType::Uint64,
            W::Int8 => DataType::Int8,
            W::Int16 => DataType::Int16,
            W::Int32 => DataType::Int32,
            W::Int64 => DataType::Int64,
            W::Fp16 => DataType::Fp16,
            W::Fp32 => DataType::Fp32,
            W::Fp64 => DataType::Fp64,
            W::Bytes => DataType::Bytes,
        }
    }
}

impl From<DataType> for wit::Datatype {
    fn from(d: DataType) -> Self {
        use wit::Datatype as W;
        match d {
            DataType::Bool => W::Bool,
            DataType::Uint8 => W::Uint8,
            DataType::Uint16 => W::Uint16,
            DataType::Uint32 => W::Uint32,
            DataType::Uint64 => W::Uint64,
            DataType::Int8 => W::Int8,
            DataType::Int16 => W::Int16,
            DataType::Int32 => W::Int32,
            DataType::Int64 => W::Int64,
            DataType::Fp16 => W::Fp16,
            DataType::Fp32 => W::Fp32,
            DataType::Fp64 => W::Fp64,
            DataType::Bytes => W::Bytes,
        }
    }
}

impl From<wit::Tensor> for Tensor {
    fn from(t: wit::Tensor) -> Self {
        let data = match t.data {
            wit::TensorData::Raw(bytes) => TensorData::Raw(bytes),
            wit::TensorData::Elements(elements) => TensorData::Elements(elements),
        };
        Tensor::new(t.name, t.datatype.into(), t.shape, data)
    }
}

impl From<Tensor> for wit::Tensor {
    fn from(t: Tensor) -> Self {
        let (name, datatype, shape, data) = t.into_parts();
        let data = match data {
            TensorData::Raw(bytes) => wit::TensorData::Raw(bytes),
            TensorData::Elements(elements) => wit::TensorData::Elements(elements),
        };
        wit::Tensor {
            name,
            datatype: datatype.into(),
            shape,
            data,
        }
    }
}

impl From<wit::Parameter> for Parameter {
    fn from(p: wit::Parameter) -> Self {
        let value = match p.value {
            wit::ParameterValue::Bool(b) => ParameterValue::Bool(b),
            wit::ParameterValue::Int(i) => ParameterValue::Int(i),
            wit::ParameterValue::Double(d) => ParameterValue::Double(d),
            wit::ParameterValue::String(s) => ParameterValue::String(s),
        };
        Parameter { key: p.key, value }
    }
}

impl From<Parameter> for wit::Parameter {
    fn from(p: Parameter) -> Self {
        let value = match p.value {
            ParameterValue::Bool(b) => wit::ParameterValue::Bool(b),
            ParameterValue::Int(i) => wit::ParameterValue::Int(i),
            ParameterValue::Double(d) => wit::ParameterValue::Double(d),
            ParameterValue::String(s) => wit::ParameterValue::String(s),
        };
        wit::Parameter { key: p.key, value }
    }
}

impl From<wit::Request> for Request {
    fn from(r: wit::Request) -> Self {
        Request {
            id: r.id,
            inputs: r.inputs.into_iter().map(Into::into).collect(),
            requested_outputs: r.requested_outputs,
            parameters: r.parameters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Request> for wit::Request {
    fn from(r: Request) -> Self {
        wit::Request {
            id: r.id,
            inputs: r.inputs.into_iter().map(Into::into).collect(),
            requested_outputs: r.requested_outputs,
            parameters: r.parameters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<wit::Response> for Response {
    fn from(r: wit::Response) -> Self {
        Response {
            outputs: r.outputs.into_iter().map(Into::into).collect(),
            parameters: r.parameters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Response> for wit::Response {
    fn from(r: Response) -> Self {
        wit::Response {
            outputs: r.outputs.into_iter().map(Into::into).collect(),
            parameters: r.parameters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<wit::ErrorKind> for ErrorKind {
    fn from(k: wit::ErrorKind) -> Self {
        match k {
            wit::ErrorKind::ModelNotFound => ErrorKind::ModelNotFound,
            wit::ErrorKind::ModelNotReady => ErrorKind::ModelNotReady,
            wit::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
            wit::ErrorKind::QuotaExceeded => ErrorKind::QuotaExceeded,
            wit::ErrorKind::Timeout => ErrorKind::Timeout,
            wit::ErrorKind::Internal => ErrorKind::Internal,
        }
    }
}

impl From<ErrorKind> for wit::ErrorKind {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::ModelNotFound => wit::ErrorKind::ModelNotFound,
            ErrorKind::ModelNotReady => wit::ErrorKind::ModelNotReady,
            ErrorKind::InvalidInput => wit::ErrorKind::InvalidInput,
            ErrorKind::QuotaExceeded => wit::ErrorKind::QuotaExceeded,
            ErrorKind::Timeout => wit::ErrorKind::Timeout,
            ErrorKind::Internal => wit::ErrorKind::Internal,
        }
    }
}

impl From<wit::Error> for Error {
    fn from(e: wit::Error) -> Self {
        Error::new(e.kind.into(), e.message)
    }
}

impl From<Error> for wit::Error {
    fn from(e: Error) -> Self {
        wit::Error {
            kind: e.kind().into(),
            message: e.message().to_owned(),
        }
    }
}
