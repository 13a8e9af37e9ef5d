//! Test fixture `guest_http_import`: a well-formed model handler (Y = X for X: FP32 `[batch, 1]`)
//! that would make an HTTP request for a negative X, so the component imports
//! `wasi:http/outgoing-handler`, which the model world does not provide. Deploying it must fail
//! with a 400 that names the import and says what to do.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};
use wstd::http::{Body, Client, Request as HttpRequest};

/// The handler.
pub struct GuestHttpImport;

impl Model for GuestHttpImport {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestHttpImport)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if x.as_f32()?.iter().any(|v| *v < 0.0) {
            let outgoing = HttpRequest::get("http://127.0.0.1/")
                .body(Body::empty())
                .map_err(|e| Error::internal(e.to_string()))?;
            wstd::runtime::block_on(Client::new().send(outgoing))
                .map_err(|e| Error::internal(e.to_string()))?;
        }
        Ok(Response::new().with_output(x.renamed("Y")))
    }
}

tessera_guest::export_model!(GuestHttpImport);
