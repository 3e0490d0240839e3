//! Ordered GGUF metadata with typed getters whose errors name the key, the expected and the
//! found type.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::value::{ArrayValue, MetadataValue};

/// Metadata key/value pairs in file order, with O(1) lookup by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

fn wrong(key: &str, expected: &'static str, v: &MetadataValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found: v.type_description(),
    }
}

fn wrong_array(key: &str, expected: &'static str, v: &MetadataValue) -> GgufError {
    wrong(key, expected, v)
}

macro_rules! scalar_getters {
    ($($get:ident, $opt:ident, $t:ty, $expected:literal, |$v:ident| $conv:expr;)*) => {$(
        #[doc = concat!("The `", $expected, "` at `key`; errors when it is absent or of another type.")]
        pub fn $get(&self, key: &str) -> Result<$t> {
            self.$opt(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_owned() })
        }

        #[doc = concat!("The `", $expected, "` at `key`, `None` when absent; errors when of another type.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
            match self.get(key) {
                None => Ok(None),
                Some($v) => match $conv {
                    Some(x) => Ok(Some(x)),
                    None => Err(wrong(key, $expected, $v)),
                },
            }
        }
    )*};
}

macro_rules! array_getters {
    ($($get:ident, $opt:ident, $variant:ident, $t:ty, $expected:literal;)*) => {$(
        #[doc = concat!("The `", $expected, "` at `key`; errors when it is absent or of another type.")]
        pub fn $get(&self, key: &str) -> Result<&[$t]> {
            self.$opt(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_owned() })
        }

        #[doc = concat!("The `", $expected, "` at `key`, `None` when absent; errors when of another type.")]
        pub fn $opt(&self, key: &str) -> Result<Option<&[$t]>> {
            match self.get(key) {
                None => Ok(None),
                Some(MetadataValue::Array(ArrayValue::$variant(v))) => Ok(Some(v)),
                Some(v) => Err(wrong_array(key, $expected, v)),
            }
        }
    )*};
}

impl Metadata {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key`; returns false (and changes nothing) when it is already present.
    pub fn insert(&mut self, key: String, value: MetadataValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Sets `key`, replacing an existing value in place (keeping its position).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<MetadataValue>) {
        let key = key.into();
        let value = value.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.insert(key, value);
            }
        }
    }

    /// The value at `key`.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Key/value pairs in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &MetadataValue)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in file order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value at `key`, or a `MissingKey` error.
    pub fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    // Integer getters accept narrower integers of the same signedness (a lossless widening);
    // everything else must match exactly.
    scalar_getters! {
        get_u8, get_u8_opt, u8, "uint8", |v| match *v { MetadataValue::U8(x) => Some(x), _ => None };
        get_u32, get_u32_opt, u32, "uint32", |v| match *v {
            MetadataValue::U8(x) => Some(u32::from(x)),
            MetadataValue::U16(x) => Some(u32::from(x)),
            MetadataValue::U32(x) => Some(x),
            _ => None,
        };
        get_i32, get_i32_opt, i32, "int32", |v| match *v {
            MetadataValue::I8(x) => Some(i32::from(x)),
            MetadataValue::I16(x) => Some(i32::from(x)),
            MetadataValue::I32(x) => Some(x),
            _ => None,
        };
        get_u64, get_u64_opt, u64, "uint64", |v| match *v {
            MetadataValue::U8(x) => Some(u64::from(x)),
            MetadataValue::U16(x) => Some(u64::from(x)),
            MetadataValue::U32(x) => Some(u64::from(x)),
            MetadataValue::U64(x) => Some(x),
            _ => None,
        };
        get_i64, get_i64_opt, i64, "int64", |v| match *v {
            MetadataValue::I8(x) => Some(i64::from(x)),
            MetadataValue::I16(x) => Some(i64::from(x)),
            MetadataValue::I32(x) => Some(i64::from(x)),
            MetadataValue::I64(x) => Some(x),
            _ => None,
        };
        get_f32, get_f32_opt, f32, "float32", |v| match *v { MetadataValue::F32(x) => Some(x), _ => None };
        get_f64, get_f64_opt, f64, "float64", |v| match *v {
            MetadataValue::F32(x) => Some(f64::from(x)),
            MetadataValue::F64(x) => Some(x),
            _ => None,
        };
        get_bool, get_bool_opt, bool, "bool", |v| match *v { MetadataValue::Bool(x) => Some(x), _ => None };
    }

    /// The string at `key`; errors when it is absent or of another type.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get_str_opt(key)?.ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// The string at `key`, `None` when absent; errors when of another type.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(MetadataValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong(key, "string", v)),
        }
    }

    /// The array (any element type) at `key`; errors when it is absent or not an array.
    pub fn get_array(&self, key: &str) -> Result<&ArrayValue> {
        match self.require(key)? {
            MetadataValue::Array(a) => Ok(a),
            v => Err(wrong(key, "array", v)),
        }
    }

    array_getters! {
        get_str_array, get_str_array_opt, String, String, "array[string]";
        get_f32_array, get_f32_array_opt, F32, f32, "array[float32]";
        get_i32_array, get_i32_array_opt, I32, i32, "array[int32]";
        get_u32_array, get_u32_array_opt, U32, u32, "array[uint32]";
        get_u8_array, get_u8_array_opt, U8, u8, "array[uint8]";
        get_i64_array, get_i64_array_opt, I64, i64, "array[int64]";
        get_u64_array, get_u64_array_opt, U64, u64, "array[uint64]";
        get_bool_array, get_bool_array_opt, Bool, bool, "array[bool]";
    }
}

impl<K: Into<String>, V: Into<MetadataValue>> FromIterator<(K, V)> for Metadata {
    /// Later duplicates of a key replace earlier values.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = Metadata::new();
        for (k, v) in iter {
            m.set(k, v);
        }
        m
    }
}
