//! Typed values out of PostgreSQL rows.

/// An id, seq or watermark from a column the schema keeps in range (CHECK constraints,
/// sequences). A value out of range is a decoding error, as a column of the wrong type
/// would be.
pub fn id<T>(value: i64) -> Result<T, sqlx::Error>
where
    T: TryFrom<i64>,
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(value).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}
