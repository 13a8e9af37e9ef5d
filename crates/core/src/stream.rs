//! Streams of responses: how a decoupled model (Triton's `model_transaction_policy { decoupled:
//! true }`) answers one request with any number of responses.
//!
//! A call to a decoupled model carries a [`ResponseSender`]; the caller holds the matching
//! [`ResponseStream`]. Between them is a bounded channel ([`STREAM_BUFFER`] messages), so a
//! reader that falls behind makes [`ResponseSender::send`] wait: a slow reader slows the sender
//! and memory stays bounded. Dropping the stream is cancellation: every later send fails with
//! [`SendError::Cancelled`] and [`ResponseSender::is_cancelled`] turns true, so the model can
//! stop its work for that request.
//!
//! A stream ends with a message marked `last` (a response, an error, or nothing: Triton's
//! flags-only final). A sender that is dropped before one was sent ends the stream with an
//! error instead, so a caller never waits forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use crate::infer::{InferError, InferResponse, InferResult};

/// Messages buffered between a sender and a slow reader before `send` waits.
pub const STREAM_BUFFER: usize = 16;

/// One message of a stream: a response or an error (`None`: a final message without a
/// response), and whether it is the last.
#[derive(Debug)]
pub struct StreamMessage {
    pub result: Option<InferResult>,
    pub last: bool,
}

/// Why a send did not go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The caller has gone: it cancelled, disconnected or stopped waiting.
    #[error("the caller cancelled the request")]
    Cancelled,
    /// The last message was already sent.
    #[error("the final response was already sent")]
    Closed,
}

/// Why [`ResponseSender::try_send`] did not send.
#[derive(Debug, thiserror::Error)]
pub enum TrySendError {
    /// The reader's buffer is full; the message comes back.
    #[error("the reader's buffer is full")]
    Full(Box<StreamMessage>),
    #[error("the caller cancelled the request")]
    Cancelled,
    #[error("the final response was already sent")]
    Closed,
}

struct Shared {
    /// The last message went out (by the model or by the host on its behalf).
    finished: AtomicBool,
}

/// The sending end of a stream, handed to the model with the call. Clones send into the same
/// stream; the first `last` message ends it for all of them.
#[derive(Clone)]
pub struct ResponseSender {
    tx: mpsc::Sender<StreamMessage>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ResponseSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSender")
            .field("finished", &self.is_finished())
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl ResponseSender {
    /// Sends one message, waiting while the reader's buffer is full.
    pub async fn send(&self, result: Option<InferResult>, last: bool) -> Result<(), SendError> {
        self.claim(last)?;
        self.tx
            .send(StreamMessage { result, last })
            .await
            .map_err(|_| SendError::Cancelled)
    }

    /// Sends one message if the reader's buffer has room, without waiting: how a sender that
    /// serves many streams (an LLM engine's token loop) keeps one slow reader from holding up
    /// the others.
    pub fn try_send(&self, result: Option<InferResult>, last: bool) -> Result<(), TrySendError> {
        let permit = match self.tx.try_reserve() {
            Ok(permit) => permit,
            Err(mpsc::error::TrySendError::Full(())) => {
                return Err(TrySendError::Full(Box::new(StreamMessage { result, last })));
            }
            Err(mpsc::error::TrySendError::Closed(())) => return Err(TrySendError::Cancelled),
        };
        self.claim(last).map_err(|e| match e {
            SendError::Cancelled => TrySendError::Cancelled,
            SendError::Closed => TrySendError::Closed,
        })?;
        permit.send(StreamMessage { result, last });
        Ok(())
    }

    /// Ends the stream with `error` unless it has ended already, without waiting: an error is
    /// what the host sends when the model cannot (it failed, trapped or was unloaded).
    pub fn fail(&self, error: InferError) {
        if self.claim(true).is_err() {
            return;
        }
        let message = StreamMessage {
            result: Some(Err(error)),
            last: true,
        };
        match self.tx.try_send(message) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            // The reader is behind: deliver after what it has not read yet.
            Err(mpsc::error::TrySendError::Full(message)) => {
                let tx = self.tx.clone();
                tokio::spawn(async move { tx.send(message).await });
            }
        }
    }

