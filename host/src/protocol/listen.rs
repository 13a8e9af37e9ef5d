//! Accepting connections within bounds, and closing them within bounds at shutdown.
//!
//! A client must not be able to hold the server's resources by being slow, and a slow or idle
//! client must not keep the server from exiting:
//!
//! - **Connections per listener** are bounded (`--max-connections`). When every slot is taken
//!   and a new client connects, the connection idle the longest (no request in progress: an
//!   HTTP/1 keep-alive connection, one still trickling its headers, an HTTP/2 connection with no
//!   call open) is closed for it ([`Slots`]); when none is idle, the new client waits in the
//!   kernel's backlog until one closes. Idle connections are legitimate (clients pool them) but
//!   must not keep new clients out: 4,096 idle HTTP/2 connections held the gRPC port for good.
//! - **HTTP/1 request headers** must arrive within `--http-header-read-timeout-secs` (hyper's
//!   own timer, which also closes a keep-alive connection left idle that long), and a **request
//!   body** within `--http-body-read-timeout-secs` of the request ([`DeadlineBody`]; 408).
//! - **gRPC (HTTP/2) connections** must send the HTTP/2 preface and their first SETTINGS frame
//!   within the header timeout ([`Bounded`]); after that, an idle HTTP/2 connection is
//!   legitimate (clients keep channels open) and is bounded by the connection limit.
//! - **A client that stops reading** is disconnected once the connection's writes have made no
//!   progress for `--http-send-timeout-secs` ([`Sending`]); what its answers held in the budget
//!   for buffered bytes ([`WrittenBody`]) is given back. An HTTP/2 client can stop one stream
//!   while its connection goes on (it grants that stream no flow-control window): hyper then
//!   polls neither the stream's answer nor, for `ModelStreamInfer`, its requests, so what they
//!   hold is watched from outside ([`ConnectionCloser`]) and the connection closed when a held
//!   answer makes no progress for the send timeout or a message being read outlives its
//!   deadline.
//! - **At shutdown** readiness drops first, listeners stop accepting, every open connection is
//!   asked to finish (HTTP/1: after its request in flight; HTTP/2: GOAWAY, streams in flight
//!   finish), and whatever is still open after `--exit-timeout-secs` is closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::limits::ByteBudget;
use tokio::task::JoinSet;

pub use crate::limits::ConnectionLimits;

/// Waits until `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The next connection to serve, with its slot; None once `stop` is set. With every slot taken,
/// a client that connects gets the slot of the connection idle the longest ([`Slots::shed`]),
/// or waits for one to close.
async fn accept(
    listener: &TcpListener,
    slots: &Slots,
    stop: &watch::Receiver<bool>,
) -> Option<(TcpStream, OwnedSemaphorePermit)> {
    let free = slots.permits.clone().try_acquire_owned().ok();
    let (tcp, permit) = match free {
        Some(permit) => (accept_one(listener, stop).await?, permit),
        None => tokio::select! {
            permit = slots.permits.clone().acquire_owned() => {
                (accept_one(listener, stop).await?, permit.ok()?)
            }
            tcp = accept_one(listener, stop) => (tcp?, slots.freed_for_newcomer(stop).await?),
            () = stopped(stop.clone()) => return None,
        },
    };
    // Without TCP_NODELAY, an answer written in parts waits on the client's delayed ACK
    // (40 ms).
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("cannot set TCP_NODELAY: {e}");
    }
    Some((tcp, permit))
}

/// The next connection from `listener`; None once `stop` is set.
async fn accept_one(listener: &TcpListener, stop: &watch::Receiver<bool>) -> Option<TcpStream> {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => return Some(tcp),
                // Out of file descriptors, or a connection reset before it was accepted: the
                // listener itself is fine; pause so an exhausted process does not spin.
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = stopped(stop.clone()) => return None,
        }
    }
}

