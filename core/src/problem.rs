//! RFC 9457 problem details: every 4xx and 5xx of every service has this body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub const CONTENT_TYPE: &str = "application/problem+json";

tokio::task_local! {
    /// The id of the request being answered (`x-request-id`), set by the service's
    /// request middleware around each request: every problem made while answering it
    /// carries it.
    pub static REQUEST_ID: String;
}

/// `{type, title, status, detail, field?, requestId?}`. `type` is `/problems/<code>`;
/// the codes are listed in docs/api.md.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    /// The request field (JSON path, query parameter or path segment) at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The request's `x-request-id`, as its log lines carry it.
    #[serde(rename = "requestId", skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        code: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: format!("/problems/{code}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            request_id: REQUEST_ID.try_with(String::clone).ok(),
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self).expect("a Problem always serializes");
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        response.extensions_mut().insert(self);
        response
    }
}
