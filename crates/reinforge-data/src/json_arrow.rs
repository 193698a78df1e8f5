//! JSON values → one Arrow column with a nested type (struct, list, string, int64, float64,
//! bool, null), for the Parquet writer.
//!
//! Why not `arrow-json`: it pulled `arrow-cast`, `arrow-ord` and the `lexical` crates into
//! every build (about 110 s of a newcomer's 2-core cold build) for the few lines we need, and
//! its inference coerces mixed types (ints to floats, scalars to lists) which we then had to
//! detect with a round trip. Here a column whose values do not share one type is refused, and
//! the caller stores it as JSON text; what is built reads back unchanged by construction.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, ListArray, NullArray, StringArray, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields};
use serde_json::Value;

/// The type of a column, inferred from its values.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// Only nulls (or empty lists' elements) seen.
    Null,
    Bool,
    Int,
    Float,
    Str,
    List(Box<Kind>),
    /// Members in order of first appearance.
    Struct(Vec<(String, Kind)>),
}

impl Kind {
    fn of(v: &Value) -> Result<Kind, String> {
        Ok(match v {
            Value::Null => Kind::Null,
            Value::Bool(_) => Kind::Bool,
            Value::Number(n) if n.is_i64() => Kind::Int,
            Value::Number(n) if n.is_f64() => Kind::Float,
            Value::Number(n) => return Err(format!("{n} does not fit a signed 64-bit integer")),
            Value::String(_) => Kind::Str,
            Value::Array(items) => Kind::List(Box::new(items.iter().try_fold(Kind::Null, |k, v| k.merge(Kind::of(v)?))?)),
            Value::Object(m) if m.is_empty() => return Err("contains an empty object, which parquet cannot store".into()),
            Value::Object(m) => Kind::Struct(m.iter().map(|(k, v)| Ok((k.clone(), Kind::of(v)?))).collect::<Result<_, String>>()?),
        })
    }

