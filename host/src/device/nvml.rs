//! Triton's GPU metrics through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run
//! time): utilization, memory, power and energy of each GPU the server uses, labelled by
//! `gpu_uuid`, read when `/metrics` is scraped. Without NVML (no driver) there are none, as with
//! Triton on a machine without GPUs.

use nvml_wrapper::Nvml;

use super::Devices;

/// The NVML handle and, per GPU, the energy reading at start (the counter counts from there).
pub struct GpuMetrics {
    nvml: Nvml,
    /// `(uuid, millijoules at start)` for each GPU the server uses that NVML knows.
    gpus: Vec<(String, Option<u64>)>,
}

impl GpuMetrics {
    /// NVML for the GPUs in `devices`; `None` (with the reason logged) when there are none or
    /// NVML cannot be loaded.
    pub fn start(devices: &Devices) -> Option<GpuMetrics> {
        if devices.gpus().is_empty() {
            return None;
        }
        let nvml = match Nvml::init() {
            Ok(nvml) => nvml,
            Err(e) => {
                tracing::warn!("no GPU metrics: NVML is not available ({e})");
                return None;
            }
        };
        let mut gpus = Vec::new();
        for gpu in devices.gpus() {
            match nvml.device_by_uuid(gpu.uuid.as_str()) {
                Ok(device) => {
                    let energy = device.total_energy_consumption().ok();
                    gpus.push((gpu.uuid.clone(), energy));
                }
                Err(e) => tracing::warn!(gpu = gpu.id, "no GPU metrics for {}: {e}", gpu.uuid),
            }
        }
        Some(GpuMetrics { nvml, gpus })
    }

    /// Appends the `nv_gpu_*` and `nv_energy_consumption` families; a reading NVML refuses (a
    /// GPU without power sensors, say) is left out rather than reported as 0.
    pub fn render(&self, out: &mut String) {
        type Reading = Option<f64>;
        let mut rows: Vec<(String, [Reading; 6])> = Vec::new();
        for (uuid, energy_start) in &self.gpus {
            let Ok(device) = self.nvml.device_by_uuid(uuid.as_str()) else {
                continue;
            };
            let memory = device.memory_info().ok();
            rows.push((
                uuid.clone(),
                [
                    device
                        .utilization_rates()
                        .ok()
                        .map(|u| f64::from(u.gpu) / 100.0),
                    memory.as_ref().map(|m| m.total as f64),
                    memory.as_ref().map(|m| m.used as f64),
                    device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    device
                        .power_management_limit()
                        .ok()
                        .map(|mw| f64::from(mw) / 1000.0),
                    match (device.total_energy_consumption().ok(), energy_start) {
                        (Some(now), Some(start)) => {
                            Some(now.saturating_sub(*start) as f64 / 1000.0)
                        }
                        _ => None,
                    },
                ],
            ));
        }
        const FAMILIES: [(&str, &str, &str); 6] = [
            (
                "nv_gpu_utilization",
                "gauge",
                "GPU utilization rate [0.0 - 1.0)",
            ),
            (
                "nv_gpu_memory_total_bytes",
                "gauge",
                "GPU total memory, in bytes",
            ),
            (
                "nv_gpu_memory_used_bytes",
                "gauge",
                "GPU used memory, in bytes",
            ),
            ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
            (
                "nv_gpu_power_limit",
                "gauge",
                "GPU power management limit in watts",
            ),
            (
                "nv_energy_consumption",
                "counter",
                "GPU energy consumption in joules since the Tessera server started",
            ),
        ];
        for (i, (name, kind, help)) in FAMILIES.iter().enumerate() {
            let mut family = crate::metrics::Family::start(out, name, kind, help);
            for (uuid, readings) in &rows {
                if let Some(value) = readings[i] {
                    family.sample(&[("gpu_uuid", uuid)], value);
                }
            }
        }
    }
}
