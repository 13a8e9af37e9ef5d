//! Tessera's shared vocabulary: the KServe v2 tensor datatypes, their wire and config names, their
//! element sizes, and the one place where shapes and byte sizes are computed.
//!
//! Sizes come from clients and guests, so every product here is checked: a shape of `[2^62]`
//! FP32 must be an error, not a wrapped-around "0 bytes". Nothing in this crate allocates from a
//! declared size; callers compare the checked size with the bytes they actually hold first.
//!
//! The crate has no dependencies, so the host and `wasm32-wasip2` guests share it.

use std::fmt;

/// A KServe v2 tensor datatype.
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
    pub const fn name(self) -> &'static str {
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

    /// The datatype of a wire name.
    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The name in `config.pbtxt` and the `/config` JSON ("TYPE_FP32"; BYTES is "TYPE_STRING").
    pub const fn config_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::Uint8 => "TYPE_UINT8",
            DataType::Uint16 => "TYPE_UINT16",
            DataType::Uint32 => "TYPE_UINT32",
            DataType::Uint64 => "TYPE_UINT64",
            DataType::Int8 => "TYPE_INT8",
            DataType::Int16 => "TYPE_INT16",
            DataType::Int32 => "TYPE_INT32",
            DataType::Int64 => "TYPE_INT64",
            DataType::Fp16 => "TYPE_FP16",
            DataType::Fp32 => "TYPE_FP32",
            DataType::Fp64 => "TYPE_FP64",
            DataType::Bytes => "TYPE_STRING",
        }
    }

    /// The datatype of a config name.
    pub fn from_config_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.config_name() == name)
    }

    /// Bytes per element; `None` for variable-length `BYTES`.
    pub const fn size(self) -> Option<usize> {
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

/// A name that is neither a wire nor a config datatype name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownDataType(pub String);

impl fmt::Display for UnknownDataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown datatype '{}'", self.0)
    }
}

impl std::error::Error for UnknownDataType {}

impl std::str::FromStr for DataType {
    type Err = UnknownDataType;

    /// Parses a wire name (`"FP32"`) or a config name (`"TYPE_FP32"`, `"TYPE_STRING"`), for code
    /// that reads either (a guest reading its configuration). Protocol decoders that must accept
    /// only wire names use [`DataType::from_name`].
    fn from_str(s: &str) -> Result<Self, UnknownDataType> {
        DataType::from_name(s)
            .or_else(|| DataType::from_config_name(s))
            .ok_or_else(|| UnknownDataType(s.to_owned()))
    }
}

