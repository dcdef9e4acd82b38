//! Per-user rate limits: a token bucket per user for each kind of write that costs the
//! service (sends, conversations created, member changes, users added to groups). A request over its bucket is
//! refused with 429 and `Retry-After` before it reaches the database. The buckets are
//! governor's keyed GCRA limiters; [`RateLimits::sweep`] forgets users whose buckets are
//! full again, so the table holds only recently active users.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use chatpipe_core::UserId;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};

use crate::configuration::Bucket;
use crate::configuration::RateLimitSettings;
use crate::error::ApiError;

/// What a bucket limits; the label of `rate_limited_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Send,
    Create,
    MemberChange,
    /// One token per user added to a group.
    MembersAdded,
    Read,
    /// `POST /demo/token`, one bucket for every caller.
    DemoToken,
}

impl Kind {
    /// What a 429's detail counts.
    fn noun(self) -> &'static str {
        match self {
            Self::Send => "sends",
            Self::Create => "creations",
            Self::MemberChange => "member changes",
            Self::MembersAdded => "users added to groups",
            Self::Read => "reads",
            Self::DemoToken => "demo tokens",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::Create => "create",
            Self::MemberChange => "member_change",
            Self::MembersAdded => "members_added",
            Self::Read => "read",
            Self::DemoToken => "demo_token",
        }
    }
}

struct Limiter<L> {
    bucket: Bucket,
    limiter: L,
}

type PerUser = Limiter<DefaultKeyedRateLimiter<UserId>>;

/// The limiters (`None`: that kind is not limited); cheap to clone.
#[derive(Clone)]
pub struct RateLimits(Arc<Limiters>);

struct Limiters {
    sends: Option<PerUser>,
    creates: Option<PerUser>,
    member_changes: Option<PerUser>,
    members_added: Option<PerUser>,
    reads: Option<PerUser>,
    /// `demo.tokens`: one bucket for everyone (a caller of `/demo/token` has no id).
    demo_tokens: Option<Limiter<DefaultDirectRateLimiter>>,
}

/// The quota of `bucket`, or `None` when its rate is 0 (not limited).
fn quota(bucket: Bucket) -> Option<Quota> {
    let rate = NonZeroU32::new(bucket.rate)?;
    let period = Duration::from_secs(u64::from(bucket.per_secs.max(1))) / rate.get();
    let burst = NonZeroU32::new(bucket.burst).unwrap_or(rate);
    Some(Quota::with_period(period)?.allow_burst(burst))
}

impl RateLimits {
    pub fn new(settings: &RateLimitSettings, demo_tokens: Bucket) -> Self {
        let per_user = |bucket: Bucket| {
            Some(Limiter {
                bucket,
                limiter: governor::RateLimiter::keyed(quota(bucket)?),
            })
        };
        Self(Arc::new(Limiters {
            sends: per_user(settings.sends),
            creates: per_user(settings.creates),
            member_changes: per_user(settings.member_changes),
            members_added: per_user(settings.members_added),
            reads: per_user(settings.reads),
            demo_tokens: quota(demo_tokens).map(|q| Limiter {
                bucket: demo_tokens,
                limiter: governor::RateLimiter::direct(q),
            }),
        }))
    }

    fn limiter(&self, kind: Kind) -> Option<&PerUser> {
        match kind {
            Kind::Send => self.0.sends.as_ref(),
            Kind::Create => self.0.creates.as_ref(),
            Kind::MemberChange => self.0.member_changes.as_ref(),
            Kind::MembersAdded => self.0.members_added.as_ref(),
            Kind::Read => self.0.reads.as_ref(),
            Kind::DemoToken => None,
        }
    }

    /// Takes one token from `user`'s `kind` bucket, or says when one will be there.
    pub fn check(&self, kind: Kind, user: UserId) -> Result<(), ApiError> {
        let Some(l) = self.limiter(kind) else {
            return Ok(());
        };
        l.limiter
            .check_key(&user)
            .map_err(|not_until| refused(kind, l.bucket, &not_until))
    }

