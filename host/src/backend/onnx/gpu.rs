//! ONNX models on a GPU: a session with the CUDA (and, when asked for, TensorRT) execution
//! providers on the instance's device, running on a CUDA stream the host created for that
//! instance. Inputs go to ONNX Runtime in ordinary host memory, and ONNX Runtime copies them to
//! the device: staging them in page-locked (pinned) buffers of the instance's own, as this module
//! did before, made `session.run` slower, not faster (an H100, 2026-11-27: 679 µs for a batch of
//! about 30 rows of an 8×4096 MLP staged, 472 µs not; docs/benchmarks.md, "GPU").

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider, ExecutionProvider};
use ort::session::Session;

use super::providers::GpuProviders;
use crate::backend::LoadError;
use crate::device::Gpu;

/// Whether the loaded ONNX Runtime can run models on an NVIDIA GPU at all (it is a GPU build).
pub fn cuda_available() -> bool {
    ep::CUDA::is_available().unwrap_or(false)
}

/// What a GPU instance keeps next to its session: the stream the session runs on. The session
/// is dropped first (it is declared first where both are held).
pub struct GpuResources {
    _stream: Arc<CudaStream>,
}

/// Opens the session of one instance on `gpu`.
pub fn open_session(
    builder: ort::session::builder::SessionBuilder,
    path: &Path,
    providers: &GpuProviders,
    gpu: &Gpu,
) -> Result<(Session, GpuResources), LoadError> {
    if !cuda_available() {
        return Err(LoadError::unsupported(
            "KIND_GPU needs ONNX Runtime's CUDA execution provider, and the loaded ONNX Runtime is a CPU-only build; \
             install the onnxruntime-gpu wheel and point ORT_DYLIB_PATH at its libonnxruntime.so (docs/gpu.md)",
        ));
    }
    let stream = gpu
        .new_stream()
        .map_err(|e| LoadError::runtime(e.to_string()))?;
    let raw_stream = stream.cu_stream() as *mut ();
    let device_id = gpu.id as i32;
    let mut dispatch = Vec::new();
    if let Some(options) = &providers.tensorrt {
        if !ep::TensorRT::is_available().unwrap_or(false) {
            return Err(LoadError::unsupported(
                "the tensorrt execution accelerator is requested, but the loaded ONNX Runtime has no TensorRT execution provider",
            ));
        }
        let mut trt = ep::TensorRT::default().with_device_id(device_id);
        for (key, value) in options {
            trt = trt.with_arbitrary_config(key, value);
        }
        // SAFETY: the stream is kept in `GpuResources`, which outlives the session.
        let trt = unsafe { trt.with_compute_stream(raw_stream) };
        dispatch.push(trt.build().error_on_failure());
    }
    let mut cuda = ep::CUDA::default().with_device_id(device_id);
    for (key, value) in &providers.cuda {
        cuda = cuda.with_arbitrary_config(key, value);
    }
    // SAFETY: as above.
    let cuda = unsafe { cuda.with_compute_stream(raw_stream) };
    dispatch.push(cuda.build().error_on_failure());
    let fail = |e: String| {
        let hint = if e.contains("nvinfer") || e.contains("TensorRT") || e.contains("tensorrt") {
            " (is TensorRT installed, with libnvinfer on LD_LIBRARY_PATH?)"
        } else if e.contains(".so") {
            " (are the CUDA and cuDNN libraries onnxruntime-gpu needs on LD_LIBRARY_PATH? docs/gpu.md)"
        } else {
            ""
        };
        LoadError::runtime(format!(
            "ONNX Runtime cannot load {} on GPU {}: {e}{hint}",
            path.display(),
            gpu.id
        ))
    };
    let session = builder
        .with_execution_providers(dispatch)
        .map_err(|e| fail(e.to_string()))?
        .commit_from_file(path)
        .map_err(|e| fail(e.to_string()))?;
    Ok((session, GpuResources { _stream: stream }))
}
