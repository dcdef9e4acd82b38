//! The presence table: user -> the gateways holding their sessions, each with a lease.
//! Built from the compacted chat.presence topic (a global table: every fanout member
//! reads all of it). An entry whose lease has passed counts as offline: that is how a
//! gateway that died without a word stops receiving fanout lists.

use std::collections::HashMap;
use std::sync::Arc;

use chatpipe_schemas::UserId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    pub id: Arc<str>,
    pub partition: i32,
}

#[derive(Debug, Clone)]
struct Lease {
    gateway: Gateway,
    expires_at_ms: i64,
}

#[derive(Debug, Default)]
pub struct Online {
    by_user: HashMap<UserId, Vec<Lease>>,
}

impl Online {
    pub fn upsert(&mut self, user: UserId, gateway: Gateway, expires_at_ms: i64) {
        let leases = self.by_user.entry(user).or_default();
        match leases.iter_mut().find(|l| l.gateway.id == gateway.id) {
            Some(l) => {
                l.gateway = gateway;
                l.expires_at_ms = expires_at_ms;
            }
            None => leases.push(Lease {
                gateway,
                expires_at_ms,
            }),
        }
    }

    /// A tombstone: the user left that gateway.
    pub fn remove(&mut self, user: UserId, gateway_id: &str) {
        if let Some(leases) = self.by_user.get_mut(&user) {
            leases.retain(|l| &*l.gateway.id != gateway_id);
            if leases.is_empty() {
                self.by_user.remove(&user);
            }
        }
    }

    /// The gateways holding `user` now (unexpired leases).
    pub fn gateways(&self, user: UserId, now_ms: i64) -> impl Iterator<Item = &Gateway> {
        self.by_user
            .get(&user)
            .into_iter()
            .flatten()
            .filter(move |l| l.expires_at_ms > now_ms)
            .map(|l| &l.gateway)
    }

    pub fn is_online(&self, user: UserId, now_ms: i64) -> bool {
        self.gateways(user, now_ms).next().is_some()
    }

    /// How many users are online now.
    pub fn online_users(&self, now_ms: i64) -> usize {
        self.by_user
            .values()
            .filter(|leases| leases.iter().any(|l| l.expires_at_ms > now_ms))
            .count()
    }

    /// Forgets leases that expired before `forget_before_ms` and returns them as
    /// (user, gateway id): entries of gateways that died without a word, whose keys
    /// nobody else will ever tombstone.
    pub fn forget(&mut self, forget_before_ms: i64) -> Vec<(UserId, Arc<str>)> {
        let mut gone = Vec::new();
        self.by_user.retain(|user, leases| {
            leases.retain(|l| {
                let keep = l.expires_at_ms > forget_before_ms;
                if !keep {
                    gone.push((*user, l.gateway.id.clone()));
                }
                keep
            });
            !leases.is_empty()
        });
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(id: &str, partition: i32) -> Gateway {
        Gateway {
            id: Arc::from(id),
            partition,
        }
    }

    #[test]
    fn a_user_on_two_gateways_is_reached_on_both_until_one_leaves() {
        let mut o = Online::default();
        o.upsert(UserId::of(1), gw("a", 0), 1_000);
        o.upsert(UserId::of(1), gw("b", 1), 1_000);
        assert_eq!(o.gateways(UserId::of(1), 0).count(), 2);
        o.remove(UserId::of(1), "a");
        assert_eq!(
            o.gateways(UserId::of(1), 0).collect::<Vec<_>>(),
            vec![&gw("b", 1)]
        );
    }

    #[test]
    fn an_expired_lease_counts_as_offline() {
        let mut o = Online::default();
        o.upsert(UserId::of(1), gw("a", 0), 1_000);
        assert!(o.is_online(UserId::of(1), 999));
        assert!(
            !o.is_online(UserId::of(1), 1_000),
            "a silent gateway stops counting at its lease"
        );
        o.upsert(UserId::of(1), gw("a", 0), 2_000);
        assert!(
            o.is_online(UserId::of(1), 1_500),
            "a renewal brings it back"
        );
        assert_eq!(o.online_users(2_000), 0);
        assert!(o.forget(1_999).is_empty(), "expired, not yet forgotten");
        assert_eq!(o.forget(2_000), vec![(UserId::of(1), Arc::from("a"))]);
        assert!(!o.is_online(UserId::of(1), 0));
    }
}
