//! Triton's system shared-memory extension: clients register POSIX shared-memory objects
//! (`shm_open` keys) as named regions, then name a region, an offset and a size instead of
//! sending tensor data; outputs can be written into a region the same way.
//!
//! Every access is checked against the registered window (offset + size within the region, the
//! region within the object when registered), and goes through raw-pointer copies: the client
//! may write the memory at any time, so no Rust reference to it is ever made. An input is copied
//! once, out of the region, into the request's own buffer; an output is copied once into it.
//! Both protocols share one registry, as in Triton.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::infer::{InferError, SharedMemoryRef};
use tessera_core::kserve::RegionReader;

/// Why a tenant gets no regions.
pub const OPERATOR_ONLY: &str = "system shared memory is the operator's: a region's key reaches any shared-memory object of the server's user";

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("shared memory region '{0}' is already registered")]
    Exists(String),
    #[error("Unable to find system shared memory region: '{0}'")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
}

/// A registered region, as status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: usize,
    pub byte_size: usize,
}

/// One mapped region: `byte_size` bytes at `base + offset` of the mapping.
struct Region {
    status: RegionStatus,
    base: *mut u8,
    mapped: usize,
}

// SAFETY: the mapping is process-wide memory owned by this value until it drops; it is only
// ever accessed through `copy_nonoverlapping` within bounds, never through references.
unsafe impl Send for Region {}
// SAFETY: as above; concurrent copies in or out race only with the client's own writes, which
// the extension leaves to the client (as Triton does), and never touch memory outside the map.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base` and `mapped` are exactly what mmap returned and was asked for; requests
        // copying from the region hold an `Arc<Region>`, so none is in flight.
        unsafe {
            libc::munmap(self.base.cast(), self.mapped);
        }
    }
}

impl Region {
    /// The window `place` names inside this region, checked.
    fn window(&self, place: &SharedMemoryRef, what: &str) -> Result<*mut u8, InferError> {
        let end = place.offset.checked_add(place.byte_size);
        if end.is_none_or(|end| end > self.status.byte_size) {
            return Err(InferError::invalid(format!(
                "{what}: {} bytes at offset {} of shared memory region '{}' are out of its {} bytes",
                place.byte_size, place.offset, self.status.name, self.status.byte_size
            )));
        }
        // SAFETY: region offset + place offset + size <= mapped, checked above and at registration.
        Ok(unsafe { self.base.add(self.status.offset + place.offset) })
    }
}

/// The registered regions.
#[derive(Default)]
pub struct SharedMemory {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
}

impl SharedMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Region>>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, name: &str) -> Result<Arc<Region>, InferError> {
        self.lock()
            .get(name)
            .cloned()
            .ok_or_else(|| InferError::invalid(ShmError::NotFound(name.to_owned()).to_string()))
    }

    /// Maps `byte_size` bytes at `offset` of the shared-memory object `key` as region `name`.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<(), ShmError> {
        if name.is_empty() {
            return Err(ShmError::Invalid("a region needs a name".into()));
        }
        if self.lock().contains_key(name) {
            return Err(ShmError::Exists(name.to_owned()));
        }
        if byte_size == 0 {
            return Err(ShmError::Invalid(format!(
                "shared memory region '{name}': byte_size must be positive"
            )));
        }
        let c_key = CString::new(key)
            .map_err(|_| ShmError::Invalid(format!("shared memory key '{key}' contains NUL")))?;
        // SAFETY: a valid C string; the descriptor is closed below on every path.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(ShmError::Invalid(format!(
                "Unable to open shared memory region '{name}' with key '{key}': {}",
                std::io::Error::last_os_error()
            )));
        }
        let mapped = offset.checked_add(byte_size);
        let result = (|| {
            // SAFETY: fstat fills `stat` for an open descriptor.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            if unsafe { libc::fstat(fd, &mut stat) } != 0 {
                return Err(ShmError::Invalid(format!(
                    "cannot inspect shared memory key '{key}': {}",
                    std::io::Error::last_os_error()
                )));
            }
            let object_size = usize::try_from(stat.st_size).unwrap_or(0);
            let mapped = mapped.filter(|&m| m <= object_size).ok_or_else(|| {
                ShmError::Invalid(format!(
                    "shared memory region '{name}': offset {offset} + byte_size {byte_size} exceed the {object_size} bytes of '{key}'"
                ))
            })?;
            // SAFETY: maps `mapped` bytes of the object, which holds at least that many.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    mapped,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(ShmError::Invalid(format!(
                    "cannot map shared memory key '{key}': {}",
                    std::io::Error::last_os_error()
                )));
            }
            Ok(Region {
                status: RegionStatus {
                    name: name.to_owned(),
                    key: key.to_owned(),
                    offset,
                    byte_size,
                },
                base: base.cast(),
                mapped,
            })
        })();
        // SAFETY: the descriptor from shm_open above; the mapping outlives it.
        unsafe {
            libc::close(fd);
        }
        let region = result?;
        let mut regions = self.lock();
        if regions.contains_key(name) {
            return Err(ShmError::Exists(name.to_owned()));
        }
        regions.insert(name.to_owned(), Arc::new(region));
        tracing::info!(
            region = name,
            key,
            offset,
            byte_size,
            "registered shared memory"
        );
        Ok(())
    }

    /// Unregisters `name` (None: every region). Requests using it finish first: they hold it.
    pub fn unregister(&self, name: Option<&str>) -> Result<(), ShmError> {
        let mut regions = self.lock();
        match name {
            None => regions.clear(),
            Some(name) => {
                regions
                    .remove(name)
                    .ok_or_else(|| ShmError::NotFound(name.to_owned()))?;
            }
        }
        Ok(())
    }

    /// Every region (or the one named), for the status endpoints.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, ShmError> {
        let regions = self.lock();
        match name {
            None => Ok(regions.values().map(|r| r.status.clone()).collect()),
            Some(name) => regions
                .get(name)
                .map(|r| vec![r.status.clone()])
                .ok_or_else(|| ShmError::NotFound(name.to_owned())),
        }
    }

    /// Writes `data` (an output) to `place`; it must fit.
    pub fn write(
        &self,
        output: &str,
        place: &SharedMemoryRef,
        data: &[u8],
    ) -> Result<(), InferError> {
        let region = self.get(&place.region)?;
        if data.len() > place.byte_size {
            return Err(InferError::invalid(format!(
                "shared memory size specified with the request for output '{output}' ({} bytes) should be at least {} bytes to hold the results",
                place.byte_size,
                data.len()
            )));
        }
        let at = region.window(place, &format!("output '{output}'"))?;
        // SAFETY: `at` starts a window of at least `data.len()` bytes inside the mapping
        // (checked by `window`), and `data` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        Ok(())
    }
}

