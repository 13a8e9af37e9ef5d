//! Micro-benchmark of the Wasm handler path, without HTTP or queues:
//! - instantiating `add_sub_wasm` from its `InstancePre` into a fresh store (no guest code runs);
//! - one `execute` call (a batch of one request, INPUT0/INPUT1 FP32 [1,16]) on a reused instance,
//!   including the conversions between the server's tensors and the WIT types.
//!
//! `cargo bench --bench wasm_micro` (after the build installed model_repository/add_sub_wasm).
//! Prints median and p99 in microseconds.

use std::path::Path;
use std::time::{Duration, Instant};

use tessera::backend::ModelInstance;
use tessera::backend::wasm::{Standalone, WasmRuntime};
use tessera::infer::{Call, CallContext, InferRequest};
use tessera::tensor::Tensor;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn row(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "| {name:<34} | {:>8} | {:>10.2} | {:>10.2} |",
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99)
    );
}

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model_repository/add_sub_wasm");
    let config = tessera::config::read(&root.join("config.pbtxt"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let wasm = WasmRuntime::new(None, &tessera::limits::ServerLimits::default())?;
        let model = Standalone::load(&wasm, "add_sub_wasm", &root.join("1/model.wasm"), &config)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let (warm, n_inst, n_exec) = (200, 3000, 20000);
        let mut instantiate = Vec::with_capacity(n_inst);
        for i in 0..warm + n_inst {
            let t = Instant::now();
            model.instantiate_bare().await.map_err(anyhow::Error::msg)?;
            if i >= warm {
                instantiate.push(t.elapsed());
            }
        }
        let mut instance = model.instance().await.map_err(anyhow::Error::msg)?;
        let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let request = InferRequest {
            inputs: vec![
                Tensor::from_f32("INPUT0", vec![1, 16], &a),
                Tensor::from_f32("INPUT1", vec![1, 16], &a),
            ],
            ..Default::default()
        };
        let mut execute = Vec::with_capacity(n_exec);
        for i in 0..warm + n_exec {
            let batch = vec![Call {
                stream: None,
                cx: CallContext::root(),
                request: request.clone(),
            }];
            let t = Instant::now();
            let executed = instance.execute(batch).await;
            let elapsed = t.elapsed();
            anyhow::ensure!(executed.results.iter().all(Result::is_ok), "execute failed");
            if i >= warm {
                execute.push(elapsed);
            }
        }
        println!(
            "| {:<34} | {:>8} | {:>10} | {:>10} |",
            "add_sub_wasm", "samples", "median µs", "p99 µs"
        );
        println!("|{:-<36}|{:->10}|{:->12}|{:->12}|", "", "", "", "");
        row("instantiate from InstancePre", instantiate);
        row("execute (1 request) on a reused instance", execute);
        Ok(())
    })
}
