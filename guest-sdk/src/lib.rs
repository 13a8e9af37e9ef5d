//! # tessera-guest: write Tessera model handlers in Rust
//!
//! A Tessera model handler is a WebAssembly component of the `tessera:inference/model` world
//! (`wit/tessera.wit`), the counterpart of Triton's Python backend `TritonPythonModel`. This crate
//! hides the component-model plumbing behind:
//!
//! - the [`Model`] trait: [`initialize`](Model::initialize) once per instance with the
//!   [`ModelConfig`], [`execute`](Model::execute) for each batch of [`Request`]s (one
//!   `Result<Response, Error>` per request, so one bad request fails alone), and an optional
//!   [`finalize`](Model::finalize);
//! - the [`export_model!`] macro, which makes a type implementing [`Model`] the component's
//!   handler;
//! - [`Tensor`]: typed, datatype-checked views of inputs ([`Tensor::as_f32`],
//!   [`Tensor::as_i64`], [`Tensor::as_strings`], …, borrowing the data where alignment allows),
//!   shape checks ([`Tensor::expect_shape`], [`Tensor::check`]) and builders for outputs
//!   ([`Tensor::from_f32`], [`Tensor::from_i64`], [`Tensor::from_strings`], …);
//! - [`Error`], whose constructors ([`Error::invalid_input`], [`Error::internal`], …) pick the
//!   status code the client sees;
//! - [`infer`] and [`model_metadata`] to call other models of the same server (business logic
//!   scripting), with [`Request::builder`];
//! - [`log`], the host's log, and [`metrics`], custom counters, gauges and histograms on the
//!   server's `/metrics`;
//! - [`DecoupledModel`] and [`export_decoupled_model!`] for decoupled models, which answer a
//!   request with any number of responses through a [`ResponseSender`] (Triton's
//!   `model_transaction_policy { decoupled: true }`); see the `repeat` example.
//!
//! ## Building
//!
//! A handler is a `cdylib` crate built for `wasm32-wasip2`, which makes a component directly:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! tessera-guest = { path = "../../guest-sdk" }
//! ```
//!
//! ```sh
//! rustup target add wasm32-wasip2
//! cargo build --target wasm32-wasip2 --release
//! cp target/wasm32-wasip2/release/my_model.wasm model_repository/my_model/1/model.wasm
//! ```
//!
//! with `backend: "wasm"` in the model's `config.pbtxt`.
//!
//! ## Example
//!
//! The `add_sub_wasm` example model (`examples/add_sub_wasm`): Triton's classic `add_sub`, two
//! `FP32 [batch, 16]` inputs in, their sum and difference out.
//!
//! ```no_run
#![doc = include_str!("../../examples/add_sub_wasm/src/lib.rs")]
//! ```
//!
//! ## Semantics worth knowing
//!
//! - One instance runs one batch at a time, so [`Model::execute`] takes `&mut self`.
//! - Outputs the caller did not ask for are dropped from each response (handlers may skip them
//!   early with [`Request::wants_output`]); a requested output that is missing, or an output
//!   whose data does not fit its shape and datatype, turns that request's result into an
//!   `internal` error.
//! - If `execute` returns the wrong number of results, missing ones become `internal` errors
//!   and extra ones are dropped: the host always gets exactly one result per request.
//! - A panic aborts the instance (Wasm traps): the whole batch fails and the host replaces the
//!   instance. The panic message goes to the host's log first. Return an [`Error`] for anything
//!   a request can cause.

#![warn(missing_docs)]

mod config;
mod convert;
mod decoupled;
mod error;
mod infer;
pub mod log;
pub mod metrics;
mod request;
mod tensor;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use config::ModelConfig;
pub use decoupled::{DecoupledModel, ResponseSender, Resume, SendError};
pub use error::{Error, ErrorKind, ResultExt};
pub use infer::{
    ModelMetadata, Polled, ResponseStream, TensorMetadata, infer, infer_stream, model_metadata,
};
pub use request::{Parameter, ParameterValue, Request, RequestBuilder, Response};
pub use tensor::{DataType, Element, Tensor, TensorData};

/// The raw bindings `wit-bindgen` generates for the `model` world of `wit/tessera.wit`.
///
/// Not part of the SDK's API: use the types at the crate root instead.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "model",
        pub_export_macro: true,
        export_macro_name: "__export_model_world",
        default_bindings_module: "tessera_guest::bindings",
    });
}

