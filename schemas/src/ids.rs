//! Validated domain ids, shared by every event type, topic and service. A value of
//! these types is always in range: the constructors are the only way in. Ids and seqs
//! refuse zero and negatives; a [`Watermark`] may be 0 (nothing read yet).
//!
//! Decoders turn an out-of-range value on the wire into a decoding error (a poison
//! record), so past the decoder nobody checks again.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("must be a positive integer, got {0}")]
pub struct NotPositive(pub i64);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("must not be negative, got {0}")]
pub struct Negative(pub i64);

macro_rules! positive_id {
    ($(#[$doc:meta])* $name:ident) => {
        checked_i64!($(#[$doc])* $name, NotPositive, 1, "must be a positive integer");
    };
}

macro_rules! checked_i64 {
    ($(#[$doc:meta])* $name:ident, $error:ident, $min:literal, $expected:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "i64", into = "i64")]
        pub struct $name(i64);

        impl $name {
            pub fn new(value: i64) -> Result<Self, $error> {
                if value >= $min { Ok(Self(value)) } else { Err($error(value)) }
            }

            /// A literal that is known to be in range (constants, tests). Panics
            /// otherwise; values from outside go through [`Self::new`].
            pub const fn of(value: i64) -> Self {
                assert!(value >= $min, $expected);
                Self(value)
            }

            pub fn get(self) -> i64 {
                self.0
            }
        }

        /// In the OpenAPI document: an int64 of at least the minimum.
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::Integer)
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                        utoipa::openapi::KnownFormat::Int64,
                    )))
                    .minimum(Some($min))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl TryFrom<i64> for $name {
            type Error = $error;
            fn try_from(value: i64) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> i64 {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let value: i64 = s.parse().map_err(|_| format!(concat!($expected, ", got {:?}"), s))?;
                Self::new(value).map_err(|e| e.to_string())
            }
        }
    };
}

positive_id!(
    /// A user, as named by the `sub` claim of their token. Users live outside chatpipe.
    UserId
);
positive_id!(
    /// A conversation (DIRECT or GROUP).
    ConversationId
);
positive_id!(
    /// A message's position in its conversation: 1..=last_seq, gapless.
    Seq
);
checked_i64!(
    /// How far a member has read in a conversation: the seq of the last message they
    /// read, or 0 before the first. It only moves forwards (invariant 4).
    Watermark,
    Negative,
    0,
    "must be a non-negative integer"
);

impl Watermark {
    /// Nothing read yet.
    pub const ZERO: Watermark = Watermark(0);

    /// Whether a member at this watermark has read `seq`.
    pub fn covers(self, seq: Seq) -> bool {
        self.0 >= seq.get()
    }
}

impl From<Seq> for Watermark {
    fn from(seq: Seq) -> Self {
        Watermark(seq.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_refuse_zero_and_negatives() {
        assert_eq!(Seq::new(0), Err(NotPositive(0)));
        assert_eq!(UserId::new(-3), Err(NotPositive(-3)));
        assert_eq!(ConversationId::new(7).map(i64::from), Ok(7));
    }

    #[test]
    fn a_watermark_may_be_zero_but_not_negative() {
        assert_eq!(Watermark::new(0), Ok(Watermark::ZERO));
        assert_eq!(Watermark::new(-1), Err(Negative(-1)));
        let five = Watermark::from(Seq::new(5).unwrap());
        assert!(five.covers(Seq::new(5).unwrap()));
        assert!(!five.covers(Seq::new(6).unwrap()));
        assert!("-2".parse::<Watermark>().is_err());
    }

    #[test]
    fn ids_deserialize_through_validation() {
        assert!(serde_json::from_str::<Seq>("0").is_err());
        assert_eq!(serde_json::from_str::<Seq>("5").unwrap().get(), 5);
        assert_eq!("12".parse::<UserId>().unwrap().get(), 12);
        assert!("abc".parse::<UserId>().is_err());
    }
}
