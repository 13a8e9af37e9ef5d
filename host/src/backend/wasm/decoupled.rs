//! Decoupled handlers: components of the `decoupled-model` world, which answer a request with
//! any number of responses through a `response-sender` (Triton's
//! `model_transaction_policy { decoupled: true }` and `request.get_response_sender()`).
//!
//! Each request of a batch comes with a sender resource wrapping the call's
//! [`ResponseSender`]. A send waits while the caller's buffer is full (backpressure); the time
//! it waits is not charged to the execution deadline, which bounds the guest's own work. The
//! guest may keep senders after `execute` returns: the instance then has open work, and the
//! scheduler calls `resume` between batches until every sender has sent its final response
//! (see `scheduler::serve_open_work`). A sender dropped without a final response, or left open
//! when the guest says it has nothing more to do, ends its stream with an error; a trap ends
//! them all.

use std::time::{Duration, Instant};

use wasmtime::component::Resource;

use super::convert;
use super::host::{BlockedTime, HostState};
use super::tessera::inference::types;
use crate::infer::InferError;
use crate::stream::{ResponseSender, SendError};

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "decoupled-model",
        imports: { default: async },
        exports: { default: async },
        with: {
            "tessera:inference/types": crate::backend::wasm::tessera::inference::types,
            "tessera:inference/inference": crate::backend::wasm::tessera::inference::inference,
            "tessera:inference/log": crate::backend::wasm::tessera::inference::log,
            "tessera:inference/metrics": crate::backend::wasm::tessera::inference::metrics,
            "tessera:inference/streaming.response-sender": super::StreamSender,
        },
    });
}

use bindings::tessera::inference::streaming;
pub use bindings::{DecoupledModel, DecoupledModelPre};

/// The interface a decoupled handler exports (any 0.1 patch version).
pub const DECOUPLED_HANDLER_EXPORT: &str = "tessera:inference/decoupled-handler@0.1";

/// A guest's handle on one request's stream.
pub struct StreamSender {
    sender: ResponseSender,
}

/// Hands the guest its senders: one resource per call, kept in the guest's table.
pub fn senders_for(
    host: &mut HostState,
    senders: Vec<ResponseSender>,
) -> wasmtime::Result<Vec<Resource<StreamSender>>> {
    let mut handed = Vec::with_capacity(senders.len());
    for sender in senders {
        match host.table().push(StreamSender {
            sender: sender.clone(),
        }) {
            Ok(resource) => {
                host.streams.hold(resource.rep(), sender);
                handed.push(resource);
            }
            Err(e) => {
                // The guest never gets these: take back the ones already in its table.
                for resource in handed {
                    let rep = resource.rep();
                    let _ = host.table().delete(resource);
                    host.streams.release(rep);
                }
                return Err(e.into());
            }
        }
    }
    Ok(handed)
}

/// Waits for a guest call at most `limit` of the guest's own time: time its sends spent
/// waiting for readers extends the deadline. `None` when the deadline passed.
pub async fn within_deadline<F: std::future::Future>(
    call: F,
    limit: Duration,
    blocked: &BlockedTime,
) -> Option<F::Output> {
    let started = Instant::now();
    let blocked_before = blocked.so_far();
    tokio::pin!(call);
    let mut deadline = started + limit;
    loop {
        tokio::select! {
            output = &mut call => return Some(output),
            _ = tokio::time::sleep_until(deadline.into()) => {
                let waited = blocked.so_far().saturating_sub(blocked_before);
                let extended = started + limit + waited;
                if extended <= Instant::now() {
                    return None;
                }
                deadline = extended;
            }
        }
    }
}

fn send_error(e: SendError) -> streaming::SendError {
    match e {
        SendError::Cancelled => streaming::SendError::Cancelled,
        SendError::Closed => streaming::SendError::Closed,
    }
}

impl HostState {
    fn sender(&mut self, this: &Resource<StreamSender>) -> Option<ResponseSender> {
        self.table().get(this).ok().map(|s| s.sender.clone())
    }

    /// Sends one message, counting the time it waited for the reader. A reader that takes
    /// nothing for as long as the handler's execution deadline loses its request: the stream
    /// ends with a timeout error and the handler sees `cancelled`, so one stalled client cannot
    /// hold the instance (and every stream on it) for ever.
    async fn send_message(
        &mut self,
        this: &Resource<StreamSender>,
        result: Option<crate::infer::InferResult>,
        last: bool,
    ) -> Result<(), streaming::SendError> {
        let Some(sender) = self.sender(this) else {
            return Err(streaming::SendError::Closed);
        };
        let patience = self.streams.max_send_wait;
        self.streams.blocked.begin();
        let sent = tokio::time::timeout(patience, sender.send(result, last)).await;
        self.streams.blocked.end();
        match sent {
            Ok(sent) => sent.map_err(send_error),
            Err(_) => {
                sender.fail(InferError::new(
                    crate::infer::ErrorKind::Timeout,
                    format!(
                        "the client read nothing for {} ms (the model's execution deadline); the request was ended",
                        patience.as_millis()
                    ),
                ));
                Err(streaming::SendError::Cancelled)
            }
        }
    }
}

impl streaming::Host for HostState {}

impl streaming::HostResponseSender for HostState {
    async fn send(
        &mut self,
        this: Resource<StreamSender>,
        response: types::Response,
        last: bool,
    ) -> Result<(), streaming::SendError> {
        match convert::response_from_wit(response, self.streams.max_output_bytes) {
            Ok(response) => self.send_message(&this, Some(Ok(response)), last).await,
            Err(too_large) => {
                if let Some(sender) = self.sender(&this) {
                    sender.fail(too_large);
                }
                Err(streaming::SendError::TooLarge)
            }
        }
    }

    async fn send_error(
        &mut self,
        this: Resource<StreamSender>,
        error: types::Error,
    ) -> Result<(), streaming::SendError> {
        let error = convert::error_from_wit(error, self.streams.max_output_bytes);
        self.send_message(&this, Some(Err(error)), true).await
    }

    async fn finish(&mut self, this: Resource<StreamSender>) -> Result<(), streaming::SendError> {
        self.send_message(&this, None, true).await
    }

    async fn is_cancelled(&mut self, this: Resource<StreamSender>) -> bool {
        self.sender(&this).is_none_or(|s| s.is_cancelled())
    }

    async fn drop(&mut self, this: Resource<StreamSender>) -> wasmtime::Result<()> {
        let rep = this.rep();
        let held = self.table().delete(this)?;
        self.streams.release(rep);
        if !held.sender.is_finished() {
            held.sender.fail(InferError::internal(format!(
                "handler '{}' dropped the response sender without sending a final response",
                crate::namespace::shown(self.model())
            )));
        }
        Ok(())
    }
}
