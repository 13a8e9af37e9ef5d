//! Decoupled handlers: any number of responses per request (Triton's
//! `model_transaction_policy { decoupled: true }` and `request.get_response_sender()`).
//!
//! Each request comes with a [`ResponseSender`]. Send responses with [`ResponseSender::send`],
//! and end with [`ResponseSender::send_final`], [`ResponseSender::finish`] (no response, as
//! Triton's flags-only final) or [`ResponseSender::fail`]. A sender may be kept in the model's
//! state after [`DecoupledModel::execute`] returns; the host then calls
//! [`DecoupledModel::resume`] until every kept sender has ended, and hands new requests to
//! `execute` in between, so one instance serves many streams at once.

use std::time::Duration;

use crate::bindings_decoupled::tessera::inference::streaming;
use crate::{Error, ModelConfig, Request, Response};

/// Why a response could not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The caller has gone (cancelled, disconnected or stopped waiting): stop working on its
    /// request and drop the sender.
    Cancelled,
    /// The final response was already sent.
    Closed,
    /// The response is over the model's output limit; the caller got an error instead.
    TooLarge,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Cancelled => "the caller cancelled the request",
            SendError::Closed => "the final response was already sent",
            SendError::TooLarge => "the response is over the output limit",
        })
    }
}

impl std::error::Error for SendError {}

impl From<streaming::SendError> for SendError {
    fn from(e: streaming::SendError) -> Self {
        match e {
            streaming::SendError::Cancelled => SendError::Cancelled,
            streaming::SendError::Closed => SendError::Closed,
            streaming::SendError::TooLarge => SendError::TooLarge,
        }
    }
}

/// Where the responses to one request go. Dropping it before a final response ends the
/// caller's stream with an error.
pub struct ResponseSender(streaming::ResponseSender);

impl ResponseSender {
    /// Sends one response; more follow. Waits while the caller has not read the earlier ones.
    pub fn send(&self, response: Response) -> Result<(), SendError> {
        self.0.send(&response.into(), false).map_err(Into::into)
    }

    /// Sends the last response.
    pub fn send_final(self, response: Response) -> Result<(), SendError> {
        self.0.send(&response.into(), true).map_err(Into::into)
    }

    /// Ends the stream without another response.
    pub fn finish(self) -> Result<(), SendError> {
        self.0.finish().map_err(Into::into)
    }

    /// Ends the request with an error.
    pub fn fail(self, error: Error) -> Result<(), SendError> {
        self.0.send_error(&error.into()).map_err(Into::into)
    }

    /// Whether the caller has gone.
    pub fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// When to call [`DecoupledModel::resume`] again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// As soon as possible (after any new requests are handed to `execute`).
    Now,
    /// After this long, or earlier when new requests arrive.
    After(Duration),
    /// Nothing more to do: the host ends any stream still open with an error.
    Done,
}

/// A decoupled model handler. Export it with [`export_decoupled_model!`](crate::export_decoupled_model).
pub trait DecoupledModel: Sized + 'static {
    /// As [`Model::initialize`](crate::Model::initialize).
    fn initialize(config: &ModelConfig) -> Result<Self, String>;

    /// Takes a batch of requests, each with its sender. Answer them now, or keep the senders
    /// and go on in [`resume`](DecoupledModel::resume).
    fn execute(&mut self, requests: Vec<(Request, ResponseSender)>);

    /// Goes on with the senders kept from earlier calls. The default has nothing to go on
    /// with: a model that answers within `execute` needs no `resume`.
    fn resume(&mut self) -> Resume {
        Resume::Done
    }

    /// As [`Model::finalize`](crate::Model::finalize).
    fn finalize(&mut self) {}
}

/// Makes a type implementing [`DecoupledModel`] the component's handler: exports the WIT
/// `decoupled-handler` interface. The model's config must set
/// `model_transaction_policy { decoupled: true }`.
#[macro_export]
macro_rules! export_decoupled_model {
    ($model:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __TESSERA_MODEL: ::core::cell::RefCell<::core::option::Option<$model>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __TesseraHandler;

            impl $crate::__private_decoupled::Guest for __TesseraHandler {
                fn initialize(
                    config_json: ::std::string::String,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    $crate::__private_decoupled::initialize::<$model>(&__TESSERA_MODEL, config_json)
                }

                fn execute(
                    requests: ::std::vec::Vec<(
                        $crate::__private::WitRequest,
                        $crate::__private_decoupled::WitSender,
                    )>,
                ) {
                    $crate::__private_decoupled::execute::<$model>(&__TESSERA_MODEL, requests)
                }

                fn resume() -> ::core::option::Option<u32> {
                    $crate::__private_decoupled::resume::<$model>(&__TESSERA_MODEL)
                }

                fn finalize() {
                    $crate::__private_decoupled::finalize::<$model>(&__TESSERA_MODEL)
                }
            }

            $crate::__private_decoupled::bindings::__export_decoupled_model_world!(
                __TesseraHandler with_types_in $crate::__private_decoupled::bindings
            );
        };
    };
}

/// What [`export_decoupled_model!`](crate::export_decoupled_model) expands to; not part of the API.
#[doc(hidden)]
pub mod private {
    pub use crate::bindings_decoupled as bindings;
    pub use crate::bindings_decoupled::exports::tessera::inference::decoupled_handler::Guest;
    pub use crate::bindings_decoupled::tessera::inference::streaming::ResponseSender as WitSender;

    use super::{DecoupledModel, ResponseSender, Resume};
    use crate::__private::WitRequest;
    use crate::Request;

    pub use crate::__private::Slot;

    pub fn initialize<M: DecoupledModel>(
        slot: &'static Slot<M>,
        config_json: String,
    ) -> Result<(), String> {
        crate::__private::install(slot, config_json, M::initialize)
    }

    pub fn execute<M: DecoupledModel>(
        slot: &'static Slot<M>,
        requests: Vec<(WitRequest, WitSender)>,
    ) {
        let requests: Vec<(Request, ResponseSender)> = requests
            .into_iter()
            .map(|(request, sender)| (Request::from(request), ResponseSender(sender)))
            .collect();
        slot.with(|cell| match cell.try_borrow_mut() {
            Ok(mut state) => match state.as_mut() {
                Some(model) => model.execute(requests),
                // Dropping the senders ends their streams with an error.
                None => crate::log::error!("execute was called before initialize succeeded"),
            },
            Err(_) => crate::log::error!("execute was called while the instance was busy"),
        });
    }

    pub fn resume<M: DecoupledModel>(slot: &'static Slot<M>) -> Option<u32> {
        let next = slot.with(|cell| match cell.try_borrow_mut() {
            Ok(mut state) => state.as_mut().map_or(Resume::Done, DecoupledModel::resume),
            Err(_) => Resume::Done,
        });
        match next {
            Resume::Now => Some(0),
            Resume::After(wait) => Some(u32::try_from(wait.as_millis()).unwrap_or(u32::MAX)),
            Resume::Done => None,
        }
    }

    pub fn finalize<M: DecoupledModel>(slot: &'static Slot<M>) {
        if let Some(mut model) = crate::__private::take(slot) {
            model.finalize();
        }
    }
}