/// One listener's connection slots (`--max-connections`) and the connections holding them.
#[derive(Clone)]
pub struct Slots {
    permits: Arc<Semaphore>,
    open: Arc<std::sync::Mutex<Vec<std::sync::Weak<ConnectionState>>>>,
    /// Told when a connection's last request ends: a newcomer waiting for a slot may shed it.
    became_idle: Arc<tokio::sync::Notify>,
}

/// How long a connection must have been idle to be shed: a response handed over just now may
/// still be in its write buffers, and a pooled connection is likeliest to be reused soon
/// after its last answer.
const SHED_AFTER_IDLE_MS: u64 = 1000;

impl Slots {
    fn new(max_connections: usize) -> Slots {
        Slots {
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            open: Arc::default(),
            became_idle: Arc::default(),
        }
    }

    /// A slot for a client that connected while every slot was taken: the slot of an idle
    /// connection, closed for it, as soon as one is idle long enough (or a connection closes).
    async fn freed_for_newcomer(
        &self,
        stop: &watch::Receiver<bool>,
    ) -> Option<OwnedSemaphorePermit> {
        let mut warned = false;
        loop {
            // Once one is shed, its slot comes back when it has closed; until then, look again
            // when a connection turns idle and when one may have been idle long enough.
            let shed = self.shed();
            if !shed && !warned && now_and_then(&FULL_LOGGED_MS) {
                tracing::warn!(
                    "every connection slot (--max-connections) is in use: a new client waits \
                     until a connection closes or has been idle for a second (logged at most \
                     every 10 s)"
                );
                warned = true;
            }
            tokio::select! {
                permit = self.permits.clone().acquire_owned() => return permit.ok(),
                () = self.became_idle.notified(), if !shed => {}
                () = tokio::time::sleep(Duration::from_millis(SHED_AFTER_IDLE_MS)), if !shed => {}
                () = stopped(stop.clone()) => return None,
            }
        }
    }

    /// A newly accepted connection's state, counted among the open ones.
    fn register(&self) -> Arc<ConnectionState> {
        let state = Arc::new(ConnectionState::new(self.became_idle.clone()));
        if let Ok(mut open) = self.open.lock() {
            open.retain(|c| c.strong_count() > 0);
            open.push(Arc::downgrade(&state));
        }
        state
    }

    /// Closes the connection idle the longest, if one has been idle long enough, so that a new
    /// client gets its slot once it is gone.
    fn shed(&self) -> bool {
        self.shed_at(clock_ms())
    }

    /// [`Slots::shed`] at `now` ([`clock_ms`]).
    fn shed_at(&self, now: u64) -> bool {
        let Ok(mut open) = self.open.lock() else {
            return false;
        };
        open.retain(|c| c.strong_count() > 0);
        let idlest = open
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|c| {
                c.active.load(Ordering::Acquire) == 0
                    && !c.closer.is_closed()
                    && now.saturating_sub(c.idle_since.load(Ordering::Relaxed))
                        >= SHED_AFTER_IDLE_MS
            })
            .min_by_key(|c| c.idle_since.load(Ordering::Relaxed));
        drop(open);
        let Some(idlest) = idlest else {
            return false;
        };
        crate::limits::SHED_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        idlest.closer.close(
            "idle while every connection slot (--max-connections) was taken and a new client \
             connected"
                .into(),
        );
        true
    }
}

/// When a connection's closing and a full listener were last logged (a client that opens
/// connections as fast as it can must not fill the log).
static CLOSE_LOGGED_MS: AtomicU64 = AtomicU64::new(0);
static FULL_LOGGED_MS: AtomicU64 = AtomicU64::new(0);