/// Why a shape or size is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// A dimension is negative (`-1` is only a wildcard in configs, never in a tensor).
    NegativeDimension { index: usize, value: i64 },
    /// The element count or byte size does not fit in `usize`.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NegativeDimension { index, value } => {
                write!(f, "dimension {index} is negative ({value})")
            }
            SizeError::Overflow => f.write_str("its size overflows"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Elements in a tensor of `shape`: the product of its dimensions, exact or an error.
pub fn element_count(shape: &[i64]) -> Result<usize, SizeError> {
    let mut dims = Vec::with_capacity(shape.len());
    for (index, &value) in shape.iter().enumerate() {
        dims.push(
            usize::try_from(value).map_err(|_| SizeError::NegativeDimension { index, value })?,
        );
    }
    // A zero dimension makes an empty tensor, however large the others are.
    if dims.contains(&0) {
        return Ok(0);
    }
    dims.into_iter().try_fold(1usize, |acc, d| {
        acc.checked_mul(d).ok_or(SizeError::Overflow)
    })
}

/// Bytes that `count` elements of a fixed-size `datatype` take; `None` for `BYTES`.
pub fn byte_size(datatype: DataType, count: usize) -> Option<Result<usize, SizeError>> {
    datatype
        .size()
        .map(|size| count.checked_mul(size).ok_or(SizeError::Overflow))
}

/// Bytes of a fixed-size tensor of `shape`; `Ok(None)` for `BYTES`, whose size depends on the
/// elements.
pub fn shape_byte_size(datatype: DataType, shape: &[i64]) -> Result<Option<usize>, SizeError> {
    let count = element_count(shape)?;
    byte_size(datatype, count).transpose()
}

/// Bytes one `BYTES` element takes on the wire: a 4-byte little-endian length, then the bytes.
/// The same accounting is used for guest outputs, so a million empty strings are not free.
pub const BYTES_ELEMENT_OVERHEAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_name(d.name()), Some(d));
            assert_eq!(DataType::from_config_name(d.config_name()), Some(d));
        }
        assert_eq!(DataType::from_name("TYPE_FP32"), None);
        assert_eq!(DataType::from_config_name("FP32"), None);
    }

    #[test]
    fn either_name_parses() {
        assert_eq!("FP32".parse::<DataType>(), Ok(DataType::Fp32));
        assert_eq!("TYPE_STRING".parse::<DataType>(), Ok(DataType::Bytes));
        assert_eq!(
            "STRING".parse::<DataType>(),
            Err(UnknownDataType("STRING".into()))
        );
    }

    /// The WIT (`wit/tessera.wit`) is the contract; this crate must list the same datatypes, in
    /// the same order, under the same names.
    #[test]
    fn the_datatypes_agree_with_the_wit() {
        let wit = include_str!("../../../wit/tessera.wit");
        let start = wit
            .find("enum datatype {")
            .expect("the WIT declares enum datatype");
        let body = &wit[start..];
        let body = &body[..body.find('}').expect("the enum closes")];
        let cases: Vec<String> = body
            .lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .map(|l| {
                l.trim_end_matches(',')
                    .trim_start_matches('%')
                    .to_uppercase()
            })
            .collect();
        let ours: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(cases, ours);
    }

    #[test]
    fn element_count_rejects_negative_and_overflow() {
        assert_eq!(element_count(&[2, 3]), Ok(6));
        assert_eq!(element_count(&[]), Ok(1));
        assert_eq!(
            element_count(&[2, -1]),
            Err(SizeError::NegativeDimension {
                index: 1,
                value: -1
            })
        );
        assert_eq!(
            element_count(&[i64::MAX, i64::MAX]),
            Err(SizeError::Overflow)
        );
        assert_eq!(element_count(&[1 << 32, 1 << 32]), Err(SizeError::Overflow));
        assert_eq!(element_count(&[i64::MAX, i64::MAX, 0]), Ok(0));
    }

    #[test]
    fn byte_size_of_a_huge_shape_is_an_error_not_zero() {
        // 2^62 FP32 elements "need" 2^64 bytes: wrapping multiplication would give 0.
        assert_eq!(
            shape_byte_size(DataType::Fp32, &[1 << 62]),
            Err(SizeError::Overflow)
        );
        assert_eq!(
            shape_byte_size(DataType::Fp64, &[1 << 61]),
            Err(SizeError::Overflow)
        );
        assert_eq!(shape_byte_size(DataType::Bytes, &[1 << 62]), Ok(None));
        assert_eq!(shape_byte_size(DataType::Fp16, &[3, 5]), Ok(Some(30)));
    }

    /// The exact product in 128 bits, the reference the checked arithmetic must agree with.
    fn exact_product(shape: &[i64]) -> Option<u128> {
        if shape.contains(&0) {
            return Some(0);
        }
        shape.iter().try_fold(1u128, |acc, &d| {
            let d = u128::try_from(d).ok()?;
            acc.checked_mul(d)
        })
    }

    proptest! {
        #[test]
        fn element_count_is_exact_or_refused(shape in prop::collection::vec(-3i64..=i64::MAX, 0..6)) {
            let exact = if shape.iter().any(|&d| d < 0) { None } else { exact_product(&shape) };
            match element_count(&shape) {
                Ok(n) => prop_assert_eq!(Some(n as u128), exact),
                Err(SizeError::NegativeDimension { index, value }) => {
                    prop_assert!(value < 0);
                    prop_assert_eq!(shape[index], value);
                    prop_assert!(shape[..index].iter().all(|&d| d >= 0));
                }
                Err(SizeError::Overflow) => {
                    prop_assert!(shape.iter().all(|&d| d >= 0));
                    prop_assert!(exact.is_none_or(|e| e > usize::MAX as u128));
                }
            }
        }

        #[test]
        fn byte_size_never_wraps(shape in prop::collection::vec(0i64..=(1 << 40), 0..4), t in 0usize..13) {
            let datatype = DataType::ALL[t];
            let exact = exact_product(&shape)
                .and_then(|n| datatype.size().map(|s| n * s as u128));
            match shape_byte_size(datatype, &shape) {
                Ok(Some(bytes)) => prop_assert_eq!(Some(bytes as u128), exact),
                Ok(None) => prop_assert_eq!(datatype, DataType::Bytes),
                Err(e) => {
                    prop_assert_eq!(e, SizeError::Overflow);
                    prop_assert!(exact.is_none_or(|e| e > usize::MAX as u128));
                }
            }
        }
    }
}
