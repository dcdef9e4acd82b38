//! Least privilege (issue 24, item 11): the services connect as `chatpipe_service`
//! (config/postgres/roles.sql, granted by migration 20261203000004), which may read and
//! write rows and nothing more; PostgreSQL's own catalogs and error codes are the witness.

use chatpipe_tests::{as_service, spawn_app};
use sqlx::{Connection, PgConnection};

/// SQLSTATE 42501: insufficient_privilege.
async fn refused(db: &mut PgConnection, sql: &str) {
    let err = sqlx::raw_sql(sql)
        .execute(&mut *db)
        .await
        .err()
        .unwrap_or_else(|| panic!("chatpipe_service was allowed: {sql}"));
    let code = err
        .as_database_error()
        .and_then(|e| e.code().map(|c| c.into_owned()));
    assert_eq!(code.as_deref(), Some("42501"), "{sql}: {err}");
}

#[tokio::test]
async fn the_api_connects_as_the_services_role_which_cannot_change_the_schema_or_make_roles() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    assert_eq!(alice.send_message(conv, "as chatpipe_service").await, 1);

    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let logins: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT r.rolname, r.rolsuper, r.rolcreaterole FROM pg_stat_activity a
           JOIN pg_roles r ON r.oid = a.usesysid
          WHERE a.datname = $1 AND a.application_name = 'ingest-api'",
    )
    .bind(&db)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(!logins.is_empty(), "the app's pool has connections");
    for (role, superuser, createrole) in &logins {
        assert_eq!(role, "chatpipe_service");
        assert!(!superuser && !createrole, "{role} is ordinary");
    }

    let url: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .map(|db: String| chatpipe_tests::with_database(&chatpipe_tests::server_url(), &db))
        .unwrap();
    let mut service = PgConnection::connect(&as_service(&url)).await.unwrap();
    // What it may do: read and write rows.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM message")
        .fetch_one(&mut service)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    // What it may not.
    refused(&mut service, "CREATE ROLE chatpipe_intruder").await;
    refused(&mut service, "CREATE TABLE intruder (id int)").await;
    refused(&mut service, "ALTER TABLE message ADD COLUMN intruder int").await;
    refused(&mut service, "DROP TABLE outbox").await;
    refused(&mut service, "TRUNCATE message").await;
    refused(&mut service, "CREATE DATABASE intruder").await;
    refused(
        &mut service,
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
              VALUES (1, 'x', true, '\\x00', 0)",
    )
    .await;
    refused(
        &mut service,
        "SELECT pg_create_logical_replication_slot('intruder', 'pgoutput')",
    )
    .await;
    refused(&mut service, "SELECT * FROM pg_authid").await;
}

#[tokio::test]
async fn debeziums_role_reads_the_outbox_and_nothing_else() {
    let app = spawn_app().await;
    let alice = app.user(10);
    let conv = alice.create_group(&[20]).await;
    alice.send_message(conv, "not for cdc").await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let (login, ca) = chatpipe_tests::cdc_login();
    let url = chatpipe_tests::with_database(&login, &db);
    // Its login is refused without TLS (pg_hba: hostnossl … reject)…
    let plain = format!("{url}?sslmode=disable");
    let err = PgConnection::connect(&plain).await.expect_err("refused");
    assert!(
        err.to_string().contains("pg_hba.conf") || err.to_string().contains("no encryption"),
        "{err}"
    );
    // … and served with it, the server's certificate checked.
    let tls = format!("{url}?sslmode=verify-full&sslrootcert={}", ca.display());
    let mut cdc = PgConnection::connect(&tls).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&mut cdc)
        .await
        .unwrap();
    refused(&mut cdc, "SELECT body FROM message").await;
    refused(&mut cdc, "SELECT * FROM sync_cursor_key").await;
    refused(&mut cdc, "DELETE FROM outbox").await;
}

/// No credentials are compiled in: without `database.url` the binaries refuse to start
/// and name the key.
#[tokio::test]
async fn without_a_database_url_the_services_refuse_to_start_and_name_the_key() {
    for (var, args, listen) in [
        (
            "CHATPIPE_INGEST_API_BIN",
            vec![],
            [
                ("INGEST_ADDR", "127.0.0.1:0"),
                ("INGEST_ADMIN_ADDR", "127.0.0.1:0"),
            ]
            .as_slice(),
        ),
        (
            "CHATPIPE_PIPELINE_BIN",
            vec!["receipts"],
            [("CHATPIPE_HTTP__METRICS_ADDR", "127.0.0.1:0")].as_slice(),
        ),
    ] {
        let bin = std::env::var(var)
            .unwrap_or_else(|_| panic!("{var} is not set: run the suite with scripts/test"));
        let out = tokio::process::Command::new(&bin)
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("JWT_SECRET", chatpipe_tests::JWT_SECRET)
            .env("SCHEMA_REGISTRY_URL", chatpipe_tests::registry_url())
            .env("KAFKA_BROKERS", chatpipe_tests::stream::brokers())
            .envs(listen.iter().copied())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
            .await
            .unwrap_or_else(|_| panic!("{bin} did not exit without a database URL"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bin} started: {stderr}");
        assert!(
            stderr.contains("database.url (DATABASE_URL) is not set"),
            "{bin}: {stderr}"
        );
    }
}
