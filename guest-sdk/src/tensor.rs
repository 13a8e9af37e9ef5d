//! Tensors: typed views over a request's inputs and builders for a response's outputs.

use std::borrow::Cow;
use std::fmt;

use crate::Error;

/// The KServe v2 tensor datatypes: the one definition shared with the host (`tessera-abi`).
/// `name()` is the wire name (`"FP32"`), `size()` the bytes per element (`None` for `BYTES`),
/// and `parse()` accepts wire and `config.pbtxt` names (`"TYPE_FP32"`, `"TYPE_STRING"`).
pub use tessera_abi::DataType;

mod sealed {
    pub trait Sealed {}
}

/// A fixed-size element type that a tensor can be viewed as or built from: `u8`…`u64`,
/// `i8`…`i64`, `f32`, `f64`. Sealed: the SDK implements it for exactly these types.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The tensor datatype whose elements are `Self`.
    const DATATYPE: DataType;

    /// Decodes one element from its little-endian bytes (`bytes.len() == size_of::<Self>()`).
    #[doc(hidden)]
    fn from_le_slice(bytes: &[u8]) -> Self;

    /// Appends the element's little-endian bytes.
    #[doc(hidden)]
    fn extend_le(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($($ty:ty => $dt:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DATATYPE: DataType = DataType::$dt;
            fn from_le_slice(bytes: &[u8]) -> Self {
                let mut buf = [0u8; std::mem::size_of::<$ty>()];
                buf.copy_from_slice(bytes);
                <$ty>::from_le_bytes(buf)
            }
            fn extend_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

element! {
    u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    f32 => Fp32, f64 => Fp64,
}

/// Reinterprets little-endian bytes as elements: borrowed when the bytes are suitably aligned
/// (the usual case: the host's buffers come from the allocator), copied otherwise.
fn cast_le<T: Element>(bytes: &[u8]) -> Cow<'_, [T]> {
    #[cfg(target_endian = "little")]
    if let Ok(slice) = bytemuck::try_cast_slice::<u8, T>(bytes) {
        return Cow::Borrowed(slice);
    }
    Cow::Owned(
        bytes
            .chunks_exact(std::mem::size_of::<T>())
            .map(T::from_le_slice)
            .collect(),
    )
}

/// Encodes elements as little-endian bytes.
fn to_le_bytes<T: Element>(values: &[T]) -> Vec<u8> {
    #[cfg(target_endian = "little")]
    {
        bytemuck::cast_slice::<T, u8>(values).to_vec()
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut out = Vec::with_capacity(std::mem::size_of_val(values));
        for v in values {
            v.extend_le(&mut out);
        }
        out
    }
}

/// The elements of a tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Every fixed-size datatype: the elements' little-endian bytes, back to back.
    Raw(Vec<u8>),
    /// [`DataType::Bytes`] tensors: one byte string per element.
    Elements(Vec<Vec<u8>>),
}

/// A named tensor: a request's input or a response's output.
///
/// Read one with the typed views, which check the datatype and never copy when they need not:
///
/// ```
/// use tessera_guest::{DataType, Tensor};
///
/// let t = Tensor::from_f32("INPUT0", [2, 2], &[1.0, 2.0, 3.0, 4.0]);
/// t.check(DataType::Fp32, &[-1, 2])?; // any batch size, two columns
/// assert_eq!(t.as_f32()?.iter().sum::<f32>(), 10.0);
/// assert!(t.as_i64().is_err()); // wrong datatype: an invalid-input error
///
/// let s = Tensor::from_strings("TEXT", [2, 1], &["héllo", "wörld"]);
/// assert_eq!(s.as_strings()?, ["héllo", "wörld"]);
/// # Ok::<(), tessera_guest::Error>(())
/// ```
///
/// Builders (`from_f32`, `from_i64`, `from_strings`, …) do not check that the data fits the
/// shape; the SDK checks every output before it leaves the handler and turns a mismatch into an
/// `internal` error for that request. Call [`Tensor::validate`] to check earlier.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    data: TensorData,
}

