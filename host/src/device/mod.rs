//! The GPUs this server owns: discovered once at start through the CUDA driver API (`cudarc`,
//! which loads `libcuda` at run time, so the same binary runs on machines without CUDA), with the
//! facts Triton reports and, on first use, one primary context per device.
//!
//! Which GPUs are used, in order: the CUDA driver hides those `CUDA_VISIBLE_DEVICES` leaves out
//! (ids below are the driver's, i.e. after that variable), `--gpus` selects among the rest, and
//! devices under `--min-supported-compute-capability` (7.5 by default, Triton's) are left out.
//! Without a driver or a usable device the list is empty and [`Devices::unavailable`] says why;
//! `KIND_GPU` instance groups then fail to load with that reason ([`placement`]).

use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

pub mod nvml;
pub mod placement;

/// One GPU as the CUDA driver reports it.
#[derive(Debug)]
pub struct Gpu {
    /// The CUDA device ordinal (what `instance_group.gpus` names).
    pub id: u32,
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and Triton's metrics print it.
    pub uuid: String,
    pub compute_capability: (i32, i32),
    pub total_memory: u64,
    pub multiprocessors: i32,
    /// `0000:17:00.0` style; empty if the driver does not say.
    pub pci_bus_id: String,
    /// Retained on first use; a failure is not kept, so the next load tries again.
    context: Mutex<Option<Arc<CudaContext>>>,
}

impl Gpu {
    /// The device's primary context (the one the CUDA runtime, and so ONNX Runtime, uses too),
    /// retained on first use and kept for the server's life.
    pub fn context(&self) -> Result<Arc<CudaContext>, DeviceError> {
        let mut held = self.context.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(context) = held.as_ref() {
            return Ok(context.clone());
        }
        let context = guarded(|| CudaContext::new(self.id as usize).map_err(|e| e.to_string()))
            .and_then(|r| r)
            .map_err(|reason| DeviceError::Context {
                id: self.id,
                reason,
            })?;
        *held = Some(context.clone());
        Ok(context)
    }

    /// A new stream on this device, for one model instance's work.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, DeviceError> {
        let context = self.context()?;
        guarded(|| context.new_stream().map_err(|e| e.to_string()))
            .and_then(|r| r)
            .map_err(|reason| DeviceError::Context {
                id: self.id,
                reason,
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("GPU {id}: cannot create a CUDA context: {reason}")]
    Context { id: u32, reason: String },
}

/// Which CUDA devices the server may use (`--gpus`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GpuSelection {
    /// Every device the driver shows.
    #[default]
    All,
    /// None: GPU instance groups are refused and `KIND_AUTO` means CPU.
    None,
    /// These device ids only.
    Only(Vec<u32>),
}

impl std::str::FromStr for GpuSelection {
    type Err = String;

    /// `all`, `none`, or a comma-separated list of device ids (`0,2`).
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "all" | "" => Ok(GpuSelection::All),
            "none" => Ok(GpuSelection::None),
            list => list
                .split(',')
                .map(|id| {
                    id.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("'{text}': expected all, none or device ids like 0,1"))
                })
                .collect::<Result<Vec<u32>, String>>()
                .map(GpuSelection::Only),
        }
    }
}

/// What discovery needs to know.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    pub selection: GpuSelection,
    /// Devices below this compute capability are not used (Triton's default: 7.5).
    pub min_compute_capability: f64,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            selection: GpuSelection::All,
            min_compute_capability: 7.5,
        }
    }
}

/// The GPUs the server uses, and why there are none when there are none.
#[derive(Debug, Default)]
pub struct Devices {
    gpus: Vec<Arc<Gpu>>,
    unavailable: Option<String>,
    driver_version: Option<i32>,
}

impl Devices {
    /// A server that uses no GPU, for the reason given.
    pub fn none(reason: impl Into<String>) -> Devices {
        Devices {
            unavailable: Some(reason.into()),
            ..Devices::default()
        }
    }

    /// Asks the CUDA driver which devices there are. Never fails: a missing driver, a driver
    /// error or a filtered-out device leaves fewer GPUs and a reason.
    pub fn discover(options: &DeviceOptions) -> Devices {
        if options.selection == GpuSelection::None {
            return Devices::none("GPUs are turned off (--gpus none)");
        }
        let (found, driver_version, mut left_out) = match guarded(query_driver).and_then(|r| r) {
            Ok(found) => found,
            Err(reason) => return Devices::none(reason),
        };
        let mut gpus = Vec::new();
        for gpu in found {
            if let GpuSelection::Only(ids) = &options.selection
                && !ids.contains(&gpu.id)
            {
                left_out.push(format!("GPU {} is not in --gpus", gpu.id));
                continue;
            }
            let (major, minor) = gpu.compute_capability;
            let capability = f64::from(major) + f64::from(minor) / 10.0;
            if capability + 1e-9 < options.min_compute_capability {
                left_out.push(format!(
                    "GPU {} ({}) has compute capability {major}.{minor}, below --min-supported-compute-capability {}",
                    gpu.id, gpu.name, options.min_compute_capability
                ));
                continue;
            }
            gpus.push(Arc::new(gpu));
        }
        if let GpuSelection::Only(ids) = &options.selection {
            for id in ids {
                if !gpus.iter().any(|g| g.id == *id)
                    && !left_out.iter().any(|l| l.contains(&format!("GPU {id} ")))
                {
                    left_out.push(format!(
                        "--gpus names GPU {id}, which the driver does not show"
                    ));
                }
            }
        }
        for reason in &left_out {
            tracing::warn!("{reason}");
        }
        let unavailable = gpus.is_empty().then(|| {
            if left_out.is_empty() {
                "the CUDA driver reports no device".to_owned()
            } else {
                format!("no usable GPU: {}", left_out.join("; "))
            }
        });
        Devices {
            gpus,
            unavailable,
            driver_version: Some(driver_version),
        }
    }