/// Outputs a request asked to have in shared memory: their names and places.
pub fn requested_outputs(
    outputs: &[crate::infer::RequestedOutput],
) -> Vec<(String, SharedMemoryRef)> {
    outputs
        .iter()
        .filter_map(|o| Some((o.name.clone(), o.shared_memory.clone()?)))
        .collect()
}

/// Writes the outputs of `response` that `requested` places in shared memory; returns, for
/// each, its name, its region and the bytes written. `shm` None: the caller has no regions.
pub fn write_outputs(
    shm: Option<&SharedMemory>,
    requested: &[(String, SharedMemoryRef)],
    outputs: &[crate::tensor::Tensor],
) -> Result<Vec<(String, String, usize)>, InferError> {
    use crate::tensor::TensorData;
    let mut placed = Vec::with_capacity(requested.len());
    for (name, place) in requested {
        let shm = shm.ok_or_else(|| {
            InferError::invalid(ShmError::NotFound(place.region.clone()).to_string())
        })?;
        let Some(tensor) = outputs.iter().find(|t| &t.name == name) else {
            continue;
        };
        let written = match &tensor.data {
            TensorData::Raw(bytes) => {
                shm.write(name, place, bytes)?;
                bytes.len()
            }
            TensorData::Elements(items) => {
                let bytes = tessera_core::kserve::encode_bytes_elements(items);
                shm.write(name, place, &bytes)?;
                bytes.len()
            }
        };
        placed.push((name.clone(), place.region.clone(), written));
    }
    Ok(placed)
}

impl RegionReader for SharedMemory {
    fn read(&self, place: &SharedMemoryRef) -> Result<Bytes, InferError> {
        let region = self.get(&place.region)?;
        let at = region.window(place, "input")?;
        let mut out = vec![0u8; place.byte_size];
        // SAFETY: `at` starts a window of `byte_size` bytes inside the mapping (checked by
        // `window`); `out` is a fresh buffer of that size.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), place.byte_size) };
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A POSIX shared-memory object of `size` bytes, unlinked when dropped.
    struct Object(CString);

    impl Object {
        fn new(size: usize) -> Object {
            let name = CString::new(format!("/tessera-test-{}-{size}", std::process::id()))
                .expect("no NUL");
            // SAFETY: test setup with a valid name; the descriptor is closed at once.
            unsafe {
                let fd = libc::shm_open(name.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
                assert!(fd >= 0, "shm_open");
                assert_eq!(libc::ftruncate(fd, size as libc::off_t), 0);
                libc::close(fd);
            }
            Object(name)
        }

        fn key(&self) -> &str {
            self.0.to_str().expect("utf-8")
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            // SAFETY: unlinks the object this test created.
            unsafe { libc::shm_unlink(self.0.as_ptr()) };
        }
    }

    fn place(region: &str, offset: usize, byte_size: usize) -> SharedMemoryRef {
        SharedMemoryRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    #[test]
    fn outputs_written_are_read_back_within_bounds() -> Result<(), InferError> {
        let object = Object::new(64);
        let shm = SharedMemory::default();
        shm.register("r", object.key(), 16, 32)
            .map_err(|e| InferError::invalid(e.to_string()))?;
        shm.write("Y", &place("r", 4, 8), &[1, 2, 3, 4, 5, 6, 7, 8])?;
        assert_eq!(
            shm.read(&place("r", 4, 8))?.as_ref(),
            &[1, 2, 3, 4, 5, 6, 7, 8]
        );
        // Past the region's 32 bytes, or an offset that overflows: refused.
        assert!(shm.read(&place("r", 30, 4)).is_err());
        assert!(shm.read(&place("r", usize::MAX, 2)).is_err());
        assert!(
            shm.write("Y", &place("r", 0, 2), &[0; 4]).is_err(),
            "too small a window"
        );
        assert!(shm.read(&place("nope", 0, 1)).is_err());
        Ok(())
    }

    #[test]
    fn registration_checks_the_object() {
        let object = Object::new(64);
        let shm = SharedMemory::default();
        assert!(
            shm.register("big", object.key(), 32, 64).is_err(),
            "past its end"
        );
        assert!(
            shm.register("none", "/tessera-no-such-object", 0, 8)
                .is_err()
        );
        assert!(shm.register("r", object.key(), 0, 64).is_ok());
        assert!(matches!(
            shm.register("r", object.key(), 0, 8),
            Err(ShmError::Exists(_))
        ));
        assert_eq!(shm.status(None).map(|s| s.len()).ok(), Some(1));
        assert!(shm.unregister(Some("r")).is_ok());
        assert!(shm.unregister(Some("r")).is_err());
    }
}