/// Whether to log now: at most once every 10 s per `last`.
fn now_and_then(last: &AtomicU64) -> bool {
    // Stored one past the clock, so that 0 means never.
    let now = clock_ms().saturating_add(1);
    let before = last.load(Ordering::Relaxed);
    (before == 0 || now >= before.saturating_add(10_000))
        && last
            .compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Milliseconds since the first connection of the process, for ordering idle connections.
fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// What a connection is doing: requests in progress (from their start until their response's
/// body is dropped) and since when it has had none.
pub struct ConnectionState {
    active: std::sync::atomic::AtomicUsize,
    idle_since: AtomicU64,
    pub closer: ConnectionCloser,
    /// The listener's [`Slots::became_idle`].
    became_idle: Arc<tokio::sync::Notify>,
}

impl ConnectionState {
    fn new(became_idle: Arc<tokio::sync::Notify>) -> ConnectionState {
        ConnectionState {
            active: std::sync::atomic::AtomicUsize::new(0),
            idle_since: AtomicU64::new(clock_ms()),
            closer: ConnectionCloser::default(),
            became_idle,
        }
    }

    /// Counts a request in progress until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InProgress {
        self.active.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }
}

/// A request in progress on a connection (see [`ConnectionState::begin`]).
pub struct InProgress(Arc<ConnectionState>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.idle_since.store(clock_ms(), Ordering::Relaxed);
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.became_idle.notify_one();
        }
    }
}

/// A response body that keeps its request counted as in progress until it is dropped (written,
/// or its connection gone).
pub struct TrackedBody<B> {
    inner: B,
    _in_progress: InProgress,
}

impl<B> TrackedBody<B> {
    pub fn new(inner: B, in_progress: InProgress) -> TrackedBody<B> {
        TrackedBody {
            inner,
            _in_progress: in_progress,
        }
    }
}

impl<B> http_body::Body for TrackedBody<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves HTTP/1 `app` on `listener` until `stop` is set, then drains (see the module doc).
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) {
    let slots = Slots::new(limits.max_connections);
    let app = app.layer(axum::middleware::from_fn_with_state(
        limits.body_read_timeout,
        body_deadline,
    ));
    let (close, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    while let Some((tcp, permit)) = accept(&listener, &slots, &stop).await {
        let state = slots.register();
        let closer = state.closer.clone();
        let app = app.clone();
        // Each request counts as in progress on its connection until its response is dropped,
        // so that only idle connections are shed.
        let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
            let in_progress = state.begin();
            let mut router = app.clone();
            async move {
                std::future::poll_fn(|cx| {
                    tower_service::Service::<axum::extract::Request>::poll_ready(&mut router, cx)
                })
                .await?;
                let response =
                    tower_service::Service::call(&mut router, request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| TrackedBody::new(body, in_progress)),
                )
            }
        });
        let closing = closing.clone();
        let header_read_timeout = limits.header_read_timeout;
        let send_timeout = limits.send_timeout;
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let connection = builder.serve_connection(
                TokioIo::new(Sending::new(tcp, send_timeout, closer)),
                service,
            );
            tokio::pin!(connection);
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!("HTTP connection ended: {e}");
                    }
                }
                () = stopped(closing) => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        // Reap finished connections so the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = close.send(true);
    drain(connections, limits.exit_timeout).await;
}

/// Waits for `connections` to finish, at most `timeout`; closes the rest.
async fn drain(mut connections: JoinSet<()>, timeout: Duration) {
    let all_closed = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(timeout, all_closed).await.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "closing connections still open after --exit-timeout-secs"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

/// The accepted connections of a gRPC listener, for tonic: bounded in number, each given
/// [`Bounded`]'s preface deadline; ends when `stop` is set.
pub fn grpc_incoming(
    listener: TcpListener,
    limits: &ConnectionLimits,
    stop: watch::Receiver<bool>,
) -> impl futures::Stream<Item = std::io::Result<Bounded>> + Send + 'static {
    let slots = Slots::new(limits.max_connections);
    let preface_timeout = limits.header_read_timeout;
    let send_timeout = limits.send_timeout;
    futures::stream::unfold(
        (listener, slots, stop),
        move |(listener, slots, stop)| async move {
            let (tcp, permit) = accept(&listener, &slots, &stop).await?;
            let state = slots.register();
            let tcp = Sending::new(tcp, send_timeout, state.closer.clone());
            let connection = Bounded::new(tcp, permit, state, preface_timeout);
            Some((Ok(connection), (listener, slots, stop)))
        },
    )
}

