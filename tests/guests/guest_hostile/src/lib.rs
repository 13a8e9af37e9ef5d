//! Test fixture `guest_hostile`, written only against `wit/tessera.wit` (no SDK, nothing checked on
//! the guest side). Answers `Y = X` for X >= 0; a negative X picks an attack:
//!
//! | X   | attack |
//! |-----|--------|
//! | -1  | floods the `log` import (200 messages of 1 MiB, then 100 000 empty ones), then answers normally |
//! | -2  | a 32 MiB response parameter |
//! | -3  | a 32 MiB error message |
//! | -4  | 4 M empty BYTES elements (16 MB on the wire, 0 bytes of payload) |
//! | -5  | an FP32 output of shape [2^62] with no data (2^64 bytes wrap to 0) |
//! | -6  | opens 100 000 WASI output streams and keeps them |
//! | -7  | sleeps 1 s, then calls the model named by its `peer` parameter with X = 1 |
//! | -9  | fails with the outcome of the `infer` call its `initialize` made (`call_in_initialize`) |
//! | -10 | traps (the instance is replaced; the new one runs `initialize` again) |
//! | -11 | returns Y as INT32, where the configuration declares FP32 |
//! | -12 | returns an output Z that the configuration does not declare |
//!
//! The same component serves several models of the fixture repository: `mutual_a` and `mutual_b`
//! name each other as `peer`; `init_self_call` calls itself from `initialize`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "model",
});

use exports::tessera::inference::handler::Guest;
use tessera::inference::inference::infer;
use tessera::inference::log::{Level, log};
use tessera::inference::types::{
    Datatype, Error, ErrorKind, Parameter, ParameterValue, Request, Response, Tensor, TensorData,
};

struct Hostile;

struct State {
    peer: Option<String>,
    init_call: String,
    streams: Vec<wasip2::io::streams::OutputStream>,
}

static STATE: std::sync::Mutex<State> = std::sync::Mutex::new(State {
    peer: None,
    init_call: String::new(),
    streams: Vec::new(),
});

fn string_parameter(config: &serde_json::Value, key: &str) -> Option<String> {
    config["parameters"][key]["string_value"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn x_request(value: f32) -> Request {
    Request {
        id: String::new(),
        inputs: vec![Tensor {
            name: "X".into(),
            datatype: Datatype::Fp32,
            shape: vec![1, 1],
            data: TensorData::Raw(value.to_le_bytes().to_vec()),
        }],
        requested_outputs: Vec::new(),
        parameters: Vec::new(),
    }
}

fn error(message: String) -> Error {
    Error {
        kind: ErrorKind::Internal,
        message,
    }
}

fn echo(x: &Tensor) -> Response {
    Response {
        outputs: vec![Tensor {
            name: "Y".into(),
            ..x.clone()
        }],
        parameters: Vec::new(),
    }
}

fn attack(x: &Tensor, value: f32) -> Result<Response, Error> {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    match value as i32 {
        -1 => {
            let big = "x".repeat(1 << 20);
            for _ in 0..200 {
                log(Level::Info, &big);
            }
            for _ in 0..100_000 {
                log(Level::Info, "");
            }
            Ok(echo(x))
        }
        -2 => Ok(Response {
            parameters: vec![Parameter {
                key: "p".into(),
                value: ParameterValue::String("p".repeat(32 << 20)),
            }],
            ..echo(x)
        }),
        -3 => Err(error("e".repeat(32 << 20))),
        -4 => Ok(Response {
            outputs: vec![Tensor {
                name: "Y".into(),
                datatype: Datatype::Bytes,
                shape: vec![1, 4 << 20],
                data: TensorData::Elements(vec![Vec::new(); 4 << 20]),
            }],
            parameters: Vec::new(),
        }),
        -5 => Ok(Response {
            outputs: vec![Tensor {
                name: "Y".into(),
                datatype: Datatype::Fp32,
                shape: vec![1 << 62],
                data: TensorData::Raw(Vec::new()),
            }],
            parameters: Vec::new(),
        }),
        -6 => {
            for _ in 0..100_000 {
                state.streams.push(wasip2::cli::stdout::get_stdout());
            }
            Ok(echo(x))
        }
        -7 => {
            let peer = state.peer.clone().ok_or_else(|| error("no peer".into()))?;
            drop(state);
            std::thread::sleep(std::time::Duration::from_secs(1));
            infer(&peer, None, &x_request(1.0))?;
            Ok(echo(x))
        }
        -9 => Err(error(format!("initialize's call: {}", state.init_call))),
        -10 => std::process::abort(),
        -11 => Ok(Response {
            outputs: vec![Tensor {
                name: "Y".into(),
                datatype: Datatype::Int32,
                ..x.clone()
            }],
            parameters: Vec::new(),
        }),
        -12 => Ok(Response {
            outputs: vec![Tensor {
                name: "Z".into(),
                ..x.clone()
            }],
            parameters: Vec::new(),
        }),
        _ => Err(Error {
            kind: ErrorKind::InvalidInput,
            message: format!("no attack for {value}"),
        }),
    }
}

impl Guest for Hostile {
    fn initialize(config_json: String) -> Result<(), String> {
        let config: serde_json::Value =
            serde_json::from_str(&config_json).map_err(|e| e.to_string())?;
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        state.peer = string_parameter(&config, "peer");
        if let Some(target) = string_parameter(&config, "call_in_initialize") {
            drop(state);
            let outcome = match infer(&target, None, &x_request(1.0)) {
                Ok(_) => "succeeded".to_owned(),
                Err(e) => format!("{:?}: {}", e.kind, e.message),
            };
            STATE.lock().unwrap_or_else(|p| p.into_inner()).init_call = outcome;
        }
        Ok(())
    }

    fn execute(requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .iter()
            .map(|request| {
                let x = request
                    .inputs
                    .iter()
                    .find(|t| t.name == "X")
                    .ok_or_else(|| error("no input X".into()))?;
                let value = match &x.data {
                    TensorData::Raw(b) if b.len() >= 4 => {
                        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                    }
                    _ => return Err(error("X must be FP32".into())),
                };
                if value >= 0.0 {
                    Ok(echo(x))
                } else {
                    attack(x, value)
                }
            })
            .collect()
    }

    fn finalize() {}
}

export!(Hostile);
