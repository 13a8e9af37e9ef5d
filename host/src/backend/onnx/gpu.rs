//! ONNX models on a GPU: a session with the CUDA (and, when asked for, TensorRT) execution
//! providers on the instance's device, running on a CUDA stream the host created for that
//! instance; and its inputs staged in page-locked (pinned) host buffers that stay with the
//! instance and are reused batch after batch, so each input reaches the device in one DMA copy
//! per batch, issued by ONNX Runtime on the instance's stream.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, PinnedHostSlice};
use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider, ExecutionProvider};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{Session, SessionInputValue};
use ort::value::{Shape, TensorRefMut};

use super::providers::GpuProviders;
use crate::backend::LoadError;
use crate::device::Gpu;
use crate::infer::InferError;
use crate::tensor::{DataType, Tensor, TensorData};

/// Whether the loaded ONNX Runtime can run models on an NVIDIA GPU at all (it is a GPU build).
pub fn cuda_available() -> bool {
    ep::CUDA::is_available().unwrap_or(false)
}

/// What a GPU instance keeps next to its session. The session is dropped first (it is declared
/// first where both are held), because it runs on this stream.
pub struct GpuResources {
    gpu: u32,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// One pinned buffer per configured input, grown to the largest batch seen.
    staging: Vec<Option<PinnedHostSlice<u8>>>,
    /// How many bytes of each buffer the last batch filled.
    filled: Vec<usize>,
}

/// Opens the session of one instance on `gpu`.
pub fn open_session(
    builder: ort::session::builder::SessionBuilder,
    path: &Path,
    providers: &GpuProviders,
    gpu: &Gpu,
    inputs: usize,
) -> Result<(Session, GpuResources), LoadError> {
    if !cuda_available() {
        return Err(LoadError::unsupported(
            "KIND_GPU needs ONNX Runtime's CUDA execution provider, and the loaded ONNX Runtime is a CPU-only build; \
             install the onnxruntime-gpu wheel and point ORT_DYLIB_PATH at its libonnxruntime.so (docs/gpu.md)",
        ));
    }
    let context = gpu
        .context()
        .map_err(|e| LoadError::runtime(e.to_string()))?;
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
    Ok((
        session,
        GpuResources {
            gpu: gpu.id,
            context,
            stream,
            staging: (0..inputs).map(|_| None).collect(),
            filled: vec![0; inputs],
        },
    ))
}

/// Element types that are staged as they are; others (strings, booleans) go the CPU way.
fn staged(datatype: DataType) -> bool {
    !matches!(datatype, DataType::Bytes | DataType::Bool)
}

impl GpuResources {
    pub fn gpu(&self) -> u32 {
        self.gpu
    }

    /// The instance's stream (its work is ordered on it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies input `index` of every request of a batch into that input's pinned buffer,
    /// growing it first if the batch is larger than any before. Returns false when the input is
    /// not staged (not plain numbers), and the caller passes it the CPU way.
    pub fn stage(&mut self, index: usize, parts: &[&Tensor]) -> Result<bool, InferError> {
        let Some(first) = parts.first() else {
            return Ok(false);
        };
        if !staged(first.datatype) || index >= self.staging.len() {
            return Ok(false);
        }
        let mut chunks = Vec::with_capacity(parts.len());
        for part in parts {
            match &part.data {
                TensorData::Raw(bytes) => chunks.push(bytes),
                TensorData::Elements(_) => return Ok(false),
            }
        }
        let needed: usize = chunks.iter().map(|c| c.len()).sum();
        let too_small = self.staging[index]
            .as_ref()
            .is_none_or(|b| b.len() < needed);
        if too_small {
            // Free the old buffer before taking the larger one; round up so that slowly growing
            // batches do not reallocate every time.
            self.staging[index] = None;
            const MIB: usize = 1 << 20;
            let capacity = if needed <= MIB {
                needed.next_power_of_two().max(64 * 1024)
            } else {
                needed.div_ceil(MIB) * MIB
            };
            // SAFETY: plain bytes; every byte read later is written below first.
            let buffer = unsafe { self.context.alloc_pinned_with_flags::<u8>(capacity, 0) }
                .map_err(|e| {
                    InferError::internal("cannot allocate pinned host memory for a batch")
                        .with_detail(e.to_string())
                })?;
            self.staging[index] = Some(buffer);
        }
        let Some(buffer) = self.staging[index].as_mut() else {
            return Ok(false);
        };
        let host = buffer.as_mut_slice().map_err(|e| {
            InferError::internal("pinned host memory is not ready").with_detail(e.to_string())
        })?;
        let mut at = 0;
        for chunk in chunks {
            host[at..at + chunk.len()].copy_from_slice(chunk);
            at += chunk.len();
        }
        self.filled[index] = at;
        Ok(true)
    }

    /// An ONNX Runtime tensor over input `index`'s pinned buffer, as staged last.
    pub fn view(
        &self,
        index: usize,
        datatype: DataType,
        shape: &[i64],
    ) -> Result<SessionInputValue<'_>, InferError> {
        let Some(Some(buffer)) = self.staging.get(index) else {
            return Err(InferError::internal("input was not staged"));
        };
        let pointer = buffer.as_ptr().map_err(|e| {
            InferError::internal("pinned host memory is not ready").with_detail(e.to_string())
        })? as *mut std::ffi::c_void;
        let element = datatype.size().unwrap_or(1);
        let elements = crate::tensor::element_count(shape).unwrap_or(usize::MAX);
        if elements.saturating_mul(element) != self.filled.get(index).copied().unwrap_or(0) {
            return Err(InferError::invalid(format!(
                "the batch's data for an input does not hold the {elements} elements of shape {shape:?}"
            )));
        }
        let info = MemoryInfo::new(
            AllocationDevice::CUDA_PINNED,
            self.gpu as i32,
            AllocatorType::Device,
            MemoryType::CPUInput,
        )
        .map_err(|e| InferError::internal("ONNX Runtime memory info").with_detail(e.to_string()))?;
        let shape = Shape::new(shape.iter().copied());
        let refused = |e: ort::Error| {
            InferError::internal("ONNX Runtime refused a staged input").with_detail(e.to_string())
        };
        macro_rules! view {
            ($($dt:ident => $t:ty),*) => {
                match datatype {
                    // SAFETY: the buffer holds at least `shape` elements (checked above), is
                    // page-aligned, and lives in `self`, which the returned view borrows; ONNX
                    // Runtime only reads inputs.
                    $(DataType::$dt => unsafe { TensorRefMut::<$t>::from_raw(info, pointer, shape) }
                        .map(SessionInputValue::from)
                        .map_err(refused),)*
                    other => Err(InferError::internal(format!("datatype {other} is not staged"))),
                }
            };
        }
        numeric_types!(view)
    }
}
