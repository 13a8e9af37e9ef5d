//! One error type for every front-end: each error the server's API returns converts into an
//! [`ApiError`] once, here, with the HTTP status and the gRPC code Triton uses for it, and an
//! `ApiError` becomes an HTTP answer (a KServe `{"error"}` body) or a gRPC status. The message
//! is bounded ([`tessera_core::infer::MAX_ERROR_MESSAGE_BYTES`]) on both.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tonic::Code;

use crate::api::{AuthError, ControlError, ShmError, TenantError};
use crate::infer::{ErrorKind, InferError};

/// An error as a front-end answers it.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    /// Seconds until a retry may succeed (HTTP `Retry-After`, gRPC `retry-after` metadata).
    pub retry_after: Option<u64>,
    /// A missing or invalid key: HTTP adds `WWW-Authenticate: Bearer`.
    pub unauthenticated: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            unauthenticated: false,
        }
    }

    fn bounded_message(&self) -> String {
        tessera_core::infer::bounded(&self.message, tessera_core::infer::MAX_ERROR_MESSAGE_BYTES)
            .into_owned()
    }
}

/// The HTTP status and gRPC code Triton uses for each kind of inference error.
pub fn status_of(kind: ErrorKind) -> (StatusCode, Code) {
    match kind {
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, Code::NotFound),
        ErrorKind::Unavailable | ErrorKind::Timeout => {
            (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable)
        }
        ErrorKind::InvalidArgument => (StatusCode::BAD_REQUEST, Code::InvalidArgument),
        ErrorKind::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, Code::ResourceExhausted),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
        ErrorKind::Unsupported => (StatusCode::BAD_REQUEST, Code::Unimplemented),
    }
}

impl From<&InferError> for ApiError {
    fn from(e: &InferError) -> ApiError {
        let (status, code) = status_of(e.kind);
        ApiError {
            retry_after: e.retry_after_secs(),
            ..ApiError::new(status, code, e.message.clone())
        }
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> ApiError {
        ApiError::from(&e)
    }
}

impl From<&ControlError> for ApiError {
    /// Model control: 400 for most, as Triton answers, or a more precise status.
    fn from(e: &ControlError) -> ApiError {
        let (status, code) = match e {
            ControlError::NotFound(_) => (StatusCode::NOT_FOUND, Code::NotFound),
            ControlError::Invalid(_) | ControlError::NotAllowed(_) => {
                (StatusCode::BAD_REQUEST, Code::InvalidArgument)
            }
            ControlError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, Code::ResourceExhausted),
            ControlError::Forbidden(_) => (StatusCode::FORBIDDEN, Code::PermissionDenied),
            ControlError::Conflict(_) => (StatusCode::CONFLICT, Code::Aborted),
            ControlError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            ControlError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<&ShmError> for ApiError {
    /// Shared memory: Triton's HTTP answers 400 for all of them; gRPC says which.
    fn from(e: &ShmError) -> ApiError {
        let code = match e {
            ShmError::Exists(_) => Code::AlreadyExists,
            ShmError::NotFound(_) => Code::NotFound,
            ShmError::Invalid(_) => Code::InvalidArgument,
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, e.to_string())
    }
}

impl From<&TenantError> for ApiError {
    fn from(e: &TenantError) -> ApiError {
        let (status, code) = match e {
            TenantError::NotFound(_) => (StatusCode::NOT_FOUND, Code::NotFound),
            TenantError::Conflict(_) => (StatusCode::CONFLICT, Code::AlreadyExists),
            TenantError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            TenantError::Invalid(_) | TenantError::Disabled => {
                (StatusCode::BAD_REQUEST, Code::InvalidArgument)
            }
            TenantError::Store(inner) => {
                tracing::error!("tenant registry: {inner}");
                (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal)
            }
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<&AuthError> for ApiError {
    fn from(e: &AuthError) -> ApiError {
        ApiError {
            unauthenticated: true,
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                Code::Unauthenticated,
                e.to_string(),
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.bounded_message() });
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.unauthenticated {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> tonic::Status {
        let mut status = tonic::Status::new(e.code, e.bounded_message());
        if let Some(value) = e.retry_after.and_then(|s| s.to_string().parse().ok()) {
            status.metadata_mut().insert("retry-after", value);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_once_for_both_protocols() {
        let quota = InferError {
            retry_after: Some(std::time::Duration::from_millis(1500)),
            ..InferError::new(ErrorKind::ResourceExhausted, "over quota")
        };
        let e = ApiError::from(&quota);
        assert_eq!(
            (e.status, e.code, e.retry_after),
            (
                StatusCode::TOO_MANY_REQUESTS,
                Code::ResourceExhausted,
                Some(2)
            )
        );
        let response = e.clone().into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let status = tonic::Status::from(e);
        assert_eq!(
            status.metadata().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..])
        );

        let e = ApiError::from(&ShmError::Exists("r".into()));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, Code::AlreadyExists)
        );
        let e = ApiError::from(&AuthError::Missing);
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let e = ApiError::from(&ControlError::TooLarge("big".into()));
        assert_eq!(
            (e.status, e.code),
            (StatusCode::PAYLOAD_TOO_LARGE, Code::ResourceExhausted)
        );
    }
}
