//! GGUF metadata values: the thirteen value types of the specification, arrays kept typed.

use std::fmt;

/// A GGUF metadata value type id, as stored before every value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`
    U8 = 0,
    /// `int8`
    I8 = 1,
    /// `uint16`
    U16 = 2,
    /// `int16`
    I16 = 3,
    /// `uint32`
    U32 = 4,
    /// `int32`
    I32 = 5,
    /// `float32`
    F32 = 6,
    /// `bool` (one byte, 0 or 1)
    Bool = 7,
    /// `string` (u64 length + UTF-8 bytes)
    String = 8,
    /// `array` (element type u32 + u64 count + elements)
    Array = 9,
    /// `uint64`
    U64 = 10,
    /// `int64`
    I64 = 11,
    /// `float64`
    F64 = 12,
}

impl ValueType {
    /// The value type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The specification's name of the type (`"uint32"`, `"string"`...).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "uint8",
            ValueType::I8 => "int8",
            ValueType::U16 => "uint16",
            ValueType::I16 => "int16",
            ValueType::U32 => "uint32",
            ValueType::I32 => "int32",
            ValueType::F32 => "float32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "uint64",
            ValueType::I64 => "int64",
            ValueType::F64 => "float64",
        }
    }

    /// Encoded size of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one encoded value of this type can take (used to bound counts before
    /// allocating).
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// `uint8`
    U8(u8),
    /// `int8`
    I8(i8),
    /// `uint16`
    U16(u16),
    /// `int16`
    I16(i16),
    /// `uint32`
    U32(u32),
    /// `int32`
    I32(i32),
    /// `float32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// `string`
    String(String),
    /// `array` of any element type, including nested arrays.
    Array(ArrayValue),
    /// `uint64`
    U64(u64),
    /// `int64`
    I64(i64),
    /// `float64`
    F64(f64),
}

/// A typed GGUF array: one vector per element type, so large numeric arrays stay compact and
/// typed getters can hand out slices.
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayValue {
    /// `uint8[]`
    U8(Vec<u8>),
    /// `int8[]`
    I8(Vec<i8>),
    /// `uint16[]`
    U16(Vec<u16>),
    /// `int16[]`
    I16(Vec<i16>),
    /// `uint32[]`
    U32(Vec<u32>),
    /// `int32[]`
    I32(Vec<i32>),
    /// `float32[]`
    F32(Vec<f32>),
    /// `bool[]`
    Bool(Vec<bool>),
    /// `string[]`
    String(Vec<String>),
    /// `array[]`: nested arrays, each with its own element type.
    Array(Vec<ArrayValue>),
    /// `uint64[]`
    U64(Vec<u64>),
    /// `int64[]`
    I64(Vec<i64>),
    /// `float64[]`
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// A readable type description: `"uint32"`, or `"array[string]"` for arrays.
    pub fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(a) => a.type_description(),
            v => v.value_type().name().to_owned(),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&ArrayValue> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value widened to `u64` when it is a non-negative integer of any width.
    pub fn to_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl ArrayValue {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            ArrayValue::U8(_) => ValueType::U8,
            ArrayValue::I8(_) => ValueType::I8,
            ArrayValue::U16(_) => ValueType::U16,
            ArrayValue::I16(_) => ValueType::I16,
            ArrayValue::U32(_) => ValueType::U32,
            ArrayValue::I32(_) => ValueType::I32,
            ArrayValue::F32(_) => ValueType::F32,
            ArrayValue::Bool(_) => ValueType::Bool,
            ArrayValue::String(_) => ValueType::String,
            ArrayValue::Array(_) => ValueType::Array,
            ArrayValue::U64(_) => ValueType::U64,
            ArrayValue::I64(_) => ValueType::I64,
            ArrayValue::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ArrayValue::U8(v) => v.len(),
            ArrayValue::I8(v) => v.len(),
            ArrayValue::U16(v) => v.len(),
            ArrayValue::I16(v) => v.len(),
            ArrayValue::U32(v) => v.len(),
            ArrayValue::I32(v) => v.len(),
            ArrayValue::F32(v) => v.len(),
            ArrayValue::Bool(v) => v.len(),
            ArrayValue::String(v) => v.len(),
            ArrayValue::Array(v) => v.len(),
            ArrayValue::U64(v) => v.len(),
            ArrayValue::I64(v) => v.len(),
            ArrayValue::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `"array[<element type>]"`.
    pub fn type_description(&self) -> String {
        format!("array[{}]", self.element_type().name())
    }

    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Self {
        match ty {
            ValueType::U8 => ArrayValue::U8(Vec::new()),
            ValueType::I8 => ArrayValue::I8(Vec::new()),
            ValueType::U16 => ArrayValue::U16(Vec::new()),
            ValueType::I16 => ArrayValue::I16(Vec::new()),
            ValueType::U32 => ArrayValue::U32(Vec::new()),
            ValueType::I32 => ArrayValue::I32(Vec::new()),
            ValueType::F32 => ArrayValue::F32(Vec::new()),
            ValueType::Bool => ArrayValue::Bool(Vec::new()),
            ValueType::String => ArrayValue::String(Vec::new()),
            ValueType::Array => ArrayValue::Array(Vec::new()),
            ValueType::U64 => ArrayValue::U64(Vec::new()),
            ValueType::I64 => ArrayValue::I64(Vec::new()),
            ValueType::F64 => ArrayValue::F64(Vec::new()),
        }
    }
}

macro_rules! from_impls {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for MetadataValue {
            fn from(x: $t) -> Self { MetadataValue::$v(x) }
        }
        impl From<Vec<$t>> for ArrayValue {
            fn from(x: Vec<$t>) -> Self { ArrayValue::$v(x) }
        }
        impl From<Vec<$t>> for MetadataValue {
            fn from(x: Vec<$t>) -> Self { MetadataValue::Array(ArrayValue::$v(x)) }
        }
    )*};
}
from_impls!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for MetadataValue {
    fn from(s: &str) -> Self {
        MetadataValue::String(s.to_owned())
    }
}

impl From<ArrayValue> for MetadataValue {
    fn from(a: ArrayValue) -> Self {
        MetadataValue::Array(a)
    }
}

impl fmt::Display for MetadataValue {
    /// Scalars print as themselves, strings quoted, arrays as their first elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(s) => write!(f, "{s:?}"),
            MetadataValue::Array(a) => write!(f, "{a}"),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for ArrayValue {
    /// Up to the first eight elements, then the remaining count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        fn list<T>(
            f: &mut fmt::Formatter<'_>,
            v: &[T],
            each: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
        ) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in v.iter().take(SHOWN).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                each(f, x)?;
            }
            if v.len() > SHOWN {
                write!(f, ", ... ({} more)", v.len() - SHOWN)?;
            }
            f.write_str("]")
        }
        match self {
            ArrayValue::U8(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::I8(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::U16(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::I16(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::U32(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::I32(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::F32(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::Bool(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::String(v) => list(f, v, |f, x| write!(f, "{x:?}")),
            ArrayValue::Array(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::U64(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::I64(v) => list(f, v, |f, x| write!(f, "{x}")),
            ArrayValue::F64(v) => list(f, v, |f, x| write!(f, "{x}")),
        }
    }
}
