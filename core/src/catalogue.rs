//! Every metric a chatpipe service exports, with the `# HELP` text Prometheus shows for
//! it. One table for all services: the exporter prints a description only beside a
//! metric the process actually has, so each service shows just its own. A reader's
//! metrics carry its prefix (`receipts`, `fanout`, `gateway_deliveries`, …) and are
//! described when the reader is made ([`reader_metrics`]).
//!
//! The fault drill scrapes every running service and fails on a metric without HELP
//! (`tests/drill/`), so a new metric cannot ship undescribed.

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

/// One metric: its name, kind and help text.
pub type Entry = (&'static str, Kind, &'static str);

/// The metrics of every service, by the code that writes them.
pub const METRICS: &[Entry] = &[
    // Every process.
    ("chatpipe_build_info", Gauge, "Always 1: the service, its version and the git revision it was built from, as labels."),
    // Every Kafka client (core::kafka::rebootstrap).
    ("kafka_rebootstraps_total", Counter, "Kafka clients given their bootstrap servers again after a metadata answer left them no broker (librdkafka#5301), by client type."),
    // HTTP listeners of ingest-api and the gateway (core::http, ingest-api's routes).
    ("http_requests_total", Counter, "HTTP requests answered, by method, route template and status."),
    ("http_request_duration_seconds", Histogram, "Time from request to response, by method and route template."),
    ("http_request_timeouts_total", Counter, "Requests that ran past http.request_timeout_ms and were answered 503."),
    ("http_body_limit_rejections_total", Counter, "Requests refused 413 for a body over http.max_request_bytes."),
    ("http_connections_open", Gauge, "Client connections open on the HTTP listener."),
    ("http_connections_refused_total", Counter, "Connections refused (503, Retry-After: 1), by reason: total (http.max_connections were open), per_ip (http.max_connections_per_ip from that address)."),
    ("http_connections_dropped_total", Counter, "Refused connections closed unanswered because http.refusing_at_once were being answered already."),
    ("gateway_deprecated_subprotocol_total", Counter, "WebSocket connections that offered only the subprotocol's old name `chatpipe` (answered for one release; `chatpipe.v1` is current)."),
    ("http_unversioned_redirects_total", Counter, "Requests for an API path without its /v1 prefix, answered 308 to the versioned path (old clients; the redirects end in the next release)."),
    ("http_connection_timeouts_total", Counter, "Connections closed for sending no request headers within http.header_read_timeout_ms."),
    // ingest-api.
    ("messages_sent_total", Counter, "Messages committed (each with its seq and its outbox event)."),
    ("message_replays_total", Counter, "Sends answered from the stored message because the clientMsgId was already committed."),
    ("outbox_events_written_total", Counter, "Outbox rows written, by event type; Debezium streams each to chat.events."),
    ("read_watermark_advances_total", Counter, "Direct-mode read marks that moved a member's watermark."),
    ("receipts_produced_total", Counter, "Read receipts and delivery acks the broker acknowledged (stream mode)."),
    ("receipts_produce_failures_total", Counter, "Receipts the broker did not acknowledge within kafka.produce_timeout_ms (answered 503)."),
    ("receipts_queue_full_total", Counter, "Receipts refused because the producer queue (kafka.queue_max_messages) stayed full."),
    ("send_batch_messages", Histogram, "Messages per send batch (one transaction per conversation batch)."),
    ("send_batch_failures_total", Counter, "Send batches whose transaction failed (every send in it answered 503)."),
    ("send_queue_waiting", Gauge, "Sends waiting for a conversation's writer."),
    ("send_queue_rejections_total", Counter, "Sends refused 503 because sends.max_queued were waiting on the conversation."),
    ("send_writers_busy", Gauge, "Conversation writers running a batch now."),
    ("sync_requests_total", Counter, "GET /sync answers, by kind (initial: no cursor; delta: with one; continuation: the rest of a sync that did not fit one answer; stale: a cursor of another history of the database, refused 409)."),
    ("sync_answers_cut_total", Counter, "GET /sync answers that stopped at a bound and hand out a continuation, by bound (conversations: sync.max_conversations; bytes: sync.max_bytes)."),
    ("member_checks_total", Counter, "Membership checks before a member-only write, by result (cached: a member remembered; member: asked of PostgreSQL; refused: not a member, 404 before any queue or lock)."),
    ("member_cache_entries", Gauge, "(conversation, member) pairs remembered by the membership gate (membership.cache_max_entries)."),
    ("readyz_probes_total", Counter, "Database probes of the public /readyz (its answer is kept for 1 s, so at most one a second)."),
    ("idempotency_replays_total", Counter, "Creates answered with the first answer to their Idempotency-Key (a retry; nothing was made again)."),
    ("member_limit_rejections_total", Counter, "Member changes refused 409 for passing limits.max_group_members."),
    ("send_batches_with_mentions_total", Counter, "Send batches of which a message named members: one transaction of the send statement and the mentions' (batches with neither mentions nor replies are one statement)."),
    ("thread_replies_total", Counter, "Replies committed in threads (each also counts in messages_sent_total); their batches are one transaction with the threads' bookkeeping (chat_record_replies)."),
    ("reaction_limit_rejections_total", Counter, "Reactions refused 409 for a new key past limits.max_reaction_keys on one message."),
    ("reactions_changed_total", Counter, "Reactions added or taken back (`change`: added, removed); a repeat that changed nothing is not counted."),
    ("redriven_total", Counter, "Dead letters put back on their source topic by `pipeline redrive`."),
    ("registry_unknown_id_retries_total", Counter, "Lookups of a writer schema id the registry answered 404 for, retried within registry.unknown_id_grace_ms instead of dead-lettering the record."),
    ("jwks_fetches_total", Counter, "Fetches of the identity provider's JWKS (auth.jwks), by result (ok; failed: the keys held are kept; skipped: an unknown key id within refetch_min_ms of the last fetch)."),
    ("jwks_keys", Gauge, "Verifying keys held from the identity provider's JWKS."),
    ("blocked_refusals_total", Counter, "Requests refused 403 /problems/blocked: a write in a DIRECT conversation under a block, a DIRECT opened or an invitation by a blocked user."),
    ("rate_limited_total", Counter, "Requests refused 429 by a rate limit, by kind (send, create, member_change, members_added, read: per user; demo_token: all callers together)."),
    ("rate_limit_users", Gauge, "Users tracked by a per-user rate limiter, by kind."),
    ("history_cold_pages_total", Counter, "History pages that read archived messages from the cold tier (Cassandra)."),
    ("archived_messages_restored_total", Counter, "Archived messages brought back into PostgreSQL by an edit or a delete of them (they leave again once Cassandra has the change)."),
    ("cold_unavailable_total", Counter, "Requests answered 503 because they needed the cold tier and it did not answer."),
    ("db_pool_connections", Gauge, "PostgreSQL pool connections, by state (idle, in_use)."),
    ("db_pool_max_connections", Gauge, "The pool's bound (database.max_connections)."),
    ("db_pool_acquire_timeouts_total", Counter, "Requests answered 503 because no pool connection freed within database.acquire_timeout_ms."),
    // pipeline receipts.
    ("receipts_in_total", Counter, "Receipts read from the topic, by mark (read, delivered)."),
    ("receipts_flushes_total", Counter, "Batched watermark flushes written, by mark."),
    ("receipts_windows_total", Counter, "Receipt windows closed for a flush, by mark and reason: full (receipts.max_batch_keys), debounce (receipts.debounce_window_ms since the first receipt), quiet (receipts.quiet_flush_ms since the last)."),
    ("receipts_flush_keys", Histogram, "Distinct (conversation, member) keys per flush, by mark."),
    ("receipts_rows_advanced_total", Counter, "Watermarks a flush moved, by mark."),
    ("receipts_dropped_non_member_total", Counter, "Receipts of users who are not members, dropped by the flush, by mark."),
    ("receipts_flush_duration_seconds", Histogram, "Time one flush took (its UPDATE, outbox events and commit), by mark."),
    ("receipts_collapse_ratio", Gauge, "Receipts read per watermark written in the last flush, by mark."),
    // pipeline archive.
    ("archive_changes_total", Counter, "Message changes written to the cold tier (Cassandra), by kind (new, edited, deleted)."),
    ("notifications_written_total", Counter, "Records written to chat.notifications, by kind (mention, reply, message): one per offline member and collapse window."),
    ("notifications_skipped_total", Counter, "Members who would have been told but were online (reason=online): their sockets had the messages."),
    ("notification_flush_failures_total", Counter, "Collapse windows whose recipients could not be read or whose records were not acknowledged; the window stays and is retried."),
    ("notification_flush_seconds", Histogram, "Time to read a window's recipients and write and acknowledge its records."),
    ("notification_window_messages", Histogram, "New messages per collapse window sent."),
    ("notification_windows_open", Gauge, "Conversations with new messages waiting for their collapse window (bounded by notifications.max_open_windows)."),
    // pipeline analytics.
    ("analytics_rows_total", Counter, "Rows written and acknowledged on the analytics topics, by topic (messages, reads, deliveries, membership)."),
    ("analytics_batch_rows", Histogram, "Rows per batch written (bounded by analytics.max_batch)."),
    ("analytics_batch_seconds", Histogram, "Time to complete, write and acknowledge a batch."),
    ("analytics_write_failures_total", Counter, "Batches whose first versions could not be read or whose rows were not acknowledged; the batch stays and is retried."),
    ("analytics_first_version_missing_total", Counter, "Edits and deletes of messages PostgreSQL no longer held (archived): their rows say createdAt and threadRootSeq null."),
    ("analytics_watermarks_tracked", Gauge, "Members whose last watermark the processor remembers for fromSeq (bounded by analytics.max_tracked_watermarks)."),
    ("analytics_watermarks_forgotten_total", Counter, "Watermarks forgotten because analytics.max_tracked_watermarks was reached: the next move of each says fromSeq null."),
    ("archive_batches_total", Counter, "Batches written to the cold tier, each followed by its progress in message_archive."),
    ("archive_batch_changes", Histogram, "Changes per batch (at most archive.max_batch)."),
    ("archive_batch_duration_seconds", Histogram, "Time to write one batch: its Cassandra writes (archive.write_concurrency in flight) and its progress in PostgreSQL."),
    ("archive_write_rows", Histogram, "Rows per Cassandra write: the changes of one partition in a batch, at most archive.rows_per_write (one unlogged single-partition batch)."),
    ("archive_retention_moved_total", Counter, "Message rows the retention step moved out of PostgreSQL (each found equal in Cassandra first)."),
    ("archive_retention_kept_total", Counter, "Message rows the retention step left in PostgreSQL, by reason: differs (Cassandra lacks its latest change), changed (changed during the sweep)."),
    ("archive_retention_round_seconds", Histogram, "Time one retention round took (at most archive.retention_conversations conversations)."),
    ("archive_retention_failures_total", Counter, "Retention rounds that failed (PostgreSQL or Cassandra unavailable); tried again at the next interval."),
    ("audit_archive_lag_records", Gauge, "Records of chat.events after the archiver group's committed offset, by partition (audit.archive_group)."),
    ("audit_archive_lag_seconds", Gauge, "Age of the oldest chat.events record the archiver has not committed, by partition (alarm archive_lagging)."),
    ("audit_archive_seq_behind", Gauge, "The most messages one of the recently streamed conversations (audit.cdc_sample) has that message_archive does not count as archived, by chat.events partition."),
    ("archive_write_failures_total", Counter, "Batches that failed to write (Cassandra or PostgreSQL unavailable or timing out); each is retried whole, the reader holding its position."),
    // pipeline fanout.
    ("fanout_events_total", Counter, "Events of chat.events joined with members and presence, by type."),
    ("fanout_deliveries_total", Counter, "Fanout lists written to chat.deliveries."),
    ("fanout_recipients_total", Counter, "Online recipients named in the lists written."),
    ("fanout_list_size", Histogram, "Users per fanout list."),
    ("fanout_event_age_seconds", Histogram, "Time from an event's commit in PostgreSQL to its fanout."),
    ("fanout_stale_skipped_total", Counter, "Events older than fanout.max_age_ms, not pushed (clients catch up over REST)."),
    ("fanout_presence_online", Gauge, "Users fanout holds online (a live presence lease)."),
    ("fanout_presence_tombstones_total", Counter, "Presence entries removed (a gateway's tombstone or fanout.presence_forget_ms)."),
    ("fanout_conversations", Gauge, "Conversations whose members fanout holds in memory."),
    ("fanout_cache_evictions_total", Counter, "Conversations evicted from memory past fanout.max_cached_conversations or fanout.max_cached_members."),
    ("fanout_cached_members", Gauge, "Member ids fanout holds in memory, over all conversations (bound: fanout.max_cached_members)."),
    ("fanout_presence_acks_total", Counter, "presence.applied lists sent to gateways: how far this member has read chat.presence, and the chat.events partitions it fans out (the gateways' ready frames)."),
    ("fanout_presence_ack_errors_total", Counter, "presence.applied lists the producer refused (the gateway waits for the next one)."),
    ("fanout_changelog_coalesced_total", Counter, "Membership changes folded into a changelog write of the same conversation in the same tick."),
    ("fanout_membership_loads_total", Counter, "Conversations whose members were loaded from PostgreSQL."),
    ("fanout_membership_version_reloads_total", Counter, "Member lists loaded from PostgreSQL again because an event carried a newer membership version than the list (a membership event never reached fanout)."),
    ("fanout_changelog_refused_total", Counter, "Changelog entries the broker refused: written again on the next tick, the offsets after them held until then."),
    ("fanout_changelog_writes_total", Counter, "Membership changes written to the chat.fanout-members changelog."),
    ("fanout_restored_records_total", Counter, "Changelog records read to restore membership on assignment."),
    ("fanout_unacked_lists", Gauge, "Fanout lists written but not yet acknowledged by the broker (offsets wait for them)."),
    ("fanout_produce_queue_full_total", Counter, "Times fanout waited because fanout.produce_queue_max lists were unacknowledged."),
    ("fanout_produce_errors_total", Counter, "Fanout lists the broker refused (written again)."),
    ("fanout_typing_pushed_total", Counter, "Typing signals pushed to the other online members."),
    ("fanout_typing_dropped_total", Counter, "Typing signals dropped, by reason (throttled, stale, non_member, membership_budget: members not cached and fanout.typing_member_loads_per_sec spent, queue_full)."),
    ("fanout_typing_membership_loads_total", Counter, "Membership checks of typing signals that went to PostgreSQL."),
    // pipeline audit.
    ("audit_alarm", Gauge, "1 while the auditor's alarm is firing, by alarm."),
    ("audit_events_total", Counter, "Events the auditor read from chat.events."),
    ("audit_commit_to_topic_seconds", Histogram, "Time from a message's COMMIT to its append on chat.events."),
    ("audit_seq_gaps_total", Counter, "Conversations whose seq jumped on chat.events (a lost message)."),
    ("audit_missing_seqs_total", Counter, "Seqs missing in those gaps."),
    ("audit_duplicates_total", Counter, "Events seen twice (at-least-once redelivery; consumers dedupe by conversation and seq)."),
    ("audit_read_regressions_total", Counter, "read.updated events lower than an earlier one of the same member."),
    ("audit_untracked_starts_total", Counter, "Conversations first seen past seq 1 (their start was before the auditor's)."),
    ("audit_undecodable_total", Counter, "Records of chat.events the auditor could not decode."),
    ("audit_cdc_unstreamed", Gauge, "Commits seen in PostgreSQL and not yet on chat.events."),
    ("audit_cdc_oldest_unstreamed_seconds", Gauge, "Age of the oldest commit seen in PostgreSQL and not on chat.events."),
    ("audit_slot_active", Gauge, "1 while the replication slot has a client (Debezium)."),
    ("audit_slot_retained_wal_bytes", Gauge, "WAL the replication slot keeps PostgreSQL from recycling."),
    ("audit_connector_running", Gauge, "1 while the connector and its task are RUNNING."),
    ("audit_connector_restarts_total", Counter, "Restarts of a FAILED connector or task the auditor asked of Connect, by outcome (accepted, refused, unreachable)."),
    ("audit_probe_ok", Gauge, "1 while a probed /readyz answers 2xx, by target."),
    ("audit_dead_letters", Gauge, "End offset of each dead-letter topic, by topic."),
    ("audit_under_replicated_partitions", Gauge, "Partitions of audit.replicated_topics with fewer in-sync replicas than replicas."),
    ("audit_offline_partitions", Gauge, "Partitions of audit.replicated_topics without a leader."),
    ("audit_connector_task_moves", Gauge, "Times the connector's task changed Connect workers within audit.task_moves_window_ms."),
    ("audit_outbox_confirm_pending", Gauge, "Outbox rows whose events the auditor read and has not yet deleted (outbox.retain_until_confirmed)."),
    ("audit_outbox_confirm_statements_total", Counter, "DELETE statements of confirmed outbox rows (at most audit.outbox_confirm_batch ids each)."),
    ("audit_outbox_confirm_seconds", Histogram, "Time to delete one batch of confirmed outbox rows."),
    ("audit_outbox_seen_total", Counter, "chat.events records read whose outbox rows were to be deleted."),
    ("audit_outbox_confirmed_total", Counter, "Outbox rows deleted because their events were read on chat.events (a record read twice deletes nothing the second time)."),
    ("audit_outbox_oldest_seconds", Gauge, "Age of the oldest outbox row: an event not confirmed on chat.events (alarm outbox_unconfirmed)."),
    ("audit_outbox_rows_at_most", Gauge, "Outbox rows left, at most (the span of their positions)."),
    ("audit_postgres_primaries", Gauge, "Servers of audit.postgres_nodes answering as primary (1; more is a split brain)."),
    ("audit_postgres_standbys", Gauge, "Servers of audit.postgres_nodes answering as standby."),
    ("audit_postgres_timeline", Gauge, "The WAL timeline the primary writes (it grows at each promotion)."),
    ("audit_standby_lag_bytes", Gauge, "WAL the primary has and a standby has not replayed, by node."),
    ("audit_standby_lag_seconds", Gauge, "How long ago the primary was at the oldest position a standby has not replayed, by node."),
    ("audit_standby_slot_usable", Gauge, "1 while a standby holds a usable (synced, persistent, valid) copy of the connector's slot, by node."),
    // gateway.
    ("gateway_connections", Gauge, "WebSocket connections open."),
    ("gateway_auth_refusals_total", Counter, "WebSocket upgrades refused for a missing, bad or expired token."),
    ("gateway_tokens_expired_total", Counter, "Connections closed 4001 because their token expired."),
    ("gateway_sessions_refused_total", Counter, "Connections closed 1013 past sessions.max_sessions."),
    ("gateway_sessions_replaced_total", Counter, "Oldest connections closed 4008 past sessions.max_sessions_per_user."),
    ("gateway_deliveries_total", Counter, "Fanout lists read from chat.deliveries."),
    ("gateway_deliveries_pending", Gauge, "Fanout lists read and not yet handed to their connections."),
    ("gateway_unknown_deliveries_total", Counter, "Fanout lists of a type this gateway does not know, dropped."),
    ("gateway_pushes_total", Counter, "Frames queued to connections."),
    ("gateway_push_latency_seconds", Histogram, "Time from an event's commit in PostgreSQL to its frame being written to the socket."),
    ("gateway_queue_overflows_total", Counter, "Connections closed 1008 because sessions.queue_bound frames were queued."),
    ("gateway_write_timeouts_total", Counter, "Connections dropped because their socket took no writes for two heartbeats."),
    ("gateway_presence_users", Gauge, "Users online on this gateway."),
    ("gateway_presence_records_total", Counter, "Presence leases and tombstones written to chat.presence."),
    ("gateway_presence_errors_total", Counter, "Presence records the broker refused."),
    ("gateway_presence_unacknowledged_total", Counter, "Lease renewals the broker had not acknowledged within a renewal tick."),
    ("gateway_sessions_awaiting_ready", Gauge, "Connections not yet told ready: their presence record is unwritten, or the fanout members that read it do not yet cover every chat.events partition."),
    ("gateway_ready_seconds", Histogram, "From a connection's upgrade to its ready frame."),
    ("gateway_resyncs_total", Counter, "Times the gateway told every client to catch up over REST, by cause (presence lapsed, deliveries reader stalled)."),
    ("gateway_resync_frames_total", Counter, "resync frames sent to sessions."),
    ("gateway_client_frames_total", Counter, "Frames clients sent, by kind (ack, typing, unknown, invalid)."),
    ("gateway_acks_total", Counter, "Delivery acks from clients, by result (produced, failed, dropped; coalesced: held back, a later one carries it)."),
    ("gateway_frame_floods_total", Counter, "Connections closed 1008 \"too many frames\": more text frames than signals.frames allows."),
    ("gateway_typing_total", Counter, "Typing signals from clients, by result (produced, throttled, failed, dropped)."),
];

