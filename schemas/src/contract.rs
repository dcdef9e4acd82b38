//! The topic contract: each topic with its value schema and the compatibility level its
//! registry subject is held to. TopicNameStrategy: the value schema of topic `t` is
//! registered under the subject `t-value`. Every version ever published is kept in
//! `schemas/history/<name>/v<N>.avsc`; the tests below check each new version against
//! all of them, offline, as the registry would (docs/topics.md, "Changing a schema").

/// How a subject's versions must relate (the registry's compatibility levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compatibility {
    /// A new version reads every older one: add fields with defaults, add union
    /// branches at the end. Consumers reading with an older compiled schema read every
    /// record of the types they know and must skip the others (a record of a newer
    /// branch does not resolve against their schema). `chat.events` only: new event
    /// types are new branches.
    BackwardTransitive,
    /// Also every older version reads each new one: only fields with defaults come and
    /// go. A consumer with any older compiled schema reads every record.
    FullTransitive,
}

impl Compatibility {
    /// The level's name in the registry's API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Self::FullTransitive => "FULL_TRANSITIVE",
        }
    }
}

impl std::fmt::Display for Compatibility {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A topic, the Avro schema of its values and the level its subject is held to.
#[derive(Debug, Clone, Copy)]
pub struct Contract {
    pub topic: &'static str,
    pub schema: &'static str,
    pub compatibility: Compatibility,
    /// The folder of `schemas/history/` with every published version.
    pub history: &'static str,
}

impl Contract {
    /// The registry subject of the value schema (TopicNameStrategy).
    pub fn subject(&self) -> String {
        format!("{}-value", self.topic)
    }
}

pub const CHAT_EVENTS: Contract = Contract {
    topic: "chat.events",
    schema: include_str!("../chat_event.avsc"),
    compatibility: Compatibility::BackwardTransitive,
    history: "chat_event",
};
pub const READ_RECEIPTS: Contract = Contract {
    topic: "chat.read-receipts",
    schema: include_str!("../read_receipt.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "read_receipt",
};
/// Delivery acks: the read receipt's schema on a topic of their own.
pub const DELIVERY_ACKS: Contract = Contract {
    topic: "chat.delivery-acks",
    ..READ_RECEIPTS
};
pub const PRESENCE: Contract = Contract {
    topic: "chat.presence",
    schema: include_str!("../presence.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "presence",
};
pub const DELIVERIES: Contract = Contract {
    topic: "chat.deliveries",
    schema: include_str!("../delivery.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "delivery",
};

pub const FANOUT_MEMBERS: Contract = Contract {
    topic: "chat.fanout-members",
    schema: include_str!("../fanout_members.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "fanout_members",
};

pub const EPHEMERAL: Contract = Contract {
    topic: "chat.ephemeral",
    schema: include_str!("../ephemeral.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "ephemeral",
};

/// What offline members should be told (the notifications processor's output).
pub const NOTIFICATIONS: Contract = Contract {
    topic: "chat.notifications",
    schema: include_str!("../notification.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "notification",
};

/// Every version of every message, for analytics (pipeline analytics): compacted.
pub const ANALYTICS_MESSAGES: Contract = Contract {
    topic: "chat.analytics.messages",
    schema: include_str!("../analytics_message.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "analytics_message",
};
/// Read watermark moves, for analytics.
pub const ANALYTICS_READS: Contract = Contract {
    topic: "chat.analytics.reads",
    schema: include_str!("../analytics_watermark.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "analytics_watermark",
};
/// Delivered watermark moves: the reads' schema on a topic of their own.
pub const ANALYTICS_DELIVERIES: Contract = Contract {
    topic: "chat.analytics.deliveries",
    ..ANALYTICS_READS
};
/// Joins, leaves and role changes, for analytics.
pub const ANALYTICS_MEMBERSHIP: Contract = Contract {
    topic: "chat.analytics.membership",
    schema: include_str!("../analytics_membership.avsc"),
    compatibility: Compatibility::FullTransitive,
    history: "analytics_membership",
};

pub const ALL: [Contract; 12] = [
    CHAT_EVENTS,
    READ_RECEIPTS,
    DELIVERY_ACKS,
    PRESENCE,
    DELIVERIES,
    FANOUT_MEMBERS,
    EPHEMERAL,
    NOTIFICATIONS,
    ANALYTICS_MESSAGES,
    ANALYTICS_READS,
    ANALYTICS_DELIVERIES,
    ANALYTICS_MEMBERSHIP,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_parses_as_avro() {
        for c in ALL {
            apache_avro::Schema::parse_str(c.schema).unwrap_or_else(|e| panic!("{}: {e}", c.topic));
        }
        assert_eq!(CHAT_EVENTS.subject(), "chat.events-value");
    }
}
