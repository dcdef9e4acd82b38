//! The topic contract: each topic with its value schema. TopicNameStrategy: the
//! value schema of topic `t` is registered under the subject `t-value`.

/// A topic and the Avro schema of its values.
#[derive(Debug, Clone, Copy)]
pub struct Contract {
    pub topic: &'static str,
    pub schema: &'static str,
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
};
pub const READ_RECEIPTS: Contract = Contract {
    topic: "chat.read-receipts",
    schema: include_str!("../read_receipt.avsc"),
};
pub const PRESENCE: Contract = Contract {
    topic: "chat.presence",
    schema: include_str!("../presence.avsc"),
};
pub const DELIVERIES: Contract = Contract {
    topic: "chat.deliveries",
    schema: include_str!("../delivery.avsc"),
};

pub const FANOUT_MEMBERS: Contract = Contract {
    topic: "chat.fanout-members",
    schema: include_str!("../fanout_members.avsc"),
};

pub const EPHEMERAL: Contract = Contract {
    topic: "chat.ephemeral",
    schema: include_str!("../ephemeral.avsc"),
};

pub const ALL: [Contract; 6] = [
    CHAT_EVENTS,
    READ_RECEIPTS,
    PRESENCE,
    DELIVERIES,
    FANOUT_MEMBERS,
    EPHEMERAL,
];

/// The compatibility level every subject is held to.
pub const COMPATIBILITY: &str = "BACKWARD_TRANSITIVE";

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
