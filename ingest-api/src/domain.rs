//! Validated request values. Each `parse` names the field it checks so the error can.

use crate::configuration::Limits;

/// Why a value of a request is refused. Only `error.rs` turns it into HTTP.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A body field's value (`422 /problems/validation`, naming the field).
    #[error("{field} {detail}")]
    Invalid { field: String, detail: String },
    /// A query parameter's value (`400 /problems/invalid-parameter`).
    #[error("{field} {detail}")]
    Parameter { field: String, detail: String },
    /// More distinct members than a conversation may have (`409 /problems/member-limit`).
    #[error("{0}")]
    MemberLimit(String),
}

impl Refused {
    fn invalid(field: &str, detail: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_owned(),
            detail: detail.into(),
        }
    }
}

/// A conversation's type, spelled as the `conversation.type` column, the API and the
/// `conversation.created` event spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, sqlx::Type, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
#[sqlx(type_name = "text", rename_all = "UPPERCASE")]
pub enum ConversationKind {
    Direct,
    Group,
}

impl ConversationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "DIRECT",
            Self::Group => "GROUP",
        }
    }
}

impl std::str::FromStr for ConversationKind {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "DIRECT" => Ok(Self::Direct),
            "GROUP" => Ok(Self::Group),
            _ => Err(()),
        }
    }
}

/// A message body: not blank, at most `limits.max_body_chars` characters.
#[derive(Debug, Clone)]
pub struct MessageBody(String);

impl MessageBody {
    pub fn parse(raw: String, limits: &Limits) -> Result<Self, Refused> {
        if raw.trim().is_empty() {
            return Err(Refused::invalid("body", "must not be empty"));
        }
        storable("body", &raw)?;
        let chars = raw.chars().count();
        if chars > limits.max_body_chars {
            return Err(Refused::invalid(
                "body",
                format!(
                    "is {chars} characters; the limit is {}",
                    limits.max_body_chars
                ),
            ));
        }
        Ok(Self(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ReactionKey {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        Self::parse(raw)
    }
}

/// PostgreSQL text holds any Unicode scalar value but U+0000 (and JSON cannot carry a
/// lone surrogate: serde refuses it as malformed JSON, 400). Refused here with the field's
/// name: it would fail the statement it was written with, again on every retry.
fn storable(field: &str, text: &str) -> Result<(), Refused> {
    match text.find('\0') {
        Some(at) => Err(Refused::invalid(
            field,
            format!("must not contain the character U+0000 (found at byte {at}); PostgreSQL text cannot store it"),
        )),
        None => Ok(()),
    }
}

/// A group title: optional, trimmed, at most `limits.max_title_chars` characters.
pub fn parse_title(raw: Option<String>, limits: &Limits) -> Result<Option<String>, Refused> {
    let Some(title) = raw.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    storable("title", &title)?;
    if title.chars().count() > limits.max_title_chars {
        return Err(Refused::invalid(
            "title",
            format!("is longer than {} characters", limits.max_title_chars),
        ));
    }
    Ok(Some(title))
}

/// A page size: `limits.default_page_limit` when absent, else 1..=`limits.max_page_limit`.
pub fn page_limit(raw: Option<i64>, limits: &Limits) -> Result<i64, Refused> {
    match raw {
        None => Ok(limits.default_page_limit),
        Some(n) if (1..=limits.max_page_limit).contains(&n) => Ok(n),
        Some(n) => Err(Refused::Parameter {
            field: "limit".to_owned(),
            detail: format!("must be between 1 and {}, got {n}", limits.max_page_limit),
        }),
    }
}

/// A list of user ids: every one positive, duplicates folded, at most `max` of them.
pub fn user_ids(field: &str, raw: Vec<i64>, max: usize) -> Result<Vec<i64>, Refused> {
    if let Some((i, bad)) = raw.iter().enumerate().find(|(_, id)| **id <= 0) {
        return Err(Refused::invalid(
            &format!("{field}[{i}]"),
            format!("must be a positive user id, got {bad}"),
        ));
    }
    let mut ids = raw;
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > max {
        return Err(Refused::MemberLimit(format!(
            "{} distinct users exceed the limit of {max} members",
            ids.len()
        )));
    }
    Ok(ids)
}

/// A positive seq from a request field.
pub fn seq(field: &str, raw: i64) -> Result<chatpipe_core::Seq, Refused> {
    chatpipe_core::Seq::new(raw).map_err(|e| Refused::invalid(field, e.to_string()))
}

/// A reaction's key: one emoji, or a short name. An emoji is stored in its fully
/// qualified form (`❤` becomes `❤️`), and a short name that is an emoji's GitHub shortcode
/// is stored as that emoji (`+1` becomes `👍`), so one reaction counts under one key.
/// Other short names (a workspace's own emoji) are 1 to 32 of `[a-z0-9_+-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactionKey(String);

/// The longest short name.
const MAX_SHORT_NAME: usize = 32;

impl ReactionKey {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(emoji) = emojis::get(raw) {
            return Ok(Self(emoji.as_str().to_owned()));
        }
        let short = !raw.is_empty()
            && raw.len() <= MAX_SHORT_NAME
            && raw
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'+' | b'-'));
        if !short {
            return Err(format!(
                "is neither one emoji nor a short name (1 to {MAX_SHORT_NAME} of a-z, 0-9, _, +, -)"
            ));
        }
        Ok(Self(match emojis::get_by_shortcode(raw) {
            Some(emoji) => emoji.as_str().to_owned(),
            None => raw.to_owned(),
        }))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        crate::configuration::Settings::defaults_with_secret("x".repeat(32).as_str()).limits
    }

