//! Test fixture `function_probe`: a function whose paths each try one thing, for the isolation
//! and limit tests.
//!
//! | path | does |
//! |---|---|
//! | `/count` | bumps a static counter and answers it (always 1 in a fresh instance) |
//! | `/env` | the environment, `K=V` lines |
//! | `/file` | tries to read `/etc/passwd` |
//! | `/fetch?<url>` | a GET to `<url>`: `status N` or `error: ...` |
//! | `/spin` | loops forever |
//! | `/alloc?<mib>` | allocates and touches that many MiB |
//! | `/sleep?<ms>` | sleeps |
//! | `/echo` | streams the body back |
//! | `/big?<kib>` | answers that many KiB |
//! | `/infer?<model>` | calls `<model>` with X = [[1]] (FP32 [1, 1]) and answers Y |
//! | `/stream?<count>` | streams `stream_probe`'s `count` responses into the body as they come, one `IDX` per line |
//! | `/panic` | panics |
//! | `/trickle?<n>` | answers 200 at once, then a line every 100 ms; panics after `n` lines |
//! | `/status?<code>` | answers with that status |

use std::sync::atomic::{AtomicU32, Ordering};

use tessera_guest::{Request as InferRequest, Tensor};
use wstd::http::{Body, Client, Error, Request, Response};

static INVOCATIONS: AtomicU32 = AtomicU32::new(0);

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    let query = request.uri().query().unwrap_or("").to_owned();
    let text = match request.uri().path() {
        "/count" => format!("{}", INVOCATIONS.fetch_add(1, Ordering::SeqCst) + 1),
        "/env" => std::env::vars()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect(),
        "/file" => match std::fs::read_to_string("/etc/passwd") {
            Ok(text) => format!("read {} bytes", text.len()),
            Err(e) => format!("denied: {e}"),
        },
        "/fetch" => {
            let outgoing = Request::get(query.as_str()).body(Body::empty())?;
            match Client::new().send(outgoing).await {
                Ok(response) => format!("status {}", response.status().as_u16()),
                Err(e) => format!("error: {e}"),
            }
        }
        "/spin" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "/alloc" => {
            let mib: usize = query.parse().unwrap_or(1);
            let block = vec![1u8; mib << 20];
            format!("allocated {} MiB", std::hint::black_box(block).len() >> 20)
        }
        "/sleep" => {
            let ms: u64 = query.parse().unwrap_or(100);
            wstd::task::sleep(wstd::time::Duration::from_millis(ms)).await;
            format!("slept {ms} ms")
        }
        "/echo" => return Ok(Response::new(request.into_body())),
        "/big" => {
            let kib: usize = query.parse().unwrap_or(1);
            "x".repeat(kib << 10)
        }
        "/infer" => {
            let input = Tensor::from_f32("X", vec![1, 1], &[1.0]);
            match tessera_guest::infer(&query, None, InferRequest::new(vec![input])) {
                Ok(mut response) => match response.take_output("Y") {
                    Ok(y) => format!("{:?}", y.as_f32()?.to_vec()),
                    Err(e) => format!("error: {e}"),
                },
                Err(e) => format!("error: {e}"),
            }
        }
        "/stream" => {
            let count: u32 = query.parse().unwrap_or(1);
            let request = InferRequest::builder()
                .input(Tensor::from_slice("COUNT", [1], &[count]))
                .input(Tensor::from_slice("BYTES", [1], &[8u32]))
                .build();
            let stream = tessera_guest::infer_stream("stream_probe", None, request)?;
            let lines = stream.map(|response| match response {
                Ok(response) => match response.output("IDX").and_then(|t| t.as_slice::<u32>()) {
                    Ok(idx) => format!("{}\n", idx.first().copied().unwrap_or(0)),
                    Err(e) => format!("error: {e}\n"),
                },
                Err(e) => format!("error: {e}\n"),
            });
            // Each line goes out as soon as its response arrives.
            return Ok(Response::new(Body::from_stream(
                futures_lite::stream::iter(lines),
            )));
        }
        "/metric" => {
            // A fresh instance each time: the count lives in the host, held for the function.
            let calls = tessera_guest::metrics::Family::new(
                "probe_function_calls_total",
                "Calls of function_probe's /metric",
                tessera_guest::metrics::Kind::Counter,
            )
            .and_then(|family| family.metric(&[]))
            .and_then(|counter| {
                counter.increment(1.0)?;
                counter.value()
            });
            match calls {
                Ok(n) => format!("{n}"),
                Err(e) => format!("error: {e}"),
            }
        }
        "/panic" => panic!("the probe panics on request"),
        "/trickle" => {
            let lines: u32 = query.parse().unwrap_or(3);
            let body = futures_lite::stream::unfold(0u32, move |line| async move {
                wstd::task::sleep(wstd::time::Duration::from_millis(100)).await;
                if line == lines {
                    panic!("the probe panics after {lines} lines");
                }
                Some((format!("{line}\n"), line + 1))
            });
            return Ok(Response::new(Body::from_stream(body)));
        }
        "/status" => {
            let mut response = Response::new(Body::from("a status of the caller's choosing"));
            *response.status_mut() = wstd::http::StatusCode::from_u16(query.parse().unwrap_or(200))
                .unwrap_or(wstd::http::StatusCode::OK);
            return Ok(response);
        }
        other => format!("unknown probe {other}"),
    };
    Ok(Response::new(text.into()))
}