/// The raw bindings of the `decoupled-model` world: its `streaming` import and the
/// `decoupled-handler` export; the interfaces it shares with the `model` world are those above.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings_decoupled {
    wit_bindgen::generate!({
        path: "../wit",
        world: "decoupled-model",
        pub_export_macro: true,
        export_macro_name: "__export_decoupled_model_world",
        default_bindings_module: "tessera_guest::bindings_decoupled",
        with: {
            "tessera:inference/types@0.1.0": crate::bindings::tessera::inference::types,
            "tessera:inference/inference@0.1.0": crate::bindings::tessera::inference::inference,
            "tessera:inference/log@0.1.0": crate::bindings::tessera::inference::log,
            "tessera:inference/metrics@0.1.0": crate::bindings::tessera::inference::metrics,
        },
    });
}

/// What [`export_decoupled_model!`] expands to; not part of the API.
#[doc(hidden)]
pub use decoupled::private as __private_decoupled;

/// The most used items, for `use tessera_guest::prelude::*;`.
pub mod prelude {
    pub use crate::{
        DataType, Error, ErrorKind, Model, ModelConfig, Request, Response, ResultExt, Tensor,
        export_model, infer,
    };
}

/// A model handler: what Triton's Python backend calls `TritonPythonModel`.
///
/// The host creates `instance_group.count` instances of the component; each calls
/// [`initialize`](Model::initialize) once, then [`execute`](Model::execute) for every batch the
/// scheduler forms, then [`finalize`](Model::finalize) before it is dropped. Export the
/// implementing type with [`export_model!`].
///
/// Implement either [`execute`](Model::execute), which sees the whole batch (to run it in one
/// go), or [`execute_request`](Model::execute_request), which the default `execute` calls once
/// per request.
pub trait Model: Sized + 'static {
    /// Creates the instance from the model's configuration. An error makes the model version
    /// `UNAVAILABLE`, with the message in the host's log and status.
    fn initialize(config: &ModelConfig) -> Result<Self, String>;

    /// Runs a batch of requests; returns exactly one result per request, in order.
    ///
    /// The default calls [`execute_request`](Model::execute_request) for each request.
    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .into_iter()
            .map(|request| self.execute_request(request))
            .collect()
    }

    /// Runs one request; called by the default [`execute`](Model::execute).
    ///
    /// The default returns an `internal` error: implement this or `execute`.
    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let _ = request;
        Err(Error::internal(
            "the handler implements neither `execute` nor `execute_request`",
        ))
    }

    /// Called once before the instance is dropped at unload or shutdown. Does nothing by
    /// default; the instance is dropped right after.
    fn finalize(&mut self) {}
}

/// Makes a type implementing [`Model`] the component's handler: exports the WIT `handler`
/// interface (`initialize`, `execute`, `finalize`) and keeps the instance's state.
///
/// Use it once per crate, at item level:
///
/// ```no_run
/// use tessera_guest::{Error, Model, ModelConfig, Request, Response};
///
/// struct Echo;
///
/// impl Model for Echo {
///     fn initialize(_config: &ModelConfig) -> Result<Self, String> {
///         Ok(Echo)
///     }
///
///     fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
///         Ok(Response::from(request.into_inputs()))
///     }
/// }
///
/// tessera_guest::export_model!(Echo);
/// ```
#[macro_export]
macro_rules! export_model {
    ($model:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __TESSERA_MODEL: ::core::cell::RefCell<::core::option::Option<$model>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            struct __TesseraHandler;

            impl $crate::__private::Guest for __TesseraHandler {
                fn initialize(
                    config_json: ::std::string::String,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    $crate::__private::initialize::<$model>(&__TESSERA_MODEL, config_json)
                }

                fn execute(
                    requests: ::std::vec::Vec<$crate::__private::WitRequest>,
                ) -> ::std::vec::Vec<
                    ::core::result::Result<
                        $crate::__private::WitResponse,
                        $crate::__private::WitError,
                    >,
                > {
                    $crate::__private::execute::<$model>(&__TESSERA_MODEL, requests)
                }

                fn finalize() {
                    $crate::__private::finalize::<$model>(&__TESSERA_MODEL)
                }
            }

            $crate::__private::bindings::__export_model_world!(
                __TesseraHandler with_types_in $crate::__private::bindings
            );
        };
    };
}