    #[test]
    fn body_must_be_non_blank_and_within_the_limit() {
        let l = limits();
        assert!(MessageBody::parse("  \n".into(), &l).is_err());
        assert!(MessageBody::parse("é".repeat(l.max_body_chars), &l).is_ok());
        assert!(MessageBody::parse("a".repeat(l.max_body_chars + 1), &l).is_err());
    }

    #[test]
    fn page_limit_defaults_and_bounds() {
        let l = limits();
        assert_eq!(page_limit(None, &l).unwrap(), 50);
        assert!(page_limit(Some(0), &l).is_err());
        assert!(page_limit(Some(201), &l).is_err());
        assert_eq!(page_limit(Some(200), &l).unwrap(), 200);
    }

    #[test]
    fn user_ids_are_positive_and_deduplicated() {
        assert_eq!(
            user_ids("memberIds", vec![3, 1, 3], 10).unwrap(),
            vec![1, 3]
        );
        assert!(user_ids("memberIds", vec![1, 0], 10).is_err());
        assert!(user_ids("memberIds", (1..=11).collect(), 10).is_err());
    }

    #[test]
    fn reaction_keys_are_one_emoji_or_a_short_name_stored_once() {
        let key = |raw: &str| ReactionKey::parse(raw).map(|k| k.as_str().to_owned());
        assert_eq!(key("👍").unwrap(), "👍");
        assert_eq!(key("+1").unwrap(), "👍", "a shortcode is its emoji");
        assert_eq!(key("thumbsup").unwrap(), "👍");
        assert_eq!(key("👍🏽").unwrap(), "👍🏽", "a skin tone is its own key");
        assert_eq!(key("❤").unwrap(), key("❤️").unwrap(), "fully qualified");
        assert_eq!(
            key("👨‍👩‍👧‍👦").unwrap(),
            "👨‍👩‍👧‍👦",
            "one grapheme of several characters"
        );
        assert_eq!(key("party_parrot").unwrap(), "party_parrot");
        for bad in [
            "",
            "👍👍",
            "👍 ",
            "Party",
            "a b",
            "<script>",
            "x".repeat(33).as_str(),
            "é",
        ] {
            assert!(key(bad).is_err(), "{bad:?} is refused");
        }
    }
}
