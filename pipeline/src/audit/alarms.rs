//! The auditor's alarms, by name. Two kinds:
//! - a *condition* (the connector is not running, CDC is behind) fires once it has held
//!   for its threshold and clears as soon as it stops holding;
//! - an *event* (a seq gap, a watermark moving backwards, a new dead letter) fires when
//!   it happens and stays firing for `audit.event_alarm_ms`, so a scrape or a person
//!   looking at `/report` a few minutes later still sees it. The counters behind them
//!   (`audit_seq_gaps_total`, ...) keep the whole history.
//!
//! Every alarm is the gauge `audit_alarm{alarm="<name>"}` (1 firing, 0 not).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Alarm {
    pub name: String,
    pub firing: bool,
    /// When the condition started to hold, or the last event happened.
    pub since: Option<DateTime<Utc>>,
    /// What was seen, in words.
    pub detail: String,
    #[serde(skip)]
    holding_since: Option<Instant>,
    #[serde(skip)]
    last_event: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct Alarms {
    by_name: BTreeMap<String, Alarm>,
}

impl Alarms {
    fn entry(&mut self, name: &str) -> &mut Alarm {
        self.by_name
            .entry(name.to_owned())
            .or_insert_with(|| Alarm {
                name: name.to_owned(),
                firing: false,
                since: None,
                detail: String::new(),
                holding_since: None,
                last_event: None,
            })
    }

    /// `holds` now; fires once it has held for `after`.
    pub fn condition(
        &mut self,
        name: &str,
        holds: bool,
        after: Duration,
        detail: impl Into<String>,
        now: Instant,
    ) {
        let a = self.entry(name);
        if holds {
            if a.holding_since.is_none() {
                a.holding_since = Some(now);
                a.since = Some(Utc::now());
            }
            a.detail = detail.into();
            a.firing = a
                .holding_since
                .is_some_and(|t| now.duration_since(t) >= after);
        } else {
            a.holding_since = None;
            a.firing = false;
        }
        set_gauge(a);
    }

    /// Something that should never happen, happened.
    pub fn event(&mut self, name: &str, detail: impl Into<String>, now: Instant) {
        let a = self.entry(name);
        a.last_event = Some(now);
        a.since = Some(Utc::now());
        a.detail = detail.into();
        a.firing = true;
        set_gauge(a);
    }

    /// Event alarms older than `hold` stop firing.
    pub fn expire(&mut self, hold: Duration, now: Instant) {
        for a in self.by_name.values_mut() {
            if let Some(t) = a.last_event {
                if now.duration_since(t) >= hold {
                    a.last_event = None;
                    a.firing = false;
                    set_gauge(a);
                }
            }
        }
    }

    pub fn all(&self) -> Vec<Alarm> {
        self.by_name.values().cloned().collect()
    }

    pub fn firing(&self) -> Vec<Alarm> {
        self.by_name
            .values()
            .filter(|a| a.firing)
            .cloned()
            .collect()
    }

    pub fn is_firing(&self, name: &str) -> bool {
        self.by_name.get(name).is_some_and(|a| a.firing)
    }
}

fn set_gauge(a: &Alarm) {
    metrics::gauge!("audit_alarm", "alarm" => a.name.clone()).set(if a.firing { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_fires_after_its_threshold_and_clears_at_once() {
        let mut alarms = Alarms::default();
        let after = Duration::from_secs(30);
        alarms.condition(
            "cdc_stalled",
            true,
            after,
            "3 conversations",
            Instant::now(),
        );
        assert!(!alarms.is_firing("cdc_stalled"));
        tokio::time::advance(Duration::from_secs(29)).await;
        alarms.condition(
            "cdc_stalled",
            true,
            after,
            "3 conversations",
            Instant::now(),
        );
        assert!(!alarms.is_firing("cdc_stalled"));
        tokio::time::advance(Duration::from_secs(1)).await;
        alarms.condition(
            "cdc_stalled",
            true,
            after,
            "4 conversations",
            Instant::now(),
        );
        assert!(alarms.is_firing("cdc_stalled"));
        assert_eq!(alarms.firing()[0].detail, "4 conversations");
        alarms.condition("cdc_stalled", false, after, "", Instant::now());
        assert!(alarms.firing().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_fires_at_once_and_expires_after_the_hold() {
        let mut alarms = Alarms::default();
        let hold = Duration::from_secs(600);
        alarms.event("seq_gap", "conversation 7: 3..5", Instant::now());
        assert!(alarms.is_firing("seq_gap"));
        tokio::time::advance(Duration::from_secs(599)).await;
        alarms.expire(hold, Instant::now());
        assert!(alarms.is_firing("seq_gap"));
        tokio::time::advance(Duration::from_secs(1)).await;
        alarms.expire(hold, Instant::now());
        assert!(!alarms.is_firing("seq_gap"));
        assert_eq!(alarms.all().len(), 1, "a cleared alarm is still listed");
    }
}
