//! Where a model's instances run, decided as Triton decides it (`model_config_utils.cc`):
//!
//! - No `instance_group`: one group named `<model>`, of kind `KIND_AUTO`, count 1.
//! - A group without a name is named `<model>_<index>`; a `count` below 1 becomes 1. (Triton
//!   gives ONNX models on the CPU 2 instances when `count` is not set; Tessera keeps 1, because
//!   instances share the cores with the HTTP workers and every other model.)
//! - `KIND_AUTO` becomes `KIND_GPU` on every usable GPU when there is one and the backend can
//!   execute there (for ONNX: the ONNX Runtime library has the CUDA provider), else `KIND_CPU`.
//!   (Triton checks only for GPUs, its backends being GPU builds; ours may load a CPU-only ONNX
//!   Runtime, and then the GPU would only fail the load.)
//! - `KIND_GPU` without `gpus` means every usable GPU; `count` instances go on *each* listed GPU.
//!   Without a usable GPU, or naming one that is not usable, the model fails to load, saying why.
//! - `KIND_CPU` must not list `gpus`.
//!
//! The result is written back into the configuration, so `GET /v2/models/{m}/config` shows the
//! kinds and devices the server chose, as Triton's does.

use crate::config::ModelConfig;
use crate::config::pb::{ModelInstanceGroup, model_instance_group::Kind};

use super::Devices;

/// One instance to create: its group (for rate-limiter resources and priority) and its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSlot {
    /// Index into `instance_group`.
    pub group: usize,
    /// Triton's instance name: `<group name>_<n>`.
    pub name: String,
    /// The GPU it runs on; `None` for the CPU.
    pub gpu: Option<u32>,
}