impl Tensor {
    /// A tensor from its parts, unchecked (see [`Tensor::validate`]).
    pub fn new(
        name: impl Into<String>,
        datatype: DataType,
        shape: impl Into<Vec<i64>>,
        data: TensorData,
    ) -> Self {
        Tensor {
            name: name.into(),
            datatype,
            shape: shape.into(),
            data,
        }
    }

    /// A fixed-size tensor from raw little-endian bytes.
    pub fn from_raw(
        name: impl Into<String>,
        datatype: DataType,
        shape: impl Into<Vec<i64>>,
        bytes: Vec<u8>,
    ) -> Self {
        Self::new(name, datatype, shape, TensorData::Raw(bytes))
    }

    /// A tensor of any [`Element`] type (`u8`…`u64`, `i8`…`i64`, `f32`, `f64`).
    pub fn from_slice<T: Element>(
        name: impl Into<String>,
        shape: impl Into<Vec<i64>>,
        values: &[T],
    ) -> Self {
        Self::from_raw(name, T::DATATYPE, shape, to_le_bytes(values))
    }

    /// An `FP32` tensor.
    pub fn from_f32(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[f32]) -> Self {
        Self::from_slice(name, shape, values)
    }

    /// An `FP64` tensor.
    pub fn from_f64(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[f64]) -> Self {
        Self::from_slice(name, shape, values)
    }

    /// An `INT32` tensor.
    pub fn from_i32(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[i32]) -> Self {
        Self::from_slice(name, shape, values)
    }

    /// An `INT64` tensor.
    pub fn from_i64(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[i64]) -> Self {
        Self::from_slice(name, shape, values)
    }

    /// A `UINT8` tensor.
    pub fn from_u8(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[u8]) -> Self {
        Self::from_raw(name, DataType::Uint8, shape, values.to_vec())
    }

    /// A `BOOL` tensor.
    pub fn from_bool(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[bool]) -> Self {
        Self::from_raw(
            name,
            DataType::Bool,
            shape,
            values.iter().map(|&b| u8::from(b)).collect(),
        )
    }

    /// A `BYTES` tensor of UTF-8 strings.
    pub fn from_strings<S: AsRef<str>>(
        name: impl Into<String>,
        shape: impl Into<Vec<i64>>,
        values: &[S],
    ) -> Self {
        let elements = values
            .iter()
            .map(|s| s.as_ref().as_bytes().to_vec())
            .collect();
        Self::new(name, DataType::Bytes, shape, TensorData::Elements(elements))
    }

    /// A `BYTES` tensor of arbitrary byte strings.
    pub fn from_bytes_elements(
        name: impl Into<String>,
        shape: impl Into<Vec<i64>>,
        elements: Vec<Vec<u8>>,
    ) -> Self {
        Self::new(name, DataType::Bytes, shape, TensorData::Elements(elements))
    }

