//! Request tracing with OpenTelemetry, configured as Triton configures it (`--trace-config`).
//!
//! Every inference is traced as a tree of spans: the front-end's `request` span (a child of the
//! client's W3C `traceparent`, when it sends one), and under it one `infer` span per model the
//! request reaches (the first, each ensemble step, each BLS call), each with its `queue` wait
//! and its `execute` span (model, version, batch size). A function invocation is a `function`
//! span, and its calls are `infer` spans under it.
//!
//! The spans are `tracing` spans of target [`TARGET`] at DEBUG level. Without `--trace-config
//! mode=opentelemetry` no subscriber layer is interested in them, so each callsite is disabled
//! once and creating a span costs a load of a cached flag: nothing measurable on the request
//! path. With it, `tracing-opentelemetry` turns them into OpenTelemetry spans, sampled at
//! `rate`, and a batch processor exports them over OTLP/HTTP (protobuf) to `url`.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};

/// The `tracing` target of request spans.
pub const TARGET: &str = "tessera::trace";

/// Why a `--trace-config` setting was refused.
#[derive(Debug, thiserror::Error)]
#[error("--trace-config {setting}: {reason}")]
pub struct TraceConfigError {
    setting: String,
    reason: String,
}

/// What `--trace-config` asked for. Triton's spellings: `mode=opentelemetry`, `rate=N` (one
/// request in N), `level=OFF|TIMESTAMPS`, and `opentelemetry,KEY=VALUE` for `url`,
/// `resource` (`name=value`, repeatable), `bsp_schedule_delay` (ms), `bsp_max_queue_size`,
/// `bsp_max_export_batch_size`.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    pub enabled: bool,
    pub url: String,
    /// One request traced in `rate`.
    pub rate: u64,
    pub resource: Vec<(String, String)>,
    pub schedule_delay: Duration,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            enabled: false,
            url: "http://localhost:4318/v1/traces".into(),
            rate: 1000,
            resource: Vec::new(),
            schedule_delay: Duration::from_millis(5000),
            max_queue_size: 2048,
            max_export_batch_size: 512,
        }
    }
}

impl TraceConfig {
    /// Reads the `--trace-config` settings in order (a later one wins).
    pub fn parse(settings: &[String]) -> Result<TraceConfig, TraceConfigError> {
        let mut config = TraceConfig::default();
        let mut mode_set = false;
        let mut level_off = false;
        for setting in settings {
            let refuse = |reason: &str| TraceConfigError {
                setting: setting.clone(),
                reason: reason.to_owned(),
            };
            let (section, pair) = match setting.split_once(',') {
                Some((section, pair)) => (Some(section), pair),
                None => (None, setting.as_str()),
            };
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| refuse("expected KEY=VALUE or opentelemetry,KEY=VALUE"))?;
            let number = |what: &str| {
                value
                    .parse::<u64>()
                    .map_err(|_| refuse(&format!("{what} must be a whole number")))
            };
            match (section, key) {
                (None, "mode") if value == "opentelemetry" => mode_set = true,
                (None, "mode") => {
                    return Err(refuse(
                        "only mode=opentelemetry is supported (Triton's triton mode writes a trace file)",
                    ));
                }
                (None, "rate") => config.rate = number("rate")?.max(1),
                (None, "level") => match value {
                    "OFF" => level_off = true,
                    "TIMESTAMPS" => level_off = false,
                    _ => {
                        return Err(refuse(
                            "level is OFF or TIMESTAMPS (tensors are not traced)",
                        ));
                    }
                },
                (Some("opentelemetry"), "url") => config.url = value.to_owned(),
                (Some("opentelemetry"), "resource") => {
                    let (name, value) = value
                        .split_once('=')
                        .ok_or_else(|| refuse("resource is name=value"))?;
                    config.resource.push((name.to_owned(), value.to_owned()));
                }
                (Some("opentelemetry"), "bsp_schedule_delay") => {
                    config.schedule_delay = Duration::from_millis(number("bsp_schedule_delay")?);
                }
                (Some("opentelemetry"), "bsp_max_queue_size") => {
                    config.max_queue_size = number("bsp_max_queue_size")?.max(1) as usize;
                }
                (Some("opentelemetry"), "bsp_max_export_batch_size") => {
                    config.max_export_batch_size =
                        number("bsp_max_export_batch_size")?.max(1) as usize;
                }
                _ => return Err(refuse("not a setting tessera knows")),
            }
        }
        config.enabled = mode_set && !level_off;
        config.max_export_batch_size = config.max_export_batch_size.min(config.max_queue_size);
        Ok(config)
    }
}

/// The OpenTelemetry pipeline, while tracing is on: flushed and stopped at shutdown.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Builds the exporter and the provider; `runtime` runs the exporter's HTTP requests.
    pub fn start(
        config: &TraceConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<(Tracing, opentelemetry_sdk::trace::Tracer), String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(config.url.clone())
            .with_http_client(Exporter::new(runtime)?)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(config.schedule_delay)
                    .with_max_queue_size(config.max_queue_size)
                    .with_max_export_batch_size(config.max_export_batch_size)
                    .build(),
            )
            .build();
        let mut resource = opentelemetry_sdk::Resource::builder().with_service_name("tessera");
        for (name, value) in &config.resource {
            resource =
                resource.with_attribute(opentelemetry::KeyValue::new(name.clone(), value.clone()));
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batches)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                1.0 / config.rate as f64,
            ))))
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("tessera");
        Ok((Tracing { provider }, tracer))
    }

    /// Exports what is buffered and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("exporting the last traces failed: {e}");
        }
    }
}

/// Makes `span` a child of the client's W3C trace context (`traceparent`, `tracestate`), when
/// tracing is on and the client sent one.
pub fn follow_client(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let (Some(traceparent), false) = (traceparent, span.is_disabled()) else {
        return;
    };
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let parent = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}

/// The OTLP exporter's HTTP client: the server's own `reqwest`, run on the server's runtime
/// (the batch processor calls it from its own thread).
#[derive(Debug)]
struct Exporter {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl Exporter {
    fn new(runtime: tokio::runtime::Handle) -> Result<Exporter, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the OTLP HTTP client: {e}"))?;
        Ok(Exporter { client, runtime })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Exporter {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = client.execute(request).await?;
            let mut answer = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let body = response.bytes().await?;
            Ok::<_, opentelemetry_http::HttpError>(answer.body(body)?)
        });
        sent.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(settings: &[&str]) -> Result<TraceConfig, TraceConfigError> {
        TraceConfig::parse(&settings.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn tritons_trace_settings_are_read_and_others_refused() {
        assert!(!parse(&[]).map(|c| c.enabled).unwrap_or(true));
        let config = parse(&[
            "mode=opentelemetry",
            "rate=1",
            "opentelemetry,url=http://127.0.0.1:4318/v1/traces",
            "opentelemetry,resource=deployment=test",
            "opentelemetry,bsp_schedule_delay=200",
        ])
        .expect("valid");
        assert!(config.enabled);
        assert_eq!(config.rate, 1);
        assert_eq!(config.url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(config.resource, [("deployment".into(), "test".into())]);
        assert_eq!(config.schedule_delay, Duration::from_millis(200));
        assert!(
            !parse(&["mode=opentelemetry", "level=OFF"])
                .expect("valid")
                .enabled
        );
        for bad in [
            "mode=triton",
            "rate=often",
            "level=TENSORS",
            "file=/tmp/x",
            "url",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }
}
