//! The stack's connector streams from a failover slot (issue 25): PostgreSQL 17, and the
//! slot `scripts/stack up` made (Debezium would make it so too: `slot.failover`). A
//! standby with `sync_replication_slots = on` keeps a copy of it, so a promoted standby
//! streams on from where the connector stood. PostgreSQL's own catalogue is the witness.

use sqlx::Connection;

#[tokio::test]
async fn the_stack_connector_streams_from_a_failover_slot_on_postgresql_17() {
    let slot = std::env::var("CHATPIPE_OUTBOX_SLOT").expect(
        "CHATPIPE_OUTBOX_SLOT is not set: start the stack (`scripts/stack up`) and `eval \"$(scripts/stack env)\"`, as scripts/test does",
    );
    let mut db = sqlx::PgConnection::connect(&chatpipe_tests::server_url())
        .await
        .expect("the stack's PostgreSQL");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert!(
        version >= 170_000,
        "PostgreSQL {version}: failover slots need 17"
    );
    let (plugin, failover): (String, bool) = sqlx::query_as(
        "SELECT plugin::text, failover FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(&slot)
    .fetch_optional(&mut db)
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("no replication slot {slot}"));
    assert_eq!(plugin, "pgoutput");
    assert!(failover, "slot {slot} was made without failover");
}