/// What [`export_model!`] expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;
    use std::thread::LocalKey;

    pub use crate::bindings;
    pub use crate::bindings::exports::tessera::inference::handler::Guest;
    use crate::bindings::tessera::inference::types as wit;
    pub use wit::{Error as WitError, Request as WitRequest, Response as WitResponse};

    use crate::{Error, Model, ModelConfig, Request, Response};

    /// The instance's state, one per component instance.
    pub type Slot<M> = LocalKey<RefCell<Option<M>>>;

    pub fn initialize<M: Model>(slot: &'static Slot<M>, config_json: String) -> Result<(), String> {
        install(slot, config_json, M::initialize)
    }

    /// Creates the instance's state from its configuration (both handler worlds).
    pub fn install<M: 'static>(
        slot: &'static Slot<M>,
        config_json: String,
        create: impl FnOnce(&ModelConfig) -> Result<M, String>,
    ) -> Result<(), String> {
        install_panic_hook();
        let config = ModelConfig::from_json(&config_json)?;
        let model = create(&config)?;
        slot.with(|cell| match cell.try_borrow_mut() {
            Ok(mut state) => {
                *state = Some(model);
                Ok(())
            }
            Err(_) => Err("initialize was called while the instance was busy".to_owned()),
        })
    }

    /// Takes the instance's state out for `finalize` (both handler worlds).
    pub fn take<M: 'static>(slot: &'static Slot<M>) -> Option<M> {
        slot.with(|cell| {
            cell.try_borrow_mut()
                .ok()
                .and_then(|mut state| state.take())
        })
    }

    pub fn execute<M: Model>(
        slot: &'static Slot<M>,
        requests: Vec<WitRequest>,
    ) -> Vec<Result<WitResponse, WitError>> {
        let count = requests.len();
        let wanted: Vec<Vec<String>> = requests
            .iter()
            .map(|r| r.requested_outputs.clone())
            .collect();
        let requests: Vec<Request> = requests.into_iter().map(Request::from).collect();
        let mut results = slot.with(|cell| match cell.try_borrow_mut() {
            Ok(mut state) => match state.as_mut() {
                Some(model) => model.execute(requests),
                None => vec![
                    Err(Error::internal(
                        "execute was called before initialize succeeded"
                    ));
                    count
                ],
            },
            Err(_) => vec![
                Err(Error::internal(
                    "execute was called while the instance was busy"
                ));
                count
            ],
        });
        if results.len() != count {
            crate::log::error!(
                "the handler returned {} results for {count} requests",
                results.len()
            );
            results.resize_with(count, || {
                Err(Error::internal(
                    "the handler returned no result for this request",
                ))
            });
        }
        results
            .into_iter()
            .zip(wanted)
            .map(|(result, wanted)| result.and_then(|response| finish(response, &wanted)))
            .map(|result| result.map(Into::into).map_err(Into::into))
            .collect()
    }

    /// Drops the outputs nobody asked for and checks the rest.
    fn finish(mut response: Response, wanted: &[String]) -> Result<Response, Error> {
        if !wanted.is_empty() {
            response
                .outputs
                .retain(|t| wanted.iter().any(|w| w == t.name()));
            if let Some(missing) = wanted
                .iter()
                .find(|w| !response.outputs.iter().any(|t| t.name() == w.as_str()))
            {
                return Err(Error::internal(format!(
                    "the handler did not produce requested output '{missing}'"
                )));
            }
        }
        for output in &response.outputs {
            output.validate().map_err(|e| {
                Error::internal(format!(
                    "the handler produced an invalid output: {}",
                    e.message()
                ))
            })?;
        }
        Ok(response)
    }

    pub fn finalize<M: Model>(slot: &'static Slot<M>) {
        if let Some(mut model) = take(slot) {
            model.finalize();
        }
    }

    /// Sends panic messages to the host's log before the instance aborts.
    pub fn install_panic_hook() {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                crate::log::log(
                    crate::log::Level::Error,
                    &format!("handler panicked: {info}"),
                );
                previous(info);
            }));
        });
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::Tensor;

        #[test]
        fn finish_filters_and_validates() {
            let response = Response::new()
                .with_output(Tensor::from_f32("A", [1], &[1.0]))
                .with_output(Tensor::from_f32("B", [1], &[2.0]));
            let kept = finish(response.clone(), &["B".to_owned()]).unwrap();
            assert_eq!(kept.outputs().len(), 1);
            assert_eq!(kept.outputs()[0].name(), "B");
            assert!(
                finish(response.clone(), &["C".to_owned()])
                    .unwrap_err()
                    .is_internal()
            );
            assert_eq!(finish(response, &[]).unwrap().outputs().len(), 2);
            let bad = Response::new().with_output(Tensor::from_f32("A", [2], &[1.0]));
            assert!(
                finish(bad, &[])
                    .unwrap_err()
                    .message()
                    .contains("invalid output")
            );
        }
    }
}