/// HTTP/2's connection preface, which a client sends first.
const HTTP2_PREFACE_LEN: usize = 24;
/// An HTTP/2 frame's header: the 24-bit length of its payload, its type, flags and stream.
const HTTP2_FRAME_HEADER_LEN: usize = 9;

/// A TCP connection that holds a connection permit while it lives, and fails its reads when the
/// client has not started HTTP/2 within the deadline: the preface and the SETTINGS frame that
/// must follow it (RFC 9113, 3.4), whole. The preface alone held a connection for good.
pub struct Bounded {
    tcp: Sending<TcpStream>,
    _permit: OwnedSemaphorePermit,
    state: Arc<ConnectionState>,
    /// Until the client's first frame has arrived: the deadline and what was read of it.
    preface: Option<(Pin<Box<tokio::time::Sleep>>, Start)>,
}

/// The first bytes of an HTTP/2 connection, as far as they were read.
struct Start {
    seen: usize,
    /// The preface and the first frame's header.
    head: [u8; HTTP2_PREFACE_LEN + HTTP2_FRAME_HEADER_LEN],
}

impl Default for Start {
    fn default() -> Start {
        Start {
            seen: 0,
            head: [0; HTTP2_PREFACE_LEN + HTTP2_FRAME_HEADER_LEN],
        }
    }
}

impl Start {
    /// Takes newly read bytes; true once the preface and the whole first frame are in.
    fn read(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            if let Some(slot) = self.head.get_mut(self.seen) {
                *slot = byte;
            }
            self.seen += 1;
        }
        if self.seen < self.head.len() {
            return false;
        }
        let at = HTTP2_PREFACE_LEN;
        let payload = usize::from(self.head[at]) << 16
            | usize::from(self.head[at + 1]) << 8
            | usize::from(self.head[at + 2]);
        self.seen >= self.head.len() + payload
    }
}

impl Bounded {
    fn new(
        tcp: Sending<TcpStream>,
        permit: OwnedSemaphorePermit,
        state: Arc<ConnectionState>,
        timeout: Duration,
    ) -> Bounded {
        Bounded {
            tcp,
            _permit: permit,
            state,
            preface: Some((Box::pin(tokio::time::sleep(timeout)), Start::default())),
        }
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if let Some((deadline, start)) = &mut this.preface {
            if let Poll::Ready(Ok(())) = read
                && start.read(&buf.filled()[before..])
            {
                this.preface = None;
                return read;
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client did not start HTTP/2 within the header read timeout",
                )));
            }
        }
        read
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Bounded {
    type ConnectInfo = GrpcConnection;

    fn connect_info(&self) -> GrpcConnection {
        GrpcConnection {
            tcp: self.tcp.io.connect_info(),
            state: self.state.clone(),
        }
    }
}

/// What tonic puts in each request's extensions about the connection it came on.
#[derive(Clone)]
pub struct GrpcConnection {
    pub tcp: tonic::transport::server::TcpConnectInfo,
    pub state: Arc<ConnectionState>,
}

/// Closes one gRPC connection from outside hyper, for what a stream holds past its deadline
/// while hyper does not poll it: a stream's body is polled only when the stream may send, so a
/// client that grants a stream no flow-control window stops its answer where it is and, for
/// `ModelStreamInfer`, the reading of its requests. Only the connection can be closed from
/// here (hyper resets a stream only when its body fails, which needs a poll); a client that
/// stalls a stream loses its other streams too.
#[derive(Clone, Default)]
pub struct ConnectionCloser(Arc<CloserState>);

#[derive(Default)]
struct CloserState {
    /// Why the connection was closed, once it was.
    reason: std::sync::OnceLock<String>,
    /// The connection's reader, woken to fail.
    reader: futures::task::AtomicWaker,
}