impl InstanceSlot {
    /// The device whose rate-limiter resources the instance uses (Triton counts CPU instances'
    /// per-device resources on device 0).
    pub fn resource_device(&self) -> u32 {
        self.gpu.unwrap_or(0)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// The configuration asks for something that cannot be (`KIND_CPU` with `gpus`, ...).
    #[error("{0}")]
    Invalid(String),
    /// The configuration asks for GPUs this server does not have.
    #[error("{0}")]
    NoGpu(String),
    /// A kind this server does not place (`KIND_MODEL`).
    #[error("{0}")]
    Unsupported(String),
}

/// Fills in and checks the instance groups of `config` for the GPUs in `devices`.
/// `backend_uses_gpu`: whether the model's backend executes on a GPU (decides `KIND_AUTO`).
pub fn normalize(
    config: &mut ModelConfig,
    devices: &Devices,
    backend_uses_gpu: bool,
) -> Result<(), PlacementError> {
    if config.instance_group.is_empty() {
        config.instance_group.push(ModelInstanceGroup {
            name: config.name.clone(),
            kind: Kind::Auto as i32,
            count: 1,
            ..Default::default()
        });
    }
    let usable: Vec<u32> = devices.gpus().iter().map(|g| g.id).collect();
    let model = config.name.clone();
    for (index, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{model}_{index}");
        }
        if group.count < 1 {
            group.count = 1;
        }
        let listed_usable = group
            .gpus
            .iter()
            .all(|&g| usable.contains(&(g as u32)) && g >= 0);
        match Kind::try_from(group.kind) {
            Ok(Kind::Auto) => {
                if backend_uses_gpu && !usable.is_empty() && listed_usable {
                    group.kind = Kind::Gpu as i32;
                } else {
                    group.kind = Kind::Cpu as i32;
                    group.gpus.clear();
                }
            }
            Ok(Kind::Gpu | Kind::Cpu) => {}
            Ok(kind) => {
                return Err(PlacementError::Unsupported(format!(
                    "instance group {} of model {model}: kind {} is not supported (use KIND_CPU, KIND_GPU or KIND_AUTO)",
                    group.name,
                    kind.as_str_name()
                )));
            }
            Err(_) => {
                return Err(PlacementError::Unsupported(format!(
                    "instance group {} of model {model}: unknown kind {}",
                    group.name, group.kind
                )));
            }
        }
        if group.kind == Kind::Cpu as i32 {
            if !group.gpus.is_empty() {
                return Err(PlacementError::Invalid(format!(
                    "instance group {} of model {model} has kind KIND_CPU but specifies one or more GPUs",
                    group.name
                )));
            }
            continue;
        }
        // KIND_GPU
        if usable.is_empty() {
            return Err(PlacementError::NoGpu(format!(
                "instance group {} of model {model} has kind KIND_GPU but no GPUs are available: {}",
                group.name,
                devices.unavailable().unwrap_or("no usable GPU")
            )));
        }
        if group.gpus.is_empty() {
            group.gpus = usable.iter().map(|&g| g as i32).collect();
        }
        if let Some(&bad) = group
            .gpus
            .iter()
            .find(|&&g| g < 0 || !usable.contains(&(g as u32)))
        {
            return Err(PlacementError::NoGpu(format!(
                "instance group {} of model {model} specifies invalid or unsupported gpu id {bad}. GPUs usable by this server are: {}",
                group.name,
                usable
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    check_resource_scopes(config, &model)?;
    Ok(())
}

/// A resource is either global or per device within one model, never both (Triton's rule).
fn check_resource_scopes(config: &ModelConfig, model: &str) -> Result<(), PlacementError> {
    let mut scopes: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
    for resource in config
        .instance_group
        .iter()
        .filter_map(|g| g.rate_limiter.as_ref())
        .flat_map(|r| &r.resources)
    {
        if let Some(&global) = scopes.get(resource.name.as_str())
            && global != resource.global
        {
            return Err(PlacementError::Invalid(format!(
                "model {model}: resource \"{}\" is present as both global and device-specific resource in the model configuration",
                resource.name
            )));
        }
        scopes.insert(&resource.name, resource.global);
    }
    Ok(())
}

/// How many instances [`slots`] makes of a normalized configuration, counted without making
/// them (a count may be anything a configuration says).
pub fn instance_count(config: &ModelConfig) -> u64 {
    config
        .instance_group
        .iter()
        .map(|group| {
            let count = u64::try_from(group.count.max(1)).unwrap_or(1);
            if group.kind == Kind::Gpu as i32 {
                count.saturating_mul(group.gpus.len() as u64)
            } else {
                count
            }
        })
        .fold(0, u64::saturating_add)
}

/// The instances of a normalized configuration, group by group: for each `count`, one per GPU
/// listed (Triton's order), or one on the CPU.
pub fn slots(config: &ModelConfig) -> Vec<InstanceSlot> {
    let mut slots = Vec::new();
    for (index, group) in config.instance_group.iter().enumerate() {
        let count = usize::try_from(group.count.max(1)).unwrap_or(1);
        for c in 0..count {
            let name = format!("{}_{c}", group.name);
            if group.kind == Kind::Gpu as i32 {
                for &gpu in &group.gpus {
                    slots.push(InstanceSlot {
                        group: index,
                        name: name.clone(),
                        gpu: u32::try_from(gpu).ok(),
                    });
                }
            } else {
                slots.push(InstanceSlot {
                    group: index,
                    name,
                    gpu: None,
                });
            }
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{Gpu, tests_support::fake_gpu};
    use super::*;
    use crate::config;

    fn devices(ids: &[u32]) -> Devices {
        Devices {
            gpus: ids
                .iter()
                .map(|&id| Arc::new(fake_gpu(id)))
                .collect::<Vec<Arc<Gpu>>>(),
            unavailable: ids.is_empty().then(|| "no NVIDIA driver".to_owned()),
            driver_version: None,
        }
    }

    fn placed(text: &str, gpus: &[u32], uses_gpu: bool) -> Result<ModelConfig, PlacementError> {
        let mut c = config::parse(&format!("name: \"m\" {text}"), "c").expect("parses");
        normalize(&mut c, &devices(gpus), uses_gpu).map(|()| c)
    }

    fn kinds(c: &ModelConfig) -> Vec<(String, i32, Vec<i32>)> {
        c.instance_group
            .iter()
            .map(|g| (g.name.clone(), g.kind, g.gpus.clone()))
            .collect()
    }

    #[test]
    fn no_group_is_one_auto_instance() {
        let c = placed("", &[], true).expect("placed");
        assert_eq!(kinds(&c), vec![("m".into(), Kind::Cpu as i32, vec![])]);
        let c = placed("", &[0, 1], true).expect("placed");
        assert_eq!(kinds(&c), vec![("m".into(), Kind::Gpu as i32, vec![0, 1])]);
        assert_eq!(slots(&c).len(), 2, "one instance on each GPU");
    }

    #[test]
    fn auto_stays_on_the_cpu_when_the_backend_cannot_use_the_gpu() {
        let c = placed(
            "instance_group [{ kind: KIND_AUTO gpus: [1] }]",
            &[0, 1],
            false,
        )
        .expect("placed");
        assert_eq!(kinds(&c), vec![("m_0".into(), Kind::Cpu as i32, vec![])]);
        let c = placed(
            "instance_group [{ kind: KIND_AUTO gpus: [3] }]",
            &[0, 1],
            true,
        )
        .expect("a listed GPU that is missing falls back to the CPU");
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
    }

    #[test]
    fn gpu_groups_put_count_instances_on_each_listed_gpu() {
        let c = placed(
            "instance_group [{ name: \"g\" kind: KIND_GPU count: 2 gpus: [1, 0] }, { kind: KIND_CPU count: 0 }]",
            &[0, 1],
            true,
        )
        .expect("placed");
        let s = slots(&c);
        let got: Vec<(usize, &str, Option<u32>)> = s
            .iter()
            .map(|s| (s.group, s.name.as_str(), s.gpu))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "g_0", Some(1)),
                (0, "g_0", Some(0)),
                (0, "g_1", Some(1)),
                (0, "g_1", Some(0)),
                (1, "m_1_0", None),
            ]
        );
        assert_eq!(s[4].resource_device(), 0, "CPU instances count on device 0");
    }

    #[test]
    fn gpu_groups_without_a_gpu_say_why() {
        let e = placed("instance_group [{ kind: KIND_GPU }]", &[], true).expect_err("no GPU");
        assert!(
            matches!(&e, PlacementError::NoGpu(m) if m.contains("no GPUs are available: no NVIDIA driver")),
            "{e}"
        );
        let e = placed(
            "instance_group [{ kind: KIND_GPU gpus: [0, 2] }]",
            &[0, 1],
            true,
        )
        .expect_err("GPU 2 is not there");
        assert!(
            e.to_string()
                .contains("invalid or unsupported gpu id 2. GPUs usable by this server are: 0, 1"),
            "{e}"
        );
    }

    #[test]
    fn cpu_groups_must_not_name_gpus_and_resources_keep_one_scope() {
        let e = placed("instance_group [{ kind: KIND_CPU gpus: [0] }]", &[0], true)
            .expect_err("CPU with GPUs");
        assert!(matches!(e, PlacementError::Invalid(_)));
        let e = placed(
            "instance_group [{ kind: KIND_CPU rate_limiter { resources [{ name: \"R\" count: 1 }] } }, \
             { kind: KIND_CPU rate_limiter { resources [{ name: \"R\" global: true count: 1 }] } }]",
            &[],
            false,
        )
        .expect_err("R is global and per device");
        assert!(
            e.to_string().contains("both global and device-specific"),
            "{e}"
        );
        let e =
            placed("instance_group [{ kind: KIND_MODEL }]", &[], false).expect_err("model kind");
        assert!(matches!(e, PlacementError::Unsupported(_)));
    }

    /// Triton users' configurations (the reference set): each places on three GPUs, and the
    /// ONNX ones' accelerators are accepted.
    #[test]
    fn reference_configs_place_and_their_accelerators_are_accepted() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/core/tests/data/triton-configs");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).expect("reference configs") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "pbtxt") {
                continue;
            }
            let mut c = config::read(&path).unwrap_or_else(|e| panic!("{e}"));
            normalize(&mut c, &devices(&[0, 1, 2]), true)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if c.platform == "onnxruntime_onnx" || c.backend == "onnxruntime" {
                crate::backend::onnx::providers::gpu_providers(&c)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            if c.name == "multi_gpu_model" {
                let on: Vec<Option<u32>> = slots(&c).iter().map(|s| s.gpu).collect();
                assert_eq!(on, vec![Some(0), Some(1), Some(2), Some(1), Some(2)]);
                let mut without = config::read(&path).expect("reads");
                assert!(matches!(
                    normalize(&mut without, &devices(&[]), true),
                    Err(PlacementError::NoGpu(_))
                ));
            }
            checked += 1;
        }
        assert!(checked >= 9, "found {checked} reference configs");
    }

    #[test]
    fn the_instance_count_is_what_slots_makes_without_making_them() {
        for (text, gpus) in [
            ("instance_group [{ count: 3 kind: KIND_CPU }]", vec![]),
            (
                "instance_group [{ count: 2 kind: KIND_GPU }, { count: 1 kind: KIND_CPU }]",
                vec![0, 1],
            ),
            ("", vec![0]),
        ] {
            let c = placed(text, &gpus, true).expect("placed");
            assert_eq!(instance_count(&c), slots(&c).len() as u64, "{text}");
        }
        let huge = placed(
            "instance_group [{ count: 2000000000 kind: KIND_GPU }]",
            &[0, 1],
            true,
        )
        .expect("placed");
        assert_eq!(instance_count(&huge), 4_000_000_000);
    }
}
