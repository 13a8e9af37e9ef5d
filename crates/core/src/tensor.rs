//! Tensors as they travel through the server: one representation for every front-end and backend.
//!
//! Fixed-size datatypes keep their elements as little-endian bytes, exactly as the KServe v2 binary
//! extension, ONNX Runtime and the Wasm guests want them, so a tensor crosses the server without
//! per-element conversion. `BYTES` tensors keep one byte string per element.
//!
//! Payloads are reference-counted [`Bytes`]: a binary input is a slice of the request body, an
//! ensemble step's input shares its producer's output, and a batch's output is split per request
//! by slicing, none of them copied.

pub use bytes::Bytes;
pub use tessera_abi::{
    BYTES_ELEMENT_OVERHEAD, DataType, SizeError, byte_size, element_count, shape_byte_size,
};

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Fixed-size elements as little-endian bytes.
    Raw(Bytes),
    /// `BYTES` elements.
    Elements(Vec<Bytes>),
}

/// A named tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: TensorData,
}

impl Tensor {
    pub fn new(
        name: impl Into<String>,
        datatype: DataType,
        shape: Vec<i64>,
        data: TensorData,
    ) -> Self {
        Tensor {
            name: name.into(),
            datatype,
            shape,
            data,
        }
    }

    /// Number of elements the shape promises, checked.
    pub fn element_count(&self) -> Result<usize, SizeError> {
        element_count(&self.shape)
    }

    /// Checks that the data holds exactly the elements the shape and datatype promise. Every size
    /// is computed with checked arithmetic: a shape whose byte size overflows is refused.
    pub fn check_consistent(&self) -> Result<(), String> {
        let invalid = |e: SizeError| {
            format!(
                "tensor '{}' has an invalid shape {:?}: {e}",
                self.name, self.shape
            )
        };
        let count = self.element_count().map_err(invalid)?;
        match (&self.data, byte_size(self.datatype, count)) {
            (TensorData::Raw(bytes), Some(needed)) => {
                let needed = needed.map_err(invalid)?;
                if bytes.len() != needed {
                    return Err(format!(
                        "tensor '{}' of shape {:?} and datatype {} needs {needed} bytes, got {}",
                        self.name,
                        self.shape,
                        self.datatype,
                        bytes.len()
                    ));
                }
            }
            (TensorData::Elements(items), None) => {
                if items.len() != count {
                    return Err(format!(
                        "tensor '{}' of shape {:?} needs {count} elements, got {}",
                        self.name,
                        self.shape,
                        items.len()
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "tensor '{}': data does not match datatype {}",
                    self.name, self.datatype
                ));
            }
        }
        Ok(())
    }

    /// Size of the payload in bytes (BYTES: the sum of element lengths).
    pub fn byte_size(&self) -> usize {
        match &self.data {
            TensorData::Raw(b) => b.len(),
            TensorData::Elements(items) => items.iter().map(Bytes::len).sum(),
        }
    }

    /// The elements as `f64`, for classification and JSON output. `None` for BYTES.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        let TensorData::Raw(b) = &self.data else {
            return None;
        };
        macro_rules! conv {
            ($t:ty, $n:expr) => {
                b.chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; $n])) as f64)
                    .collect()
            };
        }
        Some(match self.datatype {
            DataType::Bool | DataType::Uint8 => b.iter().map(|&v| v as f64).collect(),
            DataType::Int8 => b.iter().map(|&v| v as i8 as f64).collect(),
            DataType::Uint16 => conv!(u16, 2),
            DataType::Int16 => conv!(i16, 2),
            DataType::Uint32 => conv!(u32, 4),
            DataType::Int32 => conv!(i32, 4),
            DataType::Uint64 => conv!(u64, 8),
            DataType::Int64 => conv!(i64, 8),
            DataType::Fp16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::Fp32 => conv!(f32, 4),
            DataType::Fp64 => conv!(f64, 8),
            DataType::Bytes => return None,
        })
    }

    /// Builds an FP32 tensor (used by tests and examples of the API).
    pub fn from_f32(name: &str, shape: Vec<i64>, values: &[f32]) -> Tensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Fp32, shape, TensorData::Raw(bytes.into()))
    }

    /// The elements as `f32` if this is an FP32 tensor.
    pub fn as_f32_vec(&self) -> Option<Vec<f32>> {
        match (&self.data, self.datatype) {
            (TensorData::Raw(b), DataType::Fp32) => Some(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_checks_byte_length() {
        let t = Tensor::from_f32("x", vec![2, 2], &[1.0, 2.0, 3.0, 4.0]);
        assert!(t.check_consistent().is_ok());
        let bad = Tensor::from_f32("x", vec![2, 3], &[1.0, 2.0, 3.0, 4.0]);
        assert!(
            bad.check_consistent()
                .unwrap_err()
                .contains("needs 24 bytes")
        );
    }

    #[test]
    fn a_shape_whose_byte_size_wraps_is_refused() {
        // [2^62] FP32 is 2^64 bytes: with wrapping arithmetic it "needs" 0 bytes and an empty
        // payload passed this check.
        let t = Tensor::new(
            "x",
            DataType::Fp32,
            vec![1 << 62],
            TensorData::Raw(Bytes::new()),
        );
        let e = t.check_consistent().unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        let t = Tensor::new(
            "x",
            DataType::Int64,
            vec![1 << 31, 1 << 31, 4],
            TensorData::Raw(Bytes::new()),
        );
        assert!(t.check_consistent().is_err());
    }
}
