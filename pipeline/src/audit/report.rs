//! `GET /report`: the auditor's findings as JSON (documented in docs/operations.md).

use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::alarms::Alarm;
use super::ledger::{Gap, Regression};
use super::readings::Latest;
use super::{Audit, Counts, State};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `ok`, or `alarm` while any alarm fires.
    pub status: &'static str,
    /// The alarms firing now.
    pub firing: Vec<Alarm>,
    /// Every alarm seen since start, firing or not.
    pub alarms: Vec<Alarm>,
    pub counts: Counts,
    pub tracked_conversations: usize,
    pub recent_gaps: Vec<Gap>,
    pub recent_regressions: Vec<Regression>,
    pub checks: Latest,
}

impl Report {
    pub fn of(state: &State) -> Self {
        let firing = state.alarms.firing();
        Self {
            status: if firing.is_empty() { "ok" } else { "alarm" },
            firing,
            alarms: state.alarms.all(),
            counts: state.counts.clone(),
            tracked_conversations: state.ledger.tracked_conversations(),
            recent_gaps: state.recent_gaps.iter().copied().collect(),
            recent_regressions: state.recent_regressions.iter().copied().collect(),
            checks: state.checks.clone(),
        }
    }
}

/// `/report`, to merge into the process's router.
pub fn router(audit: Audit) -> Router {
    Router::new().route(
        "/report",
        get(move || {
            let report = audit.report();
            std::future::ready(Json(report))
        }),
    )
}