impl ConnectionCloser {
    /// Fails the connection's reads from now on, which ends it and every stream on it.
    pub fn close(&self, reason: String) {
        if self.0.reason.get().is_none() && now_and_then(&CLOSE_LOGGED_MS) {
            tracing::warn!("closing a connection: {reason} (logged at most every 10 s)");
        }
        let _ = self.0.reason.set(reason);
        self.0.reader.wake();
    }

    pub fn is_closed(&self) -> bool {
        self.0.reason.get().is_some()
    }

    fn poll_closed(&self, cx: &Context<'_>) -> Option<std::io::Error> {
        self.0.reader.register(cx.waker());
        let reason = self.0.reason.get()?;
        Some(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            reason.clone(),
        ))
    }

    /// Closes the connection after `timeout` unless the watchdog is dropped first.
    pub fn close_after(&self, timeout: Duration, reason: String) -> Watchdog {
        let closer = self.clone();
        Watchdog(
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                closer.close(reason);
            })
            .abort_handle(),
        )
    }

    /// Closes the connection once `progress` has not moved for `timeout` (checked every
    /// `timeout`), unless the watchdog is dropped first.
    fn close_unless_progress(
        &self,
        timeout: Duration,
        progress: Arc<AtomicU64>,
        reason: String,
    ) -> Watchdog {
        let closer = self.clone();
        Watchdog(
            tokio::spawn(async move {
                let mut seen = progress.load(Ordering::Relaxed);
                loop {
                    tokio::time::sleep(timeout).await;
                    let now = progress.load(Ordering::Relaxed);
                    if now == seen {
                        closer.close(reason);
                        return;
                    }
                    seen = now;
                }
            })
            .abort_handle(),
        )
    }
}

/// A timer that closes a connection unless it is dropped first.
pub struct Watchdog(tokio::task::AbortHandle);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection whose writes fail once they have made no progress for `timeout`: the client
/// stopped reading (or its network is gone), and the connection, the answers it holds and
/// their place in the budget go with it. Progress, not completion, is what counts: a slow
/// reader that keeps taking bytes is served.
pub struct Sending<T> {
    io: T,
    timeout: Duration,
    /// Since when writes have been waiting, as the deadline they must move by.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Closes the connection from outside (its reads and writes fail).
    closer: ConnectionCloser,
}

impl<T> Sending<T> {
    pub fn new(io: T, timeout: Duration, closer: ConnectionCloser) -> Sending<T> {
        Sending {
            io,
            timeout,
            stalled: None,
            closer,
        }
    }

    /// Passes on a write's outcome; a write still waiting past the deadline fails instead.
    fn checked<R>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        match outcome {
            Poll::Pending => {
                let timeout = self.timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stalled.as_mut().poll(cx).is_ready() {
                    tracing::debug!(
                        "closing a connection whose client read nothing for {timeout:?}"
                    );
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the client took nothing for {} s (--http-send-timeout-secs)",
                            timeout.as_secs()
                        ),
                    )));
                }
                Poll::Pending
            }
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sending<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // hyper keeps a read waiting on every connection it serves (HTTP/2 always, HTTP/1
        // between and during requests): the closer wakes it.
        if let Some(closed) = self.closer.poll_closed(cx) {
            return Poll::Ready(Err(closed));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sending<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let outcome = Pin::new(&mut self.io).poll_write(cx, buf);
        self.checked(cx, outcome)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let outcome = Pin::new(&mut self.io).poll_flush(cx);
        self.checked(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let outcome = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.checked(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Why a request body stopped: it did not arrive within `--http-body-read-timeout-secs`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} (--http-body-read-timeout-secs)")]
pub struct BodyTimeout(pub Duration);

/// Gives the request body its deadline; when it passed, the answer is 408 whatever the route
/// made of the failed read (axum's extractors call it a 400).
async fn body_deadline(
    axum::extract::State(timeout): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| Body::new(DeadlineBody::new(body, timeout, expired.clone())));
    let response = next.run(request).await;
    if !expired.load(Ordering::Relaxed) {
        return response;
    }
    let body = serde_json::json!({ "error": BodyTimeout(timeout).to_string() });
    (
        axum::http::StatusCode::REQUEST_TIMEOUT,
        [(axum::http::header::CONNECTION, "close")],
        axum::Json(body),
    )
        .into_response()
}

/// A request body that fails with [`BodyTimeout`] once its deadline passes, however slowly it
/// trickles in (a per-read timeout would let one byte every few seconds hold the connection).
pub struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    /// Set when the deadline ended the body.
    expired: Arc<AtomicBool>,
}

