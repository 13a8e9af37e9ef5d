//! Triton's `repeat_int32` contract as a decoupled handler: for a request with `IN` (INT32
//! `[n]`), `DELAY` (UINT32 `[n]`, milliseconds) and `WAIT` (UINT32 `[1]`, milliseconds), it
//! sends `n` responses, the i-th `{ OUT: [IN[i]], IDX: [i] }` after `DELAY[i]` ms more, then,
//! `WAIT` ms after the last, ends the stream with a final response that has no outputs.
//!
//! It never sleeps: `execute` only takes the requests in, and `resume` sends whatever is due,
//! telling the host when the next response is. So one instance serves many streams at once, and
//! new requests start while others are still streaming (in-flight batching).

use std::time::{Duration, Instant};

use tessera_guest::{
    DataType, DecoupledModel, Error, ModelConfig, Request, Response, ResponseSender, Resume,
    SendError, Tensor,
};

/// One request being answered.
struct Stream {
    sender: ResponseSender,
    values: Vec<i32>,
    delays: Vec<u32>,
    wait: u32,
    /// The index of the next response to send (`values.len()`: only the final one is left).
    next: usize,
    /// When the next response is due.
    due: Instant,
}

impl Stream {
    /// Sends what is due at `now`. Returns false once the stream has ended.
    fn advance(&mut self, now: Instant) -> Result<bool, SendError> {
        while self.due <= now {
            let Some(&value) = self.values.get(self.next) else {
                return Ok(false);
            };
            let index = u32::try_from(self.next).unwrap_or(u32::MAX);
            let response = Response::new()
                .with_output(Tensor::from_i32("OUT", [1], &[value]))
                .with_output(Tensor::from_slice("IDX", [1], &[index]));
            self.sender.send(response)?;
            self.next += 1;
            let pause = self.delays.get(self.next).copied().unwrap_or(self.wait);
            self.due += Duration::from_millis(u64::from(pause));
        }
        Ok(true)
    }
}

#[derive(Default)]
struct Repeat {
    streams: Vec<Stream>,
}

fn parse(request: &Request) -> Result<(Vec<i32>, Vec<u32>, u32), Error> {
    let values = request.input("IN")?;
    values.check(DataType::Int32, &[-1])?;
    let delays = request.input("DELAY")?;
    delays.check(DataType::Uint32, &[-1])?;
    let wait = request.input("WAIT")?;
    wait.check(DataType::Uint32, &[1])?;
    let values = values.as_i32()?.into_owned();
    let delays = delays.as_slice::<u32>()?.into_owned();
    if delays.len() != values.len() {
        return Err(Error::invalid_input(format!(
            "DELAY has {} elements and IN {}: one delay per value",
            delays.len(),
            values.len()
        )));
    }
    let wait = wait.as_slice::<u32>()?.first().copied().unwrap_or(0);
    Ok((values, delays, wait))
}

impl DecoupledModel for Repeat {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(Repeat::default())
    }

    fn execute(&mut self, requests: Vec<(Request, ResponseSender)>) {
        let now = Instant::now();
        for (request, sender) in requests {
            match parse(&request) {
                Ok((values, delays, wait)) => {
                    let first = delays.first().copied().unwrap_or(wait);
                    self.streams.push(Stream {
                        sender,
                        values,
                        delays,
                        wait,
                        next: 0,
                        due: now + Duration::from_millis(u64::from(first)),
                    });
                }
                Err(e) => {
                    // The caller may have gone already; nothing else to do for it.
                    let _ = sender.fail(e);
                }
            }
        }
    }

    fn resume(&mut self) -> Resume {
        let now = Instant::now();
        let mut open = Vec::with_capacity(self.streams.len());
        for mut stream in self.streams.drain(..) {
            match stream.advance(now) {
                Ok(true) => open.push(stream),
                // Everything sent and the wait is over: the final response, without outputs.
                Ok(false) => {
                    let _ = stream.sender.finish();
                }
                // The caller went away (or the stream was ended): forget the request.
                Err(_) => {}
            }
        }
        self.streams = open;
        match self.streams.iter().map(|s| s.due).min() {
            None => Resume::Done,
            Some(due) => match due.checked_duration_since(Instant::now()) {
                Some(wait) if !wait.is_zero() => Resume::After(wait),
                _ => Resume::Now,
            },
        }
    }
}

tessera_guest::export_decoupled_model!(Repeat);
