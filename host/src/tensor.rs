//! Tensors as they travel through the server: one representation for every front-end and backend.
//!
//! Fixed-size datatypes keep their elements as little-endian bytes, exactly as the KServe v2 binary
//! extension, ONNX Runtime and the Wasm guests want them, so a tensor crosses the server without
//! per-element conversion. `BYTES` tensors keep one byte string per element.

use std::fmt;

/// A KServe v2 datatype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 13] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    /// The KServe v2 wire name ("FP32", "BYTES", ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element; `None` for variable-length `BYTES`.
    pub fn size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Fixed-size elements as little-endian bytes.
    Raw(Vec<u8>),
    /// `BYTES` elements.
    Elements(Vec<Vec<u8>>),
}

/// A named tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: TensorData,
}

/// Number of elements of a shape; `None` when a dimension is negative or the product overflows.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
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

    /// Number of elements the shape promises.
    pub fn element_count(&self) -> Option<usize> {
        element_count(&self.shape)
    }

    /// Checks that the data holds exactly the elements the shape and datatype promise.
    pub fn check_consistent(&self) -> Result<(), String> {
        let count = self.element_count().ok_or_else(|| {
            format!(
                "tensor '{}' has an invalid shape {:?}",
                self.name, self.shape
            )
        })?;
        match (&self.data, self.datatype.size()) {
            (TensorData::Raw(bytes), Some(size)) => {
                if bytes.len() != count * size {
                    return Err(format!(
                        "tensor '{}' of shape {:?} and datatype {} needs {} bytes, got {}",
                        self.name,
                        self.shape,
                        self.datatype,
                        count * size,
                        bytes.len()
                    ));
                }
            }
            (TensorData::Elements(items), None) => {
                if items.len() != count {
                    return Err(format!(
                        "tensor '{}' of shape {:?} needs {} elements, got {}",
                        self.name,
                        self.shape,
                        count,
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
            TensorData::Elements(items) => items.iter().map(Vec::len).sum(),
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
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Fp32, shape, TensorData::Raw(bytes))
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
    fn element_count_rejects_negative_and_overflow() {
        assert_eq!(element_count(&[2, 3]), Some(6));
        assert_eq!(element_count(&[-1, 3]), None);
        assert_eq!(element_count(&[i64::MAX, i64::MAX]), None);
    }

    #[test]
    fn datatype_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_name(d.name()), Some(d));
        }
    }
}