/// The metric prefixes of the readers (`ReaderSpec::metric`): the receipts processor's
/// readers of reads and of acks, fanout's of events, presence and typing, the gateway's
/// of deliveries, the auditor's of events. A reader with another prefix panics at start.
pub const READER_PREFIXES: &[&str] = &[
    "receipts",
    "fanout",
    "fanout_presence",
    "fanout_typing",
    "gateway_deliveries",
    "audit",
    "archive",
    "notifications",
    "notifications_presence",
    "analytics",
];

/// The metrics of a reader with metric prefix `prefix` (see `chatpipe_runtime::reader`).
pub fn reader_metrics(prefix: &str) -> Vec<(String, Kind, String)> {
    [
        ("records_total", Counter, "Records the reader processed."),
        ("dlq_total", Counter, "Records the reader could not decode or apply, written to the dead-letter topic."),
        ("retries_total", Counter, "Retries of a held record or tick after a failure (an outage is retried, never dead-lettered)."),
        ("retrying", Gauge, "1 while the reader holds a record and retries it."),
        ("consumer_errors_total", Counter, "Errors the Kafka consumer reported (broker down, transport)."),
        ("commit_failures_total", Counter, "Offset commits that failed (retried with the next commit)."),
        ("refetches_total", Counter, "Partitions fetched again because records waited unfetched past the reader's position."),
        ("leader_queries_total", Counter, "Metadata requests the reader made for partitions without a known leader."),
        ("consumer_lag", Gauge, "Records between the reader's position and the end of the partition, by partition."),
        ("consumer_stalled", Gauge, "1 while the reader counts as stalled (its /readyz is 503)."),
    ]
    .into_iter()
    .map(|(suffix, kind, help)| (format!("{prefix}_{suffix}"), kind, help.to_owned()))
    .collect()
}

/// Gives the process-wide recorder the help text of every metric above.
pub fn describe_all() {
    for (name, kind, help) in METRICS {
        describe(name.to_string(), *kind, help.to_string());
    }
}

/// Gives the recorder one metric's help text.
pub fn describe(name: String, kind: Kind, help: String) {
    match kind {
        Counter => metrics::describe_counter!(name, help),
        Gauge => metrics::describe_gauge!(name, help),
        Histogram => metrics::describe_histogram!(name, help),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_named_once_and_has_help() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, kind, help) in METRICS {
            assert!(seen.insert(*name), "{name} is listed twice");
            assert!(!help.is_empty(), "{name} has no help");
            if name.ends_with("_total") {
                assert_eq!(*kind, Counter, "{name} ends in _total: a counter");
            }
        }
    }
}
