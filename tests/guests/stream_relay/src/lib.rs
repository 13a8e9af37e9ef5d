//! Test fixture: a decoupled handler that calls `stream_probe` with `infer_stream` and forwards
//! every response as it comes (BLS over a stream). When its own caller goes away, it drops the
//! inner stream, which cancels the call to `stream_probe` too. MODE 9 calls `stream_probe` with a
//! one-response `infer` instead, which a decoupled model refuses. MODE 8 opens streams without
//! reading them until the host refuses one, and fails with how many it opened and why.

use tessera_guest::{DecoupledModel, ModelConfig, Request, ResponseSender, infer, infer_stream};

struct StreamRelay;

fn forward(request: Request, sender: ResponseSender) {
    let mode = request
        .input("MODE")
        .ok()
        .and_then(|t| t.as_slice::<u32>().ok()?.first().copied())
        .unwrap_or(0);
    let inner = Request::builder().inputs(request.into_inputs()).build();
    if mode == 8 {
        let mut held = Vec::new();
        let refused = loop {
            match infer_stream("stream_probe", None, inner.clone()) {
                Ok(stream) => held.push(stream),
                Err(e) => break e,
            }
        };
        let _ = sender.fail(tessera_guest::Error::internal(format!(
            "opened {}: {refused}",
            held.len()
        )));
        return;
    }
    if mode == 9 {
        let _ = match infer("stream_probe", None, inner) {
            Ok(response) => sender.send_final(response),
            Err(e) => sender.fail(e),
        };
        return;
    }
    let stream = match infer_stream("stream_probe", None, inner) {
        Ok(stream) => stream,
        Err(e) => {
            let _ = sender.fail(e);
            return;
        }
    };
    for response in stream {
        let sent = match response {
            Ok(response) => sender.send(response),
            Err(e) => {
                let _ = sender.fail(e);
                return;
            }
        };
        if sent.is_err() {
            return; // our caller went away: dropping the stream cancels the inner call
        }
    }
    let _ = sender.finish();
}

impl DecoupledModel for StreamRelay {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(StreamRelay)
    }

    fn execute(&mut self, requests: Vec<(Request, ResponseSender)>) {
        for (request, sender) in requests {
            forward(request, sender);
        }
    }
}

tessera_guest::export_decoupled_model!(StreamRelay);
