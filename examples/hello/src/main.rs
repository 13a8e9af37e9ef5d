//! `hello`: the smallest function. A standard `wasi:http` component built with `wstd`, with no
//! Tessera imports, so the same `.wasm` runs under `wasmtime serve -Scli` and in Tessera.
//!
//! - `GET /` answers a greeting (the `GREETING` environment variable, if the manifest sets it).
//! - `POST /echo` streams the request body back.

use wstd::http::{Body, Error, Request, Response, StatusCode};

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    match request.uri().path() {
        "/" => {
            let greeting =
                std::env::var("GREETING").unwrap_or_else(|_| "Hello from a function".to_owned());
            Ok(Response::new(format!("{greeting}!\n").into()))
        }
        "/echo" => Ok(Response::new(request.into_body())),
        _ => Ok(Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body("not found\n".to_owned().into())?),
    }
}
