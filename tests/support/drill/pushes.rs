//! Whether each gateway kept pushing. A lost push costs nothing (the client catches up
//! over REST), so counting what is missing after the catch-up cannot tell a gateway that
//! stopped pushing for good from a healthy one; this can. Per phase and gateway: of the
//! messages acknowledged from the phase's recovery time on (the fault's end plus
//! `Config::push_recovery`) until shortly before the row, delivered to members whose
//! socket was open on that gateway when the message was acknowledged, the share that
//! gateway pushed. A gateway below [`MIN_SHARE`] fails the row.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{Ack, Clients, World};

/// The share of its members' messages a gateway with connected clients must push.
pub const MIN_SHARE: f64 = 0.9;

/// Messages acknowledged this close to the row are not counted: their pushes may be in
/// flight.
pub const IN_FLIGHT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayShare {
    pub gateway: usize,
    /// Deliveries due to members connected to it.
    pub due: u64,
    /// Of those, pushed by it.
    pub pushed: u64,
}

impl GatewayShare {
    pub fn share(&self) -> f64 {
        if self.due == 0 {
            1.0
        } else {
            self.pushed as f64 / self.due as f64
        }
    }
}

/// The shares of the two gateways for the messages acknowledged in `[from, until)`.
pub fn shares(
    acks: &[Ack],
    world: &World,
    clients: &Clients,
    from: Instant,
    until: Instant,
) -> Vec<GatewayShare> {
    let mut out: Vec<GatewayShare> = (0..2)
        .map(|gateway| GatewayShare {
            gateway,
            due: 0,
            pushed: 0,
        })
        .collect();
    for a in acks.iter().filter(|a| a.at >= from && a.at < until) {
        for user in &world.conversations[&a.conversation] {
            let seen = clients.seen[user].lock().unwrap();
            let Some(g) = seen.gateway_at(a.at) else {
                continue;
            };
            out[g].due += 1;
            if seen.pushed_by.get(&(a.conversation, a.seq)).map(|p| p.0) == Some(g) {
                out[g].pushed += 1;
            }
        }
    }
    out
}

/// How long pushes took, from the 201 to the frame a member's open socket read: the
/// slowest, and how many took longer than `late`, over the messages of `acks` (what a
/// user waited, whatever part of the path held it up).
pub fn delays(
    acks: &[Ack],
    world: &World,
    clients: &Clients,
    late: Duration,
) -> (Option<Duration>, u64) {
    let (mut slowest, mut over) = (None::<Duration>, 0);
    for a in acks {
        for user in &world.conversations[&a.conversation] {
            let seen = clients.seen[user].lock().unwrap();
            if let Some((_, at)) = seen.pushed_by.get(&(a.conversation, a.seq)) {
                let took = at.saturating_duration_since(a.at);
                slowest = slowest.max(Some(took));
                over += u64::from(took > late);
            }
        }
    }
    (slowest, over)
}

/// The gateways that pushed too little, in words (empty: every gateway kept pushing).
pub fn stopped(shares: &[GatewayShare]) -> Vec<String> {
    shares
        .iter()
        .filter(|s| s.due > 0 && s.share() < MIN_SHARE)
        .map(|s| {
            format!(
                "gateway {} pushed {} of {} ({:.0}%)",
                s.gateway,
                s.pushed,
                s.due,
                s.share() * 100.0
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drill::load::Seen;

    #[test]
    fn a_gateway_under_ninety_percent_with_clients_fails_and_one_without_clients_does_not() {
        let share = |gateway, due, pushed| GatewayShare {
            gateway,
            due,
            pushed,
        };
        assert!(stopped(&[share(0, 100, 90), share(1, 0, 0)]).is_empty());
        assert_eq!(
            stopped(&[share(0, 100, 89), share(1, 50, 50)]),
            ["gateway 0 pushed 89 of 100 (89%)"]
        );
    }

    #[test]
    fn a_message_is_due_to_the_gateway_whose_socket_was_open_when_it_was_acknowledged() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let seen = Seen {
            sockets: vec![(0, at(0), Some(at(10))), (1, at(12), None)],
            ..Seen::default()
        };
        assert_eq!(seen.gateway_at(at(5)), Some(0));
        assert_eq!(seen.gateway_at(at(11)), None, "between two sockets");
        assert_eq!(seen.gateway_at(at(30)), Some(1));
    }
}