    /// Takes `n` tokens at once from `user`'s `kind` bucket (all or none). More than
    /// its burst can never be taken: that is a 400 naming `field`.
    pub fn check_n(&self, kind: Kind, user: UserId, n: usize, field: &str) -> Result<(), ApiError> {
        let Some(l) = self.limiter(kind) else {
            return Ok(());
        };
        let Some(n) = u32::try_from(n).ok().and_then(NonZeroU32::new) else {
            return Ok(());
        };
        match l.limiter.check_key_n(&user, n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(refused(kind, l.bucket, &not_until)),
            Err(_) => Err(ApiError::invalid(
                field,
                format!(
                    "at most {} at once (rate_limits.{})",
                    l.bucket.burst.max(l.bucket.rate),
                    kind.label()
                ),
            )),
        }
    }

    /// Takes one token from the bucket of demo tokens.
    pub fn check_demo_token(&self) -> Result<(), ApiError> {
        let Some(l) = &self.0.demo_tokens else {
            return Ok(());
        };
        l.limiter
            .check()
            .map_err(|not_until| refused(Kind::DemoToken, l.bucket, &not_until))
    }

    /// Forgets users whose buckets are full again; sets `rate_limit_users{kind}`.
    pub fn sweep(&self) {
        for kind in [
            Kind::Send,
            Kind::Create,
            Kind::MemberChange,
            Kind::MembersAdded,
            Kind::Read,
        ] {
            if let Some(l) = self.limiter(kind) {
                l.limiter.retain_recent();
                l.limiter.shrink_to_fit();
                metrics::gauge!("rate_limit_users", "kind" => kind.label())
                    .set(l.limiter.len() as f64);
            }
        }
    }

    /// Sweeps every `interval` for as long as the process runs.
    pub fn spawn_sweeper(&self, interval: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
            loop {
                tick.tick().await;
                this.sweep();
            }
        });
    }
}

/// The 429 of a refused `kind`, counted in `rate_limited_total{kind}`.
fn refused(
    kind: Kind,
    bucket: Bucket,
    not_until: &governor::NotUntil<governor::clock::QuantaInstant>,
) -> ApiError {
    metrics::counter!("rate_limited_total", "kind" => kind.label()).increment(1);
    let wait = not_until.wait_time_from(DefaultClock::default().now());
    ApiError::RateLimited {
        retry_after: wait,
        detail: format!(
            "more than {} {} per {} s (burst {}); retry after {} ms",
            bucket.rate,
            kind.noun(),
            bucket.per_secs,
            bucket.burst,
            wait.as_millis().max(1)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(sends: Bucket) -> RateLimitSettings {
        let off = Bucket::OFF;
        RateLimitSettings {
            sends,
            creates: off,
            member_changes: off,
            members_added: off,
            reads: off,
            sweep_interval_ms: 60_000,
        }
    }

    #[test]
    fn a_user_gets_the_burst_then_waits_and_others_are_not_affected() {
        let limits = RateLimits::new(
            &settings(Bucket {
                rate: 60,
                per_secs: 60,
                burst: 3,
            }),
            Bucket {
                rate: 1,
                per_secs: 60,
                burst: 2,
            },
        );
        let (a, b) = (UserId::of(1), UserId::of(2));
        for _ in 0..3 {
            limits.check(Kind::Send, a).unwrap();
        }
        match limits.check(Kind::Send, a) {
            Err(ApiError::RateLimited { retry_after, .. }) => {
                assert!(
                    retry_after > Duration::from_millis(900)
                        && retry_after <= Duration::from_secs(1),
                    "one token a second: {retry_after:?}"
                )
            }
            other => panic!("expected 429, got {other:?}"),
        }
        limits.check(Kind::Send, b).unwrap();
        // A kind whose rate is 0 is not limited.
        for _ in 0..100 {
            limits.check(Kind::Create, a).unwrap();
        }
        // Demo tokens: one bucket for every caller.
        limits.check_demo_token().unwrap();
        limits.check_demo_token().unwrap();
        assert!(matches!(
            limits.check_demo_token(),
            Err(ApiError::RateLimited { .. })
        ));
    }
}
