use axum::extract::State;
use axum::response::IntoResponse;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::domain::page_limit;
use crate::error::ApiError;
use crate::extract::{Caller, Query};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::mentions::{self as store, After, MentionPage};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MentionsQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

/// `GET /mentions?limit=&cursor=`
#[utoipa::path(
    get,
    path = "/mentions",
    tag = "inbox",
    summary = "The messages that name the caller, across conversations, newest first",
    params(MentionsQuery),
    responses(
        (status = 200, description = "A page of the caller's mentions", body = MentionPage),
        crate::openapi::Common
    )
)]
pub async fn mentions(
    State(state): State<AppState>,
    Caller(user): Caller,
    Query(q): Query<MentionsQuery>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, user)?;
    let limit = page_limit(q.limit, &state.limits)?;
    let after = match q.cursor.as_deref() {
        None => None,
        Some(raw) => Some(decode(raw).ok_or_else(|| {
            ApiError::bad_parameter("cursor", "is not a cursor this API returned")
        })?),
    };
    let (mentions, more) = store::list(&state.store, user, after, limit).await?;
    let next_cursor = more
        .then(|| {
            mentions
                .last()
                .map(|m| encode((m.created_at, m.conversation_id, m.seq)))
        })
        .flatten();
    Ok(axum::Json(MentionPage {
        mentions,
        next_cursor,
    }))
}

/// base64url of `<micros>:<conversation>:<seq>`, the last mention of a page.
fn encode((at, conversation, seq): (DateTime<Utc>, i64, i64)) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{conversation}:{seq}", at.timestamp_micros()))
}

fn decode(raw: &str) -> After {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(raw).ok()?).ok()?;
    let mut parts = text.split(':');
    let at = DateTime::from_timestamp_micros(parts.next()?.parse().ok()?)?;
    let conversation: i64 = parts.next()?.parse().ok()?;
    let seq: i64 = parts.next()?.parse().ok()?;
    use chrono::Datelike;
    let sane = (1..=9999).contains(&at.year()) && conversation > 0 && seq > 0;
    (sane && parts.next().is_none()).then_some((at, conversation, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_anything_else_is_refused() {
        let at = DateTime::from_timestamp_micros(1_796_000_000_123_456).unwrap();
        assert_eq!(decode(&encode((at, 7, 42))), Some((at, 7, 42)));
        for bad in [
            "",
            "x",
            "MTox",
            &URL_SAFE_NO_PAD.encode("1:2:0"),
            &URL_SAFE_NO_PAD.encode("1:2:3:4"),
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
