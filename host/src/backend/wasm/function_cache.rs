//! Cranelift's incremental compilation cache, kept in memory for the server's life: a function
//! compiled once is not compiled again, whichever component it comes in. Components built by
//! the same toolchain share most of their code (every Python handler carries the same CPython,
//! about 16 s of compilation on 2 cores), so the second such component compiles mostly from
//! here. Restarts are covered by the compiled-component cache on disk; this one only spares the
//! compiler. Bounded in bytes: past the bound it stops storing, and compiles as before.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use wasmtime::CacheStore;

#[derive(Debug)]
pub struct FunctionCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
}

impl FunctionCache {
    pub fn new(max_bytes: usize) -> FunctionCache {
        FunctionCache {
            entries: Mutex::default(),
            max_bytes,
        }
    }

    /// Bytes held (keys and compiled code).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.bytes)
    }
}

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        // A copy: the entry cannot be lent out of the lock.
        let entries = self.entries.lock().ok()?;
        entries.map.get(key).map(|v| Cow::Owned(v.clone()))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let Ok(mut entries) = self.entries.lock() else {
            return false;
        };
        let size = key.len() + value.len();
        if entries.map.contains_key(key) || entries.bytes + size > self.max_bytes {
            return false;
        }
        entries.bytes += size;
        entries.map.insert(key.to_vec(), value);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_until_the_bound_then_refuses() {
        let cache = FunctionCache::new(10);
        assert!(cache.insert(b"ab", vec![1, 2, 3]));
        assert_eq!(cache.get(b"ab").as_deref(), Some(&[1u8, 2, 3][..]));
        assert!(!cache.insert(b"ab", vec![9]), "an entry is never replaced");
        assert!(!cache.insert(b"cd", vec![0; 6]), "past the bound");
        assert!(cache.insert(b"e", vec![0; 4]));
        assert_eq!(cache.bytes(), 10);
        assert!(cache.get(b"cd").is_none());
    }
}