    /// The same tensor under another name, e.g. to feed one model's output to another model's
    /// input. Moves the data; nothing is copied.
    #[must_use]
    pub fn renamed(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The same data with another shape of the same element count (checked by
    /// [`Tensor::validate`], as for any tensor).
    #[must_use]
    pub fn reshaped(mut self, shape: impl Into<Vec<i64>>) -> Self {
        self.shape = shape.into();
        self
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor's datatype.
    pub fn datatype(&self) -> DataType {
        self.datatype
    }

    /// The dimensions, batch dimension first where the model batches.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Dimension `axis` as a `usize`, or an `invalid-input` error when the tensor has fewer
    /// dimensions.
    pub fn dim(&self, axis: usize) -> Result<usize, Error> {
        self.shape
            .get(axis)
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .ok_or_else(|| self.error(format!("has no dimension {axis} (shape {:?})", self.shape)))
    }

    /// The number of elements the shape describes (1 for a scalar, shape `[]`).
    pub fn element_count(&self) -> usize {
        // Negative dimensions count as 0 and an overflowing product saturates; `validate` refuses
        // both.
        if self.shape.iter().any(|&d| d < 0) {
            return 0;
        }
        tessera_abi::element_count(&self.shape).unwrap_or(usize::MAX)
    }

    /// The raw data.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// Takes the tensor apart into name, datatype, shape and data.
    pub fn into_parts(self) -> (String, DataType, Vec<i64>, TensorData) {
        (self.name, self.datatype, self.shape, self.data)
    }

    fn error(&self, what: impl fmt::Display) -> Error {
        Error::invalid_input(format!("tensor '{}' {what}", self.name))
    }

    /// Checks the datatype: an `invalid-input` error names the tensor and both datatypes.
    pub fn expect_datatype(&self, datatype: DataType) -> Result<&Self, Error> {
        if self.datatype == datatype {
            Ok(self)
        } else {
            Err(self.error(format_args!(
                "has datatype {}, expected {datatype}",
                self.datatype
            )))
        }
    }

    /// Checks the number of dimensions.
    pub fn expect_rank(&self, rank: usize) -> Result<&Self, Error> {
        if self.shape.len() == rank {
            Ok(self)
        } else {
            Err(self.error(format_args!(
                "has shape {:?}, expected {rank} dimensions",
                self.shape
            )))
        }
    }

    /// Checks the shape against a pattern in which `-1` matches any size, as in `config.pbtxt`:
    /// `expect_shape(&[-1, 16])` accepts `[1, 16]` and `[8, 16]`, not `[8, 15]` or `[16]`.
    pub fn expect_shape(&self, pattern: &[i64]) -> Result<&Self, Error> {
        let fits = self.shape.len() == pattern.len()
            && self
                .shape
                .iter()
                .zip(pattern)
                .all(|(&d, &p)| p < 0 || d == p);
        if fits {
            Ok(self)
        } else {
            Err(self.error(format_args!(
                "has shape {:?}, expected {:?}",
                self.shape, pattern
            )))
        }
    }

    /// [`expect_datatype`](Self::expect_datatype) and [`expect_shape`](Self::expect_shape) in one.
    pub fn check(&self, datatype: DataType, pattern: &[i64]) -> Result<&Self, Error> {
        self.expect_datatype(datatype)?.expect_shape(pattern)
    }

    /// Checks that the data agrees with the datatype and the shape: raw data for fixed-size
    /// datatypes, one element per entry for `BYTES`, element count equal to the shape's
    /// product, no negative dimension.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(d) = self.shape.iter().find(|&&d| d < 0) {
            return Err(self.error(format_args!(
                "has a negative dimension {d} in shape {:?}",
                self.shape
            )));
        }
        let count = tessera_abi::element_count(&self.shape)
            .map_err(|e| self.error(format_args!("has an invalid shape {:?}: {e}", self.shape)))?;
        match (&self.data, self.datatype.size()) {
            (TensorData::Raw(bytes), Some(size)) => {
                let needed = count.checked_mul(size).ok_or_else(|| {
                    self.error(format_args!(
                        "has shape {:?} whose byte size overflows",
                        self.shape
                    ))
                })?;
                if bytes.len() != needed {
                    return Err(self.error(format_args!(
                        "holds {} bytes, but shape {:?} of {} needs {needed}",
                        bytes.len(),
                        self.shape,
                        self.datatype,
                    )));
                }
            }
            (TensorData::Elements(elements), None) => {
                if elements.len() != count {
                    return Err(self.error(format_args!(
                        "holds {} elements, but shape {:?} needs {count}",
                        elements.len(),
                        self.shape
                    )));
                }
            }
            (TensorData::Raw(_), None) => {
                return Err(self.error("is BYTES but holds raw data"));
            }
            (TensorData::Elements(_), Some(_)) => {
                return Err(self.error(format_args!(
                    "is {} but holds byte-string elements",
                    self.datatype
                )));
            }
        }
        Ok(())
    }

    /// The raw little-endian bytes of a fixed-size tensor, with the datatype checked and the
    /// length checked against the shape.
    fn raw_of(&self, datatype: DataType) -> Result<&[u8], Error> {
        self.expect_datatype(datatype)?;
        self.validate()?;
        match &self.data {
            TensorData::Raw(bytes) => Ok(bytes),
            TensorData::Elements(_) => Err(self.error("holds byte-string elements")),
        }
    }

    /// The raw little-endian bytes of any fixed-size tensor, whatever its datatype.
    pub fn as_raw_bytes(&self) -> Result<&[u8], Error> {
        match &self.data {
            TensorData::Raw(bytes) => Ok(bytes),
            TensorData::Elements(_) => Err(self.error("is BYTES, expected a fixed-size datatype")),
        }
    }

    /// The elements as `T` (see [`Element`]), after checking the datatype is `T::DATATYPE`.
    /// Borrows the tensor's bytes where their alignment allows (the usual case), copies
    /// otherwise; either way the result derefs to `&[T]`.
    pub fn as_slice<T: Element>(&self) -> Result<Cow<'_, [T]>, Error> {
        Ok(cast_le(self.raw_of(T::DATATYPE)?))
    }