    /// Whether the caller has gone.
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether the last message was sent.
    pub fn is_finished(&self) -> bool {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// Waits until the caller has gone.
    pub async fn cancelled(&self) {
        self.tx.closed().await;
    }

    /// A handle that does not keep the stream open: a stream whose every sender is gone ends
    /// (with an error if no final message was sent) even while weak handles remain.
    pub fn downgrade(&self) -> WeakResponseSender {
        WeakResponseSender {
            tx: self.tx.downgrade(),
            shared: self.shared.clone(),
        }
    }

    /// Checks that a message may still be sent, and marks the stream finished if it is `last`.
    fn claim(&self, last: bool) -> Result<(), SendError> {
        if self.is_cancelled() {
            return Err(SendError::Cancelled);
        }
        let finished = if last {
            self.shared.finished.swap(true, Ordering::AcqRel)
        } else {
            self.is_finished()
        };
        if finished {
            Err(SendError::Closed)
        } else {
            Ok(())
        }
    }
}

/// A [`ResponseSender`] that does not keep the stream open ([`ResponseSender::downgrade`]).
pub struct WeakResponseSender {
    tx: mpsc::WeakSender<StreamMessage>,
    shared: Arc<Shared>,
}

impl WeakResponseSender {
    /// The sender, while some other sender keeps the stream open.
    pub fn upgrade(&self) -> Option<ResponseSender> {
        Some(ResponseSender {
            tx: self.tx.upgrade()?,
            shared: self.shared.clone(),
        })
    }
}

/// What the reader does to each response before handing it on (the model's output checks,
/// its name, version and the request id).
pub type Finish = Arc<dyn Fn(InferResponse) -> InferResult + Send + Sync>;

/// Sees every message as the reader reads it, before [`Finish`] (statistics).
pub type Inspect = Arc<dyn Fn(&StreamMessage) + Send + Sync>;

/// The receiving end: the caller's. Dropping it cancels the request.
pub struct ResponseStream {
    rx: mpsc::Receiver<StreamMessage>,
    finish: Option<Finish>,
    inspect: Option<Inspect>,
    /// Held as long as the stream is read: admission and accounting of the request.
    guards: Vec<Box<dyn Send + Sync>>,
    ended: bool,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("ended", &self.ended)
            .finish()
    }
}

/// A new stream: the sender goes with the call, the stream to the caller.
pub fn channel() -> (ResponseSender, ResponseStream) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let sender = ResponseSender {
        tx,
        shared: Arc::new(Shared {
            finished: AtomicBool::new(false),
        }),
    };
    let stream = ResponseStream {
        rx,
        finish: None,
        inspect: None,
        guards: Vec::new(),
        ended: false,
    };
    (sender, stream)
}

impl ResponseStream {
    /// A stream of exactly one message: a model that is not decoupled, seen as a stream.
    pub fn single(result: InferResult) -> ResponseStream {
        let (sender, stream) = channel();
        // A fresh channel has room and a reader, so this cannot fail.
        let _ = sender.tx.try_send(StreamMessage {
            result: Some(result),
            last: true,
        });
        stream
    }

    /// Applies `finish` to every response read from now on (after any already set).
    pub fn map(mut self, finish: Finish) -> ResponseStream {
        self.finish = Some(match self.finish.take() {
            None => finish,
            Some(first) => Arc::new(move |r| first(r).and_then(|r| finish(r))),
        });
        self
    }

    /// Shows every message read from now on to `inspect` (one inspector per stream).
    pub fn inspect(mut self, inspect: Inspect) -> ResponseStream {
        self.inspect = Some(inspect);
        self
    }

    /// Whether the last message was read.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Keeps `guard` alive while the stream is read.
    pub fn hold(mut self, guard: impl Send + Sync + 'static) -> ResponseStream {
        self.guards.push(Box::new(guard));
        self
    }