    pub fn gpus(&self) -> &[Arc<Gpu>] {
        &self.gpus
    }

    pub fn get(&self, id: u32) -> Option<&Arc<Gpu>> {
        self.gpus.iter().find(|g| g.id == id)
    }

    /// Why the server has no GPU, when it has none.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// The CUDA driver's version as `major.minor`, when a driver answered.
    pub fn driver_version(&self) -> Option<String> {
        self.driver_version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    /// One line per GPU for the start-up log.
    pub fn describe(&self) -> Vec<String> {
        self.gpus
            .iter()
            .map(|g| {
                format!(
                    "GPU {}: {} ({}), compute capability {}.{}, {} MiB, {} SMs, PCI {}",
                    g.id,
                    g.name,
                    g.uuid,
                    g.compute_capability.0,
                    g.compute_capability.1,
                    g.total_memory / (1024 * 1024),
                    g.multiprocessors,
                    g.pci_bus_id
                )
            })
            .collect()
    }
}

/// Runs a driver call, turning a panic (cudarc panics when a symbol is missing from `libcuda`)
/// into an error, so a broken or partial driver never takes the server down.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown error".to_owned());
        format!("the CUDA driver library is unusable: {what}")
    })
}

/// Every device the driver shows, the driver's version, and why devices it could not describe
/// (a GPU that fell off the bus, say) are left out: one bad device does not hide the others.
fn query_driver() -> Result<(Vec<Gpu>, i32, Vec<String>), String> {
    // SAFETY: only tries to open the library by name; loads nothing into our symbols.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "no NVIDIA driver: libcuda.so was not found (LD_LIBRARY_PATH and the system library paths were searched)"
                .to_owned(),
        );
    }
    result::init().map_err(|e| format!("the CUDA driver did not start: {e}"))?;
    let mut version = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| format!("the CUDA driver did not give its version: {e}"))?;
    let count =
        result::device::get_count().map_err(|e| format!("cannot count CUDA devices: {e}"))?;
    let mut gpus = Vec::new();
    let mut left_out = Vec::new();
    for ordinal in 0..count {
        match describe_device(ordinal) {
            Ok(gpu) => gpus.push(gpu),
            Err(e) => left_out.push(format!("GPU {ordinal} cannot be described: {e}")),
        }
    }
    Ok((gpus, version, left_out))
}

fn describe_device(ordinal: i32) -> Result<Gpu, cudarc::driver::DriverError> {
    use sys::CUdevice_attribute::*;
    let device = result::device::get(ordinal)?;
    // SAFETY: `device` came from the driver just now; the attribute calls only read.
    let (total_memory, major, minor, multiprocessors) = unsafe {
        (
            result::device::total_mem(device)?,
            result::device::get_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            result::device::get_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            result::device::get_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        )
    };
    let mut bus = [0 as c_char; 32];
    // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `bus`.
    let pci_bus_id =
        match unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, device) }
            .result()
        {
            Ok(()) => c_string(&bus),
            Err(_) => String::new(),
        };
    let uuid = result::device::get_uuid(device)?;
    Ok(Gpu {
        id: ordinal as u32,
        name: result::device::get_name(device)?,
        uuid: format_uuid(&uuid.bytes),
        compute_capability: (major, minor),
        total_memory: total_memory as u64,
        multiprocessors,
        pci_bus_id,
        context: Mutex::new(None),
    })
}

fn c_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A CUDA UUID in NVML's (and Triton's `gpu_uuid` label's) spelling.
pub fn format_uuid(bytes: &[c_char; 16]) -> String {
    let bytes = bytes.map(|b| b as u8);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex::encode(&bytes[0..4]),
        hex::encode(&bytes[4..6]),
        hex::encode(&bytes[6..8]),
        hex::encode(&bytes[8..10]),
        hex::encode(&bytes[10..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gpu_selections() {
        assert_eq!("all".parse(), Ok(GpuSelection::All));
        assert_eq!("none".parse(), Ok(GpuSelection::None));
        assert_eq!("0, 2".parse(), Ok(GpuSelection::Only(vec![0, 2])));
        assert!("0,x".parse::<GpuSelection>().is_err());
    }

    #[test]
    fn uuids_print_as_nvml_does() {
        let mut bytes = [0 as c_char; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8 * 17) as c_char;
        }
        assert_eq!(
            format_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn turned_off_gpus_say_so() {
        let devices = Devices::discover(&DeviceOptions {
            selection: GpuSelection::None,
            ..DeviceOptions::default()
        });
        assert!(devices.gpus().is_empty());
        assert!(
            devices
                .unavailable()
                .is_some_and(|r| r.contains("--gpus none"))
        );
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// A GPU as discovery would describe it, for tests of what is decided from the list.
    pub fn fake_gpu(id: u32) -> Gpu {
        Gpu {
            id,
            name: format!("Test GPU {id}"),
            uuid: format!("GPU-0000000{id}-0000-0000-0000-000000000000"),
            compute_capability: (9, 0),
            total_memory: 80 << 30,
            multiprocessors: 132,
            pci_bus_id: format!("0000:0{id}:00.0"),
            context: Mutex::new(None),
        }
    }
}
