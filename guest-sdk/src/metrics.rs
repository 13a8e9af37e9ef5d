//! Custom metrics on the server's `/metrics` (Triton's `pb_utils.MetricFamily`): counters,
//! gauges and histograms, next to the server's own families.
//!
//! ```no_run
//! use tessera_guest::metrics::{Family, Kind};
//!
//! # fn main() -> Result<(), tessera_guest::Error> {
//! let family = Family::new("preprocess_ns", "Time spent pre-processing", Kind::Counter)?;
//! let spent = family.metric(&[("stage", "tokenize")])?;
//! spent.increment(1250.0)?;
//! let sizes = Family::new("batch_rows", "Rows per batch", Kind::Histogram)?
//!     .histogram(&[], &[1.0, 4.0, 16.0])?;
//! sizes.observe(3.0)?;
//! # Ok(())
//! # }
//! ```
//!
//! A family is shared by name across the server: asking for one that exists returns it (with
//! its first description; another kind is an error). A series lives while its [`Metric`] does,
//! so keep metrics in the handler's state (made in `initialize`). Names are Prometheus names
//! (letters, digits, `_`, `:`), not starting `nv_` or `tessera_`; a tenant's series carry the
//! label `tenant`, set by the server. Misuse (a counter decremented, `set` on a counter, a
//! histogram without buckets) is an [`Error`] saying so.
//!
//! Outside a Wasm component (native unit tests) each metric keeps its value locally.

use crate::Error;

/// What a family measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value that only grows (`increment`).
    Counter,
    /// A value that goes up and down (`set`, `increment`).
    Gauge,
    /// Observations counted into buckets (`observe`).
    Histogram,
}

#[cfg(target_arch = "wasm32")]
use crate::bindings::tessera::inference::metrics as wit;

/// One metric name, its help text and kind.
pub struct Family {
    #[cfg(target_arch = "wasm32")]
    inner: wit::MetricFamily,
    #[cfg(not(target_arch = "wasm32"))]
    kind: Kind,
}

/// One series of a [`Family`]: its value for one set of labels.
pub struct Metric {
    #[cfg(target_arch = "wasm32")]
    inner: wit::Metric,
    /// Outside Wasm: the kind and the value, kept here for a handler's native unit tests.
    #[cfg(not(target_arch = "wasm32"))]
    local: (Kind, std::cell::Cell<f64>),
}

impl Family {
    /// The family `name`, created when new.
    pub fn new(name: &str, description: &str, kind: Kind) -> Result<Family, Error> {
        #[cfg(target_arch = "wasm32")]
        {
            let kind = match kind {
                Kind::Counter => wit::MetricKind::Counter,
                Kind::Gauge => wit::MetricKind::Gauge,
                Kind::Histogram => wit::MetricKind::Histogram,
            };
            wit::family(name, description, kind)
                .map(|inner| Family { inner })
                .map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = (name, description);
            Ok(Family { kind })
        }
    }

    /// The counter's or gauge's series with `labels`.
    pub fn metric(&self, labels: &[(&str, &str)]) -> Result<Metric, Error> {
        self.series(labels, None)
    }

    /// The histogram's series with `labels`, counting into `buckets` (upper bounds, increasing).
    pub fn histogram(&self, labels: &[(&str, &str)], buckets: &[f64]) -> Result<Metric, Error> {
        self.series(labels, Some(buckets))
    }

    fn series(&self, labels: &[(&str, &str)], buckets: Option<&[f64]>) -> Result<Metric, Error> {
        #[cfg(target_arch = "wasm32")]
        {
            let labels: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.inner
                .metric(&labels, buckets)
                .map(|inner| Metric { inner })
                .map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = labels;
            if (self.kind == Kind::Histogram) != buckets.is_some() {
                return Err(Error::internal(
                    "a histogram, and only a histogram, has buckets",
                ));
            }
            Ok(Metric {
                local: (self.kind, std::cell::Cell::new(0.0)),
            })
        }
    }
}

impl Metric {
    /// Adds `value` (a counter's must not be negative).
    pub fn increment(&self, value: f64) -> Result<(), Error> {
        #[cfg(target_arch = "wasm32")]
        {
            self.inner.increment(value).map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (kind, current) = &self.local;
            if *kind == Kind::Histogram
                || (*kind == Kind::Counter && (value < 0.0 || value.is_nan()))
            {
                return Err(Error::internal(format!(
                    "a {kind:?} cannot increment by {value}"
                )));
            }
            current.set(current.get() + value);
            Ok(())
        }
    }

    /// Sets a gauge.
    pub fn set(&self, value: f64) -> Result<(), Error> {
        #[cfg(target_arch = "wasm32")]
        {
            self.inner.set(value).map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (kind, current) = &self.local;
            if *kind != Kind::Gauge {
                return Err(Error::internal(format!("a {kind:?} has no set")));
            }
            current.set(value);
            Ok(())
        }
    }

    /// Counts one observation in a histogram.
    pub fn observe(&self, value: f64) -> Result<(), Error> {
        #[cfg(target_arch = "wasm32")]
        {
            self.inner.observe(value).map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (kind, current) = &self.local;
            if *kind != Kind::Histogram {
                return Err(Error::internal(format!("a {kind:?} has no observe")));
            }
            current.set(current.get() + value);
            Ok(())
        }
    }

    /// A counter's or gauge's current value (a histogram has none).
    pub fn value(&self) -> Result<f64, Error> {
        #[cfg(target_arch = "wasm32")]
        {
            self.inner.value().map_err(Error::internal)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (kind, current) = &self.local;
            if *kind == Kind::Histogram {
                return Err(Error::internal("a histogram has no single value"));
            }
            Ok(current.get())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natively_each_metric_keeps_its_value_and_its_kind_rules() {
        let counter = Family::new("c", "", Kind::Counter)
            .unwrap()
            .metric(&[])
            .unwrap();
        counter.increment(2.0).unwrap();
        assert!(counter.increment(-1.0).is_err());
        assert!(counter.set(1.0).is_err());
        assert_eq!(counter.value().unwrap(), 2.0);
        let family = Family::new("h", "", Kind::Histogram).unwrap();
        assert!(family.metric(&[]).is_err());
        let histogram = family.histogram(&[], &[1.0]).unwrap();
        histogram.observe(0.5).unwrap();
        assert!(histogram.value().is_err());
    }
}