impl DeadlineBody {
    pub fn new(inner: Body, timeout: Duration, expired: Arc<AtomicBool>) -> DeadlineBody {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            expired,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(this.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Response bytes handed to a connection at a time: a frame larger than this is held in the
/// budget and given out in slices of it (zero-copy), so that what a client has not read stays
/// counted until the connection takes it.
pub const RESPONSE_SLICE_BYTES: usize = 64 * 1024;

/// Why a response could not be written: the bytes held for clients are at their bound.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server holds as many bytes for its clients as it may (--http-max-buffered-bytes): a response of {0} bytes cannot be written now; retry"
)]
pub struct ResponseOverBudget(pub usize);

/// A response body whose large data frames are held in the front-ends' budget for buffered
/// bytes (`--http-max-buffered-bytes`, shared with request bodies) from when the body gives them
/// until the connection has written and dropped their last slice (each slice shares the frame's
/// memory and keeps its place in the budget). A client that stops reading leaves its
/// connection holding the response: without this, 20 HTTP clients that sent 50 MB each and read
/// nothing held 1.1 GB, for good, and the server had no bound on how many could.
///
/// HTTP/1 takes a slice when it has room in its write buffer, HTTP/2 when the stream's window
/// has room, so what a stalled client holds outside the budget is a slice or two. A frame that
/// does not fit fails the body (the connection is ended); a response known whole before it is
/// sent is checked first instead ([`WrittenBody::prepaid`]), so that it can be refused with a
/// status.
pub struct WrittenBody<B> {
    inner: B,
    budget: ByteBudget,
    /// A reservation made for the first large frame before the body started.
    prepaid: Option<OwnedSemaphorePermit>,
    /// The frame being handed over, and its place in the budget, shared with its slices.
    current: Option<(Bytes, Arc<HeldFrame>)>,
    /// On an HTTP/2 connection: closes it when a held frame makes no progress for the send
    /// timeout (see [`ConnectionCloser`]).
    stall: Option<(ConnectionCloser, Duration)>,
    /// A gRPC answer: a frame that does not fit ends the call with UNAVAILABLE trailers (a
    /// failed body would reset the stream, which clients report as INTERNAL).
    grpc: bool,
    /// The body ended early with its own trailers.
    ended: bool,
    /// Its request, counted in progress on its connection until the body is dropped.
    _in_progress: Option<InProgress>,
}

/// A frame's place in the budget, with how many of its slices were written.
struct HeldFrame {
    _permit: OwnedSemaphorePermit,
    written: Arc<AtomicU64>,
    _watchdog: Option<Watchdog>,
}

/// One slice of a held frame: the frame's place in the budget goes with its last slice.
struct HeldSlice {
    data: Bytes,
    held: Arc<HeldFrame>,
}

impl AsRef<[u8]> for HeldSlice {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for HeldSlice {
    fn drop(&mut self) {
        // Dropped once the connection has written it.
        self.held.written.fetch_add(1, Ordering::Relaxed);
    }
}

impl<B> WrittenBody<B> {
    pub fn new(inner: B, budget: ByteBudget) -> WrittenBody<B> {
        WrittenBody {
            inner,
            budget,
            prepaid: None,
            current: None,
            stall: None,
            grpc: false,
            ended: false,
            _in_progress: None,
        }
    }

    /// Closes the connection through `closer` when a held frame makes no progress for
    /// `timeout` (HTTP/2, where [`Sending`] does not see a stream stopped by its window).
    pub fn watched(mut self, closer: ConnectionCloser, timeout: Duration) -> WrittenBody<B> {
        self.stall = Some((closer, timeout));
        self
    }

