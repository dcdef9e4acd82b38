//! Validated domain ids. A value of these types is always positive: the constructors
//! are the only way in, and they refuse zero and negatives.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("must be a positive integer, got {0}")]
pub struct NotPositive(pub i64);

macro_rules! positive_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "i64", into = "i64")]
        pub struct $name(i64);

        impl $name {
            pub fn new(value: i64) -> Result<Self, NotPositive> {
                if value > 0 { Ok(Self(value)) } else { Err(NotPositive(value)) }
            }

            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl TryFrom<i64> for $name {
            type Error = NotPositive;
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
                let value: i64 = s.parse().map_err(|_| format!("must be a positive integer, got {s:?}"))?;
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
    fn ids_deserialize_through_validation() {
        assert!(serde_json::from_str::<Seq>("0").is_err());
        assert_eq!(serde_json::from_str::<Seq>("5").unwrap().get(), 5);
        assert_eq!("12".parse::<UserId>().unwrap().get(), 12);
        assert!("abc".parse::<UserId>().is_err());
    }
}
