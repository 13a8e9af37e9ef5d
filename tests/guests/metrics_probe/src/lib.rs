//! Test fixture `metrics_probe`: custom metrics through the WIT `metrics` interface. For X: FP32
//! `[batch, 1]`, each request adds its rows to the counter `probe_rows_total{model=<name>}`, sets
//! the gauge `probe_last_x` to its last value and counts every value into the histogram
//! `probe_x` (buckets 1, 10, 100); Y is the counter as the host reads it back. A negative value
//! is added to the counter too, which the host refuses (a counter only grows): the request fails
//! with the host's reason.

use tessera_guest::metrics::{Family, Kind, Metric};
use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// The handler: its series live as long as it does.
pub struct MetricsProbe {
    rows: Metric,
    last: Metric,
    values: Metric,
}

impl Model for MetricsProbe {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let name = config.name().to_owned();
        let metric = |family: &str, help: &str, kind: Kind| -> Result<Metric, Error> {
            let family = Family::new(family, help, kind)?;
            match kind {
                Kind::Histogram => family.histogram(&[("model", &name)], &[1.0, 10.0, 100.0]),
                _ => family.metric(&[("model", &name)]),
            }
        };
        let made = (|| {
            Ok::<_, Error>(MetricsProbe {
                rows: metric("probe_rows_total", "Rows seen", Kind::Counter)?,
                last: metric("probe_last_x", "The last value seen", Kind::Gauge)?,
                values: metric("probe_x", "Values seen", Kind::Histogram)?,
            })
        })();
        made.map_err(|e| e.message().to_owned())
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        let values = x.as_f32()?;
        for &v in values.iter() {
            self.values.observe(f64::from(v))?;
            self.last.set(f64::from(v))?;
            if v < 0.0 {
                self.rows.increment(f64::from(v))?;
            }
        }
        self.rows.increment(values.len() as f64)?;
        let total = self.rows.value()? as f32;
        let y = vec![total; values.len()];
        Ok(Response::new().with_output(Tensor::from_f32("Y", x.shape().to_vec(), &y)))
    }
}

tessera_guest::export_model!(MetricsProbe);