    /// The one type both values fit without changing either (null fits anything).
    fn merge(self, other: Kind) -> Result<Kind, String> {
        Ok(match (self, other) {
            (Kind::Null, k) | (k, Kind::Null) => k,
            (Kind::List(a), Kind::List(b)) => Kind::List(Box::new(a.merge(*b)?)),
            (Kind::Struct(mut a), Kind::Struct(b)) => {
                for (name, kb) in b {
                    match a.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, ka)) => *ka = std::mem::replace(ka, Kind::Null).merge(kb).map_err(|e| format!("{name}: {e}"))?,
                        None => a.push((name, kb)),
                    }
                }
                Kind::Struct(a)
            }
            (a, b) if a == b => a,
            (a, b) => return Err(format!("values of different types ({} and {})", a.name(), b.name())),
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "bool",
            Kind::Int => "integer",
            Kind::Float => "float",
            Kind::Str => "string",
            Kind::List(_) => "list",
            Kind::Struct(_) => "object",
        }
    }

    fn data_type(&self) -> DataType {
        match self {
            Kind::Null => DataType::Null,
            Kind::Bool => DataType::Boolean,
            Kind::Int => DataType::Int64,
            Kind::Float => DataType::Float64,
            Kind::Str => DataType::Utf8,
            Kind::List(item) => DataType::List(Arc::new(Field::new_list_field(item.data_type(), true))),
            Kind::Struct(members) => DataType::Struct(fields(members)),
        }
    }

    /// The array of `values` (`None`: absent, read back as null) of this type.
    fn build(&self, values: &[Option<&Value>]) -> Result<ArrayRef, String> {
        let present = |v: &Option<&Value>| v.is_some_and(|v| !v.is_null());
        Ok(match self {
            Kind::Null => Arc::new(NullArray::new(values.len())),
            Kind::Bool => Arc::new(values.iter().map(|v| v.and_then(Value::as_bool)).collect::<BooleanArray>()),
            Kind::Int => Arc::new(values.iter().map(|v| v.and_then(Value::as_i64)).collect::<Int64Array>()),
            Kind::Float => Arc::new(values.iter().map(|v| v.and_then(Value::as_f64)).collect::<Float64Array>()),
            Kind::Str => Arc::new(values.iter().map(|v| v.and_then(Value::as_str)).collect::<StringArray>()),
            Kind::List(item) => {
                let mut lengths = Vec::with_capacity(values.len());
                let mut children = Vec::new();
                for v in values {
                    let items = v.and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
                    lengths.push(items.len());
                    children.extend(items.iter().map(Some));
                }
                let field = Arc::new(Field::new_list_field(item.data_type(), true));
                let nulls = NullBuffer::from(values.iter().map(present).collect::<Vec<bool>>());
                Arc::new(ListArray::try_new(field, OffsetBuffer::from_lengths(lengths), item.build(&children)?, Some(nulls)).map_err(|e| e.to_string())?)
            }
            Kind::Struct(members) => {
                let columns = members
                    .iter()
                    .map(|(name, kind)| {
                        let of_member: Vec<Option<&Value>> = values.iter().map(|v| v.and_then(|v| v.get(name))).collect();
                        kind.build(&of_member)
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let nulls = NullBuffer::from(values.iter().map(present).collect::<Vec<bool>>());
                Arc::new(StructArray::try_new(fields(members), columns, Some(nulls)).map_err(|e| e.to_string())?)
            }
        })
    }
}

fn fields(members: &[(String, Kind)]) -> Fields {
    members.iter().map(|(name, kind)| Field::new(name, kind.data_type(), true)).collect()
}

/// The column `name` of `values`: its field (nested type inferred, every level nullable, as
/// pyarrow writes) and its array. An error says why the values share no storable type.
pub(crate) fn column(name: &str, values: &[Value]) -> Result<(Field, ArrayRef), String> {
    let kind = values.iter().try_fold(Kind::Null, |k, v| k.merge(Kind::of(v)?))?;
    let array = kind.build(&values.iter().map(Some).collect::<Vec<_>>())?;
    Ok((Field::new(name, kind.data_type(), true), array))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use serde_json::json;

    #[test]
    fn nested_values_get_one_type_and_keep_their_nulls() {
        let values = vec![
            json!([{"role": "user", "content": "hi"}]),
            json!([{"role": "system", "content": "be brief", "name": null}, {"role": "user", "content": "2+2", "name": "x"}]),
            json!([]),
            Value::Null,
        ];
        let (field, array) = column("prompt", &values).unwrap();
        let want = DataType::List(Arc::new(Field::new_list_field(
            DataType::Struct(Fields::from(vec![Field::new("role", DataType::Utf8, true), Field::new("content", DataType::Utf8, true), Field::new("name", DataType::Utf8, true)])),
            true,
        )));
        assert_eq!(field.data_type(), &want);
        let list = array.as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(list.value_offsets(), &[0, 1, 3, 3, 3]);
        assert!(list.is_valid(2) && list.is_null(3));
        let structs = list.values().as_any().downcast_ref::<StructArray>().unwrap();
        let names = structs.column(2).as_any().downcast_ref::<StringArray>().unwrap();
        assert!(names.is_null(0) && names.is_null(1) && names.value(2) == "x");
    }

    #[test]
    fn mixed_types_and_empty_objects_are_refused() {
        assert!(column("g", &[json!(1), json!(1.5)]).unwrap_err().contains("integer and float"));
        assert!(column("g", &[json!("a"), json!(["a"])]).unwrap_err().contains("string and list"));
        assert!(column("e", &[json!({"a": {}})]).unwrap_err().contains("empty object"));
        assert!(column("n", &[json!(u64::MAX)]).unwrap_err().contains("64-bit"));
        let (f, a) = column("x", &[Value::Null, Value::Null]).unwrap();
        assert_eq!((f.data_type(), a.len()), (&DataType::Null, 2));
    }
}