    /// The elements of an `FP32` tensor.
    pub fn as_f32(&self) -> Result<Cow<'_, [f32]>, Error> {
        self.as_slice()
    }

    /// The elements of an `FP64` tensor.
    pub fn as_f64(&self) -> Result<Cow<'_, [f64]>, Error> {
        self.as_slice()
    }

    /// The elements of an `INT32` tensor.
    pub fn as_i32(&self) -> Result<Cow<'_, [i32]>, Error> {
        self.as_slice()
    }

    /// The elements of an `INT64` tensor.
    pub fn as_i64(&self) -> Result<Cow<'_, [i64]>, Error> {
        self.as_slice()
    }

    /// The elements of a `UINT8` tensor (never copied).
    pub fn as_u8(&self) -> Result<&[u8], Error> {
        self.raw_of(DataType::Uint8)
    }

    /// The bit patterns of an `FP16` tensor (convert with the `half` crate if needed).
    pub fn as_fp16_bits(&self) -> Result<Cow<'_, [u16]>, Error> {
        Ok(cast_le(self.raw_of(DataType::Fp16)?))
    }

    /// The elements of a `BOOL` tensor; bytes other than 0 and 1 are an `invalid-input` error.
    pub fn as_bool(&self) -> Result<Vec<bool>, Error> {
        self.raw_of(DataType::Bool)?
            .iter()
            .enumerate()
            .map(|(i, &b)| match b {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(self.error(format_args!("element {i} is {b}, not a BOOL (0 or 1)"))),
            })
            .collect()
    }

    /// The byte strings of a `BYTES` tensor.
    pub fn as_bytes_elements(&self) -> Result<&[Vec<u8>], Error> {
        self.expect_datatype(DataType::Bytes)?;
        self.validate()?;
        match &self.data {
            TensorData::Elements(elements) => Ok(elements),
            TensorData::Raw(_) => Err(self.error("is BYTES but holds raw data")),
        }
    }

    /// The elements of a `BYTES` tensor as UTF-8 text; an element that is not UTF-8 is an
    /// `invalid-input` error naming its index.
    pub fn as_strings(&self) -> Result<Vec<&str>, Error> {
        self.as_bytes_elements()?
            .iter()
            .enumerate()
            .map(|(i, e)| {
                std::str::from_utf8(e)
                    .map_err(|err| self.error(format_args!("element {i} is not UTF-8: {err}")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_element_type() {
        assert_eq!(
            *Tensor::from_f32("x", [3], &[1.5, -2.0, 3.25])
                .as_f32()
                .unwrap(),
            [1.5, -2.0, 3.25]
        );
        assert_eq!(
            *Tensor::from_f64("x", [1], &[1e300]).as_f64().unwrap(),
            [1e300]
        );
        assert_eq!(
            *Tensor::from_i64("x", [2], &[i64::MIN, 7]).as_i64().unwrap(),
            [i64::MIN, 7]
        );
        assert_eq!(*Tensor::from_i32("x", [1], &[-9]).as_i32().unwrap(), [-9]);
        assert_eq!(
            Tensor::from_u8("x", [2], &[1, 255]).as_u8().unwrap(),
            [1, 255]
        );
        assert_eq!(
            Tensor::from_bool("x", [2], &[true, false])
                .as_bool()
                .unwrap(),
            [true, false]
        );
        let t = Tensor::from_slice::<u16>("x", [1], &[0x3c00]);
        assert_eq!(t.datatype(), DataType::Uint16);
    }

    #[test]
    fn data_is_little_endian() {
        let t = Tensor::from_f32("x", [1], &[1.0]);
        assert_eq!(t.as_raw_bytes().unwrap(), [0, 0, 0x80, 0x3f]);
    }

    #[test]
    fn unaligned_bytes_are_copied_not_misread() {
        let mut bytes = [0u8; 1 + 8];
        bytes[1..5].copy_from_slice(&1.5f32.to_le_bytes());
        bytes[5..9].copy_from_slice(&(-4.0f32).to_le_bytes());
        // An odd offset into a buffer defeats the borrow.
        let slice = &bytes[1..];
        let values: Cow<'_, [f32]> = cast_le(slice);
        assert_eq!(*values, [1.5, -4.0]);
        let aligned = Tensor::from_f32("x", [2], &[1.5, -4.0]);
        assert!(matches!(aligned.as_f32().unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn views_check_datatype_and_length() {
        let t = Tensor::from_f32("INPUT0", [2, 2], &[1.0, 2.0, 3.0]);
        let err = t.as_f32().unwrap_err();
        assert!(err.is_invalid_input());
        assert!(err.message().contains("INPUT0"), "{err}");
        let err = Tensor::from_i64("I", [1], &[1]).as_f32().unwrap_err();
        assert_eq!(
            err.message(),
            "tensor 'I' has datatype INT64, expected FP32"
        );
    }

    #[test]
    fn shape_patterns() {
        let t = Tensor::from_f32("x", [4, 16], &[0.0; 64]);
        assert!(t.expect_shape(&[-1, 16]).is_ok());
        assert!(t.expect_shape(&[4, -1]).is_ok());
        assert!(t.expect_shape(&[-1, 15]).is_err());
        assert!(t.expect_shape(&[-1]).is_err());
        assert!(t.check(DataType::Fp32, &[4, 16]).is_ok());
        assert!(t.check(DataType::Int64, &[4, 16]).is_err());
        assert_eq!(t.dim(1).unwrap(), 16);
        assert!(t.dim(2).is_err());
    }

    #[test]
    fn strings() {
        let t = Tensor::from_bytes_elements("T", [2], vec![b"ok".to_vec(), vec![0xff, 0xfe]]);
        let err = t.as_strings().unwrap_err();
        assert!(err.message().contains("element 1 is not UTF-8"), "{err}");
        assert_eq!(t.as_bytes_elements().unwrap()[0], b"ok");
    }

    #[test]
    fn validate_catches_builder_mistakes() {
        assert!(
            Tensor::from_strings("s", [3], &["a", "b"])
                .validate()
                .is_err()
        );
        assert!(
            Tensor::from_raw("r", DataType::Bytes, [0], vec![])
                .validate()
                .is_err()
        );
        assert!(Tensor::from_f32("f", [-1], &[]).validate().is_err());
        assert!(Tensor::from_f32("f", [0, 16], &[]).validate().is_ok());
        // 2^62 FP32 elements are 2^64 bytes: wrapping arithmetic made that 0.
        assert!(
            Tensor::from_raw("w", DataType::Fp32, [1 << 62], vec![])
                .validate()
                .is_err()
        );
    }

    #[test]
    fn datatype_names() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
        }
        assert_eq!("TYPE_STRING".parse::<DataType>().unwrap(), DataType::Bytes);
        assert_eq!("TYPE_FP32".parse::<DataType>().unwrap(), DataType::Fp32);
    }
}
