//! Property tests: whatever metadata and tensors the writer is given, the reader returns the
//! same values, shapes, types and bytes.

use proptest::prelude::*;
use rocmforge_gguf::{ArrayValue, GgmlType, GgufFile, Metadata, MetadataValue, TensorToWrite};

fn scalar() -> impl Strategy<Value = MetadataValue> {
    prop_oneof![
        any::<u8>().prop_map(MetadataValue::U8),
        any::<i8>().prop_map(MetadataValue::I8),
        any::<u16>().prop_map(MetadataValue::U16),
        any::<i16>().prop_map(MetadataValue::I16),
        any::<u32>().prop_map(MetadataValue::U32),
        any::<i32>().prop_map(MetadataValue::I32),
        // Bit patterns, so NaNs and infinities are covered and compared exactly.
        any::<u32>().prop_map(|b| MetadataValue::F32(f32::from_bits(b))),
        any::<bool>().prop_map(MetadataValue::Bool),
        ".{0,12}".prop_map(MetadataValue::String),
        any::<u64>().prop_map(MetadataValue::U64),
        any::<i64>().prop_map(MetadataValue::I64),
        any::<u64>().prop_map(|b| MetadataValue::F64(f64::from_bits(b))),
    ]
}

fn array() -> impl Strategy<Value = ArrayValue> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(ArrayValue::U8),
        prop::collection::vec(any::<i16>(), 0..8).prop_map(ArrayValue::I16),
        prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..8)
            .prop_map(ArrayValue::F32),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(ArrayValue::I32),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(ArrayValue::Bool),
        prop::collection::vec(".{0,6}", 0..6).prop_map(ArrayValue::String),
        prop::collection::vec(any::<u64>(), 0..4).prop_map(ArrayValue::U64),
        prop::collection::vec(any::<i64>(), 0..4).prop_map(ArrayValue::I64),
        prop::collection::vec(any::<u64>().prop_map(f64::from_bits), 0..4)
            .prop_map(ArrayValue::F64),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(ArrayValue::Array)
    })
}

fn value() -> impl Strategy<Value = MetadataValue> {
    prop_oneof![3 => scalar(), 1 => array().prop_map(MetadataValue::Array)]
}

/// Bit-level equality (NaN == NaN when the bits agree).
fn same(a: &MetadataValue, b: &MetadataValue) -> bool {
    rocmforge_gguf::dump::canonical_value(a) == rocmforge_gguf::dump::canonical_value(b)
}

#[derive(Debug, Clone)]
struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

fn tensor(i: usize) -> impl Strategy<Value = Tensor> {
    (
        prop::sample::select(GgmlType::ALL.to_vec()),
        prop::collection::vec(1u64..4, 0..4),
        1u64..3,
    )
        .prop_flat_map(move |(ty, outer, blocks)| {
            let mut dims = vec![blocks * ty.block_size() as u64];
            dims.extend(outer);
            let n: u64 = dims.iter().product();
            let size = (n as usize) / ty.block_size() * ty.type_size();
            prop::collection::vec(any::<u8>(), size).prop_map(move |data| Tensor {
                name: format!("t{i}.{}", ty.name()),
                dims: dims.clone(),
                ty,
                data,
            })
        })
}

fn tensors() -> impl Strategy<Value = Vec<Tensor>> {
    (0usize..5).prop_flat_map(|n| (0..n).map(tensor).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_returns_the_same_file(
        kvs in prop::collection::vec(("[a-z.]{1,10}", value()), 0..12),
        align_pow in prop::option::of(0u32..8),
        ts in tensors(),
    ) {
        let mut md = Metadata::new();
        if let Some(p) = align_pow {
            md.set("general.alignment", 1u32 << p);
        }
        for (k, v) in &kvs {
            if k != "general.alignment" {
                md.set(k.clone(), v.clone());
            }
        }
        let to_write: Vec<TensorToWrite<'_>> = ts
            .iter()
            .map(|t| TensorToWrite { name: &t.name, dims: &t.dims, ty: t.ty, data: &t.data })
            .collect();
        let bytes = rocmforge_gguf::write_to_vec(&md, &to_write).expect("write");
        let f = GgufFile::from_bytes(bytes).expect("read back");
        prop_assert_eq!(f.version(), 3);
        prop_assert_eq!(f.alignment(), align_pow.map_or(32, |p| 1u64 << p));
        prop_assert_eq!(f.metadata().len(), md.len());
        for ((k1, v1), (k2, v2)) in f.metadata().iter().zip(md.iter()) {
            prop_assert_eq!(k1, k2);
            prop_assert!(same(v1, v2), "{}: {:?} != {:?}", k1, v1, v2);
        }
        prop_assert_eq!(f.tensors().len(), ts.len());
        for (info, t) in f.tensors().iter().zip(&ts) {
            prop_assert_eq!(&info.name, &t.name);
            prop_assert_eq!(&info.dims, &t.dims);
            prop_assert_eq!(info.ggml_type, t.ty);
            prop_assert_eq!(info.offset % f.alignment(), 0);
            prop_assert_eq!(f.tensor_data(info), &t.data[..]);
        }
    }
}