    /// For a gRPC answer: see the `grpc` field.
    pub fn grpc(mut self) -> WrittenBody<B> {
        self.grpc = true;
        self
    }

    /// Keeps `in_progress` until the body is dropped (see [`TrackedBody`], for bodies not held).
    pub fn in_progress(mut self, in_progress: InProgress) -> WrittenBody<B> {
        self._in_progress = Some(in_progress);
        self
    }

    /// Like [`WrittenBody::new`] for a body whose size is known: reserves it now, or gives the
    /// body back with why it does not fit.
    pub fn prepaid(
        inner: B,
        budget: ByteBudget,
        size: usize,
    ) -> Result<WrittenBody<B>, (B, ResponseOverBudget)> {
        match budget.try_reserve(size as u64) {
            Some(permit) => Ok(WrittenBody {
                inner,
                budget,
                prepaid: Some(permit),
                current: None,
                stall: None,
                grpc: false,
                ended: false,
                _in_progress: None,
            }),
            None => Err((inner, ResponseOverBudget(size))),
        }
    }
}

impl<B> http_body::Body for WrittenBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            if let Some((data, held)) = &mut this.current {
                let slice = HeldSlice {
                    data: data.split_to(data.len().min(RESPONSE_SLICE_BYTES)),
                    held: held.clone(),
                };
                if data.is_empty() {
                    this.current = None;
                }
                return Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_owner(slice)))));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let data = match frame.into_data() {
                Ok(data) if data.len() > RESPONSE_SLICE_BYTES => data,
                Ok(data) => return Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            let permit = match this.prepaid.take() {
                Some(permit) => permit,
                None => match this.budget.try_reserve(data.len() as u64) {
                    Some(permit) => permit,
                    None => {
                        let over = ResponseOverBudget(data.len());
                        tracing::warn!("{over}");
                        if this.grpc {
                            this.ended = true;
                            let mut trailers = http::HeaderMap::new();
                            let status = tonic::Status::unavailable(over.to_string());
                            if status.add_header(&mut trailers).is_err() {
                                return Poll::Ready(Some(Err(Box::new(over))));
                            }
                            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
                        }
                        return Poll::Ready(Some(Err(Box::new(over))));
                    }
                },
            };
            let written = Arc::new(AtomicU64::new(0));
            let watchdog = this.stall.as_ref().map(|(closer, timeout)| {
                closer.close_unless_progress(
                    *timeout,
                    written.clone(),
                    format!(
                        "its client took none of a {} byte response for {} s \
                         (--http-send-timeout-secs)",
                        data.len(),
                        timeout.as_secs()
                    ),
                )
            });
            let held = HeldFrame {
                _permit: permit,
                written,
                _watchdog: watchdog,
            };
            this.current = Some((data, Arc::new(held)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.current.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let held = self
            .current
            .as_ref()
            .map_or(0, |(data, _)| data.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn body(bytes: usize) -> Full<Bytes> {
        Full::new(Bytes::from(vec![7u8; bytes]))
    }

    #[tokio::test]
    async fn a_large_frame_is_held_until_its_last_slice_is_written() {
        let budget = ByteBudget::new(1 << 20);
        let mut held = WrittenBody::new(body(200 * 1024), budget.clone());
        assert_eq!(http_body::Body::size_hint(&held).exact(), Some(200 * 1024));
        let mut slices = Vec::new();
        while let Some(frame) = held.frame().await {
            slices.push(frame.expect("fits").into_data().expect("data"));
            assert_eq!(budget.held_bytes(), 200 * 1024);
        }
        let sizes: Vec<usize> = slices.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [65536, 65536, 65536, 8192]);
        // Handed over whole, but not written yet: the slices still hold the frame's memory.
        drop(held);
        assert_eq!(budget.held_bytes(), 200 * 1024);
        slices.truncate(1);
        assert_eq!(budget.held_bytes(), 200 * 1024);
        drop(slices);
        assert_eq!(budget.held_bytes(), 0);
        // Small frames pass as they are, outside the budget.
        let mut small = WrittenBody::new(body(1000), budget.clone());
        let data = small.frame().await.expect("a frame").expect("fits");
        assert_eq!(data.into_data().map(|d| d.len()).ok(), Some(1000));
        assert_eq!(budget.held_bytes(), 0);
    }

    #[test]
    fn a_full_listener_sheds_the_connection_idle_longest_and_never_a_busy_one() {
        let slots = Slots::new(4);
        let (busy, older, newer, fresh) = (
            slots.register(),
            slots.register(),
            slots.register(),
            slots.register(),
        );
        let now = 100_000;
        busy.idle_since.store(0, Ordering::Relaxed);
        let request = busy.begin();
        older.idle_since.store(now - 5_000, Ordering::Relaxed);
        newer.idle_since.store(now - 2_000, Ordering::Relaxed);
        fresh.idle_since.store(now - 500, Ordering::Relaxed);
        assert!(slots.shed_at(now));
        assert!(older.closer.is_closed() && !newer.closer.is_closed() && !busy.closer.is_closed());
        assert!(slots.shed_at(now));
        assert!(newer.closer.is_closed() && !busy.closer.is_closed());
        // The busy one is never shed; nor one idle for less than a second.
        assert!(!slots.shed_at(now));
        assert!(!fresh.closer.is_closed() && !busy.closer.is_closed());
        assert!(slots.shed_at(now + 600) && fresh.closer.is_closed());
        drop(request);
        assert!(!slots.shed(), "idle just now");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_frame_that_makes_no_progress_closes_its_connection() {
        let budget = ByteBudget::new(1 << 20);
        let timeout = Duration::from_secs(10);
        // A client that takes a slice now and then keeps its connection.
        let reading = ConnectionCloser::default();
        let mut held =
            WrittenBody::new(body(300 * 1024), budget.clone()).watched(reading.clone(), timeout);
        while let Some(frame) = held.frame().await {
            drop(frame);
            tokio::time::sleep(Duration::from_secs(7)).await;
        }
        assert!(!reading.is_closed());
        // One that takes the first slice and then nothing loses it within two timeouts.
        let stalled = ConnectionCloser::default();
        let mut held =
            WrittenBody::new(body(300 * 1024), budget.clone()).watched(stalled.clone(), timeout);
        let first = held.frame().await;
        drop(first);
        let _second = held.frame().await;
        tokio::time::sleep(timeout * 2 + Duration::from_secs(1)).await;
        assert!(stalled.is_closed());
    }

    #[tokio::test]
    async fn a_frame_that_does_not_fit_is_refused() {
        let budget = ByteBudget::new(100 * 1024);
        let refused = WrittenBody::prepaid(body(200 * 1024), budget.clone(), 200 * 1024);
        assert!(refused.is_err());
        let mut streamed = WrittenBody::new(body(200 * 1024), budget.clone());
        let failed = streamed.frame().await.expect("a frame");
        assert!(failed.is_err_and(|e| e.to_string().contains("--http-max-buffered-bytes")));
        // A gRPC answer ends with UNAVAILABLE trailers instead, and nothing after them.
        let mut grpc = WrittenBody::new(body(200 * 1024), budget.clone()).grpc();
        let trailers = grpc
            .frame()
            .await
            .and_then(|f| f.ok())
            .and_then(|f| f.into_trailers().ok())
            .expect("trailers");
        assert_eq!(trailers["grpc-status"], "14");
        assert!(grpc.frame().await.is_none() && http_body::Body::is_end_stream(&grpc));
        // A prepaid body is charged once.
        let mut prepaid =
            WrittenBody::prepaid(body(80 * 1024), budget.clone(), 80 * 1024).expect("fits");
        assert_eq!(budget.held_bytes(), 80 * 1024);
        while prepaid.frame().await.is_some() {}
        assert_eq!(budget.held_bytes(), 0);
    }
}