    /// The next message; `None` after the last one. A stream whose senders all went away
    /// without a last message ends with an error.
    pub async fn next(&mut self) -> Option<StreamMessage> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// The next message if one has arrived (`Some(None)`: the stream has ended), without
    /// waiting; `None` when there is nothing yet.
    pub fn try_next(&mut self) -> Option<Option<StreamMessage>> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match self.poll_next(&mut cx) {
            std::task::Poll::Ready(message) => Some(message),
            std::task::Poll::Pending => None,
        }
    }

    /// [`ResponseStream::next`] as a poll: how one waits on many streams at once.
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StreamMessage>> {
        if self.ended {
            return std::task::Poll::Ready(None);
        }
        let message = match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(message) => message,
            None => StreamMessage {
                result: Some(Err(InferError::internal(
                    "the model ended the stream without a final response",
                ))),
                last: true,
            },
        };
        if let Some(inspect) = &self.inspect {
            inspect(&message);
        }
        let result = match (message.result, &self.finish) {
            (Some(Ok(response)), Some(finish)) => Some(finish(response)),
            (result, _) => result,
        };
        if message.last {
            self.ended = true;
            // Done: admission, and what the model's version holds for the stream, end now,
            // not when the reader drops the stream.
            self.guards.clear();
            self.finish = None;
            self.inspect = None;
            self.rx.close();
        }
        std::task::Poll::Ready(Some(StreamMessage {
            result,
            last: message.last,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(n: i64) -> InferResult {
        Ok(InferResponse {
            id: n.to_string(),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn messages_arrive_in_order_and_the_last_ends_the_stream() {
        let (tx, mut rx) = channel();
        tx.send(Some(response(1)), false).await.expect("sent");
        tx.send(None, true).await.expect("sent");
        assert_eq!(
            tx.send(Some(response(2)), false).await,
            Err(SendError::Closed)
        );
        let first = rx.next().await.expect("first");
        assert!(!first.last && first.result.is_some());
        let last = rx.next().await.expect("last");
        assert!(last.last && last.result.is_none());
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn a_full_buffer_makes_the_sender_wait_and_a_dropped_reader_cancels() {
        let (tx, rx) = channel();
        for n in 0..STREAM_BUFFER {
            tx.send(Some(response(n as i64)), false)
                .await
                .expect("room");
        }
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            tx.send(Some(response(99)), false),
        )
        .await;
        assert!(blocked.is_err(), "the sender waits for the reader");
        drop(rx);
        assert!(tx.is_cancelled());
        assert_eq!(
            tx.send(Some(response(1)), false).await,
            Err(SendError::Cancelled)
        );
    }

    #[tokio::test]
    async fn a_sender_gone_without_a_last_message_ends_the_stream_with_an_error() {
        let (tx, mut rx) = channel();
        drop(tx);
        let end = rx.next().await.expect("an end");
        assert!(end.last && matches!(end.result, Some(Err(_))));
        let (tx, mut rx) = channel();
        tx.fail(InferError::internal("trapped"));
        tx.fail(InferError::internal("twice"));
        let end = rx.next().await.expect("an end");
        assert_eq!(
            end.result.and_then(Result::err).map(|e| e.message),
            Some("trapped".to_owned())
        );
        assert!(rx.next().await.is_none());
    }

    #[tokio::test]
    async fn a_weak_sender_does_not_keep_the_stream_open() {
        let (tx, mut rx) = channel();
        let weak = tx.downgrade();
        assert!(weak.upgrade().is_some(), "the sender is alive");
        drop(tx);
        let end = rx.next().await.expect("an end");
        assert!(end.last && matches!(end.result, Some(Err(_))));
        assert!(weak.upgrade().is_none());
    }

    #[tokio::test]
    async fn finish_applies_to_responses_and_guards_go_at_the_last_message() {
        let guard = Arc::new(());
        let stream = ResponseStream::single(response(7))
            .map(Arc::new(|mut r: InferResponse| {
                r.model_name = "m".into();
                Ok(r)
            }))
            .hold(guard.clone());
        let mut stream = stream;
        assert_eq!(Arc::strong_count(&guard), 2);
        let only = stream.next().await.expect("one");
        assert_eq!(only.result.expect("some").expect("ok").model_name, "m");
        assert_eq!(Arc::strong_count(&guard), 1, "released at the last message");
    }
}
