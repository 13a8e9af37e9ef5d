//! Test fixture: a decoupled handler that sends `COUNT` responses of `BYTES` bytes each.
//!
//! - MODE 0 (default): sends everything from `execute`, each send waiting for the reader; a
//!   cancelled caller stops it at the next send.
//! - MODE 1: keeps the sender and sends one response per `resume`.
//! - MODE 2: drops the sender without a final response.
//! - MODE 3: traps after the first response.

use tessera_guest::{
    DataType, DecoupledModel, Error, ModelConfig, Request, Response, ResponseSender, Resume, Tensor,
};

struct Pending {
    sender: ResponseSender,
    next: u32,
    count: u32,
    bytes: u32,
}

#[derive(Default)]
struct StreamProbe {
    pending: Vec<Pending>,
}

fn scalar(request: &Request, name: &str) -> Result<u32, Error> {
    let tensor = request.input(name)?;
    tensor.check(DataType::Uint32, &[1])?;
    Ok(tensor.as_slice::<u32>()?.first().copied().unwrap_or(0))
}

fn response(index: u32, bytes: u32) -> Response {
    let data = vec![(index % 251) as u8; bytes as usize];
    Response::new()
        .with_output(Tensor::from_u8("DATA", [i64::from(bytes)], &data))
        .with_output(Tensor::from_slice("IDX", [1], &[index]))
}

impl DecoupledModel for StreamProbe {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(StreamProbe::default())
    }

    fn execute(&mut self, requests: Vec<(Request, ResponseSender)>) {
        for (request, sender) in requests {
            let parsed = (|| {
                let mode = if request.inputs().iter().any(|t| t.name() == "MODE") {
                    scalar(&request, "MODE")?
                } else {
                    0
                };
                Ok::<_, Error>((scalar(&request, "COUNT")?, scalar(&request, "BYTES")?, mode))
            })();
            let (count, bytes, mode) = match parsed {
                Ok(parsed) => parsed,
                Err(e) => {
                    let _ = sender.fail(e);
                    continue;
                }
            };
            match mode {
                1 if count == 0 => {
                    let _ = sender.finish();
                }
                1 => self.pending.push(Pending {
                    sender,
                    next: 0,
                    count,
                    bytes,
                }),
                2 => drop(sender),
                3 => {
                    let _ = sender.send(response(0, bytes));
                    panic!("stream_probe: trapping mid-stream as asked");
                }
                _ => {
                    for index in 0..count {
                        if sender.send(response(index, bytes)).is_err() {
                            break; // the caller went away: stop working for it
                        }
                    }
                    let _ = sender.finish();
                }
            }
        }
    }

    fn resume(&mut self) -> Resume {
        let mut open = Vec::with_capacity(self.pending.len());
        for mut p in self.pending.drain(..) {
            if p.sender.send(response(p.next, p.bytes)).is_err() {
                continue; // the caller went away: forget it
            }
            p.next += 1;
            if p.next >= p.count {
                let _ = p.sender.finish();
            } else {
                open.push(p);
            }
        }
        self.pending = open;
        if self.pending.is_empty() {
            Resume::Done
        } else {
            Resume::Now
        }
    }
}

tessera_guest::export_decoupled_model!(StreamProbe);
