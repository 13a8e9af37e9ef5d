//! Triton's system shared-memory extension: clients register POSIX shared-memory objects
//! (`shm_open` keys) as named regions, then name a region, an offset and a size instead of
//! sending tensor data; outputs can be written into a region the same way.
//!
//! Every access is checked against the registered window (offset + size within the region), and
//! goes through the object's file descriptor (`pread`/`pwrite`), never through a mapping. The
//! client owns the object and may shrink it at any time (`ftruncate`): a read through a mapping
//! past the new end would raise SIGBUS and kill the server, while `pread` simply returns fewer
//! bytes, which is refused as an error. The cost is the same single copy a mapping needed (the
//! kernel copies from the page cache instead of user space copying from the mapping) plus one
//! system call per tensor; `benches/request_path.rs` measures it at 1 MiB. Both protocols share
//! one registry, as in Triton.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
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

/// One registered region: `byte_size` bytes at `offset` of the object open as `file`.
struct Region {
    status: RegionStatus,
    file: File,
}

impl Region {
    /// Where `place` starts in the object, checked against the registered window.
    fn window(&self, place: &SharedMemoryRef, what: &str) -> Result<u64, InferError> {
        let end = place.offset.checked_add(place.byte_size);
        if end.is_none_or(|end| end > self.status.byte_size) {
            return Err(InferError::invalid(format!(
                "{what}: {} bytes at offset {} of shared memory region '{}' are out of its {} bytes",
                place.byte_size, place.offset, self.status.name, self.status.byte_size
            )));
        }
        // Both terms are within the registered window, which fitted in the object.
        Ok((self.status.offset + place.offset) as u64)
    }

    /// The answer when the client's object no longer holds the window it registered.
    fn shrunk(&self, what: &str) -> InferError {
        InferError::invalid(format!(
            "{what}: shared memory region '{}' is smaller than when it was registered (the object '{}' was truncated)",
            self.status.name, self.status.key
        ))
    }

    fn io_error(&self, what: &str, e: &std::io::Error) -> InferError {
        tracing::warn!(region = %self.status.name, key = %self.status.key, "{what}: {e}");
        InferError::invalid(format!(
            "{what}: shared memory region '{}' cannot be accessed",
            self.status.name
        ))
    }
}

/// Regions registered at once: each keeps its object open (a file descriptor), so without a
/// bound registrations alone would exhaust the server's descriptors, and it could accept no
/// connection.
pub const MAX_REGIONS: usize = 4096;

/// The most one input reads from a region (a BYTES input: the others read what their shape
/// takes).
pub const MAX_INPUT_READ_BYTES: usize = 1 << 30;

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

    /// Registers `byte_size` bytes at `offset` of the shared-memory object `key` as region
    /// `name`, keeping the object open.
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
        // SAFETY: a valid C string; the descriptor is owned by a File at once.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            // The OS's reason goes to the log only: it describes the server's side.
            tracing::warn!(
                region = name,
                key,
                "shm_open failed: {}",
                std::io::Error::last_os_error()
            );
            return Err(ShmError::Invalid(format!(
                "Unable to open shared memory region: '{key}'"
            )));
        }
        // SAFETY: `fd` was just returned by shm_open and is owned by nothing else; the File
        // closes it on every path.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let object_size = file
            .metadata()
            .map_err(|e| {
                tracing::warn!(region = name, key, "fstat failed: {e}");
                ShmError::Invalid(format!("cannot inspect shared memory key '{key}'"))
            })?
            .len();
        let fits = offset
            .checked_add(byte_size)
            .is_some_and(|end| end as u64 <= object_size);
        if !fits {
            return Err(ShmError::Invalid(format!(
                "shared memory region '{name}': offset {offset} + byte_size {byte_size} exceed the {object_size} bytes of '{key}'"
            )));
        }
        let region = Region {
            status: RegionStatus {
                name: name.to_owned(),
                key: key.to_owned(),
                offset,
                byte_size,
            },
            file,
        };
        let mut regions = self.lock();
        if regions.contains_key(name) {
            return Err(ShmError::Exists(name.to_owned()));
        }
        if regions.len() >= MAX_REGIONS {
            return Err(ShmError::Invalid(format!(
                "{MAX_REGIONS} shared memory regions are registered already, the most at once: unregister some first"
            )));
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
    /// A name that is not registered is no error, as in Triton (its `L0_shared_memory` test
    /// unregisters before registering): clients clean up by name before they register.
    pub fn unregister(&self, name: Option<&str>) {
        let mut regions = self.lock();
        match name {
            None => regions.clear(),
            Some(name) => {
                regions.remove(name);
            }
        }
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
        let what = format!("output '{output}'");
        let at = region.window(place, &what)?;
        // pwrite past the end would grow the object again: refuse a shrunk one instead.
        let size = region
            .file
            .metadata()
            .map_err(|e| region.io_error(&what, &e))?
            .len();
        if at + data.len() as u64 > size {
            return Err(region.shrunk(&what));
        }
        region
            .file
            .write_all_at(data, at)
            .map_err(|e| region.io_error(&what, &e))
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
        if place.byte_size > MAX_INPUT_READ_BYTES {
            return Err(InferError::invalid(format!(
                "an input of {} bytes in shared memory is more than the {MAX_INPUT_READ_BYTES} bytes one input may read",
                place.byte_size
            )));
        }
        let mut out = vec![0u8; place.byte_size];
        match region.file.read_exact_at(&mut out, at) {
            Ok(()) => Ok(Bytes::from(out)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(region.shrunk("input")),
            Err(e) => Err(region.io_error("input", &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A POSIX shared-memory object of `size` bytes, unlinked when dropped.
    struct Object(CString);

    /// Tests run in parallel threads of one process: each object needs its own name, or one
    /// test's drop unlinks the object another is about to open.
    static NEXT_OBJECT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    impl Object {
        fn new(size: usize) -> Object {
            let serial = NEXT_OBJECT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = CString::new(format!(
                "/tessera-test-{}-{serial}-{size}",
                std::process::id()
            ))
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
        shm.unregister(Some("r"));
        assert_eq!(shm.status(None).map(|s| s.len()).ok(), Some(0));
        // Again, as Triton: no error.
        shm.unregister(Some("r"));
    }
}
