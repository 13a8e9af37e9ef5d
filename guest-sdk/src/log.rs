//! Logging into the host's log, tagged there with the model's name and version.
//!
//! Each level has a function taking a message and a macro taking `format!` arguments:
//!
//! ```
//! use tessera_guest::log;
//!
//! log::info("model ready");
//! let batch = 4;
//! log::debug!("executing a batch of {batch} requests");
//! ```
//!
//! Outside a Wasm component (native unit tests) messages go to standard error.

/// How important a log message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the handler survived.
    Warn,
    /// A failure.
    Error,
}

/// Writes `message` at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::tessera::inference::log as wit;
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        wit::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        eprintln!("[{level:?}] {message}");
    }
}

/// Writes `message` at [`Level::Trace`].
pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message.as_ref());
}

/// Writes `message` at [`Level::Debug`].
pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message.as_ref());
}

/// Writes `message` at [`Level::Info`].
pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message.as_ref());
}

/// Writes `message` at [`Level::Warn`].
pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message.as_ref());
}

/// Writes `message` at [`Level::Error`].
pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message.as_ref());
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_trace {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Trace, &::std::format!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_debug {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Debug, &::std::format!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_info {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Info, &::std::format!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_warn {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Warn, &::std::format!($($arg)+)) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_error {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Error, &::std::format!($($arg)+)) };
}

/// `trace!("format {}", args)`: [`trace`](fn@trace) with `format!` arguments.
#[doc(inline)]
pub use __log_trace as trace;

/// `debug!("format {}", args)`: [`debug`](fn@debug) with `format!` arguments.
#[doc(inline)]
pub use __log_debug as debug;

/// `info!("format {}", args)`: [`info`](fn@info) with `format!` arguments.
#[doc(inline)]
pub use __log_info as info;

/// `warn!("format {}", args)`: [`warn`](fn@warn) with `format!` arguments.
#[doc(inline)]
pub use __log_warn as warn;

/// `error!("format {}", args)`: [`error`](fn@error) with `format!` arguments.
#[doc(inline)]
pub use __log_error as error;
