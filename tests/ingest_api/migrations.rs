//! Migrations applied to a database that already holds data: what each changes in rows
//! that were written before it.

use sqlx::{Connection, PgConnection};

/// A migrator of the repository's migrations up to and including `last` (a version).
pub(crate) async fn migrations_up_to(last: i64) -> sqlx::migrate::Migrator {
    let dir = std::env::temp_dir().join(format!("migrations-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for entry in std::fs::read_dir(source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let version: i64 = name.split('_').next().unwrap().parse().unwrap();
        if version <= last {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    migrator
}

#[tokio::test]
async fn groups_made_before_roles_get_an_admin_each_the_creator_or_their_longest_standing_member() {
    let url = chatpipe_tests::fresh_database().await;
    let mut db = PgConnection::connect(&url).await.unwrap();
    migrations_up_to(20261201000004)
        .await
        .run(&mut db)
        .await
        .unwrap();
    // Group 1 still has its creator (10); group 2's creator left, 30 joined before 20;
    // a DIRECT conversation gets no admin.
    sqlx::raw_sql(
        "INSERT INTO conversation (id, type, title, created_by, member_count) OVERRIDING SYSTEM VALUE
              VALUES (1, 'GROUP', 'kept', 10, 2), (2, 'GROUP', 'left', 10, 2), (3, 'DIRECT', NULL, 10, 2);
         INSERT INTO conversation_member (conversation_id, user_id, joined_at) VALUES
              (1, 10, '2026-01-01'), (1, 20, '2026-01-02'),
              (2, 20, '2026-01-03'), (2, 30, '2026-01-02'),
              (3, 10, '2026-01-01'), (3, 20, '2026-01-01');",
    )
    .execute(&mut db)
    .await
    .unwrap();
    ingest_api::startup::MIGRATOR.run(&mut db).await.unwrap();
    let admins: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT conversation_id, user_id FROM conversation_member WHERE role = 'ADMIN'
          ORDER BY conversation_id",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(admins, vec![(1, 10), (2, 30)]);
}

/// Messages and members written before deletes and sync existed: their counts start at
/// zero deleted, their rows count as unchanged for every cursor (changed_xid NULL, no
/// table rewrite), and deletes, unread counts and sync work on them from then on.
#[tokio::test]
async fn history_from_before_deletes_and_sync_is_unread_synced_and_deletable() {
    let url = chatpipe_tests::fresh_database().await;
    let mut db = PgConnection::connect(&url).await.unwrap();
    migrations_up_to(20261201000006)
        .await
        .run(&mut db)
        .await
        .unwrap();
    sqlx::raw_sql(
        "INSERT INTO conversation (id, type, title, created_by, member_count, last_seq)
              OVERRIDING SYSTEM VALUE VALUES (1, 'GROUP', 'old', 10, 2, 3);
         INSERT INTO conversation_member (conversation_id, user_id, role, last_read_seq)
              VALUES (1, 10, 'ADMIN', 3), (1, 20, 'MEMBER', 1);
         INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at)
              SELECT 1, s, 10, gen_random_uuid(), 'old ' || s, now() FROM generate_series(1, 3) s;",
    )
    .execute(&mut db)
    .await
    .unwrap();
    ingest_api::startup::MIGRATOR.run(&mut db).await.unwrap();
    let app = chatpipe_tests::spawn_app_with(|s| {
        s.database.url = secrecy::SecretString::from(url.clone());
    })
    .await;
    let bob = app.user(20);
    let inbox = bob.get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["unreadCount"], 2);

    let first = bob.get("/v1/sync").await.expect(200);
    let cursor = first["nextCursor"].as_str().unwrap();
    let nothing = bob
        .get(&format!("/v1/sync?since={cursor}"))
        .await
        .expect(200);
    assert_eq!(
        nothing["conversations"],
        serde_json::json!([]),
        "old rows are not news"
    );

    assert_eq!(
        app.user(10)
            .delete("/v1/conversations/1/messages/3")
            .await
            .status,
        204
    );
    let seq = app.user(10).send_message(1, "new").await;
    assert_eq!(seq, 4);
    let page = bob
        .get(&format!("/v1/sync?since={cursor}"))
        .await
        .expect(200);
    let entry = &page["conversations"][0];
    let seqs: Vec<i64> = entry["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![3, 4]);
    assert_eq!(entry["messages"][0]["deleted"], true);
    assert_eq!(entry["unreadCount"], 2, "2 and 4; 3 is deleted");
}

/// Migrations run without the pool's statement timeout (an index on a table of
/// production size takes longer than any request may): on a pool whose statements may
/// take 1 ms, `startup::migrate` still applies every migration to a fresh database.
#[tokio::test]
async fn migrations_run_without_the_requests_statement_timeout() {
    let url = chatpipe_tests::fresh_database().await;
    let mut settings = ingest_api::configuration::Settings::defaults_with_secret("unused");
    settings.database.url = url.clone().into();
    settings.database.statement_timeout_ms = 1;
    let pool = ingest_api::startup::connect(&settings.database)
        .await
        .unwrap();
    ingest_api::startup::migrate(&pool).await.unwrap();
    let mut db = PgConnection::connect(&url).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(
        applied as usize,
        ingest_api::startup::MIGRATOR.iter().count(),
        "every migration applied"
    );
}

/// The services may not migrate (their role owns nothing), so a service started on a
/// database its owner has not migrated yet refuses to start and says what to run.
#[tokio::test]
async fn a_service_refuses_a_schema_older_than_its_build_and_says_to_migrate() {
    let start = |url: String| async move {
        let mut settings =
            ingest_api::configuration::Settings::defaults_with_secret(chatpipe_tests::JWT_SECRET);
        settings.http.addr = "127.0.0.1:0".parse().unwrap();
        settings.admin.addr = "127.0.0.1:0".parse().unwrap();
        settings.registry.url = chatpipe_tests::registry_url();
        settings.database.url = chatpipe_tests::as_service(&url).into();
        match ingest_api::startup::Application::build(settings).await {
            Ok(_) => panic!("started on a schema it does not know"),
            Err(err) => format!("{err:#}"),
        }
    };
    let empty = chatpipe_tests::fresh_database().await;
    let said = start(empty).await;
    assert!(
        said.contains("no chatpipe schema") && said.contains("ingest-api migrate"),
        "{said}"
    );

    let behind = chatpipe_tests::fresh_database().await;
    let mut db = PgConnection::connect(&behind).await.unwrap();
    migrations_up_to(20261203000003)
        .await
        .run(&mut db)
        .await
        .unwrap();
    // The grants come with the newest migration: give them by hand, so the refusal
    // is the schema's age and not a permission.
    sqlx::raw_sql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO chatpipe_service;")
        .execute(&mut db)
        .await
        .unwrap();
    let said = start(behind).await;
    assert!(
        said.contains("at migration 20261203000003") && said.contains("ingest-api migrate"),
        "{said}"
    );
}
